"""`tokenfront check`: real renderers and workers on loopback, the command itself run as a real process.

The workers (a torch load of SmolLM2-135M each) start once per module, concurrently: one with the same options
as the renderer and its render routes on, one with another `--chat-template`, one plain `tokenfront serve`
(no render routes). A worker that publishes no fingerprint (vLLM) is stood in for by a small HTTP server in
this process whose `/tokenize` hands the body to the real renderer and answers what it said.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenfront import fixtures
from tokenfront.check import EXIT_AGREE, EXIT_DIFFER, EXIT_INCOMPLETE, exit_code
from tokenfront.check.compare import AGREES, DIFFERS, UNCHECKED, Verdict
from tokenfront.check.fetch import ServerReport
from tokenfront.core.fingerprint import Fingerprint, component_label, components
from tokenfront.probe_corpus import PROBE_CASES

CASES = len(PROBE_CASES)
# ChatML without SmolLM2's default system prompt: the same ids as SmolLM2's template when the conversation
# opens with a system message, different ones otherwise.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_KEYS = ("TOKENFRONT_API_KEY", "TOKENFRONT_WORKER_API_KEY", "TOKENFRONT_ENABLE_RENDER_ENDPOINTS")


def run_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tokenfront check ARGS` as a real process, with no key from this environment unless `env` gives one."""
    environ = {key: value for key, value in os.environ.items() if key not in _KEYS}
    return subprocess.run(
        [sys.executable, "-m", "tokenfront.cli", "check", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **(env or {})},
    )


def section(stdout: str, header: str) -> list[list[str]]:
    """The rows of one table of the report (the header row excluded), split on runs of two spaces."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append([cell.strip() for cell in line.split("  ") if cell.strip()])
    return rows


def verdict_line(stdout: str, name: str) -> str:
    """A worker's verdict: the last line that starts with its name (the servers table has one too)."""
    return [line for line in stdout.splitlines() if line.startswith(f"{name}  http")][-1]


def fingerprint_of(url: str) -> Fingerprint:
    fingerprint = Fingerprint.from_json(
        httpx.get(f"{url}/server_info", timeout=10).json()["render_fingerprint"]
    )
    assert fingerprint is not None
    return fingerprint


def tokenize(url: str, body: Any) -> list[int]:
    response = httpx.post(f"{url}/tokenize", json=dict(body), timeout=30)
    assert response.status_code == 200, response.text
    return list(response.json()["tokens"])


@dataclass
class Servers:
    renderer: Any
    worker: Any  # same options, render routes on
    other_template: Any  # --chat-template CHATML, render routes on
    plain: Any  # same options, no render routes


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return fixtures.ensure_checkpoint("smollm2")


@pytest.fixture(scope="module")
def servers(
    launch: Callable[..., Any], smollm2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Servers]:
    log_dir = tmp_path_factory.mktemp("check")
    on, off = {"TOKENFRONT_ENABLE_RENDER_ENDPOINTS": "1"}, {"TOKENFRONT_ENABLE_RENDER_ENDPOINTS": "0"}
    model = ["--model", str(smollm2)]
    commands: list[tuple[list[str], dict[str, str]]] = [
        (["render", *model], off),
        (["serve", *model, "--device", "cpu"], on),
        (["serve", *model, "--device", "cpu", "--chat-template", CHATML], on),
        (["serve", *model, "--device", "cpu"], off),
    ]
    with ThreadPoolExecutor(len(commands)) as pool:
        futures = [
            pool.submit(launch, args, log_dir=log_dir, env=env, timeout=300.0) for args, env in commands
        ]
        started = [future.result() for future in futures]
    yield Servers(*started)
    for server in started:
        server.stop()


@pytest.mark.slow
def test_a_matching_worker_agrees(servers: Servers) -> None:
    result = run_check("--renderer", servers.renderer.url, "--worker", servers.worker.url)
    assert result.returncode == EXIT_AGREE, result.stdout + result.stderr
    out = result.stdout
    # Every corpus case rendered by both, the same ids.
    cases = section(out, "corpus case")
    assert [row[0] for row in cases] == [case.name for case in PROBE_CASES]
    expected = {case.name: len(tokenize(servers.renderer.url, case.body)) for case in PROBE_CASES}
    assert [(row[1], row[2]) for row in cases] == [(f"{expected[row[0]]} ids", "equal") for row in cases]
    # Every fingerprint component laid out, every one the same.
    fingerprint = fingerprint_of(servers.worker.url)
    assert fingerprint.digest == fingerprint_of(servers.renderer.url).digest
    rows = section(out, "fingerprint component")
    assert [row[0] for row in rows] == [component_label(key) for key in components(fingerprint.compared)]
    assert {row[-1] for row in rows} == {"same"}
    assert f"agrees: the same rendering fingerprint; the same ids on {CASES} of {CASES} corpus cases" in (
        verdict_line(out, "worker 1")
    )
    assert out.rstrip().endswith("result: every worker agrees with the renderer (exit 0)")


@pytest.mark.slow
def test_another_chat_template_is_named_with_the_first_differing_case(servers: Servers) -> None:
    result = run_check(
        "--renderer",
        servers.renderer.url,
        "--worker",
        servers.worker.url,
        "--worker",
        servers.other_template.url,
    )
    assert result.returncode == EXIT_DIFFER, result.stdout + result.stderr
    out = result.stdout
    # The first case whose ids differ, found here with the servers' own /tokenize.
    differing = [
        case
        for case in PROBE_CASES
        if tokenize(servers.renderer.url, case.body) != tokenize(servers.other_template.url, case.body)
    ]
    first = differing[0]
    assert first.name == "multi_turn"  # system_user opens with a system message: ChatML renders it alike
    mine, theirs = (
        tokenize(servers.renderer.url, first.body),
        tokenize(servers.other_template.url, first.body),
    )
    at = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b)
    assert verdict_line(out, "worker 2").endswith(
        "DIFFERS: chat template differs; first differing case: multi_turn (the ids differ from index "
        f"{at}: worker 2 gave {len(theirs)} ids, the renderer {len(mine)})"
    )
    assert f"agrees: the same rendering fingerprint; the same ids on {CASES} of {CASES}" in verdict_line(
        out, "worker 1"
    )
    # Component by component: the chat template alone differs.
    rows = {row[0]: row[2:] for row in section(out, "fingerprint component")}
    assert rows.pop("chat template") == ["same", "DIFFERS"]
    assert {tuple(cells) for cells in rows.values()} == {("same", "same")}
    # Case by case: worker 2 differs on exactly the cases that differ.
    cells = {row[0]: row[3] for row in section(out, "corpus case")}
    assert sorted(name for name, cell in cells.items() if cell != "equal") == sorted(
        c.name for c in differing
    )
    assert out.rstrip().endswith("result: 1 of 2 agree; 1 differs (exit 1)")


@pytest.mark.slow
def test_json_report(servers: Servers) -> None:
    result = run_check(
        "--json",
        "--renderer",
        servers.renderer.url,
        "--worker",
        servers.worker.url,
        "--worker",
        servers.other_template.url,
    )
    assert result.returncode == EXIT_DIFFER, result.stderr
    report = json.loads(result.stdout)
    assert report["exit_code"] == 1
    assert report["renderer"]["fingerprint"] == fingerprint_of(servers.renderer.url).digest
    same, other = report["workers"]
    assert (same["verdict"], same["compared"], same["equal"], same["first_differing_case"]) == (
        "agrees",
        CASES,
        CASES,
        None,
    )
    assert other["verdict"] == "differs"
    assert other["fingerprint_differences"] == ["chat template differs"]
    assert [label for label, equal in other["components"].items() if not equal] == ["chat template"]
    assert other["first_differing_case"] == "multi_turn"
    assert other["cases"]["system_user"] == {"state": "equal", "reason": None}
    assert other["cases"]["multi_turn"]["state"] == "differs"


@pytest.mark.slow
def test_a_worker_without_render_routes_is_compared_by_its_fingerprint(servers: Servers) -> None:
    result = run_check("--renderer", servers.renderer.url, "--worker", servers.plain.url)
    assert result.returncode == EXIT_AGREE, result.stdout + result.stderr
    out = result.stdout
    servers_table = {row[0]: row for row in section(out, "server")}
    assert servers_table["worker 1"][-1] == (
        "no: render routes off (start the worker with TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1)"
    )
    assert {row[2] for row in section(out, "corpus case")} == {"-"}
    assert verdict_line(out, "worker 1").endswith(
        "agrees: the same rendering fingerprint; ids not compared (render routes off (start the worker with "
        "TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1))"
    )


@pytest.mark.slow
def test_another_tokenizer_names_model_type_and_vocabulary(servers: Servers, qwen3_renderer: Any) -> None:
    result = run_check("--renderer", servers.renderer.url, "--worker", qwen3_renderer.url)
    assert result.returncode == EXIT_DIFFER, result.stdout + result.stderr
    line = verdict_line(result.stdout, "worker 1")
    assert "DIFFERS: model type llama vs qwen3; chat template differs;" in line
    assert "tokenizer vocabulary differs" in line and "tokenizer added tokens differs" in line
    assert "first differing case: system_user (the ids differ from index 0" in line


@pytest.mark.slow
def test_api_keys(servers: Servers, launch: Callable[..., Any], smollm2: Path, tmp_path: Path) -> None:
    keyed = launch(["render", "--model", str(smollm2), "--api-key", "k-renderer"], log_dir=tmp_path)
    try:
        without = run_check("--renderer", keyed.url, "--worker", servers.worker.url)
        assert without.returncode == EXIT_INCOMPLETE, without.stdout + without.stderr
        assert (
            "UNCHECKED: the renderer could not be checked: /server_info answered 401 to a request without a key: "
            "give its key with --api-key" in without.stdout
        )
        wrong = run_check("--renderer", keyed.url, "--worker", servers.worker.url, "--api-key", "nope")
        assert wrong.returncode == EXIT_INCOMPLETE and "401 to the key sent" in wrong.stdout
        # The key from the environment; the worker (no key of its own) ignores it.
        right = run_check(
            "--renderer", keyed.url, "--worker", servers.worker.url, env={"TOKENFRONT_API_KEY": "k-renderer"}
        )
        assert right.returncode == EXIT_AGREE, right.stdout + right.stderr
        assert f"the same ids on {CASES} of {CASES}" in right.stdout
        # A keyed worker, its key given apart from the renderer's.
        worker_side = run_check(
            "--renderer", servers.worker.url, "--worker", keyed.url, "--worker-api-key", "k-renderer"
        )
        assert worker_side.returncode == EXIT_AGREE, worker_side.stdout + worker_side.stderr
    finally:
        keyed.stop()


class StandIn:
    """A server that is not tokenfront (vLLM's shape): no `/server_info`; `/tokenize` answered by a real
    renderer (`tokenize_via`), optionally with the last id of one case dropped, or not there at all, or slow."""

    def __init__(
        self, tokenize_via: str | None, *, drop_last_of: str | None = None, delay: float = 0.0
    ) -> None:
        perturbed = next(c.body for c in PROBE_CASES if c.name == drop_last_of) if drop_last_of else None
        self.bodies: list[Any] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.bodies.append(body)
                time.sleep(delay)
                if tokenize_via is None or self.path != "/tokenize":
                    self._answer(404, {"detail": "Not Found"})
                    return
                response = httpx.post(f"{tokenize_via}/tokenize", json=body, timeout=30)
                payload = response.json()
                if body == perturbed:
                    payload = {**payload, "tokens": payload["tokens"][:-1], "count": payload["count"] - 1}
                self._answer(response.status_code, payload)

            def _answer(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_a_worker_without_fingerprint_agrees_on_the_corpus_only(servers: Servers) -> None:
    with StandIn(servers.renderer.url) as stand_in:
        result = run_check("--renderer", servers.renderer.url, "--worker", stand_in.url)
    assert result.returncode == EXIT_AGREE, result.stdout + result.stderr
    assert stand_in.bodies == [dict(case.body) for case in PROBE_CASES]  # the corpus, each case once
    assert verdict_line(result.stdout, "worker 1").endswith(
        f"agrees on the corpus only: the same ids on {CASES} of {CASES} corpus cases, but worker 1 publishes no "
        "rendering fingerprint (no /server_info), so only these cases are shown to render alike (a router "
        "forwards ids to such a worker only when it is added with verify=probe)"
    )
    assert {row[2] for row in section(result.stdout, "fingerprint component")} == {"-"}


@pytest.mark.slow
def test_a_worker_without_fingerprint_that_differs_on_one_case(servers: Servers) -> None:
    tools = next(case for case in PROBE_CASES if case.name == "tools")
    count = len(tokenize(servers.renderer.url, tools.body))
    with StandIn(servers.renderer.url, drop_last_of="tools") as stand_in:
        result = run_check("--renderer", servers.renderer.url, "--worker", stand_in.url)
    assert result.returncode == EXIT_DIFFER, result.stdout + result.stderr
    assert verdict_line(result.stdout, "worker 1").endswith(
        "DIFFERS: worker 1 publishes no rendering fingerprint (no /server_info); first differing case: tools "
        f"(the ids differ from index {count - 1}: worker 1 gave {count - 1} ids, the renderer {count})"
    )
    cells = [row[2] for row in section(result.stdout, "corpus case")]
    assert cells.count("equal") == CASES - 1 and cells.count(f"differs at index {count - 1}") == 1


@pytest.mark.slow
def test_a_worker_with_neither_fingerprint_nor_tokenize_is_not_shown_to_agree(servers: Servers) -> None:
    with StandIn(None) as stand_in:
        result = run_check("--renderer", servers.renderer.url, "--worker", stand_in.url)
    assert result.returncode == EXIT_DIFFER, result.stdout + result.stderr
    assert verdict_line(result.stdout, "worker 1").endswith(
        "NOT SHOWN TO AGREE: worker 1 publishes no rendering fingerprint (no /server_info), and ids not compared "
        "(no POST /tokenize (it answered 404))"
    )
    assert len(stand_in.bodies) == 1  # asked once, then no more


@pytest.mark.slow
def test_a_slow_worker_is_unchecked_after_the_timeout(servers: Servers) -> None:
    with StandIn(servers.renderer.url, delay=2.0) as stand_in:
        result = run_check("--renderer", servers.renderer.url, "--worker", stand_in.url, "--timeout", "0.2")
    assert result.returncode == EXIT_INCOMPLETE, result.stdout + result.stderr
    assert "UNCHECKED: unreachable: POST /tokenize failed (ReadTimeout" in verdict_line(
        result.stdout, "worker 1"
    )


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_servers_exit_2() -> None:
    renderer, worker = f"http://127.0.0.1:{_closed_port()}", f"http://127.0.0.1:{_closed_port()}"
    result = run_check("--renderer", renderer, "--worker", worker)
    assert result.returncode == EXIT_INCOMPLETE, result.stdout + result.stderr
    assert (
        "the renderer could not be checked: unreachable: GET /server_info failed (ConnectError"
        in result.stdout
    )
    assert result.stdout.rstrip().endswith("result: 0 of 1 agree; 1 unchecked (exit 2)")
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--renderer", "http://127.0.0.1:9", "--worker", "http://localhost:9/"],
            "error: --worker http://localhost:9 is also given as --renderer: name each server once",
        ),
        (
            ["--renderer", "http://127.0.0.1:9", "--worker", "ftp://host"],
            "error: argument --worker: URL 'ftp://host': the scheme must be http:// or https://",
        ),
        (["--renderer", "http://127.0.0.1:9"], "error: the following arguments are required: --worker"),
        (
            ["--renderer", "http://127.0.0.1:9", "--worker", "http://127.0.0.1:8", "--api-key", " "],
            "error: --api-key (or $TOKENFRONT_API_KEY) is empty",
        ),
    ],
)
def test_command_line_mistakes_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run_check(*args)
    assert result.returncode == EXIT_INCOMPLETE
    assert result.stdout == ""
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr


def test_check_never_imports_torch() -> None:
    """A client tool: the whole command, run in a process where torch is installed, leaves it unimported."""
    code = (
        "import sys; from tokenfront.cli import main; "
        f"rc = main(['check', '--renderer', 'http://127.0.0.1:{_closed_port()}', '--worker', "
        f"'http://127.0.0.1:{_closed_port()}']); "
        "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "2 False False", result.stdout + result.stderr


def test_a_difference_outweighs_an_unchecked_worker() -> None:
    def verdict(state: str) -> Verdict:
        return Verdict(ServerReport("worker", "http://127.0.0.1:1"), state, "")

    assert exit_code([verdict(AGREES), verdict(AGREES)]) == EXIT_AGREE
    assert exit_code([verdict(AGREES), verdict(UNCHECKED)]) == EXIT_INCOMPLETE
    assert exit_code([verdict(UNCHECKED), verdict(DIFFERS)]) == EXIT_DIFFER

"""Router test fixtures: real workers and routers on loopback, and a plain OpenAI server that is not tokenfront.

Workers load torch and a model (seconds each), so a module starts its workers once, concurrently, and the
tests of the module share them. Every process is stopped by its own pid at the end of its module.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenfront import fixtures

_ROOT_CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"
WORKER_HEADER = "x-tokenfront-worker"
FORWARDED_HEADER = "x-tokenfront-forwarded"
GATE_WARNING = "not forwarding token ids"
GATE_RESUMED = "forwarding token ids again"
# The admin key of routers whose tests add or remove workers (`--admin-api-key`), and the header that sends it.
ADMIN_KEY = "test-admin-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def _root_conftest(config: pytest.Config) -> Any:
    module = config.pluginmanager.get_plugin(str(_ROOT_CONFTEST))
    assert module is not None, f"{_ROOT_CONFTEST} is not loaded"
    return module


@pytest.fixture(scope="session")
def tiny_random() -> Path:
    """A 2-layer random-weight Llama on the SmolLM2 tokenizer: fast, meaningless output."""
    return fixtures.ensure_checkpoint("tiny-random")


class Fleet:
    """Starts tokenfront processes for one module (concurrently when asked) and stops them all at the end."""

    def __init__(self, root: Any, log_dir: Path) -> None:
        self._root = root
        self.log_dir = log_dir
        self.started: list[Any] = []

    def start(self, *args: str, verify: Any = None) -> Any:
        """`tokenfront ARGS... --host 127.0.0.1 --port <free>`, once /health answers (over HTTPS checked with
        the SSL context `verify`, when given)."""
        server = self._root.start_server(list(args), log_dir=self.log_dir, timeout=240.0, verify=verify)
        self.started.append(server)
        return server

    def start_many(self, *commands: list[str]) -> list[Any]:
        """Start several servers at once (a worker spends most of its start-up importing torch)."""
        with ThreadPoolExecutor(len(commands)) as pool:
            return list(pool.map(lambda command: self.start(*command), commands))

    def start_on_port(self, port: int, *args: str, host: str = "127.0.0.1") -> Any:
        """Start a server on a given port (a worker coming back where it was), on another loopback address
        (127.0.0.2, ...: Linux routes all of 127/8 to lo) when `host` says so."""
        log_path = self.log_dir / f"server-{host}-{port}-{time.monotonic_ns()}.log"
        command = [sys.executable, "-m", "tokenfront.cli", *args, "--host", host, "--port", str(port)]
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=dict(os.environ)
            )
        server = self._root.ServerProcess(process, f"http://{host}:{port}", log_path)
        self.started.append(server)
        assert wait_until(lambda: _healthy(server), timeout=240.0), server.log()[-3000:]
        return server

    def running(self, url: str) -> Any:
        """The live process this fleet started on `url`."""
        return next(s for s in reversed(self.started) if s.url == url and s.process.poll() is None)

    def stop_all(self) -> None:
        for server in reversed(self.started):
            server.stop()


def _healthy(server: Any) -> bool:
    if server.process.poll() is not None:
        raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()[-3000:]}")
    try:
        return httpx.get(f"{server.url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Processes that live until the end of the test module."""
    started = Fleet(_root_conftest(request.config), tmp_path_factory.mktemp("router-fleet"))
    yield started
    started.stop_all()


def router_command(model: Path | None, workers: list[str], *extra: str) -> list[str]:
    """`route` arguments for these workers, checking health quickly so that tests need not wait long."""
    command = ["route", *(["--model", str(model)] if model is not None else [])]
    for url in workers:
        command += ["--worker", url]
    return [*command, "--health-interval", "0.5", "--kv-events-interval", "0.2", *extra]


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.1) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; return whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def wait_for_checks(client: httpx.Client, url: str, count: int, timeout: float = 30.0) -> bool:
    """Wait until the router behind `client` has checked the worker `url` `count` more times (in GET /workers
    its `seconds_since_check` starts again from 0 at each check): what a test waits on before it asserts that
    the checks changed nothing. Return whether they happened within `timeout`."""
    checks, last = 0, None

    def checked() -> bool:
        nonlocal checks, last
        listed = {item["url"]: item for item in client.get("/workers").json()["workers"]}
        since = listed[url]["seconds_since_check"]
        if last is not None and since is not None and since < last:
            checks += 1
        last = since
        return checks >= count

    return wait_until(checked, timeout, interval=0.05)


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of a server's /metrics (0 when it is not there yet)."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10.0).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def log_lines(server: Any, needle: str) -> list[str]:
    """The lines of a server's log that contain `needle`."""
    return [line for line in server.log().splitlines() if needle in line]


def chat(client: httpx.Client, messages: list[dict[str, Any]], **fields: Any) -> httpx.Response:
    """POST /v1/chat/completions through the router, asserting success."""
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, **fields}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def forwarded(response: httpx.Response) -> bool:
    """Whether the router says it sent its ids."""
    value = response.headers[FORWARDED_HEADER]
    assert value in ("true", "false"), value
    return value == "true"


# --- a plain OpenAI server: not tokenfront, no /server_info ---------------------------------------------------


class PlainOpenAIServer:
    """A minimal OpenAI-compatible HTTP server on loopback (a thread in the test process).

    It answers `/v1/chat/completions` and `/v1/completions` with a fixed reply and records every body it
    received, and every request (`requests`: method, path, Authorization header); `/health` answers 200.
    `/server_info` is a 404, as on vLLM or any other server — unless `server_info` is given, in which case it
    answers that (a stand-in publishing a chosen fingerprint).
    `POST /tokenize` is a 404 too — unless `tokenize` is given: it gets each body (recorded in
    `tokenize_bodies`) and returns the status and payload to answer (a stand-in for vLLM's `/tokenize`).
    `health_status` is what `/health` answers; `models`, when given, is listed by `GET /v1/models` (a 404
    otherwise).
    """

    def __init__(
        self,
        server_info: dict[str, Any] | None = None,
        tokenize: Callable[[dict[str, Any]], tuple[int, Any]] | None = None,
        *,
        health_status: int = 200,
        models: list[str] | None = None,
        generate_status: int = 400,
    ) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str | None]] = []
        # What POST /inference/v1/generate answers: 400 (the route is there, the body is not a request; as
        # vLLM with --enable-scale-out answers the router's check), or 403/404 (the route is not there).
        self.generate_status = generate_status
        self.tokenize_bodies: list[dict[str, Any]] = []
        self.server_info = server_info
        self.tokenize = tokenize
        self.health_status = health_status
        self.models = models
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest's output clean
                pass

            def _record(self) -> None:
                owner.requests.append((self.command, self.path, self.headers.get("authorization")))

            def do_GET(self) -> None:
                self._record()
                if self.path == "/health":
                    self._json(owner.health_status, {"status": "ok"})
                elif self.path == "/v1/models" and owner.models is not None:
                    self._json(
                        200, {"object": "list", "data": [{"id": m, "object": "model"} for m in owner.models]}
                    )
                elif self.path == "/server_info" and owner.server_info is not None:
                    self._json(200, owner.server_info)
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                self._record()
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if self.path == "/tokenize" and owner.tokenize is not None:
                    owner.tokenize_bodies.append(body)
                    self._json(*owner.tokenize(body))
                    return
                if self.path == "/inference/v1/generate":
                    self._json(owner.generate_status, {"error": {"message": "token_ids: Field required"}})
                    return
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    self._json(404, {"error": {"message": "not found"}})
                    return
                owner.bodies.append(body)
                chat_route = self.path == "/v1/chat/completions"
                choice: dict[str, Any] = (
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "plain"},
                        "finish_reason": "stop",
                    }
                    if chat_route
                    else {"index": 0, "text": "plain", "finish_reason": "stop"}
                )
                self._json(
                    200,
                    {
                        "id": "plain-1",
                        "object": "chat.completion" if chat_route else "text_completion",
                        "model": body.get("model") or "plain",
                        "choices": [choice],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def plain_servers() -> Iterator[Callable[..., PlainOpenAIServer]]:
    """Start plain OpenAI servers; all are shut down at the end of the module."""
    started: list[PlainOpenAIServer] = []

    def start(
        server_info: dict[str, Any] | None = None,
        tokenize: Callable[[dict[str, Any]], tuple[int, Any]] | None = None,
        **options: Any,
    ) -> PlainOpenAIServer:
        server = PlainOpenAIServer(server_info, tokenize, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def words(seed: int, count: int) -> str:
    """`count` distinct-looking words from a seed: prompts that share no prefix across seeds."""
    vocabulary = sorted({w.lower() for w in re.findall(r"[A-Za-z]{3,}", fixtures.__doc__ or "")}) or ["token"]
    rng = random.Random(seed)
    return f"Conversation {seed}: " + " ".join(rng.choice(vocabulary) for _ in range(count))

"""Nothing long on the event loop, and only valid JSON echoed (issue 17, item 5), on real servers on loopback:
a renderer (`--allow-request-chat-template`), a worker with the render endpoints and a router in front of it,
all on SmolLM2 with a chat template that writes the tools into the prompt (the request builders and that
template are `benchmarks.health_latency`'s, which measures the same cases).

Each big request is the largest its limits allow (a million output ids to derender, the most stop-string
characters and the most tools a request may send; 100,000 tools, inside the body limit, are a 400). The request
is sent whole from a thread; then `/health` is polled until it answers, and the big request must still be
running at that moment: the loop answered while the work went on. Then the big request's own answer is checked.
No time is asserted (the figures are `python -m benchmarks.health_latency`'s, in docs/robustness.md).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from benchmarks.health_latency import TOOLS_TEMPLATE, most_stop_strings, tools

from tokenfront.protocol import MAX_STOP_CHARACTERS, MAX_TOOLS

pytestmark = pytest.mark.slow  # a worker on SmolLM2 and requests of seconds each

HEALTH_DEADLINE_S = 120.0
BIG_REQUEST_TIMEOUT_S = 900.0


@dataclass
class BigRequest:
    """A POST sent whole from a thread; `sent` is set once its body is written, `done` once it is answered."""

    url: str
    path: str
    body: bytes
    sent: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    status: int | None = None
    answer: bytes = b""
    error: BaseException | None = None

    def start(self) -> BigRequest:
        threading.Thread(target=self._run, daemon=True).start()
        assert self.sent.wait(BIG_REQUEST_TIMEOUT_S), "the big request was never sent"
        return self

    def _run(self) -> None:
        parts = urlsplit(self.url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=BIG_REQUEST_TIMEOUT_S)
        try:
            connection.request(
                "POST", self.path, body=self.body, headers={"Content-Type": "application/json"}
            )
            self.sent.set()
            response = connection.getresponse()
            self.status, self.answer = response.status, response.read()
        except BaseException as exc:  # reported by `result`
            self.error = exc
        finally:
            connection.close()
            self.sent.set()
            self.done.set()

    def result(self) -> tuple[int, Any]:
        assert self.done.wait(BIG_REQUEST_TIMEOUT_S), "the big request was not answered"
        assert self.error is None, self.error
        assert self.status is not None
        return self.status, json.loads(self.answer)


def _health_answers_while(url: str, path: str, body: bytes) -> tuple[int, Any]:
    """Send the big request; poll /health until it answers 200; the big request must not have finished by then
    (else the loop answered only after it). Returns the big request's status and parsed answer."""
    parts = urlsplit(url)
    big = BigRequest(url, path, body).start()
    deadline = time.monotonic() + HEALTH_DEADLINE_S
    polls = 0
    while True:
        assert time.monotonic() < deadline, "/health did not answer"
        finished_before = big.done.is_set()
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HEALTH_DEADLINE_S)
        try:
            connection.request("GET", "/health")
            status = connection.getresponse().status
        except (OSError, http.client.HTTPException):
            status = None
        finally:
            connection.close()
        polls += 1
        if status == 200:
            break
        big.done.wait(0.05)  # a connection refused or reset: try again shortly (never as "long enough")
    assert not finished_before, f"/health answered only after {path} had finished ({polls} polls)"
    return big.result()


def _servers_started(launch: Callable[..., Any], smollm2: Path, log_dir: Path) -> dict[str, Any]:
    template = log_dir / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    common = ["--model", str(smollm2), "--chat-template", str(template)]
    renderer = launch(["render", *common, "--allow-request-chat-template"], log_dir=log_dir)
    worker = launch(
        ["serve", *common, "--device", "cpu"],
        log_dir=log_dir,
        env={"TOKENFRONT_ENABLE_RENDER_ENDPOINTS": "1"},
    )
    router = launch(["route", *common, "--worker", worker.url], log_dir=log_dir)
    return {"renderer": renderer, "worker": worker, "router": router}


@pytest.fixture(scope="module")
def servers(
    launch: Callable[..., Any], checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    started = _servers_started(launch, checkpoint("smollm2"), tmp_path_factory.mktemp("event-loop"))
    yield started
    for server in reversed(list(started.values())):
        assert server.stop() == 0


def _post(url: str, path: str, body: bytes) -> tuple[int, Any]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=BIG_REQUEST_TIMEOUT_S)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())  # every answer parses
    finally:
        connection.close()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _derender_body(ids: list[int], stop: list[str] | None = None) -> bytes:
    body: dict[str, Any] = {
        "generate_responses": [{"choices": [{"index": 0, "finish_reason": "length", "token_ids": ids}]}]
    }
    if stop is not None:
        body["completion_request"] = {"prompt": "Hi", "stop": stop}
    return _dumps(body)


def _stops(room: int = 0) -> list[str]:
    stops = most_stop_strings(room)
    assert sum(map(len, stops)) == MAX_STOP_CHARACTERS - room and len(set(stops)) == len(stops)
    return stops


def _output_ids(count: int) -> list[int]:
    # Ids of ordinary word pieces (SmolLM2's vocabulary), none a special token.
    return [1000 + i % 20000 for i in range(count)]


SERVER_NAMES = ("renderer", "worker", "router")


@pytest.mark.parametrize("server", SERVER_NAMES)
def test_health_answers_while_a_million_ids_are_derendered(servers: dict[str, Any], server: str) -> None:
    status, answer = _health_answers_while(
        servers[server].url, "/v1/completions/derender", _derender_body(_output_ids(1_000_000))
    )
    assert status == 200, answer
    (choice,) = answer["choices"]
    assert answer["usage"]["completion_tokens"] == 1_000_000
    assert choice["finish_reason"] == "length" and len(choice["text"]) > 1_000_000


@pytest.mark.parametrize("server", SERVER_NAMES)
def test_health_answers_while_the_most_stop_strings_are_matched(servers: dict[str, Any], server: str) -> None:
    url = servers[server].url
    ids = _output_ids(2_000)
    stops = _stops()
    status, answer = _health_answers_while(url, "/v1/completions/derender", _derender_body(ids, stops))
    assert status == 200, answer
    plain_status, plain = _post(url, "/v1/completions/derender", _derender_body(ids))
    assert plain_status == 200
    (choice,), (plain_choice,) = answer["choices"], plain["choices"]
    assert choice["text"] == plain_choice["text"] and choice["stop_reason"] is None  # none of them occurs
    # One stop string more and the request is refused before anything is read.
    status, refused = _post(url, "/v1/completions/derender", _derender_body(ids, [*stops, "!"]))
    assert status == 400 and refused["error"]["param"] == "completion_request.stop", refused


def test_a_stop_string_among_the_most_cuts_the_derendered_text(servers: dict[str, Any]) -> None:
    url = servers["renderer"].url
    ids = _output_ids(2_000)
    status, plain = _post(url, "/v1/completions/derender", _derender_body(ids))
    assert status == 200, plain
    text = plain["choices"][0]["text"]
    cut = text[5_000:5_012]  # a piece of the output, listed last among the most stop strings
    stops = [*_stops(room=len(cut)), cut]
    status, answer = _post(url, "/v1/completions/derender", _derender_body(ids, stops))
    assert status == 200, answer
    (choice,) = answer["choices"]
    assert choice["stop_reason"] == cut and choice["text"] == text[: text.index(cut)]


@pytest.mark.parametrize("path", ["/v1/completions", "/inference/v1/generate"])
def test_health_answers_while_the_worker_generates_with_the_most_stop_strings(
    servers: dict[str, Any], path: str
) -> None:
    stops = _stops()
    if path == "/v1/completions":
        body = {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "stop": stops}
    else:
        body = {
            "token_ids": [1, 9690, 198],
            "sampling_params": {"max_tokens": 32, "temperature": 0, "stop": stops},
        }
    status, answer = _health_answers_while(servers["worker"].url, path, _dumps(body))
    assert status == 200, answer
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "length" and choice.get("stop_reason") is None  # none of them occurs
    assert answer["usage"]["completion_tokens"] == 32


@pytest.mark.parametrize("server", SERVER_NAMES)
def test_health_answers_while_the_most_tools_are_validated_and_rendered(
    servers: dict[str, Any], server: str
) -> None:
    url = servers[server].url
    hi = [{"role": "user", "content": "Hi"}]
    status, answer = _health_answers_while(
        url, "/v1/chat/completions/render", _dumps({"messages": hi, "tools": tools(MAX_TOOLS)})
    )
    assert status == 200, answer
    assert answer["request"]["tools"][MAX_TOOLS - 1]["function"]["name"] == f"tool_{MAX_TOOLS - 1}"
    assert len(answer["token_ids"]) > MAX_TOOLS * 10  # every tool is in the prompt
    # 100,000 tools fit in the body limit; they are refused before any of them is validated.
    body = _dumps({"messages": hi, "tools": tools(100_000)})
    assert len(body) < 16 * 1024 * 1024
    status, refused = _post(url, "/v1/chat/completions/render", body)
    assert status == 400 and refused["error"]["param"] == "tools", refused
    assert (
        f"100000 tools are more than this server accepts in one request ({MAX_TOOLS})"
        in refused["error"]["message"]
    )


def test_checkpoint_renders_go_before_queued_request_templates(servers: dict[str, Any]) -> None:
    url = servers["renderer"].url
    # Inside the template step bound, about a second or more each on this machine.
    slow_template = (
        "{%- for i in range(1500) %}{%- for j in range(2000) %}{%- endfor %}{%- endfor %}"
        "{%- for message in messages %}{{ message['content'] }}{%- endfor %}"
    )
    slow_body = _dumps({"messages": [{"role": "user", "content": "slow"}], "chat_template": slow_template})
    slow = [BigRequest(url, "/v1/chat/completions/render", slow_body).start() for _ in range(6)]
    normal = _dumps({"messages": [{"role": "user", "content": "Hi"}]})
    status, answer = _post(url, "/v1/chat/completions/render", normal)
    still_running = sum(not request.done.is_set() for request in slow)
    assert status == 200 and answer["token_ids"], answer
    # It waited for the client template being rendered, not for the ones queued behind it.
    assert still_running >= 4, still_running
    answers = [request.result() for request in slow]
    assert [status for status, _ in answers] == [200] * 6
    assert len({tuple(answer["token_ids"]) for _, answer in answers}) == 1  # the same prompt, six times


_BODY = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
_ENCODINGS = {
    "utf-8 with a BOM": ("\ufeff" + json.dumps(_BODY)).encode("utf-8"),
    "utf-16": json.dumps(_BODY).encode("utf-16"),  # with its BOM
    "utf-16-le": json.dumps(_BODY).encode("utf-16-le"),
    "utf-16-be": json.dumps(_BODY).encode("utf-16-be"),
    "utf-32": json.dumps(_BODY).encode("utf-32"),
}


@pytest.mark.parametrize("server", SERVER_NAMES)
def test_a_body_not_in_utf8_is_a_400_that_parses(servers: dict[str, Any], server: str) -> None:
    url = servers[server].url
    paths = (
        ["/v1/chat/completions/render", "/v1/chat/completions"]
        if server != "renderer"
        else ["/v1/chat/completions/render"]
    )
    answered = 0
    for path in paths:
        for name, body in _ENCODINGS.items():
            status, answer = _post(url, path, body)  # parses, or json.loads raises
            assert status == 400, (path, name, answer)
            message = answer["error"]["message"]
            assert ("UTF-8 with a byte order mark" if "BOM" in name else name[:6].upper()) in message, message
            answered += 1
        status, answer = _post(url, path, _dumps({**_BODY, "max_tokens": 1}))
        assert status == 200, answer
    assert answered == 5 * len(paths)

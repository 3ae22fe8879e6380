"""Graceful shutdown (issue 10, item 4): SIGTERM stops accepting, in-flight requests get `--shutdown-timeout`
seconds, and what must still be cut ends in the API's own shape — a 503 OpenAI error for a request not yet
answered, an error event and `data: [DONE]` for a stream (through the router too) — and the process exits 0.

Real `tokenfront serve` / `tokenfront route` processes on the tiny random checkpoint (fast to load; its
generations are long enough to be in flight at SIGTERM), plus the drain itself on a bare ASGI app.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenfront.server.shutdown import SHUTTING_DOWN_CODE, Drain

# tokens: on SmolLM2 about 80 s at ~25 tokens/s on this quiet 2-core machine, so still generating when a
# shutdown timeout of 1-2 s is over (tiny-random makes 2000 tokens in about 4 s: too close to the timeout).
LONG = 2000
SHORT = 64  # tokens: seconds, well within a generous shutdown timeout


@pytest.fixture(scope="module")
def tiny_random() -> Path:
    from tokenfront import fixtures

    return fixtures.ensure_checkpoint("tiny-random")


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from tokenfront import fixtures

    return fixtures.ensure_checkpoint("smollm2")


@pytest.fixture
def servers(launch: Callable[..., Any], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start `tokenfront ARGS...` with the root conftest's launcher; whatever still runs is stopped after."""
    started: list[Any] = []

    def start(*args: str) -> Any:
        server = launch(list(args), log_dir=tmp_path, timeout=240.0)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def chat_body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        **extra,
    }


class InFlight:
    """A non-streaming and a streaming chat request running in threads against `url`."""

    def __init__(self, url: str, max_tokens: int) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.response: httpx.Response | None = None
        self.events: list[Any] = []  # the stream's `data:` payloads (JSON, or "[DONE]")
        self.first_chunk = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._plain), threading.Thread(target=self._stream)]
        for thread in self.threads:
            thread.start()

    def _plain(self) -> None:
        try:
            self.response = httpx.post(
                f"{self.url}/v1/chat/completions", json=chat_body(self.max_tokens), timeout=300
            )
        except BaseException as exc:
            self.errors.append(exc)

    def _stream(self) -> None:
        try:
            body = chat_body(self.max_tokens, stream=True)
            with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=300) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if not line:
                        continue
                    assert line.startswith("data: "), line
                    data = line.removeprefix("data: ")
                    self.events.append(data if data == "[DONE]" else json.loads(data))
                    if any(event.get("choices") for event in self.events if isinstance(event, dict)):
                        self.first_chunk.set()
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.first_chunk.set()

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout)
            assert not thread.is_alive(), "a request did not end"
        assert not self.errors, self.errors


def engine_running(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("tokenfront_engine_running "):
            return float(line.split()[1])
    return 0.0


def wait_until(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def terminate(server: Any, timeout: float = 120.0) -> int:
    server.process.send_signal(signal.SIGTERM)
    return int(server.process.wait(timeout=timeout))


def assert_cut_stream(events: list[Any]) -> None:
    """Some chunks, then one error event saying the server shut down, then [DONE] last."""
    assert events[-1] == "[DONE]", events[-3:]
    error = events[-2]
    assert isinstance(error, dict) and set(error) == {"error"}, events[-3:]
    assert error["error"]["code"] == SHUTTING_DOWN_CODE and "shutting down" in error["error"]["message"]
    assert any(isinstance(e, dict) and e.get("choices") for e in events[:-2]), events[:3]


# -- a worker ------------------------------------------------------------------------------------------------


def test_worker_cuts_requests_in_flight_at_the_shutdown_timeout(
    servers: Callable[..., Any], smollm2: Path
) -> None:
    worker = servers("serve", "--model", str(smollm2), "--shutdown-timeout", "2")
    flight = InFlight(worker.url, LONG)
    wait_until(lambda: engine_running(worker.url) == 2)  # both requests generate
    assert flight.first_chunk.wait(120)
    started = time.monotonic()
    assert terminate(worker) == 0
    flight.join(60)
    assert time.monotonic() - started < 60
    # The non-streaming request: a JSON error in OpenAI's shape, not a plain-text 500.
    assert flight.response is not None
    assert flight.response.status_code == 503, flight.response.text
    assert flight.response.headers["content-type"].startswith("application/json")
    error = flight.response.json()["error"]
    assert error["code"] == SHUTTING_DOWN_CODE and error["type"] == "service_unavailable"
    assert "shutdown timeout (2 s)" in error["message"]
    # The stream: an error event, then [DONE].
    assert_cut_stream(flight.events)
    log = worker.log()
    assert "aborted 2 engine sequence(s)" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert "client disconnected" not in log, log[-3000:]


def test_worker_lets_requests_in_flight_finish_within_the_shutdown_timeout(
    servers: Callable[..., Any], tiny_random: Path
) -> None:
    worker = servers("serve", "--model", str(tiny_random), "--shutdown-timeout", "300")
    flight = InFlight(worker.url, SHORT)
    wait_until(lambda: engine_running(worker.url) == 2)  # both requests generate
    assert terminate(worker, timeout=300) == 0
    flight.join(60)
    assert flight.response is not None and flight.response.status_code == 200, flight.response
    answer = flight.response.json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == SHORT
    assert flight.events[-1] == "[DONE]"
    assert not any(isinstance(e, dict) and "error" in e for e in flight.events), flight.events[-3:]
    finals = [c["finish_reason"] for e in flight.events if isinstance(e, dict) for c in e.get("choices", ())]
    assert finals[-1] == "length", flight.events[-3:]
    assert "cutting" not in worker.log()


# -- through a router ----------------------------------------------------------------------------------------


def test_router_cuts_a_relayed_stream_with_an_error_event_and_done(
    servers: Callable[..., Any], smollm2: Path
) -> None:
    worker = servers("serve", "--model", str(smollm2))
    router = servers("route", "--model", str(smollm2), "--worker", worker.url, "--shutdown-timeout", "1")
    flight = InFlight(router.url, LONG)  # the router checked its worker before it said ready
    wait_until(lambda: engine_running(worker.url) == 2)
    assert flight.first_chunk.wait(120)
    assert terminate(router) == 0
    flight.join(60)
    assert flight.response is not None and flight.response.status_code == 503, flight.response
    assert flight.response.json()["error"]["code"] == SHUTTING_DOWN_CODE
    assert_cut_stream(flight.events)
    assert "Traceback" not in router.log(), router.log()[-3000:]
    # The worker stops generating for the router's closed requests and goes on serving.
    wait_until(lambda: engine_running(worker.url) == 0, timeout=60)
    assert httpx.get(f"{worker.url}/health", timeout=10).status_code == 200


# -- the drain on a bare ASGI app ----------------------------------------------------------------------------


class _Recorder:
    """An ASGI server's side of one request: the messages sent, and a client that never leaves."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def status(self) -> int:
        return int(next(m["status"] for m in self.messages if m["type"] == "http.response.start"))

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


def test_drain_refuses_new_requests_while_shutting_down() -> None:
    async def scenario() -> _Recorder:
        drain = Drain()
        drain.begin(30)
        recorder = _Recorder()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError("a request that arrives while draining never reaches the app")

        await drain.serve(app, SCOPE, recorder.receive, recorder.send)
        return recorder

    recorder = asyncio.run(scenario())
    assert recorder.status() == 503
    assert json.loads(recorder.body())["error"]["code"] == SHUTTING_DOWN_CODE


def test_drain_cuts_a_stream_mid_event_and_a_stuck_handler() -> None:
    async def scenario() -> tuple[_Recorder, _Recorder, list[str]]:
        drain = Drain()
        hooks: list[str] = []
        drain.on_deadline(lambda: hooks.append("deadline"))

        async def streaming(scope: Any, receive: Any, send: Any) -> None:
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            part = b'data: {"choices": []}\n\ndata: {"par'  # the relay's last piece ends mid-event
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.Event().wait()  # stuck: only a cancellation ends it

        async def plain(scope: Any, receive: Any, send: Any) -> None:
            await asyncio.Event().wait()

        stream, answer = _Recorder(), _Recorder()
        tasks = [
            asyncio.create_task(drain.serve(streaming, SCOPE, stream.receive, stream.send)),
            asyncio.create_task(drain.serve(plain, SCOPE, answer.receive, answer.send)),
        ]

        async def both_waiting() -> None:
            while drain.in_flight < 2 or len(stream.messages) < 2:
                await asyncio.sleep(0.001)

        await asyncio.wait_for(both_waiting(), 5)  # both in flight, the stream's first part sent
        assert drain.in_flight == 2
        drain.begin(0.1)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        assert drain.in_flight == 0
        return stream, answer, hooks

    stream, answer, hooks = asyncio.run(scenario())
    assert hooks == ["deadline"]
    body = stream.body().decode()
    assert body.endswith("data: [DONE]\n\n"), body
    events = [chunk for chunk in body.split("\n\n") if chunk]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == SHUTTING_DOWN_CODE
    assert stream.messages[-1]["more_body"] is False
    assert answer.status() == 503
    assert json.loads(answer.body())["error"]["type"] == "service_unavailable"

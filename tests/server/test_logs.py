"""Logs (server/logs.py, server/request_ids.py, server/middleware.RequestIdLayer): JSON lines, the request id of
each request (the client's X-Request-Id or a new one, in the answer's header and in the request's log lines),
the access line, the router's gate warning as fields, and no prompt text in any of it."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from tokenfront import fixtures
from tokenfront.router.gate import NO_TOKENIZER, ForwardingGate
from tokenfront.router.worker_report import WorkerReport
from tokenfront.server.logs import JsonFormatter, TextFormatter
from tokenfront.server.middleware import RequestIdLayer
from tokenfront.server.request_ids import (
    MAX_REQUEST_ID_LENGTH,
    accepted_request_id,
    current_request_id,
    reset_request_id,
    set_request_id,
)

NEW_ID = re.compile(r"[0-9a-f]{32}")
# A prompt word no log line may contain (prompts are the users' data).
MARKER = "zebra-quartz-4711-secret"
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
UVICORN_TEXT_LINE = re.compile(r"(INFO|WARNING|ERROR):\s+\S")


# --- request ids ---------------------------------------------------------------------------------------------


def test_a_client_request_id_is_kept_when_usable_else_replaced() -> None:
    kept = [
        b"abc-123",
        b"0f8fad5b-d9cb-469f-a165-70867728950e",
        b"x",
        b"a" * MAX_REQUEST_ID_LENGTH,
        b"a/b:c=d",
    ]
    replaced = [
        None,
        b"",
        b"a" * (MAX_REQUEST_ID_LENGTH + 1),
        b"two words",
        b"tab\there",
        b"new\nline",
        "caf\u00e9".encode(),
        b"nul\x00",
    ]
    assert [accepted_request_id(sent) for sent in kept] == [sent.decode() for sent in kept]
    fresh = [accepted_request_id(sent) for sent in replaced]
    assert all(NEW_ID.fullmatch(value) for value in fresh), fresh
    assert len(set(fresh)) == len(replaced) == 8


def test_the_current_request_id_is_set_and_reset() -> None:
    assert current_request_id() is None
    token = set_request_id("r-1")
    assert current_request_id() == "r-1"
    reset_request_id(token)
    assert current_request_id() is None


# --- formatters ----------------------------------------------------------------------------------------------


def _logged(formatter: logging.Formatter, emit: Callable[[logging.Logger], None]) -> list[str]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("tokenfront.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue().splitlines()


def test_json_lines_carry_level_logger_message_request_id_and_fields() -> None:
    def emit(logger: logging.Logger) -> None:
        logger.info("plain %s", "line")
        token = set_request_id("req-9")
        try:
            logger.warning("two\nlines", extra={"worker": "http://w", "reasons": ["a", "b"], "n": 3})
            try:
                raise ValueError("boom")
            except ValueError:
                logger.exception("failed")
        finally:
            reset_request_id(token)

    lines = _logged(JsonFormatter(), emit)
    assert len(lines) == 3  # a newline in a message or a traceback stays inside its line
    plain, warning, failure = (json.loads(line) for line in lines)
    assert plain == {
        "time": plain["time"],
        "level": "info",
        "logger": "tokenfront.test_logs",
        "message": "plain line",
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", plain["time"])
    assert warning == {
        "time": warning["time"],
        "level": "warning",
        "logger": "tokenfront.test_logs",
        "message": "two\nlines",
        "request_id": "req-9",
        "worker": "http://w",
        "reasons": ["a", "b"],
        "n": 3,
    }
    assert failure["level"] == "error" and failure["request_id"] == "req-9"
    assert failure["exception"].startswith("Traceback") and "ValueError: boom" in failure["exception"]


def test_text_lines_keep_their_format_and_end_with_the_request_id_during_a_request() -> None:
    def emit(logger: logging.Logger) -> None:
        logger.info("outside")
        token = set_request_id("req-7")
        try:
            logger.warning("inside")
        finally:
            reset_request_id(token)

    outside, inside = _logged(TextFormatter(), emit)
    assert TEXT_LINE.match(outside) and outside.endswith(" INFO tokenfront.test_logs: outside")
    assert TEXT_LINE.match(inside) and inside.endswith(
        " WARNING tokenfront.test_logs: inside request_id=req-7"
    )


# --- the request-id layer, in process ------------------------------------------------------------------------


async def _streaming(scope: Scope, receive: Receive, send: Send) -> None:
    assert current_request_id() is not None  # the app answers with the id set
    logging.getLogger("tokenfront.test_logs").warning("while streaming")
    headers = [(b"content-type", b"text/event-stream"), (b"x-request-id", b"from-the-worker")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for chunk in (b"data: 1\n\n", b"data: [DONE]\n\n"):
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _failing(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("before any answer")


def _call(app: Any, headers: list[tuple[bytes, bytes]]) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"secret=1",
        "headers": headers,
        "client": ("127.0.0.1", 5555),
    }

    async def answer() -> None:
        try:
            await app(scope, receive, send)
        finally:
            # The layer resets the id in the task it ran in, once the request is answered.
            assert current_request_id() is None

    asyncio.run(answer())
    return sent


def test_the_layer_returns_the_id_on_a_stream_and_logs_one_access_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    layer = RequestIdLayer(_streaming, access_log=True)
    sent = _call(layer, [(b"x-request-id", b"client-1")])
    start = sent[0]
    # One X-Request-Id, the layer's: the one the app relayed (a worker's) is replaced.
    assert [v for n, v in start["headers"] if n == b"x-request-id"] == [b"client-1"]
    assert (b"content-type", b"text/event-stream") in start["headers"]
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", b"data: [DONE]\n\n", b""]
    records = [(r.name, r) for r in caplog.records]
    assert [name for name, _ in records] == ["tokenfront.test_logs", "tokenfront.access"]
    access = records[1][1]
    fields = {k: getattr(access, k) for k in ("client", "method", "path", "status")}
    assert fields == {
        "client": "127.0.0.1:5555",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
    }
    assert access.duration_ms >= 0  # type: ignore[attr-defined]
    assert "secret" not in access.getMessage()  # no query string


def test_the_layer_logs_a_failed_request_as_500_with_its_new_id(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    seen: list[str | None] = []
    formatter = JsonFormatter()

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(json.loads(formatter.format(record)).get("request_id"))

    keep = Keep()
    logging.getLogger("tokenfront.access").addHandler(keep)
    try:
        with pytest.raises(RuntimeError):
            _call(RequestIdLayer(_failing, access_log=True), [(b"x-request-id", b"bad id with spaces")])
    finally:
        logging.getLogger("tokenfront.access").removeHandler(keep)
    (access,) = [r for r in caplog.records if r.name == "tokenfront.access"]
    assert access.status == 500  # type: ignore[attr-defined]
    assert len(seen) == 1 and seen[0] is not None and NEW_ID.fullmatch(seen[0])


def test_without_access_log_the_layer_writes_no_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sent = _call(RequestIdLayer(_streaming), [])
    (value,) = [v for n, v in sent[0]["headers"] if n == b"x-request-id"]
    assert NEW_ID.fullmatch(value.decode())
    assert [r.name for r in caplog.records if r.name.startswith("tokenfront")] == ["tokenfront.test_logs"]


# --- the router's gate warning -------------------------------------------------------------------------------


def test_the_gate_warning_carries_the_blocking_workers_and_reasons(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tokenfront.router.gate")
    gate = ForwardingGate(None, has_model_path=False)
    gate.evaluate({"http://b": WorkerReport(None, missing="/server_info answered 404"), "http://a": None})
    (record,) = caplog.records
    assert record.levelname == "WARNING" and record.getMessage().startswith("not forwarding token ids")
    line = json.loads(JsonFormatter().format(record))
    assert line["forwarding"] is False
    assert line["router_reasons"] == [NO_TOKENIZER]
    assert line["blocking"] == [
        {"worker": "http://a", "reasons": ["no fingerprint (not checked yet)"]},
        {"worker": "http://b", "reasons": ["no fingerprint (/server_info answered 404)"]},
    ]


# --- real processes ------------------------------------------------------------------------------------------


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of a process's output as JSON, each with level, logger and message."""
    lines = text.splitlines()
    assert lines, "the process wrote nothing"
    parsed = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
        assert {"time", "level", "logger", "message"} <= item.keys(), line
        parsed.append(item)
    return parsed


def _access(lines: list[dict[str, Any]], request_id: str) -> dict[str, Any]:
    (line,) = [
        item
        for item in lines
        if item["logger"] == "tokenfront.access" and item.get("request_id") == request_id
    ]
    return line


@pytest.mark.slow
def test_renderer_json_logs_every_line_and_each_request_by_its_id(
    launch: Callable[..., Any], qwen3: Path, tmp_path: Path
) -> None:
    # --workers 2: the pre-fork children's lines (uvicorn's included) are JSON too.
    args = ["render", "--model", str(qwen3), "--log-format", "json", "--access-log", "--workers", "2"]
    server = launch(args, log_dir=tmp_path)
    turn = {"role": "user", "content": f"Tell me about {MARKER}."}
    sent: list[tuple[str | None, str, str, int]] = [  # (X-Request-Id sent, method, path, status expected)
        ("client-id-1", "POST", "/v1/chat/completions/render", 200),
        (None, "POST", "/v1/chat/completions/render", 200),
        ("client-id-400", "POST", "/v1/chat/completions/render", 400),
        ("client-id-404", "GET", "/no/such/route", 404),
        ("x" * (MAX_REQUEST_ID_LENGTH + 1), "POST", "/v1/chat/completions/render", 200),
    ]
    bodies = [
        {"messages": [turn]},
        {"messages": [turn]},
        {"messages": [{**turn, "role": "nobody"}]},
        None,
        {"messages": [turn]},
    ]
    answered: list[str] = []
    try:
        with httpx.Client(base_url=server.url, timeout=60.0) as client:
            for (request_id, method, path, status), body in zip(sent, bodies, strict=True):
                headers = {"x-request-id": request_id} if request_id is not None else {}
                response = client.request(method, path, json=body, headers=headers)
                assert response.status_code == status, response.text
                answered.append(response.headers["x-request-id"])
    finally:
        code = server.stop()
    output = server.log()
    assert code == 0, output[-3000:]
    lines = _json_lines(output)
    # The client's id is returned as it was sent; none, or an unusable one, gets a new one.
    assert answered[0] == "client-id-1" and answered[2:4] == ["client-id-400", "client-id-404"]
    assert NEW_ID.fullmatch(answered[1]) and NEW_ID.fullmatch(answered[4])
    assert len(set(answered)) == 5
    for request_id, (_, method, path, status) in zip(answered, sent, strict=True):
        access = _access(lines, request_id)
        assert (access["method"], access["path"], access["status"]) == (method, path, status)
        assert access["level"] == "info" and access["duration_ms"] >= 0
    assert sent[4][0] not in output  # an unusable id is not logged
    assert MARKER not in output  # no prompt text
    loggers = {item["logger"] for item in lines}
    assert {"tokenfront", "tokenfront.server.process", "uvicorn.error", "tokenfront.access"} <= loggers
    assert sum(item["message"].startswith("Started server process") for item in lines) == 2


class _HeaderRecorder:
    """A plain OpenAI-shaped worker on loopback (a thread of the test): no /server_info, so it blocks the
    router's forwarding; it records the X-Request-Id of every chat request it gets."""

    def __init__(self) -> None:
        self.request_ids: list[str | None] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._json(200, {"status": "ok"})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                owner.request_ids.append(self.headers.get("x-request-id"))
                message = {"role": "assistant", "content": "plain"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                self._json(
                    200, {"id": "plain-1", "object": "chat.completion", "model": "m", "choices": [choice]}
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
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def plain_worker() -> Iterator[_HeaderRecorder]:
    worker = _HeaderRecorder()
    yield worker
    worker.close()


def _wait_for_line(server: Any, prefix: str, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and prefix not in server.log():
        time.sleep(0.1)
    assert prefix in server.log(), server.log()[-3000:]


@pytest.mark.slow
def test_router_json_gate_warning_has_fields_and_the_request_id_reaches_the_worker(
    launch: Callable[..., Any], qwen3: Path, tmp_path: Path, plain_worker: _HeaderRecorder
) -> None:
    args = ["route", "--model", str(qwen3), "--worker", plain_worker.url, "--health-interval", "0.5"]
    router = launch([*args, "--log-format", "json", "--access-log"], log_dir=tmp_path)
    chat = {"messages": [{"role": "user", "content": f"Say {MARKER}."}], "max_tokens": 2}
    try:
        _wait_for_line(router, "not forwarding token ids")
        with httpx.Client(base_url=router.url, timeout=60.0) as client:
            with_id = client.post("/v1/chat/completions", json=chat, headers={"X-Request-Id": "fleet-7"})
            without = client.post("/v1/chat/completions", json=chat)
    finally:
        code = router.stop()
    output = router.log()
    assert code == 0, output[-3000:]
    assert with_id.status_code == 200 and without.status_code == 200
    generated = without.headers["x-request-id"]
    assert with_id.headers["x-request-id"] == "fleet-7" and NEW_ID.fullmatch(generated)
    # The worker got the same ids: one id across the router's and the worker's logs.
    assert plain_worker.request_ids == ["fleet-7", generated]
    lines = _json_lines(output)
    (warning,) = [item for item in lines if item["message"].startswith("not forwarding token ids")]
    assert warning["level"] == "warning" and warning["logger"] == "tokenfront.router.gate"
    assert warning["forwarding"] is False and warning["router_reasons"] == []
    assert warning["blocking"] == [
        {"worker": plain_worker.url, "reasons": ["no fingerprint (/server_info answered 404)"]}
    ]
    for request_id in ("fleet-7", generated):
        access = _access(lines, request_id)
        assert (access["path"], access["status"]) == ("/v1/chat/completions", 200)
    assert MARKER not in output


@pytest.mark.slow
def test_text_mode_lines_keep_their_format_and_answers_carry_the_id(qwen3_renderer: Any) -> None:
    response = httpx.post(
        f"{qwen3_renderer.url}/v1/chat/completions/render",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers={"x-request-id": "text-mode-1"},
        timeout=60.0,
    )
    assert response.status_code == 200 and response.headers["x-request-id"] == "text-mode-1"
    lines = qwen3_renderer.log().splitlines()
    assert len(lines) >= 4
    odd = [line for line in lines if not (TEXT_LINE.match(line) or UVICORN_TEXT_LINE.match(line))]
    assert odd == []


@pytest.mark.slow
def test_other_commands_log_json_too() -> None:
    command = [sys.executable, "-m", "tokenfront.cli"]
    listed = subprocess.run(
        [*command, "fixtures", "--list", "--only", "qwen3", "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("qwen3\t")  # the listing is the command's output, on stdout
    assert listed.stderr == ""  # it logs nothing
    failed = subprocess.run(
        [*command, "render", "--model", "/no/such/folder", "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 2 and failed.stdout == ""
    (line,) = _json_lines(failed.stderr)
    assert line["level"] == "error" and line["logger"] == "tokenfront"
    assert "/no/such/folder" in line["message"]
    # A command line argparse refuses is JSON too, in both spellings of the flag.
    for spelling in (["--log-format", "json"], ["--log-format=json"]):
        refused = subprocess.run(
            [*command, "render", "--port", "99999", *spelling], capture_output=True, text=True, timeout=120
        )
        assert refused.returncode == 2 and refused.stdout == ""
        (line,) = _json_lines(refused.stderr)
        assert line["level"] == "error" and "--port: 99999 is not a TCP port" in line["message"], line


@pytest.mark.slow
def test_worker_json_logs_a_stream_by_its_id(launch: Callable[..., Any], tmp_path: Path) -> None:
    """The worker loads weights with transformers (whose progress bar is no log line) and streams."""
    model = fixtures.ensure_checkpoint("tiny-random")
    worker = launch(
        ["serve", "--model", str(model), "--log-format", "json", "--access-log"], log_dir=tmp_path
    )
    chat = {"messages": [{"role": "user", "content": MARKER}], "max_tokens": 3, "stream": True}
    try:
        with (
            httpx.Client(base_url=worker.url, timeout=120.0) as client,
            client.stream(
                "POST", "/v1/chat/completions", json=chat, headers={"x-request-id": "stream-1"}
            ) as stream,
        ):
            assert stream.status_code == 200 and stream.headers["x-request-id"] == "stream-1"
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    finally:
        code = worker.stop()
    output = worker.log()
    assert code == 0, output[-3000:]
    assert events[-1] == "data: [DONE]" and len(events) >= 2
    lines = _json_lines(output)
    access = _access(lines, "stream-1")
    assert (access["path"], access["status"]) == ("/v1/chat/completions", 200)
    assert MARKER not in output

"""The direct lane (server/direct.py): what it answers is byte for byte what the usual path answers.

Two real renderers on the Qwen3 fixture, one with the lane (the default) and one without (`--access-log` turns it
off); the same raw HTTP/1.1 requests to both, the answers compared whole (status line, headers, body), with
only the `Date` header and the answer's own random `chatcmpl-`/`cmpl-` id masked. `tokenfront_direct_answers_total`
says which answers the lane gave: the common requests, never the errors or a request's own template.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

KEY = "direct-lane-key"
CHAT = "/v1/chat/completions/render"
COMPLETION = "/v1/completions/render"
_DEADLINE = 30.0


@pytest.fixture(scope="module")
def renderers(
    qwen3: Path, tmp_path_factory: pytest.TempPathFactory, launch: Callable[..., Any]
) -> Iterator[tuple[Any, Any]]:
    log_dir = tmp_path_factory.mktemp("direct-lane")
    base = ["render", "--model", str(qwen3), "--api-key", KEY, "--tool-call-parser", "hermes"]
    lane = launch(base, log_dir=log_dir)
    usual = launch([*base, "--access-log"], log_dir=log_dir)
    yield lane, usual
    lane.stop()
    usual.stop()


def _request(path: str, body: bytes, *, headers: bytes = b"", auth: str = KEY) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {auth}\r\nX-Request-Id: lane-test-1\r\nContent-Length: {len(body)}\r\n".encode()
        + headers
        + b"\r\n"
        + body
    )


def _read_answers(sock: socket.socket, count: int) -> list[bytes]:
    """`count` whole answers (each with a Content-Length) from the socket, in order."""
    sock.settimeout(_DEADLINE)
    buffer, answers = b"", []
    while len(answers) < count:
        head_end = buffer.find(b"\r\n\r\n")
        if head_end >= 0:
            length = int(re.search(rb"content-length: (\d+)\r\n", buffer[:head_end]).group(1))  # type: ignore[union-attr]
            end = head_end + 4 + length
            if len(buffer) >= end:
                answers.append(buffer[:end])
                buffer = buffer[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {len(answers)} of {count} answers"
        buffer += chunk
    return answers


def _exchange(url: str, *pieces: bytes, answers: int = 1) -> list[bytes]:
    """Send `pieces` one write each on one connection; the answers, masked (Date, the random answer id)."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as sock:
        for piece in pieces:
            sock.sendall(piece)
        return [_masked(answer) for answer in _read_answers(sock, answers)]


def _masked(answer: bytes) -> bytes:
    answer = re.sub(rb"date: [^\r]*", b"date: -", answer)
    return re.sub(rb'"(chatcmpl|cmpl)-[0-9a-f-]+"', b'"ID"', answer)


def _direct_answers(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return {
        route: float(value)
        for route, value in re.findall(
            r'^tokenfront_direct_answers_total\{route="([^"]+)"\} (\S+)$', text, re.M
        )
    }


CHAT_BODY = b'{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}]}'
TOOLS_BODY = (
    b'{"model":"qwen3","messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function",'
    b'"function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}'
)
# (name, path, body, extra head lines, key, answered by the lane)
CASES = [
    ("chat", CHAT, CHAT_BODY, b"", KEY, True),
    ("chat with tools", CHAT, TOOLS_BODY, b"", KEY, True),
    ("completion", COMPLETION, b'{"prompt":"Once upon a time"}', b"", KEY, True),
    ("completion of two prompts", COMPLETION, b'{"prompt":["one","two"]}', b"", KEY, True),
    ("chat, connection: close", CHAT, CHAT_BODY, b"Connection: close\r\n", KEY, True),
    ("unknown model", CHAT, b'{"model":"nope","messages":[{"role":"user","content":"hi"}]}', b"", KEY, False),
    ("no messages", CHAT, b'{"messages":[]}', b"", KEY, False),
    ("not JSON", CHAT, b'{"messages":[', b"", KEY, False),
    ("a JSON array", CHAT, b"[1,2]", b"", KEY, False),
    ("NaN", CHAT, b'{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}', b"", KEY, False),
    ("wrong key", CHAT, CHAT_BODY, b"", "not-the-key", False),
    ("form content type", CHAT, CHAT_BODY, b"Content-Type: text/plain\r\n", KEY, False),
    (
        "own template",
        CHAT,
        b'{"messages":[{"role":"user","content":"hi"}],"chat_template":"{{ messages[0].content }}"}',
        b"",
        KEY,
        False,
    ),
]


def test_the_lane_answers_what_the_usual_path_answers(renderers: tuple[Any, Any]) -> None:
    lane, usual = renderers
    before = _direct_answers(lane.url)
    compared = direct = 0
    for name, path, body, extra, key, taken in CASES:
        if extra.startswith(b"Content-Type"):
            request = _request(path, body, auth=key).replace(b"Content-Type: application/json\r\n", extra)
        else:
            request = _request(path, body, headers=extra, auth=key)
        counted = sum(_direct_answers(lane.url).values())
        (got,) = _exchange(lane.url, request)
        (expected,) = _exchange(usual.url, request)
        assert got == expected, name
        assert b"\r\nx-request-id: lane-test-1\r\n" in got, name
        compared += 1
        now = sum(_direct_answers(lane.url).values())
        assert now == counted + taken, name  # answered on the lane exactly when expected
        direct += taken
    assert compared == len(CASES) == 13
    assert direct == 5
    after = _direct_answers(lane.url)
    assert after[CHAT] - before.get(CHAT, 0) == 3 and after[COMPLETION] - before.get(COMPLETION, 0) == 2
    assert _direct_answers(usual.url) == {}  # with --access-log, every request took the usual path


def test_split_bodies_pipelining_and_keep_alive(renderers: tuple[Any, Any]) -> None:
    lane, usual = renderers
    request = _request(CHAT, CHAT_BODY)
    head, body = request.split(b"\r\n\r\n", 1)
    cases = {
        # the body arrives in its own writes, after the head: answered once it is all in
        "split body": ((head + b"\r\n\r\n", body[:10], body[10:]), 1),
        # three requests in one write, then two more on the same connection
        "pipelined": ((request * 3, request, request), 5),
    }
    for name, (pieces, count) in cases.items():
        counted = _direct_answers(lane.url).get(CHAT, 0)
        got = _exchange(lane.url, *pieces, answers=count)
        expected = _exchange(usual.url, *pieces, answers=count)
        assert got == expected, name
        assert len(got) == count and all(answer.startswith(b"HTTP/1.1 200 OK\r\n") for answer in got), name
        assert _direct_answers(lane.url)[CHAT] == counted + count, name
    assert "Traceback" not in lane.log() and "Traceback" not in usual.log()

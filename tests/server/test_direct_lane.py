"""The direct lane (server/direct.py): what it answers is byte for byte what the usual path answers.

Two real renderers on the Qwen3 fixture, one with the lane (the default) and one without (`--access-log` turns it
off); the same raw HTTP/1.1 requests to both, the answers compared whole (status line, headers, body), with
only the `Date` header and the answer's own random `chatcmpl-`/`cmpl-` id masked. `tokenfront_direct_answers_total`
says which answers the lane gave: the common requests, never the errors or a request's own template.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
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


# Requests that arrive whole in one read but that the lane's own reading of a head (`DirectLane.answer_whole`)
# leaves to the HTTP parser, or takes: (name, request, answered by the lane). The parser's answer must be the
# usual path's either way, and the lane must still take what it takes once the parser has read it.
_BASE = _request(CHAT, CHAT_BODY)
WHOLE_CASES = [
    (
        "lower-case names, Keep-Alive",
        _BASE.replace(b"Content-Type", b"content-type")
        .replace(b"X-Request-Id", b"x-request-id")
        .replace(b"\r\n\r\n", b"\r\nconnection: Keep-Alive\r\n\r\n", 1),
        True,
    ),
    ("a tab before a value", _BASE.replace(b"Id: lane-test-1", b"Id:\tlane-test-1"), True),
    ("an empty header value", _BASE.replace(b"\r\n\r\n", b"\r\nX-Empty:\r\n\r\n", 1), True),
    ("a value with white space after it", _BASE.replace(b"lane-test-1\r\n", b"lane-test-1  \r\n"), True),
    ("a query string", _BASE.replace(CHAT.encode(), CHAT.encode() + b"?x=1", 1), True),
    ("HTTP/1.0", _BASE.replace(b"HTTP/1.1", b"HTTP/1.0", 1), True),
    ("Connection: upgrade", _BASE.replace(b"\r\n\r\n", b"\r\nConnection: upgrade\r\n\r\n", 1), True),
    ("two Content-Lengths", _BASE.replace(b"\r\n\r\n", b"\r\nContent-Length: 5\r\n\r\n", 1), False),
    ("a Content-Length with a sign", _BASE.replace(b"Content-Length: ", b"Content-Length: +", 1), False),
    ("a body longer than its Content-Length", _BASE + b"  ", True),
    ("a space in a header name", _BASE.replace(b"X-Request-Id", b"X Request-Id"), False),
    ("a control character in a value", _BASE.replace(b"lane-test-1", b"lane\x01test-1"), False),
    ("a folded header line", _BASE.replace(b"\r\n\r\n", b"\r\nX-Fold: a\r\n b\r\n\r\n", 1), False),
    ("a lower-case method", _BASE.replace(b"POST", b"post", 1), False),
    ("a header line without a colon", _BASE.replace(b"\r\n\r\n", b"\r\nX-No-Colon\r\n\r\n", 1), False),
    ("a header line without a name", _BASE.replace(b"\r\n\r\n", b"\r\n: nameless\r\n\r\n", 1), False),
    ("a line feed alone in a value", _BASE.replace(b"lane-test-1", b"lane\ntest-1"), False),
    ("a DEL in a value", _BASE.replace(b"lane-test-1", b"lane\x7ftest-1"), False),
    (
        "chunked",
        _BASE.replace(b"Content-Length: %d" % len(CHAT_BODY), b"Transfer-Encoding: chunked").replace(
            CHAT_BODY, b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHAT_BODY), CHAT_BODY)
        ),
        False,
    ),
]


def test_which_whole_requests_the_lane_reads_itself(qwen3: Path) -> None:
    """In-process, the lane's own reading: the plain request and the first three cases are answered without the
    parser, every other case is left to it (None)."""
    from tokenfront import RenderOptions, RenderPipeline
    from tokenfront.renderer.app import create_renderer_app
    from tokenfront.server.direct import DirectLane

    lane = DirectLane.of(create_renderer_app(RenderPipeline.load(RenderOptions(model=str(qwen3)))))
    assert lane is not None
    read = [
        lane.answer_whole(request, 8192, 100, []) is not None
        for request in [_request(CHAT, CHAT_BODY, auth="none"), *(case[1] for case in WHOLE_CASES)]
    ]
    assert read == [True] * 4 + [False] * 16
    assert (
        lane.answer_whole(_BASE.replace(b"Bearer", b"Bearer"), 100, 100, []) is None
    )  # a head over 100 bytes
    assert lane.answer_whole(_BASE, 8192, 4, []) is None  # 5 header lines over 4
    answer, keep_alive = lane.answer_whole(
        _BASE.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1), 8192, 100, []
    )  # type: ignore[misc]
    assert not keep_alive and answer.startswith(b"HTTP/1.1 200 OK\r\ncontent-length: ")
    assert b"\r\nconnection: close\r\n" in answer and b"\r\nx-request-id: lane-test-1\r\n" in answer


def test_whole_requests_the_parser_reads_instead(renderers: tuple[Any, Any]) -> None:
    lane, usual = renderers
    compared = taken = 0
    for name, request, by_lane in WHOLE_CASES:
        counted = sum(_direct_answers(lane.url).values())
        got = _raw_exchange(lane.url, request)
        expected = _raw_exchange(usual.url, request)
        assert got == expected, name
        compared += 1
        now = sum(_direct_answers(lane.url).values())
        assert now == counted + by_lane, name
        taken += by_lane
    assert compared == len(WHOLE_CASES) == 19
    assert taken == 8
    assert "Traceback" not in lane.log() and "Traceback" not in usual.log()


def _raw_exchange(url: str, request: bytes) -> bytes:
    """Everything the server sends for one write of `request`, up to its first answer's end (or the close),
    masked."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as sock:
        sock.sendall(request)
        buffer = b""
        while True:
            head_end = buffer.find(b"\r\n\r\n")
            if head_end >= 0:
                found = re.search(rb"content-length: (\d+)\r\n", buffer[:head_end].lower())
                if found is not None and len(buffer) >= head_end + 4 + int(found.group(1)):
                    return _masked(buffer[: head_end + 4 + int(found.group(1))])
            chunk = sock.recv(65536)
            if not chunk:
                return _masked(buffer)
            buffer += chunk


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


def test_keep_alive_is_reckoned_from_the_last_answer(qwen3: Path, server_factory: Callable[..., Any]) -> None:
    """Answers read whole leave the keep-alive timer running: when it goes off it must count the idle time from
    the last answer, not close a connection that was busy meanwhile. Timed on purpose (the keep-alive timeout is
    what is tested): requests 1.2 s apart on a 2 s timeout, 2.4 s in all, then the close once idle."""
    server = server_factory("render", "--model", str(qwen3), "--keep-alive-timeout", "2")
    request = _request(CHAT, CHAT_BODY)
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as sock:
        for _ in range(3):
            sock.sendall(request)
            (answer,) = _read_answers(sock, 1)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            time.sleep(1.2)
        sock.settimeout(_DEADLINE)
        assert sock.recv(65536) == b""  # idle for 2 s after the last answer: closed
    assert _direct_answers(server.url) == {CHAT: 3.0}


def test_keep_alive_answers_wait_for_the_end_of_the_loop_turn(qwen3: Path) -> None:
    """In-process, on a running uvloop loop: a whole request's keep-alive answer is held until the end of the
    loop's turn, when every connection's answer of the turn goes out; `Connection: close` is answered and closed
    at once; a held answer goes out before its connection's next read and before a shutdown closes it, and is
    dropped when the client is gone."""
    import uvloop
    from benchmarks.render_lane import SinkTransport, lane_connections

    from tokenfront import RenderOptions, RenderPipeline
    from tokenfront.renderer.app import create_renderer_app

    app = create_renderer_app(RenderPipeline.load(RenderOptions(model=str(qwen3))), api_key=KEY)
    close_request = _BASE.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)

    def answered(transport: SinkTransport) -> list[bytes]:
        return [answer.split(b"\r\n", 1)[0] for answer in transport.written]

    async def scenario() -> None:
        connections = lane_connections(app, asyncio.get_running_loop(), 4)
        transports = [transport for _, transport in connections]
        first, second, closing, leaving = (protocol for protocol, _ in connections)
        for protocol in (first, second, leaving):
            protocol.data_received(_BASE)
        closing.data_received(close_request)
        assert [len(transport.written) for transport in transports] == [0, 0, 1, 0]
        assert transports[2].closing and answered(transports[2]) == [b"HTTP/1.1 200 OK"]
        leaving.connection_lost(None)  # gone before the turn's end: its answer is dropped
        await asyncio.sleep(0)  # the turn ends
        assert [answered(transport) for transport in transports] == [
            [b"HTTP/1.1 200 OK"],
            [b"HTTP/1.1 200 OK"],
            [b"HTTP/1.1 200 OK"],
            [],
        ]
        first.data_received(_BASE)
        first.data_received(_BASE)  # a second read in the same turn: the held answer goes out first
        assert answered(transports[0]) == [b"HTTP/1.1 200 OK"] * 2
        second.data_received(_BASE)
        second.shutdown()  # the held answer, then the close
        assert answered(transports[1]) == [b"HTTP/1.1 200 OK"] * 2 and transports[1].closing
        await asyncio.sleep(0)
        assert answered(transports[0]) == [b"HTTP/1.1 200 OK"] * 3
        assert answered(transports[1]) == [b"HTTP/1.1 200 OK"] * 2  # sent once, not again at the turn's end
        assert all(b"x-request-id: lane-test-1\r\n" in answer for answer in transports[0].written)

    uvloop.run(scenario())

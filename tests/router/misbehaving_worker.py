"""A stand-in worker that answers its inference routes badly, on purpose: the hostile peer of
`test_router_bad_workers.py`.

    python misbehaving_worker.py        # prints its port on the first line of stdout, then serves on 127.0.0.1

It answers `GET /health` (200), `GET /v1/models` and `GET /server_info` (404, as a server that is not
tokenfront) correctly, so a router takes it into its active set; `POST /v1/chat/completions` and
`POST /v1/completions` are answered as the current behaviour says (`BEHAVIOURS`, set with
`POST /_behave {"behaviour": NAME}`; "good" at start). `GET /_log` counts what happened: requests per
behaviour, and endless streams or stalls that the router ended by closing the connection.

An asyncio server writing raw bytes, so that it can send what no real server sends: a head and then nothing,
bytes that are not HTTP, a stream that never ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from typing import Any

STALL_SECONDS = 300  # the longest a stall lasts when the router does not close the connection first
# One event of the endless stream, about 4 KiB: a content delta as an OpenAI stream chunk carries it.
_ENDLESS_EVENT = (
    b'data: {"id":"chatcmpl-endless","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"content":"' + b"x" * 4000 + b'"},"finish_reason":null}]}\n\n'
)
_ENDLESS_PIECE = _ENDLESS_EVENT * 16  # written as one chunk of the chunked body
GOOD_EVENTS = 3  # the content events of a good stream, before its finish event and [DONE]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _head(status: str, content_type: str, *framing: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"content-type: {content_type}", *framing]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _full(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return _head(status, content_type, f"content-length: {len(body)}") + body


def _stream_head() -> bytes:
    return _head("200 OK", "text/event-stream", "transfer-encoding: chunked")


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _delta(index: int) -> bytes:
    choice = {"index": 0, "delta": {"content": f"word{index} "}, "finish_reason": None}
    return _event({"id": "chatcmpl-standin", "object": "chat.completion.chunk", "choices": [choice]})


def _good_answer() -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}
    body = {"id": "chatcmpl-standin", "object": "chat.completion", "model": "standin", "choices": [choice]}
    return _full("200 OK", json.dumps(body).encode())


def _good_stream() -> bytes:
    events = [_delta(index) for index in range(GOOD_EVENTS)]
    finish = {"index": 0, "delta": {}, "finish_reason": "stop"}
    events.append(_event({"id": "chatcmpl-standin", "object": "chat.completion.chunk", "choices": [finish]}))
    events.append(b"data: [DONE]\n\n")
    return _stream_head() + b"".join(_chunk(event) for event in events) + b"0\r\n\r\n"


# What each behaviour writes at once; None: the behaviour is more than one write (`Worker._answer`).
_WRITTEN: dict[str, bytes | None] = {
    "good": None,  # a correct answer or stream, whichever the request asked for
    "garbage_200": _full("200 OK", bytes(range(256)) * 4 + b"\xff\xfe\x00"),
    "not_json_200": _full("200 OK", b"<html><body>upstream says hi</body></html>", "text/html"),
    "no_choices_200": _full("200 OK", b'{"object": "chat.completion", "note": "no choices here"}'),
    "text_500": _full("500 Internal Server Error", b"Internal Server Error", "text/plain"),
    "json_400": _full(
        "400 Bad Request",
        b'{"error": {"message": "the worker refuses", "type": "invalid_request_error", "param": null, '
        b'"code": "worker_refusal"}}',
    ),
    "not_http": b"\x16\x03\x01 this is not HTTP at all\r\n\r\n",
    "huge_length": _head("200 OK", "application/json", f"content-length: {1 << 40}") + b'{"choices": [',
    "sse_garbage": _stream_head() + _chunk(b"\x00\xffgarbage\n\nmore garbage\n\n") + b"0\r\n\r\n",
    "sse_then_garbage": _stream_head()
    + _chunk(_delta(0))
    + _chunk(b"\x00\xff not an event\n\n")
    + b"0\r\n\r\n",
    "sse_not_json": _stream_head() + _chunk(_delta(0)) + _chunk(b"data: {not json\n\n") + b"0\r\n\r\n",
    "sse_no_done": _stream_head() + _chunk(_delta(0)) + _chunk(_delta(1)) + b"0\r\n\r\n",
    "stall": b"",  # nothing at all, not even a head
    "head_then_stall": _head("200 OK", "application/json", "content-length: 1000") + b'{"choices": [',
    "stream_head_then_stall": _stream_head(),
    "stream_stall_after_first": _stream_head() + _chunk(_delta(0)),
    "endless": None,
}
BEHAVIOURS = tuple(_WRITTEN)
_STALLS = {"stall", "head_then_stall", "huge_length", "stream_head_then_stall", "stream_stall_after_first"}


class Worker:
    """The stand-in's state: its current behaviour and what happened."""

    def __init__(self) -> None:
        self.behaviour = "good"
        self.log: Counter[str] = Counter()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if not await self._route(method, path, body, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _route(
        self, method: str, path: str, body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection is to be closed."""
        if method == "GET" and path == "/health":
            writer.write(_full("200 OK", b'{"status": "ok"}'))
        elif method == "GET" and path == "/_log":
            writer.write(_full("200 OK", json.dumps({**self.log, "behaviour": self.behaviour}).encode()))
        elif method == "POST" and path == "/_behave":
            behaviour = json.loads(body)["behaviour"]
            if behaviour not in BEHAVIOURS:
                writer.write(_full("400 Bad Request", b'{"error": {"message": "unknown behaviour"}}'))
            else:
                self.behaviour = behaviour
                writer.write(_full("200 OK", b"{}"))
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            return await self._answer(json.loads(body or b"{}"), reader, writer)
        else:
            writer.write(_full("404 Not Found", b'{"error": {"message": "not found"}}'))
        await writer.drain()
        return True

    async def _answer(
        self, request: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        behaviour = self.behaviour
        self.log[behaviour] += 1
        if behaviour == "good":
            writer.write(_good_stream() if request.get("stream") else _good_answer())
            await writer.drain()
            return True
        if behaviour == "endless":
            writer.write(_stream_head())
            try:
                while True:
                    writer.write(_chunk(_ENDLESS_PIECE))
                    await writer.drain()
            except ConnectionError:
                self.log["endless_closed_by_router"] += 1
            return False
        written = _WRITTEN[behaviour]
        assert written is not None
        writer.write(written)
        await writer.drain()
        if behaviour in _STALLS:
            # Wait for the router to give up: it closes the connection (reading it then ends).
            try:
                closed = await asyncio.wait_for(reader.read(), STALL_SECONDS) == b""
            except (asyncio.TimeoutError, ConnectionError):
                closed = False
            if closed:
                self.log[f"{behaviour}_closed_by_router"] += 1
        return False  # after a bad answer the connection is not to be trusted: close it


async def main() -> None:
    worker = Worker()
    server = await asyncio.start_server(worker.serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} (no arguments)")
    asyncio.run(main())

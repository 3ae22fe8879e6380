"""A loopback HTTP/1.1 server whose answers a test writes byte for byte: the worker side of the router's client
tests (`test_proxy_send.py`, `test_check_client.py`, `test_router_probe.py`).

`Server(handler)` listens on 127.0.0.1 (an ephemeral port) and calls `handler(exchange)` for each request it
reads (head and Content-Length body); it counts the connections it accepted. `run` runs a test's coroutine,
bounded, on the loop `choose_loop` picked for it (a test module parametrizes its tests over `LOOPS`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

BODY = b'{"choices":[{"index":0,"text":"hi"}]}'
Handler = Callable[["Exchange"], Awaitable[None]]

# The standard loop, and uvloop (what the router's server runs on).
LOOPS = ("asyncio", "uvloop")
_LOOP = {"name": "asyncio"}


def choose_loop(request: pytest.FixtureRequest) -> str:
    """Make `request.param` (one of `LOOPS`) the loop `run` uses; skipped where uvloop is not installed."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
    _LOOP["name"] = request.param
    return str(request.param)


def run(coroutine: Awaitable[Any]) -> Any:
    """Run `coroutine` to its end, within 30 s, on the chosen loop."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coroutine, 30)

    if _LOOP["name"] == "uvloop":
        import uvloop

        return uvloop.run(bounded())
    return asyncio.run(bounded())


def answer(body: bytes = BODY, status: str = "200 OK", *headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", "content-type: application/json", f"content-length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(*pieces: bytes, head: str = "HTTP/1.1 200 OK") -> bytes:
    out = f"{head}\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".encode()
    for piece in pieces:
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
    return out + b"0\r\n\r\n"


class Exchange:
    """One request as a scripted server saw it, and the means to answer it."""

    def __init__(self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server, self.reader, self.writer = server, reader, writer
        self.head = b""
        self.body = b""

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def closed_by_client(self) -> bool:
        """Whether the router closed the connection (read until EOF)."""
        try:
            return await asyncio.wait_for(self.reader.read(), 5) == b""
        except (asyncio.TimeoutError, ConnectionError):
            return False


class Server:
    """A loopback HTTP server whose answers are written by a test: `handler(exchange)` per request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[Exchange] = []
        self.closed = asyncio.Event()  # a connection was closed by the client
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed.set()
                    return
                exchange = Exchange(self, reader, writer)
                exchange.head = head
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.lower().split(b"\r\n")
                        if line.startswith(b"content-length:")
                    ),
                    0,
                )
                exchange.body = await reader.readexactly(length)
                self.requests.append(exchange)
                await self.handler(exchange)
                if writer.is_closing():
                    return
        finally:
            writer.close()

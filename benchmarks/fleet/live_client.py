"""The live fleet benchmark's client: every request sent through the router at its time, streamed, over plain
HTTP/1.1 keep-alive connections on asyncio streams.

The client shares the machine with the router and the fleet it measures, so it must cost little: httpx's
streaming (its pool, h11 and anyio at every chunk) took 0.6-0.85 of a core for the 256-worker agentic workload
at `--sim-speedup 0.05` on the 2-core machine (py-spy: 85 % of its samples busy), a third of what the three
share. This one writes each request as bytes and reads the answer itself: the status line and headers, then
the body (chunked, as a stream comes, or of a `Content-Length`), its `data:` lines parsed as they complete —
the same answers read the same way: TTFT at the first event with text, usage from the event that carries it,
an `error` event or a status other than 200 an error. A request is started when it is due (no task waits
for it before), at most `concurrency` in flight. Idle connections are reused for `_IDLE_SECONDS` (the router
closes them after 5), and a request that finds its reused connection closed before any answer (the router
closed it meanwhile) is sent again once on a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from benchmarks.fleet.requests import TimedRequest
from benchmarks.fleet.results import Outcome

__all__ = ["send_all"]

# Seconds an idle connection is reused: under the router's keep-alive timeout (5 s by default).
_IDLE_SECONDS = 4.0
_CONNECT_SECONDS = 30.0
# What a broken connection or answer raises while it is read.
_BROKEN = (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


async def send_all(
    url: str,
    requests: Sequence[TimedRequest],
    *,
    speedup: float,
    concurrency: int,
    request_timeout: float,
) -> list[Outcome]:
    """Every request at its `at` on a clock `speedup` times slower than the modelled one, as a streaming
    `/v1/completions` of its ids; their outcomes in the requests' order (TTFT and end in modelled seconds)."""
    pool = _Pool(url)
    gate = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    start = loop.time()
    outcomes: list[Outcome | None] = [None] * len(requests)

    async def one(index: int, request: TimedRequest, due: float) -> None:
        async with gate:
            try:
                async with asyncio.timeout(request_timeout):
                    outcomes[index] = await _stream(pool, request, due, start, speedup)
            except TimeoutError:
                outcomes[index] = Outcome(None, request.prompt_tokens, error="TimeoutError")

    tasks = []
    try:
        for index in sorted(range(len(requests)), key=lambda i: requests[i].at):
            due = start + requests[index].at / speedup
            await asyncio.sleep(max(0.0, due - loop.time()))
            tasks.append(asyncio.create_task(one(index, requests[index], due)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        pool.close()
    return [outcome for outcome in outcomes if outcome is not None]


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0


class _Pool:
    """Keep-alive connections to one server, the most recently used first."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.idle: list[_Connection] = []

    def reuse(self) -> _Connection | None:
        """An idle connection still worth reusing, if there is one."""
        now = asyncio.get_running_loop().time()
        while self.idle:
            connection = self.idle.pop()
            fresh = now - connection.idle_since < _IDLE_SECONDS
            if fresh and not connection.reader.at_eof() and not connection.writer.is_closing():
                return connection
            connection.writer.close()
        return None

    async def open(self) -> _Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=1 << 20), _CONNECT_SECONDS
        )
        return _Connection(reader, writer)

    def give_back(self, connection: _Connection) -> None:
        connection.idle_since = asyncio.get_running_loop().time()
        self.idle.append(connection)

    def close(self) -> None:
        for connection in self.idle:
            connection.writer.close()
        self.idle.clear()


async def _stream(pool: _Pool, request: TimedRequest, due: float, start: float, speedup: float) -> Outcome:
    """One streamed completion: TTFT at its first event with text, usage from the event that carries it."""
    body = orjson.dumps(request.completion_body())
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {pool.host}:{pool.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    connection = pool.reuse()
    reused = connection is not None
    while True:
        answered = False
        try:
            if connection is None:
                connection = await pool.open()
            connection.writer.write(head + body)
            status, headers = await _read_head(connection.reader)
            answered = True
            outcome = await _read_answer(connection.reader, status, headers, request, due, start, speedup)
        except _BROKEN as failure:
            if connection is not None:
                connection.writer.close()
            if reused and not answered:  # the router closed the idle connection as it was taken
                connection, reused = None, False  # once more, on a new one
                continue
            return Outcome(None, request.prompt_tokens, error=type(failure).__name__)
        if headers.get(b"connection") == b"close":
            connection.writer.close()
        else:
            pool.give_back(connection)
        return outcome


async def _read_answer(
    reader: asyncio.StreamReader,
    status: int,
    headers: dict[bytes, bytes],
    request: TimedRequest,
    due: float,
    start: float,
    speedup: float,
) -> Outcome:
    if status != 200:
        text = b"".join([part async for part in _body(reader, headers)])[:2000]
        return Outcome(None, request.prompt_tokens, error=f"status {status}: {_code(text)}")
    loop = asyncio.get_running_loop()
    first: float | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    pending = b""
    async for part in _body(reader, headers):  # read to its end even after an error: the connection is reused
        *lines, pending = (pending + part).split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if not line.startswith(b"data: ") or line == b"data: [DONE]" or error is not None:
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                error = f"error event: {_code(line[6:])}"
                continue
            choices = chunk.get("choices") or []
            if first is None and choices and choices[0].get("text"):
                first = loop.time()
            if chunk.get("usage"):
                usage = chunk["usage"]
    if error is not None or first is None or usage is None:
        return Outcome(
            None, request.prompt_tokens, error=error or ("no content" if first is None else "no usage")
        )
    details = usage.get("prompt_tokens_details") or {}
    return Outcome(
        (first - due) * speedup,
        int(usage.get("prompt_tokens") or request.prompt_tokens),
        int(details.get("cached_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        (loop.time() - start) * speedup,
    )


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """The status code and the headers (names lower-cased) of an answer."""
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name:
            headers[name.strip().lower()] = value.strip().lower()
    return status, headers


async def _body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> AsyncIterator[bytes]:
    """An answer's body as it comes: its chunks, or the `Content-Length` bytes."""
    if headers.get(b"transfer-encoding") == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # the end of the (empty) trailers
                return
            yield (await reader.readexactly(size + 2))[:-2]
    elif b"content-length" in headers:
        yield await reader.readexactly(int(headers[b"content-length"]))
    else:
        raise EOFError("an answer without Content-Length or chunks")


def _code(body: str | bytes) -> str:
    """An OpenAI error body's `code` (else its type, else "?"), to count errors by kind."""
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        error = orjson.loads(body).get("error") or {}
        return str(error.get("code") or error.get("type") or "?") if isinstance(error, dict) else "?"
    return "?"

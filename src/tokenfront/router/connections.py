"""`WorkerConnections`: a lean pool of keep-alive HTTP/1.1 connections to one worker, for proxied requests (and,
in a pool of their own, the router's checks and KV event reads: `router.check_client`).

This is the router's per-request path. httpx costs about half a millisecond of CPU per request there (anyio
streams, locks, h11, its request and response models, and a failed `import sniffio` per lock when sniffio is
not installed); aiohttp about 60 µs; this pool about 20 µs. It does only what the router needs: send a request
(a POST and its body, or a GET and its query) in one write, read the answer (Content-Length, chunked, or until
close; 1xx skipped) whole or piece by piece as it arrives, pause reading while the client is behind, close the
connection when a request is abandoned (the worker then stops generating), and reuse it otherwise. Errors are
`WorkerTransportError`s named after httpx's, so the proxy tells connection failures from worker answers the
same way; `BadAnswer` and `AnswerTooLarge` are the worker's answer breaking HTTP or the route's contract, or
going over a limit.

Every wait is bounded: the head of an answer by the `head_timeout` the caller gives (`request`), each further
read by the time given to it (by default the pool's `idle_timeout`), and a whole body (`WorkerResponse.read`) also
by a deadline and a size.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from collections.abc import Mapping
from typing import cast
from urllib.parse import quote, urlsplit

from tokenfront.tls import ClientTls, describe_tls_failure

# A proxied answer's head may be this large, and a chunk-size or trailer line this long; the body is read as
# it comes.
_MAX_HEAD_BYTES = 64 * 1024
_MAX_LINE_BYTES = 8 * 1024
# Received bytes the reader has not asked for yet, above which the connection stops reading (back-pressure
# from a slow client through the router to the worker).
_READ_HIGH_WATER = 256 * 1024


def describe_error(exc: BaseException) -> str:
    """A short name for a connection-level error, with its message when it has one, and what to do when it is a
    failed TLS handshake."""
    message = str(exc).strip()
    described = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    advice = describe_tls_failure(exc, ca_flag="--worker-ca-certs")
    return f"{described}; {advice}" if advice else described


class WorkerTransportError(Exception):
    """A proxied request failed at the connection, before or while the worker answered."""


class ConnectError(WorkerTransportError):
    """The connection could not be opened."""


class ConnectTimeout(WorkerTransportError):
    """The connection took longer than `--connect-timeout` to open."""


class ReadError(WorkerTransportError):
    """The connection broke while the answer was awaited or read."""


class ReadTimeout(WorkerTransportError):
    """The answer, or its next piece, did not arrive in time (`--first-byte-timeout`, `--idle-timeout`,
    `--request-timeout`)."""


class WriteError(WorkerTransportError):
    """The connection broke while the request was written."""


class WriteTimeout(WorkerTransportError):
    """The worker took no bytes of the request for `--idle-timeout` seconds."""


class PoolTimeout(WorkerTransportError):
    """Every connection to the worker stayed busy for `--request-timeout` seconds."""


class RemoteProtocolError(WorkerTransportError):
    """The worker closed the connection without a complete answer, or answered something that is not HTTP."""


class BadAnswer(RemoteProtocolError):
    """The worker answered something that is not HTTP/1.x, or not what the route answers (a body that is not a
    JSON object of the route's shape, an event stream that is not one): a broken worker, not a lost one."""


class AnswerTooLarge(WorkerTransportError):
    """The answer went over a limit (`--max-response-bytes`, or a stream's event budget); reading stopped.

    `worker_fault`: the worker sent more than the request allows (more events than its tokens can make), as
    opposed to an answer that may be right but is larger than the router relays.
    """

    def __init__(self, message: str, *, worker_fault: bool) -> None:
        super().__init__(message)
        self.worker_fault = worker_fault


# Where a connection is in the exchange of one request and its answer.
_IDLE, _HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(9)
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to a worker: a request written in one piece, the answer read as it arrives.

    The answer is parsed here: the status line and headers (interim 1xx answers skipped), then the body as
    its framing says — `Content-Length`, `Transfer-Encoding: chunked` (extensions and trailers ignored), or
    until the worker closes the connection. Received bytes wait in a buffer until the reader asks for them,
    and reading pauses while that buffer is long (the reader relays to a slow client), so the worker is slowed
    down rather than buffered.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.received = False  # a byte arrived since the last request was written
        self.keep_alive = False  # the answer being read lets the connection carry another request
        self._state = _IDLE
        self._remaining = 0  # body bytes left: of the whole body (_LENGTH) or of this chunk (_CHUNK_DATA)
        self._buffer = bytearray()
        self._reading_paused = False
        self._writing_paused = False
        self._eof = False  # the worker closed its side, or the connection is gone
        self._error: BaseException | None = None  # why the connection was lost, when not a clean close
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        with contextlib.suppress(OSError, AttributeError, TypeError):
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the loop's default; make sure

    def data_received(self, data: bytes) -> None:
        self.received = True
        self._buffer += data
        if len(self._buffer) > _READ_HIGH_WATER and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- use

    @property
    def reusable(self) -> bool:
        """Open, quiet, and between requests."""
        transport = self.transport
        return (
            self._state == _IDLE
            and not self._eof
            and not self._buffer
            and transport is not None
            and not transport.is_closing()
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._eof = True

    async def send(self, request: bytes, timeout: float) -> None:
        """Write a whole request (one write: a small request is one segment)."""
        if self._eof or self.transport is None or self._state != _IDLE:
            raise WriteError("the connection was closed")
        self.received = False
        self._state = _HEAD
        self.transport.write(request)
        while self._writing_paused:
            if self._eof:
                raise WriteError(_lost(self._error))
            await self._wait(timeout, WriteTimeout)

    async def read_head(self, timeout: float) -> tuple[int, dict[str, str]]:
        """The answer's status and headers (names in lower case; repeated ones joined with ", "), within
        `timeout` seconds in all (a head trickling in byte by byte is no longer)."""
        buffer = self._buffer
        deadline = self.loop.time() + timeout
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD_BYTES:
                    raise BadAnswer(f"the answer's head is over {_MAX_HEAD_BYTES} bytes")
                await self._more(deadline, "the worker closed the connection without answering")
                continue
            head = bytes(buffer[:end])
            del buffer[: end + 4]
            status, version, headers = _parse_head(head)
            if status == 101:
                raise BadAnswer("the worker switched protocols")
            if status >= 200:
                self._frame(status, version, headers)
                return status, headers
            # an interim answer (100 Continue, 103 Early Hints): the real one follows

    def _frame(self, status: int, version: bytes, headers: dict[str, str]) -> None:
        """How the body is delimited, and whether the connection can be reused after it."""
        keep_alive = version == b"HTTP/1.1" and "close" not in _tokens(headers.get("connection", ""))
        encoding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if status in (204, 304):
            self._state = _DONE
        elif encoding is not None:
            if _tokens(encoding)[-1:] == ["chunked"]:
                self._state = _CHUNK_SIZE
                keep_alive = keep_alive and length is None  # both: not to be trusted further
            else:
                self._state = _UNTIL_CLOSE
        elif length is not None:
            values = {value.strip() for value in length.split(",")}
            value = values.pop() if len(values) == 1 else ""
            if not value.isdigit():
                raise BadAnswer(f"the answer's Content-Length is {length!r}")
            self._remaining = int(value)
            self._state = _LENGTH if self._remaining else _DONE
        else:
            self._state = _UNTIL_CLOSE
        self.keep_alive = keep_alive and self._state != _UNTIL_CLOSE

    async def read_body(self, timeout: float) -> bytes | None:
        """The next piece of the body as it arrived (de-chunked, never empty), or None at its end, within
        `timeout` seconds."""
        buffer = self._buffer
        deadline = self.loop.time() + timeout
        while True:
            state = self._state
            if state in (_LENGTH, _CHUNK_DATA):
                if buffer:
                    data = self._take(min(self._remaining, len(buffer)))
                    self._remaining -= len(data)
                    if not self._remaining:
                        self._state = _DONE if state == _LENGTH else _CHUNK_END
                    return data
                await self._more(deadline, "the worker closed the connection before the end of its answer")
            elif state == _CHUNK_SIZE:
                line = self._line()
                if line is None:
                    await self._more(
                        deadline, "the worker closed the connection before the end of its answer"
                    )
                    continue
                size = line.split(b";", 1)[0].strip(b" \t")
                if not _HEX.fullmatch(size):
                    raise BadAnswer(f"bad chunk size line {line[:80]!r}")
                self._remaining = int(size, 16)
                self._state = _CHUNK_DATA if self._remaining else _TRAILERS
            elif state == _CHUNK_END:
                if len(buffer) < 2:
                    await self._more(
                        deadline, "the worker closed the connection before the end of its answer"
                    )
                    continue
                if buffer[:2] != b"\r\n":
                    raise BadAnswer("a chunk of the answer does not end with CRLF")
                del buffer[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                line = self._line()
                if line is None:
                    await self._more(
                        deadline, "the worker closed the connection before the end of its answer"
                    )
                elif not line:
                    self._state = _DONE
            elif state == _UNTIL_CLOSE:
                if buffer:
                    return self._take(len(buffer))
                if self._eof:
                    if self._error is not None:
                        raise ReadError(_lost(self._error))
                    self._state = _DONE
                else:
                    await self._wait(deadline - self.loop.time(), ReadTimeout)
            else:
                return None

    def finish(self) -> bool:
        """After a whole answer: ready for the next request (True), or to be closed."""
        if self._state == _DONE and self.keep_alive and not self._buffer:
            self._state = _IDLE
        return self.reusable

    def _line(self) -> bytes | None:
        buffer = self._buffer
        end = buffer.find(b"\r\n")
        if end < 0:
            if len(buffer) > _MAX_LINE_BYTES:
                raise BadAnswer(f"a line of the answer is over {_MAX_LINE_BYTES} bytes")
            return None
        line = bytes(buffer[:end])
        del buffer[: end + 2]
        return line

    def _take(self, size: int) -> bytes:
        buffer = self._buffer
        if size == len(buffer):
            data = bytes(buffer)
            buffer.clear()
        else:
            data = bytes(buffer[:size])
            del buffer[:size]
        if self._reading_paused and len(buffer) <= _READ_HIGH_WATER // 2 and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def _more(self, deadline: float, closed: str) -> None:
        """Wait for more bytes until `deadline` (loop time); `closed` is the error's message when none can come
        any more."""
        if self._eof:
            if self._error is not None:
                raise ReadError(_lost(self._error))
            raise RemoteProtocolError(closed)
        if self._reading_paused and self.transport is not None:  # the reader needs more than the buffer holds
            self._reading_paused = False
            self.transport.resume_reading()
        await self._wait(deadline - self.loop.time(), ReadTimeout)

    async def _wait(self, timeout: float, error: type[WorkerTransportError]) -> None:
        waiter = self.loop.create_future()
        self._waiter = waiter
        timer = self.loop.call_later(timeout, _expire, waiter, error)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _parse_head(head: bytes) -> tuple[int, bytes, dict[str, str]]:
    """Status, HTTP version and headers of an answer's head (without its final empty line)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not _is_status(parts[1]):
        raise BadAnswer(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadAnswer(f"malformed header line in the answer: {line[:80]!r}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return int(parts[1]), parts[0], headers


def _is_status(text: bytes) -> bool:
    return len(text) == 3 and text.isdigit()


def _tokens(value: str) -> list[str]:
    return [token.strip().lower() for token in value.split(",") if token.strip()]


def _expire(waiter: asyncio.Future[None], error: type[WorkerTransportError]) -> None:
    if not waiter.done():
        waiter.set_exception(error())


def _lost(exc: BaseException | None) -> str:
    return describe_error(exc) if exc is not None else "the connection was closed"


class WorkerResponse:
    """A worker's answer: status and headers, then the body, whole (`read`) or piece by piece (`next_chunk`).

    `sent_at` is when the request was written (the loop's clock): the caller's deadlines count from there.
    `close()` gives the connection back for the next request once the body was read to its end, and closes
    it otherwise (an abandoned request: the worker sees its client leave and stops). Always call it.
    """

    __slots__ = ("_closed", "_connection", "_done", "_pool", "headers", "sent_at", "status_code")

    def __init__(
        self,
        pool: WorkerConnections,
        connection: Connection,
        status: int,
        headers: dict[str, str],
        sent_at: float,
    ) -> None:
        self.status_code = status
        self.headers = headers  # names in lower case
        self.sent_at = sent_at
        self._pool = pool
        self._connection = connection
        self._done = False
        self._closed = False

    async def next_chunk(self, timeout: float | None = None) -> bytes | None:
        """The next piece of the body as it arrived (de-chunked, never empty), or None at its end; ReadTimeout
        when nothing arrives for `timeout` seconds (default: the pool's `idle_timeout`)."""
        if self._done:
            return None
        data = await self._connection.read_body(self._pool.idle_timeout if timeout is None else timeout)
        if data is None:
            self._done = True
            self.close()
        return data

    async def read(self, *, limit: int | None = None, deadline: float | None = None) -> bytes:
        """The whole body: at most `limit` bytes (AnswerTooLarge beyond, and nothing more is read), each piece
        within the pool's `idle_timeout` and the whole by `deadline` (the loop's clock; ReadTimeout else)."""
        length = self.headers.get("content-length", "")
        if limit is not None and length.isdigit() and int(length) > limit:
            raise AnswerTooLarge(
                f"answered {length} bytes (Content-Length), over --max-response-bytes ({limit})",
                worker_fault=False,
            )
        idle = self._pool.idle_timeout
        loop = self._connection.loop
        parts: list[bytes] = []
        size = 0
        while True:
            timeout = idle if deadline is None else min(idle, deadline - loop.time())
            try:
                chunk = await self.next_chunk(timeout)
            except ReadTimeout:
                if timeout < idle:
                    raise ReadTimeout("did not finish its answer within --request-timeout") from None
                raise ReadTimeout(f"sent nothing for {idle:g} s in its answer (--idle-timeout)") from None
            if chunk is None:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            size += len(chunk)
            if limit is not None and size > limit:
                raise AnswerTooLarge(
                    f"answered over --max-response-bytes ({limit} bytes)", worker_fault=False
                )
            parts.append(chunk)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.release(self._connection, reuse=self._done)


class WorkerConnections:
    """Keep-alive HTTP/1.1 connections to one worker, for the proxied requests (or the checks: `CheckClient`).

    At most `max_connections` requests at a time (more wait for a free one, up to `timeout`); idle
    connections are reused most recent first and dropped after `keepalive_expiry` seconds. `connect_timeout`
    bounds the opening of a connection; `request`'s `head_timeout` (default `timeout`) the wait for an answer's
    head; `idle_timeout` (default `timeout`) a write and each read of the body after it.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        timeout: float,
        max_connections: int,
        keepalive_expiry: float,
        headers: Mapping[str, str] | None = None,
        idle_timeout: float | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        https = parts.scheme == "https"
        self.url = url
        self.timeout = timeout
        self.idle_timeout = timeout if idle_timeout is None else idle_timeout
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if https else 80)
        self._ssl: ssl.SSLContext | None = (ssl_context or ClientTls().context()) if https else None
        self._prefix = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~").encode("ascii")
        fixed = {"host": parts.netloc.rpartition("@")[2], **(headers or {})}
        for name, value in fixed.items():
            if not _TOKEN.fullmatch(name.encode("latin-1")) or any(c in value for c in "\r\n\0"):
                raise ValueError(f"header {name!r} cannot be sent")
        self._fixed_headers = "".join(f"{name}: {value}\r\n" for name, value in fixed.items()).encode(
            "latin-1"
        )
        self._connect_timeout = connect_timeout
        self._keepalive_expiry = keepalive_expiry
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[Connection] = []
        self._closed = False

    async def post(
        self,
        path: str,
        body: bytes,
        content_type: str = "application/json",
        *,
        request_id: str | None = None,
        head_timeout: float | None = None,
        trace_headers: bytes = b"",
    ) -> WorkerResponse:
        """POST `body` to `path` and return once the answer's head arrived (`request`)."""
        return await self.request(
            "POST",
            path,
            body=body,
            content_type=content_type,
            request_id=request_id,
            head_timeout=head_timeout,
            trace_headers=trace_headers,
        )

    async def get(self, path: str, *, query: str = "", head_timeout: float | None = None) -> WorkerResponse:
        """GET `path` (with `query`, already encoded, after a "?") and return once the answer's head arrived
        (`request`)."""
        return await self.request("GET", path, query=query, head_timeout=head_timeout)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        body: bytes | None = None,
        content_type: str = "application/json",
        request_id: str | None = None,
        head_timeout: float | None = None,
        trace_headers: bytes = b"",
    ) -> WorkerResponse:
        """Send `method` to `path` (`query` after a "?" when given; `body`, of `content_type`, when not None) and
        return once the answer's head arrived; WorkerTransportError on failure (ReadTimeout when the head took
        longer than `head_timeout` seconds, default `timeout`).

        `request_id` goes as `X-Request-Id` (an id `server.request_ids` accepted: printable ASCII, no spaces);
        `trace_headers` are header lines already framed (`server.tracing`'s `traceparent`, `tracestate`).

        A kept-alive connection that fails before any byte of the answer (other than by a timeout) was one the
        worker had closed meanwhile: the request goes again on a fresh connection.
        """
        request = b"".join(
            (
                method.encode("ascii"),
                b" ",
                self._prefix,
                path.encode("ascii"),
                b"?%s" % query.encode("ascii") if query else b"",
                b" HTTP/1.1\r\n",
                self._fixed_headers,
                b"x-request-id: %s\r\n" % request_id.encode("ascii") if request_id is not None else b"",
                trace_headers,
                b""
                if body is None
                else b"content-type: %s\r\ncontent-length: %d\r\n"
                % (content_type.encode("latin-1"), len(body)),
                b"\r\n",
                body or b"",
            )
        )
        await self._acquire()
        connection: Connection | None = None
        try:
            while True:
                connection = self._idle_connection()
                reused = connection is not None
                if connection is None:
                    connection = await self._connect()
                try:
                    await connection.send(request, self.idle_timeout)
                    sent_at = connection.loop.time()
                    status, headers = await connection.read_head(
                        self.timeout if head_timeout is None else head_timeout
                    )
                except WorkerTransportError as exc:
                    connection.close()
                    # A worker that is slow to answer did not close the connection: not sent again.
                    timed_out = isinstance(exc, (ReadTimeout, WriteTimeout))
                    if reused and not connection.received and not timed_out:
                        continue
                    raise
                return WorkerResponse(self, connection, status, headers, sent_at)
        except BaseException:
            if connection is not None:
                connection.close()
            self._slots.release()
            raise

    @property
    def idle_connections(self) -> list[Connection]:
        """The connections kept open for re-use, oldest first (a copy)."""
        return list(self._idle)

    def release(self, connection: Connection, *, reuse: bool) -> None:
        """A response is done with its connection: keep it for the next request when it can be."""
        self._slots.release()
        if reuse and not self._closed and connection.finish():
            connection.idle_since = connection.loop.time()
            self._idle.append(connection)
            self._prune()
        else:
            connection.close()

    def close(self) -> None:
        """Close the idle connections; those in use close when their responses do."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def _acquire(self) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns at once
            return
        try:
            await asyncio.wait_for(self._slots.acquire(), self.timeout)
        except asyncio.TimeoutError:
            raise PoolTimeout(f"all connections to {self.url} stayed busy") from None

    def _idle_connection(self) -> Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable and self._fresh(connection):
                return connection
            connection.close()
        return None

    def _fresh(self, connection: Connection) -> bool:
        return connection.loop.time() - connection.idle_since < self._keepalive_expiry

    def _prune(self) -> None:
        """Drop the oldest idle connections once expired or closed by the worker."""
        while self._idle and not (self._idle[0].reusable and self._fresh(self._idle[0])):
            self._idle.pop(0).close()

    async def _connect(self) -> Connection:
        if self._closed:
            raise ConnectError(f"the worker {self.url} was removed")
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(loop),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                ),
                self._connect_timeout,
            )
        except asyncio.TimeoutError:
            raise ConnectTimeout() from None
        except OSError as exc:
            raise ConnectError(str(exc)) from exc
        return connection

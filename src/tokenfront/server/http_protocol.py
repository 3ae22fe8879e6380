"""uvicorn's httptools protocol with every connection bounded by `ConnectionLimits`.

uvicorn bounds none of what a client controls before its request reaches the app: a connection that sends
nothing, a head trickled a byte at a time, or a body shorter than its Content-Length stays open for ever, and
httptools buffers a header line of any length (it joins the pieces of an unfinished name or value, so 8
connections each sending a 32 MB header value cost the process ~400 MB). `BoundedHttpProtocol` adds, per
connection:

- a size and a line-count limit on the request head (`max_header_bytes`, `max_headers`): the parser is never
  fed more than `max_header_bytes` of a head, so nothing above the limit is buffered; over either, a 431 (the
  one inexact case: a pipelined head that begins in the same read as the end of the request before it is
  counted from the next read, so at most twice the limit of it reaches the parser, as httptools does not say
  where in a read a request ended);
- a deadline for the head (`header_timeout`: from the connection opening for its first request, from the
  head's first byte for a later one): a 408, or just a close for a connection that sent nothing;
- a deadline for each gap in the body (`body_timeout`, reset by every byte that arrives; paused while the app,
  not the client, is what the body waits on): a 408, and the handler waiting on `receive()` gets
  `http.disconnect`;
- a cap on the process's connections (`max_connections`, counted by the `ConnectionTable` its servers share):
  at the cap a new connection reclaims the one that has waited longest without a request in progress (idle on
  keep-alive, silent, or still sending its head; a refused one draining its answer first), and when every
  connection has a request in progress it is answered 503 and closed.

The idle keep-alive timeout is uvicorn's own (`timeout_keep_alive`), set from `keep_alive_timeout`. Every
refusal is an OpenAI error object with `connection: close`; the connection then stops being read for requests
but is drained (what still arrives is dropped) for a moment before it closes, so the client can read the answer
rather than have it destroyed by the reset that closing a socket with unread data sends.

The hot path pays a few comparisons: a request whose head and body arrive in one read arms no timer of its own.
A keep-alive answer of the direct lane's whole-request read is held until the end of the event loop's turn
(`HeldAnswers`): the answers of one turn go out back to back, so a client waiting on several of them is woken
once rather than once per answer (each wake-up is a cross-core interrupt for the sending process). It is sent
before anything else happens to its connection: a next read, a close, a shutdown, the keep-alive timeout.

This subclasses uvicorn's protocol and reads its per-connection state (the cycle, the pipeline, flow control,
the keep-alive timer), written against uvicorn 0.54: tests/robustness/test_connections.py fails if an upgrade
changes what it relies on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from tokenfront.server.connection_limits import ConnectionLimits
from tokenfront.server.direct import DirectLane
from tokenfront.server.errors import error_body

__all__ = ["BoundedHttpProtocol", "ConnectionTable", "HeldAnswers", "bounded_protocol"]

log = logging.getLogger(__name__)

# Where a connection is in its current request.
_READING_HEAD = 0  # waiting for, or reading, a request head
_READING_BODY = 1  # the head is in, the body is arriving
_MESSAGE_READ = 2  # the whole request is in (its answer may still be running); idle once it is answered
_CLOSING = 3  # refused or reclaimed: nothing more is parsed

# After a refusal, how long and how much of what the client still sends is read and dropped before closing.
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 1 << 20
# How often, at most, the connection cap being reached is logged.
_CAP_LOG_INTERVAL_SECONDS = 60.0


class _HeadTooLarge(Exception):
    """More than `max_header_bytes` went by without a request head ending."""


class _TooManyHeaders(Exception):
    """A request head with more than `max_headers` header lines (raised inside the parser's callback)."""


class ConnectionTable:
    """The open connections of one server process, counted against the cap (every server of the process that
    shares the table together), and those the cap may reclaim, longest-waiting first: the ones without a
    request in progress. Also counts what the cap did, for its log line."""

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self.open = 0
        self._waiting: OrderedDict[BoundedHttpProtocol, None] = OrderedDict()
        self._reclaimed = 0
        self._refused = 0
        self._logged_at: float | None = None

    def waiting(self, connection: BoundedHttpProtocol, *, first: bool = False) -> None:
        """`connection` has no request in progress from now; `first` puts it ahead of all the others."""
        self._waiting[connection] = None  # a new key goes last, as wanted but for `first`
        if first:
            self._waiting.move_to_end(connection, last=False)

    def answered(self, connection: BoundedHttpProtocol) -> None:
        """`connection`'s request was answered in the read that brought it: waiting again, now the last the
        cap reclaims (`busy` then `waiting` in one step)."""
        waiting = self._waiting
        if connection in waiting:
            waiting.move_to_end(connection)
        else:
            waiting[connection] = None

    def busy(self, connection: BoundedHttpProtocol) -> None:
        """`connection` has a request in progress, or is gone: not to be reclaimed."""
        self._waiting.pop(connection, None)

    def admit(self) -> bool:
        """Count a new connection, making room at the cap by closing the connection that has waited longest;
        False (and not counted) when every open connection has a request in progress."""
        self.open += 1
        if self.open <= self.max_connections:
            return True
        if not self._waiting:
            self.open -= 1
            self._note(refused=True)
            return False
        victim, _ = self._waiting.popitem(last=False)
        victim.drop()  # uncounts it
        self._note(refused=False)
        return True

    def release(self) -> None:
        """A counted connection is closing: its place is free."""
        self.open -= 1

    def _note(self, *, refused: bool) -> None:
        if refused:
            self._refused += 1
        else:
            self._reclaimed += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= _CAP_LOG_INTERVAL_SECONDS:
            log.warning(
                "the connection cap (--max-connections %d) is reached: %d waiting connections closed to make room "
                "and %d new connections refused with a 503%s",
                self.max_connections,
                self._reclaimed,
                self._refused,
                "" if self._logged_at is None else " since the last such line",
            )
            self._logged_at = now
            self._reclaimed = self._refused = 0


class HeldAnswers:
    """The connections of one server process whose direct-lane answer waits for the end of the event loop's
    turn, sent together then (one `call_soon` a turn, the first hold of the turn scheduling it)."""

    def __init__(self) -> None:
        self._held: list[BoundedHttpProtocol] = []

    def hold(self, connection: BoundedHttpProtocol) -> None:
        """`connection` holds an answer (`BoundedHttpProtocol.send_held`) to send at the end of this turn."""
        if not self._held:
            connection.loop.call_soon(self._send)
        self._held.append(connection)

    def _send(self) -> None:
        held, self._held = self._held, []
        for connection in held:
            connection.send_held()


def bounded_protocol(
    limits: ConnectionLimits, direct: DirectLane | None = None
) -> Callable[..., BoundedHttpProtocol]:
    """What `uvicorn.Config(http=...)` takes: builds each connection's protocol, every connection of the server
    process sharing one `ConnectionTable`. (Built before a pre-fork: each child gets its own copy of the
    table, empty, as the parent never serves.) `direct`: the app's direct lane (`server.direct`), if any."""
    table = ConnectionTable(limits.max_connections)
    held = HeldAnswers()

    def create(
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> BoundedHttpProtocol:
        return BoundedHttpProtocol(
            config, server_state, app_state, _loop, limits=limits, table=table, direct=direct, held=held
        )

    return create


class BoundedHttpProtocol(HttpToolsProtocol):
    """One client connection: uvicorn's httptools protocol, with the bounds of `ConnectionLimits`."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits,
        table: ConnectionTable,
        held: HeldAnswers,
        direct: DirectLane | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.table = table
        self.direct = direct
        self.held = held
        self._held_answer: bytes | None = None  # a direct-lane answer to send at the end of the loop's turn
        self._direct_cycle: RequestResponseCycle | None = None  # taken by the direct lane, its body coming
        self._max_header_bytes = limits.max_header_bytes  # read on every read: one attribute, not two
        self._max_headers = limits.max_headers
        self._phase = _READING_HEAD
        self._head_bytes = 0  # bytes fed to the parser since the last head or request ended
        self._head_begun = False  # the parser has seen the current head's first byte
        self._deadline: asyncio.TimerHandle | None = None  # the head's, or the body's next byte's
        self._dropped = 0  # bytes read and dropped after a refusal
        self._pending_refusal: tuple[int, str, str] | None = None  # to answer once earlier answers are out
        self._counted = False  # counted against the cap (`ConnectionTable.open`)
        # The loop time of the last answer given without the parser while the keep-alive timer ran on (its
        # handler then sets it again for the rest of the idle time rather than close the connection).
        self._answered_at = float("-inf")

    # -- the connection -------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.table.admit():
            self._refuse_at_capacity()
            return
        self._counted = True
        self.table.waiting(self)
        self._set_deadline(self.limits.header_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._held_answer = None  # the client is gone: nothing to send it
        self._release_direct()
        self._phase = _CLOSING
        self._cancel_deadline()
        self._uncount()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._held_answer is not None:  # a read in the same turn as the answer before it: that goes first
            self.send_held()
        if (
            self.direct is not None
            and not self._head_begun
            and self._head_bytes == 0
            and (self._phase == _READING_HEAD or self._phase == _MESSAGE_READ)
            and (self.cycle is None or self.cycle.response_complete)
            and self._answer_whole(data)
        ):
            return
        if self._phase == _CLOSING:
            self._drop_input(data)
            return
        self._unset_keepalive_if_required()
        try:
            if self._phase != _READING_BODY and len(data) <= self._max_header_bytes - self._head_bytes:
                self._head_bytes += len(data)  # the usual read: a whole head (and body) within the limit
                self.parser.feed_data(data)
            else:
                self._feed(data)
        except _HeadTooLarge:
            self._refuse(
                431,
                f"the request head is larger than this server's limit of {self.limits.max_header_bytes} bytes "
                "(--max-header-bytes)",
                code="request_headers_too_large",
            )
            return
        except httptools.HttpParserUpgrade:
            # As uvicorn does (tokenfront serves no WebSocket route: without a WebSocket library this warns).
            if self._should_upgrade():
                self.handle_websocket_upgrade()
                return
            self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _TooManyHeaders):
                self._refuse_too_many_headers()
            else:
                self.logger.warning("Invalid HTTP request received.")
                self._refuse(400, f"invalid HTTP request: {exc}", code="invalid_http_request")
            return
        if self._phase != _MESSAGE_READ or self.cycle.response_complete:  # else: nothing to arm
            self._after_read()

    def _feed(self, data: bytes) -> None:
        """Feed `data` to the parser, never more than `max_header_bytes` of one head: a head's bytes are fed up
        to the limit, and the rest only if a head ended within them (its end resets the count)."""
        limit = self._max_header_bytes
        while self._phase != _READING_BODY and len(data) > limit - self._head_bytes:
            room = limit - self._head_bytes
            if room > 0:
                self._head_bytes = limit
                self.parser.feed_data(data[:room])
                data = data[room:]
            if self._head_bytes >= limit:
                raise _HeadTooLarge
        if self._phase != _READING_BODY:
            self._head_bytes += len(data)
        self.parser.feed_data(data)

    def _after_read(self) -> None:
        """Arm the deadline the connection's phase has after a read."""
        if self._phase == _READING_BODY:
            self._set_deadline(self.limits.body_timeout, self._body_timed_out)  # a byte came: a fresh gap
        elif self._phase == _READING_HEAD:
            if self._head_begun and len(self.headers) > self._max_headers:
                self._refuse_too_many_headers()
                return
            # A later request's first bytes start its deadline; the first request's runs from the opening.
            if self._deadline is None:
                self._set_deadline(self.limits.header_timeout, self._head_timed_out)
        elif (
            self.cycle is not None
            and self.cycle.response_complete
            and not self.pipeline
            and self.timeout_keep_alive_task is None
            and not self.transport.is_closing()
        ):
            # The answer went out before the body was all in (a 413, a 401): uvicorn armed its keep-alive timer
            # then, and the body's bytes disarmed it. Idle from now, as after any answer.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    # -- parser callbacks -----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _READING_HEAD
        self._head_begun = True

    # The header lines are counted where a head ends (here) and after each read of an unfinished one
    # (`_after_read`), not line by line: a callback per line would cost every request more than the count.
    def on_headers_complete(self) -> None:
        if len(self.headers) > self._max_headers:
            raise _TooManyHeaders  # httptools stops parsing and raises HttpParserCallbackError from it
        self._phase = _READING_BODY
        self._head_bytes = 0
        self._head_begun = False
        if self._deadline is not None:
            self._cancel_deadline()
        self.table.busy(self)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _MESSAGE_READ
        self._head_bytes = 0
        if self._deadline is not None:
            self._cancel_deadline()
        super().on_message_complete()
        cycle = self._direct_cycle
        if cycle is not None:
            self._direct_cycle = None
            if cycle is self.cycle and not self._answer_directly(cycle):
                super()._start_asgi_task(cycle, self.app)

    # -- the direct lane (server.direct) ----------------------------------------------------------------------

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """uvicorn starts a request's ASGI task here (its head is in): a request the direct lane takes waits for
        its body instead, and is answered then (`on_message_complete`), or started after all."""
        direct = self.direct
        if (
            direct is not None
            and app is self.app  # not uvicorn's 503 at its concurrency limit
            and not cycle.waiting_for_100_continue
            and direct.takes(cycle.scope)  # type: ignore[arg-type]
        ):
            if cycle.more_body:
                self._direct_cycle = cycle
                return
            if self._answer_directly(cycle):  # a pipelined request, its body already in
                return
        super()._start_asgi_task(cycle, app)

    def _answer_whole(self, data: bytes) -> bool:
        """Answer `data` on the direct lane when it is one whole request read without the parser
        (`DirectLane.answer_whole`), as `_answer_directly` and uvicorn's cycle would after the parser; False:
        not answered, the parser reads `data`. Between requests only (nothing of a head fed to the parser,
        no answer in progress)."""
        assert self.direct is not None
        if self.pipeline or self.flow.write_paused or self.transport.is_closing():
            return False
        answered = self.direct.answer_whole(
            data, self._max_header_bytes, self._max_headers, self.server_state.default_headers
        )
        if answered is None:
            return False
        answer, keep_alive = answered
        self.server_state.total_requests += 1
        self._phase = _MESSAGE_READ
        if self._deadline is not None:
            self._cancel_deadline()  # the first request's head deadline
        if not keep_alive:
            self.transport.write(answer)
            self.transport.close()
            return True
        self._held_answer = answer
        self.held.hold(self)
        self.table.answered(self)  # waiting again, the last the cap reclaims
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
        else:  # left running: its handler reckons the idle time from this answer
            self._answered_at = self.loop.time()
        return True

    def send_held(self) -> None:
        """Write the direct-lane answer held for the end of the loop's turn (`HeldAnswers`), if still held."""
        answer = self._held_answer
        if answer is not None:
            self._held_answer = None
            if not self.transport.is_closing():  # closed by a path that had nothing to send first
                self.transport.write(answer)

    def timeout_keep_alive_handler(self) -> None:
        self.send_held()  # a timeout of 0 s fires before the turn's answers are sent
        idle_left = self._answered_at + self.timeout_keep_alive - self.loop.time()
        if idle_left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(idle_left, self.timeout_keep_alive_handler)
            return
        super().timeout_keep_alive_handler()

    def _release_direct(self) -> None:
        """A request the direct lane took whose body will not come in (the client left or stalled): start it
        on the usual path after all, so that it ends there as any request does (told the client is gone,
        counted)."""
        cycle = self._direct_cycle
        if cycle is not None:
            self._direct_cycle = None
            super()._start_asgi_task(cycle, self.app)

    def _answer_directly(self, cycle: RequestResponseCycle) -> bool:
        """Answer a request the direct lane took, as uvicorn's cycle would have sent it; False: not answered
        (the usual path answers it)."""
        if self.direct is None or self.flow.write_paused or self.transport.is_closing():
            return False
        answer = self.direct.answer(
            cycle.scope,  # type: ignore[arg-type]
            bytes(cycle.body),
            keep_alive=cycle.keep_alive,
            default_headers=cycle.default_headers,
        )
        if answer is None:
            return False
        cycle.response_started = cycle.response_complete = True
        cycle.body = bytearray()
        self.transport.write(answer)
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is None:
            return  # uvicorn started a pipelined request (or the connection is closing)
        # uvicorn armed its keep-alive timer: no request of this connection is in progress now.
        if self._pending_refusal is not None:
            status, message, code = self._pending_refusal  # the answers before it are all out
            self._pending_refusal = None
            self._refuse(status, message, code=code)
        else:
            self.table.waiting(self)

    def shutdown(self) -> None:
        self.send_held()
        if self._phase == _CLOSING and self._pending_refusal is None:  # a refusal draining: done with
            self.transport.close()
            return
        super().shutdown()  # closes an idle connection; lets an answer in progress finish first

    # -- deadlines --------------------------------------------------------------------------------------------

    def _set_deadline(self, seconds: float, callback: Callable[[], None]) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(seconds, callback)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _server_holds_the_client(self) -> bool:
        """Whether the client is waiting on the server rather than the other way round: reading is paused (the
        app has not asked for more body yet, or a pipelined request waits behind one still being answered), the
        client waits for `100 Continue`, or an answer is still being written on this connection."""
        cycle = self.cycle
        return self.flow.read_paused or (
            cycle is not None
            and not cycle.response_complete
            and (cycle.waiting_for_100_continue or self._phase == _READING_HEAD)
        )

    def _deadline_holds(self, phase: int, seconds: float, callback: Callable[[], None]) -> bool:
        """Whether a deadline that has just passed is the client's to bear: the connection is still in the
        `phase` it was set for, and the client, not the server, is the one waited on (otherwise it is set
        again, for `seconds` more)."""
        self._deadline = None
        if self._phase != phase or self.transport.is_closing():
            return False
        if self._server_holds_the_client():
            self._set_deadline(seconds, callback)
            return False
        return True

    def _head_timed_out(self) -> None:
        if not self._deadline_holds(_READING_HEAD, self.limits.header_timeout, self._head_timed_out):
            return
        if not (self._head_begun or self._head_bytes):
            self._close_now()  # sent nothing: nothing to answer
            return
        self._refuse(
            408,
            f"the request head did not arrive within {self.limits.header_timeout:g} s (--header-timeout)",
            code="request_header_timeout",
        )

    def _body_timed_out(self) -> None:
        if not self._deadline_holds(_READING_BODY, self.limits.body_timeout, self._body_timed_out):
            return
        self._release_direct()
        cycle = self.cycle
        answered = cycle.response_started
        # The handler waiting on the body learns the client is gone: receive() answers http.disconnect, and
        # whatever it sends is dropped (uvicorn's send returns at once for a disconnected cycle).
        cycle.disconnected = True
        cycle.message_event.set()
        if answered:
            self._close_now()  # an answer has begun: no status can be sent any more
            return
        self._refuse(
            408,
            f"the request body stopped arriving: no byte for {self.limits.body_timeout:g} s (--body-timeout)",
            code="request_body_timeout",
        )

    # -- refusing and closing -------------------------------------------------------------------------------

    def _answer(self, status: int, message: str, *, code: str, error_type: str) -> None:
        """Write an OpenAI error answer with `connection: close` (the connection closes after it)."""
        body = orjson.dumps(error_body(message, error_type=error_type, code=code))
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json\r\ncontent-length: ",
                str(len(body)).encode("ascii"),
                b"\r\nconnection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))

    def _refuse(self, status: int, message: str, *, code: str) -> None:
        """Answer a client's mistake, then stop reading requests and close once the client had time to read it:
        meanwhile what it still sends is dropped unread (it was never parsed, so never buffered)."""
        self._phase = _CLOSING
        self._cancel_deadline()
        self._unset_keepalive_if_required()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.disconnected:
            # A pipelined request refused while those before it are still being answered: written now, the
            # refusal would land inside their answers. It goes out after them (`on_response_complete`).
            self._pending_refusal = (status, message, code)
            return
        self._answer(status, message, code=code, error_type="invalid_request_error")
        self.table.waiting(self, first=True)  # done: the first the cap reclaims
        self.flow.resume_reading()  # to drain, if a pipelined request had paused it
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads the answer, then end of stream
        self._deadline = self.loop.call_later(_LINGER_SECONDS, self._close_now)

    def _refuse_too_many_headers(self) -> None:
        self.headers.clear()  # not kept while the connection drains
        self._refuse(
            431,
            f"the request head has more than this server's limit of {self._max_headers} header lines "
            "(--max-headers)",
            code="too_many_request_headers",
        )

    def _drop_input(self, data: bytes) -> None:
        self._dropped += len(data)
        if self._dropped > _LINGER_BYTES:
            self._close_now()

    def _refuse_at_capacity(self) -> None:
        """The cap is reached and no connection can be reclaimed: a 503, closed at once (holding it open to
        drain would take a descriptor the cap is there to keep)."""
        self._phase = _CLOSING
        self._answer(
            503,
            f"this server process has {self.limits.max_connections} connections open, each with a request in "
            "progress (--max-connections); retry shortly",
            code="too_many_connections",
            error_type="service_unavailable",
        )
        self.transport.close()

    def drop(self) -> None:
        """Close a connection without a request in progress, to make room under the cap."""
        self._uncount()  # from now: its descriptor is released as it closes
        self._close_now()

    def _uncount(self) -> None:
        self.table.busy(self)
        if self._counted:
            self._counted = False
            self.table.release()

    def _close_now(self) -> None:
        self.send_held()
        self._phase = _CLOSING
        self._cancel_deadline()
        self._unset_keepalive_if_required()
        self.table.busy(self)
        if not self.transport.is_closing():
            self.transport.close()

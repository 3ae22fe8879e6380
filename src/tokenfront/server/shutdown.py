"""Graceful shutdown: what a server does with its requests between SIGTERM and its exit.

When the server starts shutting down (`Drain.begin`, called by `server.process` as uvicorn stops listening),
requests already in flight go on; a request that starts after that (a keep-alive connection racing the
shutdown) is answered 503 at once, so a router retries it elsewhere. At the deadline (`--shutdown-timeout`)
the hooks run (the worker aborts its engine sequences) and every request still in flight is cut, each in its
API's own shape:

- no response started yet: 503 with an OpenAI error body (code `server_shutting_down`);
- a server-sent event stream: an error event, then `data: [DONE]`, then the end of the body;
- any other response already started: the connection is closed (a partial JSON body cannot be repaired).

Whatever the request's handler still sends is dropped. A handler told to stop by a hook ends on its own; one
still running a second later is cancelled (its own clean-up closes what it waited for, such as a worker's
relayed stream).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenfront.server.errors import error_body, error_response
from tokenfront.server.sse import SSE_DONE, sse_event

# Seconds in-flight requests get to finish after SIGTERM (`--shutdown-timeout`).
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


__all__ = ["DEFAULT_SHUTDOWN_TIMEOUT", "SHUTTING_DOWN_CODE", "Drain"]

log = logging.getLogger(__name__)

SHUTTING_DOWN_CODE = "server_shutting_down"
# Seconds after the cut answers go out at the deadline before a handler still running is cancelled. Enough
# for one that was told to stop (the worker's aborted sequences) to return on its own.
_CANCEL_AFTER = 1.0


class _Flight:
    """One request in flight: what has been sent of its response, and whether it was cut."""

    __slots__ = (
        "_send",
        "answer",
        "cancelled",
        "complete",
        "cut",
        "done_sent",
        "ended_event",
        "receive",
        "returned",
        "scope",
        "started",
        "stream",
        "task",
    )

    def __init__(self, scope: Scope, receive: Receive, send: Send, task: asyncio.Task[Any] | None) -> None:
        self.scope, self.receive, self._send, self.task = scope, receive, send, task
        self.started = False
        self.stream = False
        self.complete = False
        self.ended_event = True  # the body so far ends between two server-sent events
        self.done_sent = False
        self.cut = False  # the handler's sends are dropped from now on
        self.answer: asyncio.Task[None] | None = None  # sends the cut answer
        self.cancelled = False  # the drain cancelled the handler
        self.returned = False  # the handler is done

    async def receive_(self) -> Message:
        message = await self.receive()
        if self.cut and message["type"] == "http.disconnect":
            # The connection ends because the cut answer is out, not because the client left: the handler is
            # stopped by the hooks, or cancelled, not told that its client went away.
            await asyncio.Event().wait()
        return message

    async def send(self, message: Message) -> None:
        if self.cut:
            return  # the cut answer is on its way (or gone): nothing more of the handler's
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
            for name, value in message.get("headers", ()):
                if name.lower() == b"content-type":
                    self.stream = value.startswith(b"text/event-stream")
        elif kind == "http.response.body":
            body = message.get("body", b"")
            if body:
                self.ended_event = body.endswith(b"\n\n")
                self.done_sent = body.endswith(SSE_DONE)
            if not message.get("more_body", False):
                self.complete = True
        await self._send(message)

    async def send_cut_answer(self, message: str) -> None:
        """The answer of a request cut at the deadline, in its API's shape (module docstring)."""
        try:
            if not self.started:
                await _shutting_down(message)(self.scope, self.receive, self._send)
            elif self.stream:
                tail = b"" if self.ended_event else b"\n\n"
                if not self.done_sent:
                    body = error_body(
                        message + "; the answer is incomplete", error_type="service_unavailable"
                    )
                    body["error"]["code"] = SHUTTING_DOWN_CODE
                    tail += sse_event(body) + SSE_DONE
                await self._send({"type": "http.response.body", "body": tail, "more_body": False})
            # else: a JSON body half sent cannot be ended well; the server closes the connection.
        except Exception:  # the client is gone already
            log.debug("cannot send the answer of a request cut at shutdown", exc_info=True)


class Drain:
    """The requests in flight on one server, and what happens to them when it shuts down (module docstring).

    `serve` wraps every HTTP request; `begin` (in the event loop) starts the shutdown with its timeout;
    `on_deadline` registers what must run when the timeout is over, before the requests are cut.
    """

    def __init__(self) -> None:
        self.draining = False
        self.timeout = DEFAULT_SHUTDOWN_TIMEOUT
        self._flights: set[_Flight] = set()
        self._hooks: list[Callable[[], None]] = []

    @property
    def in_flight(self) -> int:
        """Requests not answered yet."""
        return len(self._flights)

    def on_deadline(self, hook: Callable[[], None]) -> None:
        """Run `hook` (synchronously, in the event loop) when the shutdown timeout is over."""
        self._hooks.append(hook)

    def begin(self, timeout: float) -> None:
        """Start draining: refuse new requests, cut the ones still in flight after `timeout` seconds."""
        if self.draining:
            return
        self.draining = True
        self.timeout = timeout
        if self._flights:
            log.info(
                "shutting down: %d request(s) in flight get up to %g s to finish", len(self._flights), timeout
            )
        asyncio.get_running_loop().call_later(max(timeout, 0.0), self.deadline)

    def deadline(self) -> None:
        """The shutdown timeout is over: run the hooks, answer every request still in flight with its cut
        answer, and cancel the handlers that have not returned `_CANCEL_AFTER` seconds later."""
        for hook in self._hooks:
            try:
                hook()
            except Exception:
                log.exception("a shutdown hook failed")
        flights = [flight for flight in self._flights if not flight.complete]
        if not flights:
            return
        log.warning(
            "shutdown timeout (%g s) is over: cutting %d request(s) still in flight",
            self.timeout,
            len(flights),
        )
        message = (
            f"the server is shutting down: the request did not finish within the shutdown timeout "
            f"({self.timeout:g} s)"
        )
        loop = asyncio.get_running_loop()
        for flight in flights:
            flight.cut = True
            flight.answer = loop.create_task(flight.send_cut_answer(message))
        loop.call_later(_CANCEL_AFTER, self._cancel, flights)

    @staticmethod
    def _cancel(flights: list[_Flight]) -> None:
        for flight in flights:
            if not flight.returned and flight.task is not None:
                flight.cancelled = True
                flight.task.cancel()

    async def serve(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Run one HTTP request through `app`, tracked; refused with 503 while draining."""
        if self.draining:
            refusal = _shutting_down("the server is shutting down and takes no new requests")
            await refusal(scope, receive, send)
            return
        task = asyncio.current_task()
        flight = _Flight(scope, receive, send, task)
        self._flights.add(flight)
        try:
            await app(scope, flight.receive_, flight.send)
        except asyncio.CancelledError:
            if not flight.cancelled:
                raise
            if task is not None and sys.version_info >= (3, 11):
                task.uncancel()  # the cancellation was this drain's: the request has its cut answer
        except Exception:
            if not flight.cut:
                raise
            log.debug("a request cut at shutdown ended with an error", exc_info=True)
        finally:
            flight.returned = True
            self._flights.discard(flight)
        if flight.answer is not None:
            await asyncio.shield(flight.answer)  # out before the server looks at what was sent


def _shutting_down(message: str) -> ASGIApp:
    response = error_response(503, message, code=SHUTTING_DOWN_CODE, error_type="service_unavailable")
    response.headers["connection"] = "close"
    return response

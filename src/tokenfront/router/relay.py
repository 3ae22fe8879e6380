"""A worker's stream relayed to the client event by event as it arrives, never buffered.

The proxy hands a stream over once its first event is in (`RelayResponse`): until then a failure is retried on
another worker; after it the client has part of the answer, so a break — the connection lost, the event format
broken, a bound passed, the worker silent for `--idle-timeout` — ends the stream with an error event and
`data: [DONE]`. What is relayed is a worker's events as they arrive (`worker_answers.RelayedStream`) or a
generate worker's output derendered into OpenAI events (`generate.GenerateStream`): both a `ChunkSource`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tokenfront.router.connections import AnswerTooLarge, WorkerResponse, WorkerTransportError
from tokenfront.router.interrupt import Interrupt, watch_disconnect
from tokenfront.router.planning import Plan, WorkerCall
from tokenfront.router.policies.base import WorkerLoad
from tokenfront.router.worker import Worker
from tokenfront.router.worker_failures import NO_WORKER_CODE, client_error, failure_reason
from tokenfront.server.errors import error_body
from tokenfront.server.sse import SSE_DONE, sse_event

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from tokenfront.router.proxy import Decision, Proxy

__all__ = ["ChunkSource", "RelayResponse"]

log = logging.getLogger(__name__)


class RelayResponse(StreamingResponse):
    """A worker's stream, relayed to the client event by event as it arrives, never buffered.

    A break after the first event — the connection lost, the event format broken, a bound passed, the worker
    silent for `--idle-timeout` — ends it with an error event and `data: [DONE]` (the client already has part
    of the answer, so it cannot be retried). A client that leaves ends it too, and so closes the worker's request (the worker
    stops generating). However the response ends — even if it is never sent — `finish` releases the worker's
    connection and ends the attempt, once.

    Sent by its own `__call__`: one disconnect watcher task, rather than Starlette's task group of two tasks
    around every stream.
    """

    def __init__(
        self,
        proxy: Proxy,
        worker: Worker,
        load: WorkerLoad,
        plan: Plan,
        call: WorkerCall,
        response: WorkerResponse,
        source: ChunkSource,
        first: bytes | None,
        headers: dict[str, str],
        decision: Decision,
    ) -> None:
        super().__init__(self._chunks(first), status_code=response.status_code, headers=headers)
        self.proxy, self.worker, self.load, self.plan, self.response = proxy, worker, load, plan, response
        self.call, self.source, self.decision = call, source, decision
        self.span: Span | None = None  # the worker call's client span (`Proxy`'s traced attempt), ended here
        self._done = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        interrupt = Interrupt()
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, interrupt))
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            # Before the last message: once a response is complete, `receive` says "disconnect".
            interrupt.disarm()
            watcher.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if interrupt.take() != "client":
                raise
        except OSError:  # a server that raises when the client has gone (ASGI spec 2.4)
            pass
        finally:
            interrupt.disarm()
            watcher.cancel()
            iterator = self.body_iterator
            if isinstance(iterator, AsyncGenerator):
                await iterator.aclose()
            self.finish(ok=False)  # a no-op when the stream ended on its own

    async def _chunks(self, first: bytes | None) -> AsyncIterator[bytes]:
        ok = False
        source, prefilled = self.source, False
        try:
            chunk = first
            while chunk is not None:
                if not prefilled and source.produced:  # the first output: the prompt's prefill is done
                    prefilled = True
                    self.proxy.policy_for(self.plan).on_first_token(self.load, self.plan.target)
                    if self.proxy.sync is not None:
                        self.proxy.sync.first_token(self.load, self.plan.target)
                yield chunk
                chunk = await source.next_chunk()
            ok = True
            self.proxy.routing_metrics.answered(self.decision.routing, self.plan.target, self.source.usage)
        except WorkerTransportError as exc:
            reason = failure_reason(exc)
            if not isinstance(exc, AnswerTooLarge) or exc.worker_fault:
                self.proxy.pool.mark_failed(self.worker, f"stream broke ({reason})")
            log.warning("stream from %s ended early: %s", self.worker.url, reason)
            message = (
                f"the worker {self.worker.url} failed while streaming ({reason}); the answer is incomplete"
            )
            # A connection that broke keeps the code it always had (none); the worker's answer is the cause else.
            code: str | None = client_error(exc)[1]
            code = None if code == NO_WORKER_CODE else code
            yield sse_event(error_body(message, error_type="server_error", code=code)) + SSE_DONE
        finally:
            self.finish(ok=ok)

    def finish(self, *, ok: bool) -> None:
        """Release the worker's connection and end the attempt (`Proxy.finish_attempt`) and its span, once."""
        if not self._done:
            self._done = True
            self.response.close()
            self.proxy.finish_attempt(self.worker, self.load, self.plan, self.call, ok=ok)
            if self.span is not None:
                if not ok:
                    self.span.set_attribute("tokenfront.stream_complete", False)
                self.span.end()


class ChunkSource(Protocol):
    """What a relayed stream reads: a worker's events as they arrive (`RelayedStream`), or a generate stream
    derendered (`GenerateStream`); `usage` is the worker's usage object once an event carried one, `produced`
    whether an event carried generated output yet."""

    usage: Any
    produced: bool

    async def next_chunk(self) -> bytes | None: ...

"""One choice: an engine sequence, read by the output core's `ChoiceParser` as its ids arrive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.requests import Request

from tokenfront.core.output import ChoiceParser, FinishedChoice, OutputDelta
from tokenfront.server.disconnect import unless_disconnected
from tokenfront.server.errors import APIError
from tokenfront.server.tracing import Attributes, Tracing
from tokenfront.worker.engine import NO_TOKEN, Engine, GenerationRequest, TokenOutput
from tokenfront.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

__all__ = ["ChoiceEvent", "ChoiceRun", "collect", "merged_events"]


@dataclass
class ChoiceEvent:
    """What one choice adds: its delta (the finish reason on the last) and the tokens since the last event."""

    index: int
    delta: OutputDelta
    tokens: list[TokenOutput]


@dataclass
class ChoiceRun:
    """One engine sequence (one choice) and the output parser that reads it."""

    index: int
    request: GenerationRequest
    parser: ChoiceParser
    engine: Engine
    metrics: WorkerMetrics
    route: str
    tracing: Tracing | None = None  # with it, the sequence is a `generate` span (`server.tracing`)
    tokens: list[TokenOutput] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: str | None = None
    finished: bool = False
    _submitted: bool = False

    def events(self) -> AsyncIterator[ChoiceEvent]:
        """Run the sequence; yield an event whenever there is text to show, and a last one with the reason."""
        if self.tracing is None:
            return self._events()
        request = self.request
        attributes: Attributes = {
            "gen_ai.request.id": request.request_id,
            "gen_ai.usage.input_tokens": len(request.prompt_token_ids),
            "gen_ai.request.max_tokens": request.params.max_tokens,
        }
        return self.tracing.traced_stream("generate", self._events(), attributes, self._span_end)

    def _span_end(self) -> dict[str, int | list[str]]:
        """The `generate` span's attributes known at its end."""
        return {
            "gen_ai.usage.output_tokens": len(self.tokens),
            "tokenfront.cached_tokens": self.cached_tokens,
            "gen_ai.response.finish_reasons": [self.finish_reason or "abort"],
        }

    async def _events(self) -> AsyncIterator[ChoiceEvent]:
        stream = self.engine.submit(self.request)
        self._submitted = True
        outputs = stream.__aiter__()
        finish = "abort"  # an engine stream that ends without a reason was cut short
        pending: list[TokenOutput] = []
        delta = OutputDelta()  # text not yet sent: the last token's goes out with the finish reason
        try:
            async for output in outputs:
                self.cached_tokens = stream.cached_tokens or 0
                if output.token_id != NO_TOKEN:  # an abort output carries no token
                    self.tokens.append(output)
                    pending.append(output)
                    delta.extend(self.parser.push(output.token_id))
                if self.parser.stopped:
                    self.cancel("stop_string")
                    break
                if output.finish_reason is not None:
                    finish = output.finish_reason
                    break
                if delta:
                    yield ChoiceEvent(self.index, delta, pending)
                    pending, delta = [], OutputDelta()
        except BaseException:
            self.cancel("error")  # a no-op when the caller already cancelled it for its own reason
            raise
        finally:
            with contextlib.suppress(Exception):
                await outputs.aclose()  # type: ignore[attr-defined]
        self.finished = True
        delta.extend(self.parser.finish(finish))  # a stop string makes it "stop", calls "tool_calls"
        self.finish_reason = delta.finish_reason
        self.metrics.sequences.labels(self.route, delta.finish_reason).inc()
        yield ChoiceEvent(self.index, delta, pending)

    def cancel(self, reason: str) -> None:
        """Abort the engine sequence if it is still running (stop string found, client gone, error)."""
        if self._submitted and not self.finished:
            self.finished = True
            if self.engine.cut_at_shutdown:
                # The shutdown deadline aborted every sequence: the request is being cut, its client did not
                # leave (a handler cancelled after the cut ends up here too).
                reason = "shutdown"
            self.engine.abort(self.request.request_id)
            self.metrics.aborts.labels(reason).inc()
            if reason == "client_disconnected":
                log.info("client disconnected: aborted %s", self.request.request_id)


async def collect(run: ChoiceRun) -> FinishedChoice:
    """Run a choice to its end, for a non-streaming answer."""
    # The events' text joined once at the end: `extend` per event would copy the text so far each time.
    deltas = [event.delta async for event in run.events()]
    output = OutputDelta(
        "".join(delta.reasoning for delta in deltas),
        "".join(delta.content for delta in deltas),
        [call for delta in deltas for call in delta.tool_calls],
        deltas[-1].finish_reason if deltas else None,
    )
    return FinishedChoice(run.index, output, run.tokens)


async def collect_all(runs: list[ChoiceRun], raw: Request) -> list[FinishedChoice]:
    """Run every choice to its end, for a non-streaming answer, while watching the client.

    The client leaving aborts the runs and raises `ClientDisconnected`; the engine refusing a sequence it
    cannot run is a 400. Whatever ends the wait, no run is left going.
    """

    def abort_runs() -> None:
        for run in runs:
            run.cancel("client_disconnected")

    work = asyncio.gather(*(collect(run) for run in runs))
    try:
        return list(await unless_disconnected(work, raw, on_disconnect=abort_runs))
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc
    finally:
        for run in runs:
            run.cancel("error")


async def merged_events(runs: list[ChoiceRun]) -> AsyncIterator[ChoiceEvent]:
    """The events of several choices run together, in the order they come, until every choice finishes.

    A choice's error is raised here. Leaving early (the client disconnected: the consuming generator is
    closed or cancelled) aborts the choices still running.
    """
    queue: asyncio.Queue[ChoiceEvent | BaseException] = asyncio.Queue()

    async def pump(run: ChoiceRun) -> None:
        try:
            async for event in run.events():
                await queue.put(event)
        except BaseException as exc:  # handed to the consumer, which raises it
            await queue.put(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    tasks = [asyncio.create_task(pump(run)) for run in runs]
    try:
        remaining = len(runs)
        while remaining:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.delta.finish_reason is not None:
                remaining -= 1
            yield item
    finally:
        for run in runs:
            run.cancel("client_disconnected")
        for task in tasks:
            task.cancel()

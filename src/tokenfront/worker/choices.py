"""One choice: an engine sequence, read by the output core's `ChoiceParser` as its ids arrive."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tokenfront.core.output import ChoiceParser, FinishedChoice, OutputDelta
from tokenfront.worker.engine import NO_TOKEN, Engine, GenerationRequest, TokenOutput
from tokenfront.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

__all__ = ["ChoiceEvent", "ChoiceRun", "collect"]


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
    tokens: list[TokenOutput] = field(default_factory=list)
    cached_tokens: int = 0
    finished: bool = False
    _submitted: bool = False

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        """Run the sequence; yield an event whenever there is text to show, and a last one with the reason."""
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
        self.metrics.sequences.labels(self.route, delta.finish_reason).inc()
        yield ChoiceEvent(self.index, delta, pending)

    def cancel(self, reason: str) -> None:
        """Abort the engine sequence if it is still running (stop string found, client gone, error)."""
        if self._submitted and not self.finished:
            self.finished = True
            self.engine.abort(self.request.request_id)
            self.metrics.aborts.labels(reason).inc()
            if reason == "client_disconnected":
                log.info("client disconnected: aborted %s", self.request.request_id)


async def collect(run: ChoiceRun) -> FinishedChoice:
    """Run a choice to its end, for a non-streaming answer."""
    output = OutputDelta()
    async for event in run.events():
        output.extend(event.delta)
    return FinishedChoice(run.index, output, run.tokens)

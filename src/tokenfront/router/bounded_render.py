"""How the router waits for a render: at most `--render-timeout`, then it routes by load.

The router renders each chat and completions request to route it by its prompt's cached prefix and to forward
the ids. When rendering cannot keep up (a saturated render thread or render processes, a slow client template),
waiting for it would add its queue to every request's latency; so the wait is bounded. A render that has not
finished within `--render-timeout` of being asked for is `late`: the request goes to the worker as the client
sent it (the worker renders it itself) and the policy chooses by load alone — what the router does without a
tokenizer (`no_render`). The late render is abandoned: a render still queued is cancelled and never runs; one
already running finishes (a render is bounded: `core.template_limits`) and its result is dropped. A render
that fails for a reason that is not the client's — an internal error, a render process that died, none ready —
is `failed` and routed the same way. A client's mistake (`RenderError`) is still its 400 (`invalid`).

Renders run where `--render-processes` says: 0, in the router's process through `server.render_thread` (a
small request inline on the event loop, else on the render thread); N, in N render processes
(`router.render_pool`). An inline render cannot be interrupted (it is small: a body up to 64 KiB with the
checkpoint's template); it is judged by the same rule when it returns, so `late` means the same wherever the
render ran.

Counted in `tokenfront_router_renders_total{outcome}` (ok, invalid, late, failed) and timed in
`tokenfront_router_render_seconds` (from asking to the answer, queue included; a late render is counted, not
timed: its wait was the timeout).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections.abc import Awaitable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from prometheus_client import Counter, Histogram

from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.router.connections import describe_error
from tokenfront.router.render_pool import NoRenderProcess, RenderPool
from tokenfront.router.render_step import RenderedRequest, render_request
from tokenfront.server.lean_routes import raw_body
from tokenfront.server.render_thread import render_off_loop

__all__ = [
    "DEFAULT_RENDER_TIMEOUT",
    "RENDER_OUTCOMES",
    "BoundedRender",
    "RenderOutcome",
    "RenderSettings",
]

log = logging.getLogger(__name__)

# Two seconds: a long prompt renders in tens of milliseconds (docs/benchmarks.md), so a render this late is
# queued behind a saturated renderer, not working; and two seconds is about the most a render may add to a
# request's time to first token before routing it at once, by load, is the better deal for the client.
DEFAULT_RENDER_TIMEOUT = 2.0
RENDER_OUTCOMES = ("ok", "invalid", "late", "failed")
# At most one warning about late or failed renders this often (the counter has every one).
_WARN_EVERY_SECONDS = 60.0

_T = TypeVar("_T")


@dataclass(frozen=True)
class RenderSettings:
    """Where the router renders (`--render-processes`: 0 is its own process) and how long it waits
    (`--render-timeout`)."""

    timeout: float = DEFAULT_RENDER_TIMEOUT
    processes: int = 0


@dataclass(frozen=True)
class RenderOutcome:
    """A render's result for a plan: `rendered`, or None and the `not_forwarded` reason to route by load
    (`render_late`, `render_failed`; `no_render` when the router cannot render the request at all)."""

    rendered: RenderedRequest | None
    reason: str | None = None


class BoundedRender:
    """Renders requests for the proxy's plans, waiting at most `settings.timeout` for each.

    `start` (before serving) starts the render processes when `settings.processes` asks for them; `stop` ends
    them.
    """

    def __init__(
        self, pipeline: RenderPipeline, settings: RenderSettings, *, renders: Counter, seconds: Histogram
    ) -> None:
        if settings.timeout <= 0:
            raise ValueError("the render timeout must be more than 0")
        self.pipeline = pipeline
        self.settings = settings
        self.pool: RenderPool | None = None
        self._outcomes = {outcome: renders.labels(outcome) for outcome in RENDER_OUTCOMES}
        self._seconds = seconds
        self._render = functools.partial(_render_here, pipeline)
        self._warned_at = -_WARN_EVERY_SECONDS
        self._unwarned = 0

    async def start(self, on_replaced: Any = None) -> None:
        """Start the render processes (if any) and wait until each has loaded the pipeline."""
        if self.settings.processes and self.pool is None:
            pool = RenderPool(
                self.pipeline.options,
                self.settings.processes,
                fingerprint=self.pipeline.fingerprint.digest,
                on_replaced=on_replaced,
            )
            await asyncio.to_thread(pool.start)
            self.pool = pool
            log.info("rendering in %d render processes", pool.processes)

    async def stop(self) -> None:
        """Stop the render processes."""
        pool, self.pool = self.pool, None
        if pool is not None:
            await asyncio.to_thread(pool.close)

    def describe(self) -> dict[str, Any]:
        """For `/server_info`: the timeout, and the render processes (None: the router's own process)."""
        return {
            "timeout": self.settings.timeout,
            "processes": self.pool.describe() if self.pool is not None else None,
        }

    async def render(
        self, raw: Request, request: ChatCompletionRequest | CompletionRequest, *, with_body: bool
    ) -> RenderOutcome:
        """Render `request` (whose body `raw` read) within the timeout; `with_body`: also the body to forward.
        A client's mistake raises RenderError (its 400); late and failed renders are outcomes, counted."""
        started = time.monotonic()
        timeout = self.settings.timeout
        try:
            rendered = await _within(self._start_render(raw, request, with_body), timeout)
        except asyncio.TimeoutError:
            return self._late()
        except RenderError:
            self._done("invalid", started)
            raise
        except (BrokenProcessPool, NoRenderProcess) as exc:
            return self._failed(started, describe_error(exc))
        except Exception as exc:  # not the client's: route it by load, and say why in the log
            log.exception("rendering a request failed; it is routed by load")
            return self._failed(started, describe_error(exc), warn=False)
        if time.monotonic() - started > timeout:
            return self._late()  # rendered inline, past its deadline
        if rendered.prompts is None:
            self._done("failed", started)
            return RenderOutcome(None, "no_render")
        self._done("ok", started)
        return RenderOutcome(rendered)

    def _start_render(
        self, raw: Request, request: ChatCompletionRequest | CompletionRequest, with_body: bool
    ) -> Awaitable[RenderedRequest]:
        body = raw_body(raw)
        if self.pool is None:
            return render_off_loop(raw, request, self._render, request, body, with_body)
        return asyncio.wrap_future(self.pool.submit(request, body, with_body=with_body))

    def _done(self, outcome: str, started: float) -> None:
        self._outcomes[outcome].inc()
        self._seconds.observe(time.monotonic() - started)

    def _late(self) -> RenderOutcome:
        self._outcomes["late"].inc()
        self._warn(f"not rendered within --render-timeout {self.settings.timeout:g} s")
        return RenderOutcome(None, "render_late")

    def _failed(self, started: float, why: str, *, warn: bool = True) -> RenderOutcome:
        self._done("failed", started)
        if warn:
            self._warn(f"the render failed ({why})")
        return RenderOutcome(None, "render_failed")

    def _warn(self, what: str) -> None:
        """One warning a minute at most: a saturated renderer makes every request late."""
        now = time.monotonic()
        if now - self._warned_at < _WARN_EVERY_SECONDS:
            self._unwarned += 1
            return
        also = f"; {self._unwarned} more late or failed since the last warning" if self._unwarned else ""
        log.warning("a request was %s: it is routed by load, its ids not forwarded%s", what, also)
        self._warned_at, self._unwarned = now, 0


def _render_here(
    pipeline: RenderPipeline,
    request: ChatCompletionRequest | CompletionRequest,
    body: bytes,
    with_body: bool,
) -> RenderedRequest:
    return render_request(pipeline, request, body, with_body=with_body)


async def _within(awaitable: Awaitable[_T], timeout: float) -> _T:
    """`awaitable`'s result, or asyncio.TimeoutError after `timeout` seconds (the awaitable is cancelled)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout)

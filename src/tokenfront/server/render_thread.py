"""Where rendering runs: on the event loop when it is small, else on the process's render thread.

Rendering runs a chat template (a client's own too, with --allow-request-chat-template: up to the template
time limit of core/template_limits.py) and the tokenizer; derendering reads output ids through the
tokenizer. CPU work that must not hold the event loop for long, or /health and every other request would
wait for it. The pipeline serves one call at a time (`PIPELINE_LOCK`, which the direct lane of `server.direct`
takes too: the transformers tokenizer changes its own settings per call, so two threads must not tokenize at
once). A small request with the checkpoint's
template renders in well under a millisecond: it runs right on the loop when the pipeline is free, saving the
hop to a thread (tens of microseconds, more than many renders take). Everything else — a client's template, a
large body, or any call while another is running — goes to the render thread, one per process, and is
awaited.

The render thread takes the checkpoint's template first: calls for a request's own template (`chat_template`
in the body; it may take seconds, inside its bounds) wait behind every render with the checkpoint's template
queued, so those wait for at most the one call running, never for a queue of client templates. Client
templates get no thread of their own: they would tokenize while the render thread does (see the lock), and a
client template's text may take its tokenizer seconds. The renderer's routes, the derender routes, the
worker's and the router's all run pipeline work through `render_off_loop`.

Saturation shows in two metrics of the render thread (`render_thread_collectors`, in every server's registry):
`tokenfront_render_queued`, the calls waiting for it to start them now, and `tokenfront_render_wait_seconds`, how long each
call waited before it started (its queue and the pipeline lock). Renders run on the loop wait for nothing and
are not counted: they start only when the pipeline is free.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from fastapi import Request
from prometheus_client import Gauge, Histogram
from prometheus_client.registry import Collector

from tokenfront.server.lean_routes import INLINE_BODY_BYTES, raw_body

__all__ = ["INLINE_BODY_BYTES", "PIPELINE_LOCK", "render_off_loop", "render_thread_collectors"]

_T = TypeVar("_T")

PIPELINE_LOCK = threading.Lock()
# Queue order: the checkpoint's template before a request's own; first come, first served within each.
_CHECKPOINT_TEMPLATE, _REQUEST_TEMPLATE = 0, 1
_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_Queued = tuple[int, int, float, Callable[[], Any], Future[Any]]  # priority, order, perf_counter at submit


class _RenderThread:
    """One thread running queued calls one at a time under the pipeline lock, lowest priority number first.

    Started on first use, and again in a process forked after that (a thread does not survive a fork). Its
    metrics are the process's, like the thread: not in any registry until a server's registry takes them.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pid: int | None = None
        self._queue: queue.PriorityQueue[_Queued] = queue.PriorityQueue()
        self._order = itertools.count()
        # livesum: with --workers N, the calls waiting in every live process, added up.
        self.queued = Gauge(
            "tokenfront_render_queued",
            "Calls waiting for the render thread to start them (rendering or derendering)",
            registry=None,
            multiprocess_mode="livesum",
        )
        self.wait = Histogram(
            "tokenfront_render_wait_seconds",
            "Seconds a call waited for the render thread before it started (renders run on the event loop "
            "wait for nothing and are not counted)",
            registry=None,
            buckets=_WAIT_BUCKETS,
        )

    def submit(self, priority: int, call: Callable[[], _T]) -> Future[_T]:
        """Queue `call`; its future has the result (or the exception it raised)."""
        future: Future[_T] = Future()
        with self._guard:
            if self._pid != os.getpid():
                self._queue = queue.PriorityQueue()
                threading.Thread(
                    target=self._run, args=(self._queue,), name="tokenfront-render", daemon=True
                ).start()
                self._pid = os.getpid()
            self.queued.inc()
            self._queue.put((priority, next(self._order), time.perf_counter(), call, future))
        return future

    def _run(self, calls: queue.PriorityQueue[_Queued]) -> None:
        while True:
            _, _, queued_at, call, future = calls.get()
            if not future.set_running_or_notify_cancel():
                self.queued.dec()
                continue  # its caller went away (a client that disconnected) before it started
            try:
                with PIPELINE_LOCK:  # a call waiting for the lock (held by a render on the loop) still waits
                    self.queued.dec()
                    self.wait.observe(time.perf_counter() - queued_at)
                    result = call()
            except BaseException as exc:  # handed to the awaiting request
                future.set_exception(exc)
            else:
                future.set_result(result)


_RENDER_THREAD = _RenderThread()


def render_thread_collectors() -> tuple[Collector, ...]:
    """The render thread's metrics (module docstring), for a server's registry to register."""
    return (_RENDER_THREAD.queued, _RENDER_THREAD.wait)


async def render_off_loop(
    raw: Request, request: Any, function: Callable[..., _T], *args: Any, inline_bytes: int = INLINE_BODY_BYTES
) -> _T:
    """`function(*args)` for `request` (whose body `raw` read): inline when the body is at most `inline_bytes`
    and the pipeline is free, else on the render thread."""
    call = functools.partial(function, *args)
    own_template = getattr(request, "chat_template", None) is not None
    if not own_template and len(raw_body(raw)) <= inline_bytes and PIPELINE_LOCK.acquire(blocking=False):
        try:
            return call()
        finally:
            PIPELINE_LOCK.release()
    # The request's context goes along, so that a line logged while rendering carries its request id.
    context = contextvars.copy_context()
    priority = _REQUEST_TEMPLATE if own_template else _CHECKPOINT_TEMPLATE
    return await asyncio.wrap_future(_RENDER_THREAD.submit(priority, functools.partial(context.run, call)))

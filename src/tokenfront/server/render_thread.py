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
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from fastapi import Request

from tokenfront.server.lean_routes import INLINE_BODY_BYTES, raw_body

__all__ = ["INLINE_BODY_BYTES", "PIPELINE_LOCK", "render_off_loop"]

_T = TypeVar("_T")

PIPELINE_LOCK = threading.Lock()
# Queue order: the checkpoint's template before a request's own; first come, first served within each.
_CHECKPOINT_TEMPLATE, _REQUEST_TEMPLATE = 0, 1


class _RenderThread:
    """One thread running queued calls one at a time under the pipeline lock, lowest priority number first.

    Started on first use, and again in a process forked after that (a thread does not survive a fork).
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pid: int | None = None
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], Any], Future[Any]]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()

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
            self._queue.put((priority, next(self._order), call, future))
        return future

    @staticmethod
    def _run(calls: queue.PriorityQueue[tuple[int, int, Callable[[], Any], Future[Any]]]) -> None:
        while True:
            _, _, call, future = calls.get()
            if not future.set_running_or_notify_cancel():
                continue  # its caller went away (a client that disconnected) before it started
            try:
                with PIPELINE_LOCK:
                    result = call()
            except BaseException as exc:  # handed to the awaiting request
                future.set_exception(exc)
            else:
                future.set_result(result)


_RENDER_THREAD = _RenderThread()


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

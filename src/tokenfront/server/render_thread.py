"""Where rendering runs: on the event loop when it is small, else on the process's render thread.

Rendering runs a chat template (a client's own too, with --allow-request-chat-template: up to the template
time limit of core/template_limits.py) and the tokenizer: CPU work that must not hold the event loop for
long, or /health and every other request would wait for it. The pipeline serves one render at a time
(`_RENDER_LOCK`). A small request with the checkpoint's template renders in well under a millisecond: it runs
right on the loop when the pipeline is free, saving the hop to a thread (tens of microseconds, more than many
renders take). Everything else — a client's template, a large body, or any render while another is running —
goes to the render thread, one per process, and is awaited. The renderer's routes, the worker's and the
router's all render through `render_off_loop`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request

from tokenfront.server.lean_routes import raw_body

__all__ = ["INLINE_BODY_BYTES", "render_off_loop"]

_T = TypeVar("_T")

_RENDER_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenfront-render")
_RENDER_LOCK = threading.Lock()
# Bodies up to this size with no request template render on the event loop when the pipeline is free.
INLINE_BODY_BYTES = 64 * 1024


def _locked(function: Callable[[], _T]) -> _T:
    with _RENDER_LOCK:
        return function()


async def render_off_loop(raw: Request, request: Any, function: Callable[..., _T], *args: Any) -> _T:
    """`function(*args)` for `request` (whose body `raw` read): inline when it is small and the pipeline is free,
    else on the render thread."""
    call = functools.partial(function, *args)
    small = len(raw_body(raw)) <= INLINE_BODY_BYTES and getattr(request, "chat_template", None) is None
    if small and _RENDER_LOCK.acquire(blocking=False):
        try:
            return call()
        finally:
            _RENDER_LOCK.release()
    # The request's context goes along, so that a line logged while rendering carries its request id.
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_RENDER_THREAD, context.run, _locked, call)

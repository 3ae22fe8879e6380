"""Render processes for the router (`route --render-processes N`): render capacity that grows with its cores.

A router process renders on about one core (its render thread, `server.render_thread`). With N render
processes, each holds a `RenderPipeline` of its own, loaded from the router's `RenderOptions` (the same
checkpoint, template and options; each process's fingerprint is checked against the router's when it starts),
and runs `render_step.render_request` for the router's plans: the router's process sends the validated request
and reads back the ids (and the body to forward), which is a fraction of a millisecond for a long prompt.

Each render process is a one-process `ProcessPoolExecutor` of the spawn context: a fresh interpreter, never a
fork of the router (which has threads). One executor per process rather than one of N, so that a process that
dies takes only its own renders with it: its executor breaks, its in-flight renders fail (the caller routes
them by load and counts them `failed`), and a new process replaces it. A render goes to the ready process with
the fewest renders in flight. A process being replaced is not given renders until its pipeline is loaded.

The render thread's order (the checkpoint's template before clients' own, `server.render_thread`) does not
carry over: a client's template holds one process for its render, inside the template limits, and every other
render's wait stays bounded by `--render-timeout` (`router.bounded_render`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tokenfront.core.torch_guard import hide_torch

# A render process imports this module first (it unpickles `_load` from it): torch must stay out of it, as it
# stays out of the router.
hide_torch()

from tokenfront.core.errors import TokenfrontError  # noqa: E402 - after the torch guard, on purpose
from tokenfront.core.render import RenderPipeline  # noqa: E402
from tokenfront.options import RenderOptions  # noqa: E402
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402
from tokenfront.router.render_step import RenderedRequest, render_request  # noqa: E402
from tokenfront.server.logs import configure_logging, json_logging  # noqa: E402

__all__ = ["NoRenderProcess", "RenderPool"]

log = logging.getLogger(__name__)

# How long a render process may take to load its pipeline (a tokenizer, a template) before start-up fails.
START_TIMEOUT = 300.0

# In a render process only: the pipeline its initializer loaded (`_load`), the one thing the process holds.
_PIPELINE: RenderPipeline | None = None


class NoRenderProcess(Exception):
    """No render process is ready (every one is being replaced): the render is not attempted."""


class _RenderProcess:
    """One slot of the pool: its executor (one process), its renders in flight, whether it is ready."""

    __slots__ = ("executor", "in_flight", "ready")

    def __init__(self, executor: ProcessPoolExecutor) -> None:
        self.executor = executor
        self.in_flight = 0
        self.ready = False


class RenderPool:
    """N render processes rendering `render_request` for the router.

    `start` spawns them and waits until every one has loaded its pipeline (TokenfrontError if one cannot, or
    renders with another fingerprint); `submit` hands one render to the least busy ready process; `close`
    stops them. `on_replaced` is called (from any thread) each time a dead process is replaced.
    """

    def __init__(
        self,
        options: RenderOptions,
        processes: int,
        *,
        fingerprint: str,
        on_replaced: Callable[[], None] | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("a render pool has at least one process")
        self.options = options
        self.fingerprint = fingerprint
        self.replaced = 0
        self._on_replaced = on_replaced
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._closed = False
        self._turn = 0
        # The render processes log as the router does (level and format), for their few lines.
        root = logging.getLogger()
        self._logging = (logging.getLevelName(root.getEffectiveLevel()).lower(), json_logging())
        self._slots = [self._new_slot() for _ in range(processes)]

    @property
    def processes(self) -> int:
        return len(self._slots)

    def ready(self) -> int:
        """How many processes are ready for renders (a dead one found here is replaced)."""
        self._replace_dead()
        with self._lock:
            return sum(slot.ready for slot in self._slots)

    def describe(self) -> dict[str, Any]:
        """For `/server_info`: the processes, how many are ready, how many were replaced."""
        return {"processes": self.processes, "ready": self.ready(), "replaced": self.replaced}

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start every process and wait until each has loaded its pipeline (blocking: call before serving)."""
        checks = [(slot, slot.executor.submit(_identify)) for slot in self._slots]
        for index, (slot, check) in enumerate(checks):
            try:
                pid, digest = check.result(timeout=timeout)
            except BrokenProcessPool as exc:
                self.close()
                raise TokenfrontError(
                    f"render process {index + 1} of {self.processes} could not load the checkpoint ({exc})"
                ) from exc
            except TimeoutError as exc:
                self.close()
                raise TokenfrontError(
                    f"render process {index + 1} of {self.processes} did not load the checkpoint in "
                    f"{timeout:g} s"
                ) from exc
            if digest != self.fingerprint:
                self.close()
                raise TokenfrontError(
                    f"render process {index + 1} renders with fingerprint {digest[:16]}, the router with "
                    f"{self.fingerprint[:16]}: the checkpoint changed while the router started"
                )
            with self._lock:
                slot.ready = True
            log.debug("render process %d of %d ready (pid %d)", index + 1, self.processes, pid)

    def submit(
        self, request: ChatCompletionRequest | CompletionRequest, raw_body: bytes, *, with_body: bool
    ) -> Future[RenderedRequest]:
        """Render `request` in the least busy ready process; NoRenderProcess when none is ready. The future
        fails with BrokenProcessPool when the process dies before answering."""
        self._replace_dead()
        while True:
            with self._lock:
                ready = [slot for slot in self._slots if slot.ready]
                if not ready:
                    raise NoRenderProcess("no render process is ready: they are being replaced")
                # The least busy; among equals, the next after the last one chosen (sequential renders rotate).
                self._turn += 1
                turn = self._turn
                slot = min(
                    ready,
                    key=lambda each: (each.in_flight, (self._slots.index(each) - turn) % len(self._slots)),
                )
                slot.in_flight += 1
            try:
                future = slot.executor.submit(_render, request, raw_body if with_body else b"", with_body)
            except BrokenProcessPool:
                # It died while idle: replace it, and try another.
                self._release(slot)
                self._replace(slot)
                continue
            future.add_done_callback(lambda done, slot=slot: self._finished(slot, done))  # type: ignore[misc]
            return future

    def close(self) -> None:
        """Stop every process: queued renders are cancelled, running ones finish (they are bounded)."""
        with self._lock:
            self._closed = True
            slots, self._slots = self._slots, []
        for slot in slots:
            slot.executor.shutdown(wait=True, cancel_futures=True)

    # -- the processes ---------------------------------------------------------------------------------------

    def _new_slot(self) -> _RenderProcess:
        level, json_lines = self._logging
        executor = ProcessPoolExecutor(
            max_workers=1,
            mp_context=self._context,
            initializer=_load,
            initargs=(self.options, level, "json" if json_lines else "text"),
        )
        return _RenderProcess(executor)

    def _replace_dead(self) -> None:
        """Replace the ready processes that died while idle. The executor knows at once (its manager thread
        watches the process); no future of ours tells, so its `_broken` flag is read (CPython's, 3.8 to 3.13)."""
        with self._lock:
            dead = [slot for slot in self._slots if slot.ready and getattr(slot.executor, "_broken", False)]
        for slot in dead:
            self._replace(slot)

    def _release(self, slot: _RenderProcess) -> None:
        with self._lock:
            slot.in_flight -= 1

    def _finished(self, slot: _RenderProcess, future: Future[RenderedRequest]) -> None:
        self._release(slot)
        if not future.cancelled() and isinstance(future.exception(), BrokenProcessPool):
            self._replace(slot)

    def _replace(self, slot: _RenderProcess) -> None:
        """Put a new process in a dead one's place (once, however many of its renders saw it die)."""
        with self._lock:
            if self._closed or slot not in self._slots:
                return
            fresh = self._new_slot()
            self._slots[self._slots.index(slot)] = fresh
            self.replaced += 1
        log.warning(
            "a render process died; its renders in flight are routed by load, and a new process replaces it"
        )
        slot.executor.shutdown(wait=False, cancel_futures=True)
        fresh.executor.submit(_identify).add_done_callback(
            lambda check: self._check_replacement(fresh, check)
        )
        if self._on_replaced is not None:
            self._on_replaced()

    def _check_replacement(self, slot: _RenderProcess, check: Future[tuple[int, str]]) -> None:
        """A replacement takes renders once it has loaded the router's pipeline."""
        if check.cancelled():
            return
        problem: object = check.exception()
        if problem is None and check.result()[1] != self.fingerprint:
            problem = f"its fingerprint is {check.result()[1][:16]}, the router's {self.fingerprint[:16]}"
        if problem is not None:
            # Not replaced again: a checkpoint that no longer loads would have processes spawned in a loop. The
            # pool renders with the processes it has (`ready` on /server_info; none: every render is `failed`).
            log.error("a new render process cannot render like the router (%s): it takes no renders", problem)
            return
        with self._lock:
            slot.ready = True
        log.info("a new render process is ready (pid %d)", check.result()[0])


# -- in a render process -----------------------------------------------------------------------------------------


def _load(options: RenderOptions, log_level: str, log_format: str) -> None:
    """A render process's initializer: load the router's pipeline once."""
    global _PIPELINE
    # A Ctrl-C in the terminal reaches the whole process group: the router stops its render processes itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(log_level, log_format)
    _PIPELINE = RenderPipeline.load(options)


def _identify() -> tuple[int, str]:
    """This process's pid and its pipeline's fingerprint digest (the pipeline is loaded by then)."""
    assert _PIPELINE is not None
    return os.getpid(), _PIPELINE.fingerprint.digest


def _render(
    request: ChatCompletionRequest | CompletionRequest, raw_body: bytes, with_body: bool
) -> RenderedRequest:
    assert _PIPELINE is not None
    return render_request(_PIPELINE, request, raw_body, with_body=with_body)

"""An asyncio event loop on a simulated clock: sleeps cost no wall time, so modelled GPUs run as fast as the CPU
can compute their bookkeeping.

`VirtualClockLoop` is asyncio's own `SelectorEventLoop` with two changes:

- `time()` is a virtual clock, starting at 0, that moves only forward and only when the loop has nothing to
  run: every `asyncio.sleep`, `call_later`, `wait_for` and timeout reads it, so code written for the real loop
  (the simulated engine's scheduler, `KvIndex`'s routed-guess TTL given `clock=loop.time`) runs unchanged;
- its selector, asked to wait `timeout` seconds for I/O (which asyncio does when the next thing to run is a
  timer `timeout` away), polls the real selector without blocking and, when nothing is ready, moves the clock
  forward by `timeout` and returns at once. So the loop jumps from one timer to the next.

Real I/O still works (the self-pipe, a socket a test opens) but takes no virtual time; a loop with no timer
and nothing ready blocks on the real selector, as any loop would (there is nothing to jump to). Nothing here
is thread-aware: a thread that calls `call_soon_threadsafe` wakes the loop, but virtual time does not wait for
threads. No library was used: the ones that fast-forward loop time (`looptime`, `aiotools`' `VirtualClock`)
are test helpers that patch a loop under pytest or a context manager; this is a loop of its own in sixty lines,
with no dependency added.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

__all__ = ["VirtualClockLoop", "run_virtual"]

_T = TypeVar("_T")


class _JumpingSelector(selectors.BaseSelector):
    """A real selector whose waits, when no I/O is ready, move the loop's virtual clock instead of blocking."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer at all: only real I/O can wake the loop
            return self._real.select(None)
        ready = self._real.select(0)
        if not ready and timeout > 0:
            self._loop.advance(timeout)
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop whose clock is virtual (see the module docstring)."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        """The virtual time, in seconds from the loop's creation."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the selector calls it; a negative step is ignored)."""
        if seconds > 0:
            self._now += seconds


def run_virtual(main: Coroutine[Any, Any, _T]) -> _T:
    """Run `main` to completion on a new `VirtualClockLoop` (as `asyncio.run` does on a real one), then close
    the loop: tasks left over are cancelled, async generators finalized."""
    loop = VirtualClockLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

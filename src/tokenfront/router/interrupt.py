"""What ends a proxied request's wait early: the client leaving, or the worker it waits for being lost.

Both cancel the request's own task through one `Interrupt`, rather than racing a task against every await:
the client's disconnect watcher (`watch_disconnect`) calls `client_left` (answered 499, the worker's request
closed so that it stops generating), a worker's failed health check calls `worker_lost` (the request is retried
elsewhere). The proxy waits for a worker's answer under one; a relayed stream sends under its own.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from starlette.types import Receive

from tokenfront.server.disconnect import wait_for_disconnect

__all__ = ["Interrupt", "watch_disconnect"]


class Interrupt:
    """Cancels the request's task when the client leaves or the worker it waits for is lost, and says which.

    One object per request, made in the request's task: the client's disconnect watcher calls
    `client_left`, a worker's failed health check calls `worker_lost` (registered in `Worker.lost_watchers`
    while an attempt waits). The task then sees a CancelledError wherever it waits; `take` tells it whether the
    cancellation was this object's (and why) or came from elsewhere (a shutdown), which must go on.

    One cancellation per request instead of a task and an `asyncio.wait` around every await.
    """

    __slots__ = ("_armed", "_task", "left", "reason")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = asyncio.current_task()
        self._armed = True
        self.reason: str | None = None
        self.left = False  # the client left (remembered even when the task was being cancelled already)

    def client_left(self) -> None:
        self.left = True
        self._cancel("client")

    def worker_lost(self) -> None:
        self._cancel("lost")

    def _cancel(self, reason: str) -> None:
        if self._armed and self.reason is None and self._task is not None:
            self.reason = reason
            self._task.cancel()

    def take(self) -> str | None:
        """After a CancelledError: this object's reason when it alone cancelled the task (the task is then not
        cancelled any more), None when the cancellation came from elsewhere."""
        reason, self.reason = self.reason, None
        task = self._task
        if reason is None or task is None:
            return None
        if sys.version_info >= (3, 11):
            task.uncancel()
            if task.cancelling():
                return None  # cancelled from elsewhere as well
        return reason

    def disarm(self) -> None:
        """Nothing may cancel the task any more (a cancellation already asked for is still `take`n)."""
        self._armed = False


async def watch_disconnect(receive: Receive, interrupt: Interrupt) -> None:
    """Tell `interrupt` when the client closes the connection."""
    await wait_for_disconnect(receive)
    interrupt.client_left()

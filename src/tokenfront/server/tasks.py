"""Stopping a server's background tasks: every one cancelled, then each waited for until it has ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel every task, then wait for each to end (all are cancelled before the first wait, so none runs on
    while another is awaited)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task

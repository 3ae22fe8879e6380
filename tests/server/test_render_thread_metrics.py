"""The render thread's saturation metrics: `tokenfront_render_queued` counts the calls not started yet (the
one waiting for the pipeline lock too), `tokenfront_render_wait_seconds` times each call from its submission
to its start; every server's registry shows the process's one render thread."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

from fastapi import Request
from prometheus_client import CollectorRegistry

from tokenfront.server.metrics import ServerMetrics
from tokenfront.server.render_thread import PIPELINE_LOCK, render_off_loop, render_thread_collectors

# A request with its own template always goes to the render thread (and its body is never read).
OWN_TEMPLATE = SimpleNamespace(chat_template="{{ messages }}")
NO_REQUEST = cast(Request, None)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in render_thread_collectors():
        registry.register(collector)
    return registry


def _value(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


async def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_queued_calls_and_their_wait_are_counted() -> None:
    registry = _registry()
    count_before = _value(registry, "tokenfront_render_wait_seconds_count")
    sum_before = _value(registry, "tokenfront_render_wait_seconds_sum")

    async def scenario() -> tuple[list[int], float]:
        PIPELINE_LOCK.acquire()  # the pipeline busy (as with a render on the loop): nothing can start
        released = False
        try:
            calls = [
                asyncio.create_task(render_off_loop(NO_REQUEST, OWN_TEMPLATE, lambda i=i: i))
                for i in range(3)
            ]
            await _until(lambda: _value(registry, "tokenfront_render_queued") == 3)
            queued_at = time.perf_counter()  # all three were submitted before this
            await asyncio.sleep(0.05)  # hold the lock a known while: each call waits at least that long
            held = time.perf_counter() - queued_at
            PIPELINE_LOCK.release()
            released = True
            return list(await asyncio.gather(*calls)), held
        finally:
            if not released:
                PIPELINE_LOCK.release()

    results, held = asyncio.run(scenario())
    assert results == [0, 1, 2]
    assert _value(registry, "tokenfront_render_queued") == 0
    assert _value(registry, "tokenfront_render_wait_seconds_count") - count_before == 3
    assert _value(registry, "tokenfront_render_wait_seconds_sum") - sum_before >= 3 * held


def test_every_server_registry_shows_them() -> None:
    first, second = ServerMetrics(), ServerMetrics()  # two apps in one process: one render thread
    for metrics in (first, second):
        assert metrics.registry.get_sample_value("tokenfront_render_queued") is not None
        assert metrics.registry.get_sample_value("tokenfront_render_wait_seconds_count") is not None

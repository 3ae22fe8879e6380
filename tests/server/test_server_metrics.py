"""`server.metrics`: the hot path's counts, tallied on the event loop and handed on at a scrape, read exactly as
the same counts made one by one."""

from __future__ import annotations

import asyncio
import threading

from tokenfront.server.metrics import ServerMetrics, exposition

ROUTE = "/v1/chat/completions/render"
# Every bucket bound (an answer taking exactly a bound's seconds is in that bound's bucket), just past each, zero
# and past the last bound (+Inf only).
BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SECONDS = [0.0, *BOUNDS, *(bound * 1.0001 for bound in BOUNDS), 31.0, 120.0]
RENDERS = [(1, 31), (1, 1), (3, 4096), (2, 0)]


def _count(metrics: ServerMetrics) -> None:
    for seconds in SECONDS:
        metrics.observe_direct(ROUTE, seconds)
    for prompts, tokens in RENDERS:
        metrics.count_rendered("chat", prompts, tokens)


def _samples(metrics: ServerMetrics) -> list[str]:
    # `_created` lines carry each series' creation time: the two registries' differ.
    return [line for line in exposition(metrics.registry).decode().splitlines() if "_created" not in line]


def _value(metrics: ServerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_counts_tallied_on_the_loop_read_as_the_same_counts_made_at_once() -> None:
    on_loop, at_once = ServerMetrics(), ServerMetrics()

    async def serve() -> None:
        _count(on_loop)

    asyncio.run(serve())
    _count(at_once)  # no loop running: each count goes to prometheus-client as it is made
    assert _value(at_once, "tokenfront_request_seconds_count", route=ROUTE) == len(SECONDS) == 33
    # Tallied, not yet handed on: a scrape flushes first.
    assert _value(on_loop, "tokenfront_request_seconds_count", route=ROUTE) == 0
    assert _value(on_loop, "tokenfront_rendered_tokens_total", kind="chat") == 0
    on_loop.flush()
    expected = _samples(at_once)
    assert _samples(on_loop) == expected
    assert len([line for line in expected if line.startswith("tokenfront_request_seconds_bucket")]) == 16
    # Each bound's own seconds counted in its bucket: 0 and 0.0005 in the first, then one more per bound.
    assert _value(on_loop, "tokenfront_request_seconds_bucket", route=ROUTE, le="0.0005") == 2
    assert _value(on_loop, "tokenfront_request_seconds_bucket", route=ROUTE, le="0.001") == 4
    assert _value(on_loop, "tokenfront_request_seconds_bucket", route=ROUTE, le="30.0") == 30
    assert _value(on_loop, "tokenfront_direct_answers_total", route=ROUTE) == 33
    assert _value(on_loop, "tokenfront_requests_total", route=ROUTE, status="200") == 33
    assert _value(on_loop, "tokenfront_rendered_prompts_total", kind="chat") == 7
    assert _value(on_loop, "tokenfront_rendered_tokens_total", kind="chat") == 4128
    # A second flush adds nothing: the tallies started again from nothing.
    on_loop.flush()
    assert _samples(on_loop) == expected


def test_a_count_made_off_the_loop_is_handed_on_at_once() -> None:
    metrics = ServerMetrics()

    async def serve() -> None:
        metrics.count_rendered("chat", 1, 10)  # the loop's thread: tallied
        # A render thread's count, while the loop runs.
        thread = threading.Thread(target=metrics.count_rendered, args=("chat", 2, 20))
        thread.start()
        thread.join()

    asyncio.run(serve())
    assert _value(metrics, "tokenfront_rendered_tokens_total", kind="chat") == 20
    metrics.flush()
    assert _value(metrics, "tokenfront_rendered_tokens_total", kind="chat") == 30
    assert _value(metrics, "tokenfront_rendered_prompts_total", kind="chat") == 3

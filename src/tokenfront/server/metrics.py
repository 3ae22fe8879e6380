"""Prometheus metrics of one app, in its own registry; one view over every process with `--workers N`.

With several processes serving one port (`tokenfront render --workers N`), each process counts in files
under PROMETHEUS_MULTIPROC_DIR (prometheus-client's multiprocess mode, set up by `server.process` before the
processes start), and `GET /metrics`, whichever process answers it, sums them all.

The counts of the render hot path (`observe_direct`'s request and direct-answer counters, `count_rendered`),
made on the event loop, are added up there and handed to prometheus-client once per turn of the loop
(`ServerMetrics.flush`, which `GET /metrics` also calls first): a lock and a multiprocess file write per turn
rather than per count, the same totals by the time any other request is answered. Whether a count is made on
the loop is asked of asyncio once per turn, not per count: on Python 3.11 `asyncio.get_running_loop()` is a
`getpid()` system call (it checks for a fork), four of them a request. `observe` (every other request) counts
at once.
"""

from __future__ import annotations

import asyncio
import os
import threading

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tokenfront.server.process import MULTIPROC_DIR_ENV
from tokenfront.server.render_thread import render_thread_collectors

__all__ = ["CONTENT_TYPE_LATEST", "MULTIPROC_DIR_ENV", "ServerMetrics", "exposition"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ServerMetrics:
    """The metrics every server has: requests by route and status, latency, rendered prompts and tokens,
    which requests the direct lane answered, and the render thread's queue (`server.render_thread`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tokenfront_requests", "HTTP requests answered", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "tokenfront_request_seconds",
            "Time to answer a request",
            ["route"],
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.rendered_prompts = Counter(
            "tokenfront_rendered_prompts", "Prompts rendered into ids", ["kind"], registry=self.registry
        )
        self.rendered_tokens = Counter(
            "tokenfront_rendered_tokens",
            "Prompt tokens produced by rendering",
            ["kind"],
            registry=self.registry,
        )
        self.direct_answers = Counter(
            "tokenfront_direct_answers",
            "Requests answered on the direct lane, without ASGI (a subset of tokenfront_requests_total)",
            ["route"],
            registry=self.registry,
        )
        # The process's one render thread: its metrics are in every app's registry.
        for collector in render_thread_collectors():
            self.registry.register(collector)
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self._direct: dict[str, tuple[Counter, Histogram, Counter]] = {}
        self._rendered: dict[str, tuple[Counter, Counter]] = {}
        self._pending: dict[Counter, float] = {}  # counts of this turn of the loop, not yet handed on
        self._flushing_thread: int | None = None  # the thread whose loop flushes `_pending` at its turn's end

    def flush(self) -> None:
        """Hand the counts made on the event loop so far to their counters."""
        self._flushing_thread = None
        pending, self._pending = self._pending, {}
        for child, amount in pending.items():
            child.inc(amount)

    def _count_two(self, first: Counter, first_amount: float, second: Counter, second_amount: float) -> None:
        """Add to two counters' children (every count here comes in pairs): at the end of this turn of the event
        loop when on it (once for all the counts of the turn; the turn's first count schedules the `flush`), at
        once otherwise (a render thread). Whether on the loop is asked once for both."""
        thread = threading.get_ident()
        if thread != self._flushing_thread:  # the turn's first count, or not on the loop
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                first.inc(first_amount)
                second.inc(second_amount)
                return
            loop.call_soon(self.flush)
            self._flushing_thread = thread
        pending = self._pending
        pending[first] = pending.get(first, 0) + first_amount
        pending[second] = pending.get(second, 0) + second_amount

    def observe(self, route: str, status: int, seconds: float) -> None:
        """Count one answered request."""
        children = self._children.get((route, status))
        if children is None:  # labels() looks the child up by name each call: keep them
            children = (self.requests.labels(route, str(status)), self.latency.labels(route))
            self._children[(route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_direct(self, route: str, seconds: float) -> None:
        """Count one request answered 200 on the direct lane (`server.direct`)."""
        children = self._direct.get(route)
        if children is None:  # its three children, looked up once
            children = (
                self.requests.labels(route, "200"),
                self.latency.labels(route),
                self.direct_answers.labels(route),
            )
            self._direct[route] = children
        children[1].observe(seconds)
        self._count_two(children[0], 1, children[2], 1)

    def count_rendered(self, kind: str, prompts: int, tokens: int) -> None:
        """Count rendered prompts and their tokens."""
        children = self._rendered.get(kind)
        if children is None:
            children = (self.rendered_prompts.labels(kind), self.rendered_tokens.labels(kind))
            self._rendered[kind] = children
        self._count_two(children[0], prompts, children[1], tokens)


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text of `registry`, or of every process's files in multiprocess mode."""
    if os.environ.get(MULTIPROC_DIR_ENV):
        merged = CollectorRegistry()
        MultiProcessCollector(merged)
        return generate_latest(merged)
    return generate_latest(registry)

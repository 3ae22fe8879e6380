"""Prometheus metrics of one app, in its own registry; one view over every process with `--workers N`.

With several processes serving one port (`tokenfront render --workers N`), each process counts in files
under PROMETHEUS_MULTIPROC_DIR (prometheus-client's multiprocess mode, set up by `server.process` before the
processes start), and `GET /metrics`, whichever process answers it, sums them all.

The counts of the render hot path (`observe_direct`: a direct answer's request, latency and direct-answer
counts; `count_rendered`), when made on the event loop, are added up in plain numbers (`_DirectTally`,
`_RenderedTally`) and handed to prometheus-client by `ServerMetrics.flush`: in one process only when `GET
/metrics` asks (it flushes first, so every answer already given is counted); with `--workers N`, whose `GET
/metrics` reads every process's files, at the end of each turn of the loop that counted (one `call_soon` a
turn), so the totals are in the files by the time any other request is answered. Per request that is a few
additions instead of prometheus-client's lock per value (its histogram's `observe` takes two). A count made off
the loop (a render thread) is handed on at once. Whether a count is made on the loop is known by its thread: the
first loop to count is the server's (asking asyncio each time is a `getpid()` system call on Python 3.11).
"""

from __future__ import annotations

import asyncio
import os
import threading
from bisect import bisect_left

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
        self._direct: dict[str, _DirectTally] = {}
        self._rendered: dict[str, _RenderedTally] = {}
        # The thread of the loop whose counts are tallied (the first loop to count); whether it hands them on at
        # the end of each of its turns (multiprocess mode), and whether this turn's is due.
        self._loop_thread: int | None = None
        self._per_turn = False
        self._flush_due = False

    def flush(self) -> None:
        """Hand the counts tallied on the event loop so far to prometheus-client."""
        self._flush_due = False
        for direct in self._direct.values():
            direct.hand_on()
        for rendered in self._rendered.values():
            rendered.hand_on()

    def _tallies_here(self) -> bool:
        """Whether a count made now goes to the tallies: on the tallying loop's thread (the first loop to count
        becomes it), and then with this turn's flush scheduled in multiprocess mode."""
        thread = threading.get_ident()
        if thread != self._loop_thread:
            if self._loop_thread is not None:
                return False
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return False
            self._loop_thread = thread
            # Read once the serving process counts: `--workers` sets it before the processes start.
            self._per_turn = bool(os.environ.get(MULTIPROC_DIR_ENV))
        if self._per_turn and not self._flush_due:
            asyncio.get_running_loop().call_soon(self.flush)
            self._flush_due = True
        return True

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
        tally = self._direct.get(route)
        if tally is None:  # its three children, looked up once
            tally = _DirectTally(
                self.requests.labels(route, "200"),
                self.latency.labels(route),
                self.direct_answers.labels(route),
            )
            self._direct[route] = tally
        if self._tallies_here():
            tally.answers += 1
            tally.seconds += seconds
            tally.buckets[bisect_left(tally.bounds, seconds)] += 1
        else:
            self.observe(route, 200, seconds)
            tally.direct.inc()

    def count_rendered(self, kind: str, prompts: int, tokens: int) -> None:
        """Count rendered prompts and their tokens."""
        tally = self._rendered.get(kind)
        if tally is None:
            tally = _RenderedTally(self.rendered_prompts.labels(kind), self.rendered_tokens.labels(kind))
            self._rendered[kind] = tally
        if self._tallies_here():
            tally.prompts += prompts
            tally.tokens += tokens
        else:
            tally.prompt_counter.inc(prompts)
            tally.token_counter.inc(tokens)


class _DirectTally:
    """A route's direct answers counted on the loop and not yet handed on: how many, their seconds, and how many
    fell in each latency bucket (the first whose bound is at least the seconds, as the histogram's `observe`
    picks), with the three children they go to."""

    __slots__ = ("answers", "bounds", "buckets", "direct", "latency", "requests", "seconds")

    def __init__(self, requests: Counter, latency: Histogram, direct: Counter) -> None:
        self.requests, self.latency, self.direct = requests, latency, direct
        self.bounds: list[float] = list(latency._upper_bounds)  # prometheus-client's, +Inf last
        self.answers = 0
        self.seconds = 0.0
        self.buckets = [0] * len(self.bounds)

    def hand_on(self) -> None:
        """Add the tally to the children (the histogram's sum and buckets as its `observe` adds to them, in one
        step each) and start again from nothing."""
        if not self.answers:
            return
        self.requests.inc(self.answers)
        self.direct.inc(self.answers)
        self.latency._sum.inc(self.seconds)
        for bucket, count in zip(self.latency._buckets, self.buckets, strict=True):
            if count:
                bucket.inc(count)
        self.answers = 0
        self.seconds = 0.0
        self.buckets = [0] * len(self.bounds)


class _RenderedTally:
    """A kind's rendered prompts and tokens counted on the loop and not yet handed on, and their counters."""

    __slots__ = ("prompt_counter", "prompts", "token_counter", "tokens")

    def __init__(self, prompt_counter: Counter, token_counter: Counter) -> None:
        self.prompt_counter, self.token_counter = prompt_counter, token_counter
        self.prompts = 0
        self.tokens = 0

    def hand_on(self) -> None:
        if self.prompts or self.tokens:
            self.prompt_counter.inc(self.prompts)
            self.token_counter.inc(self.tokens)
            self.prompts = self.tokens = 0


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text of `registry`, or of every process's files in multiprocess mode."""
    if os.environ.get(MULTIPROC_DIR_ENV):
        merged = CollectorRegistry()
        MultiProcessCollector(merged)
        return generate_latest(merged)
    return generate_latest(registry)

"""The router's view of its fleet on ``/metrics``, read when scraped: each worker's state, which workers keep
the gate closed, and how fresh each worker's KV events are.

- ``tokenfront_router_worker_state{worker, state}``: 1 for the state ``GET /workers`` shows (``healthy``,
  ``unhealthy``: failing its checks, ``pending``: not checked yet, ``unusable``: it answers but cannot be used,
  e.g. it refuses the router's key), 0 for the three others.
- ``tokenfront_router_worker_blocks_forwarding{worker}``: 1 for an active worker whose rendering does not match
  the router's (its fingerprint, or its probe): while any is 1, ``tokenfront_router_forwarding`` is 0.
- ``tokenfront_router_kv_events_age_seconds{worker, feed}``: seconds since the router last applied the worker's
  KV events (``KvIndex.feed_activity``). ``feed="http"``: a tokenfront worker's ``GET /kv_cache_events``, read
  every ``--kv-events-interval``, so more than a few intervals means the reads fail; ``feed="zmq"``: vLLM's
  publisher (or a tokenfront worker's ``--kv-events-endpoint``), which sends only when its cache changes.
- ``tokenfront_router_kv_events_publish_lag_seconds{worker}``: on the ``zmq`` feed, how long the last batch
  took from its own timestamp to the router's index.
- ``tokenfront_router_kv_index_resets_total{worker}``: times the index dropped what it knew of the worker's
  cache (the worker restarted, events were missed, or it cleared its cache).

Nothing here runs per request: a scrape walks the workers once (a thousand workers are a few thousand lines).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenfront.router.gate import ForwardingGate
from tokenfront.router.worker_pool import WorkerPool

__all__ = ["WORKER_STATES", "FleetMetrics"]

WORKER_STATES = ("healthy", "unhealthy", "pending", "unusable")


class FleetMetrics(Collector):
    """The fleet's metrics (module docstring), from ``pool``, its KV index and the ``gates`` (one per model of
    the router's) when scraped."""

    def __init__(
        self,
        pool: WorkerPool,
        *gates: ForwardingGate,
        gates_of: Callable[[], Iterable[ForwardingGate]] | None = None,
    ) -> None:
        """`gates_of`: the gates when scraped, instead of `gates` (a router whose models change on a reload)."""
        self._pool = pool
        self._gates_of = gates_of or (lambda: gates)

    def collect(self) -> Iterator[Metric]:
        workers = list(self._pool.workers.values())
        blocking = {url for gate in self._gates_of() for url in gate.state.blocking}
        states = GaugeMetricFamily(
            "tokenfront_router_worker_state",
            "1 for the state each worker is in (GET /workers): healthy, unhealthy, pending or unusable",
            labels=["worker", "state"],
        )
        blocks = GaugeMetricFamily(
            "tokenfront_router_worker_blocks_forwarding",
            "1 for an active worker whose rendering does not match the router's (the gate's reasons on GET "
            "/workers): the router forwards no ids while one does",
            labels=["worker"],
        )
        for worker in workers:
            state = worker.describe()["state"]
            for name in WORKER_STATES:
                states.add_metric([worker.url, name], 1.0 if name == state else 0.0)
            blocks.add_metric([worker.url], 1.0 if worker.url in blocking else 0.0)
        yield states
        yield blocks
        yield from self._kv_feeds()

    def _kv_feeds(self) -> Iterator[Metric]:
        age = GaugeMetricFamily(
            "tokenfront_router_kv_events_age_seconds",
            "Seconds since the router last applied the worker's KV events (feed http is read every "
            "--kv-events-interval; feed zmq publishes when the worker's cache changes)",
            labels=["worker", "feed"],
        )
        lag = GaugeMetricFamily(
            "tokenfront_router_kv_events_publish_lag_seconds",
            "Seconds from the worker's last ZMQ KV event batch's own timestamp to its application in the index",
            labels=["worker"],
        )
        resets = CounterMetricFamily(
            "tokenfront_router_kv_index_resets",
            "Times the KV index dropped what it knew of the worker's cache (restart, missed events, cleared)",
            labels=["worker"],
        )
        for worker, activity in self._pool.kv_index.feed_activity().items():
            age.add_metric([worker, activity.feed], activity.seconds_since_applied)
            if activity.publish_lag is not None:
                lag.add_metric([worker], activity.publish_lag)
            resets.add_metric([worker], float(activity.resets))
        yield age
        yield lag
        yield resets

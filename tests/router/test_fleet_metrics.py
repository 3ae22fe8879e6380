"""The KV index's feed activity and the router's fleet metrics built on it: how long since each worker's events
were applied (by feed), a vLLM batch's publish lag, the index's resets; gone with the worker.

The worker states and the gate's blocking workers are checked on a real router by
tests/monitoring/test_prometheus_scrape.py (a worker stopped, a worker that renders differently)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.router.fleet_metrics import FleetMetrics
from tokenfront.router.gate import ForwardingGate
from tokenfront.router.kv_index import FeedActivity, KvIndex
from tokenfront.router.vllm_events import VllmEventBatch
from tokenfront.router.worker_pool import PoolSettings, WorkerPool
from tokenfront.worker.kv_events import KvEventLog

TOKENFRONT = "http://w1:8000"
VLLM = "http://w2:8000"
TPB = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _store(log: KvEventLog, start: int) -> None:
    ids = list(range(start, start + 2 * TPB))
    log.stored(block_hashes(ids, TPB, None), None, [ids[:TPB], ids[TPB:]], TPB)


def test_feed_activity_ages_lags_and_resets() -> None:
    clock = Clock()
    index, log = KvIndex(clock=clock), KvEventLog()
    assert index.feed_activity() == {}
    _store(log, 0)
    index.apply_tokenfront_events(TOKENFRONT, log.read(0))
    index.apply_vllm_batch(VLLM, VllmEventBatch(ts=time.time() - 2.0, events=()))
    clock.now += 7.5
    activity = index.feed_activity()
    assert activity[TOKENFRONT] == FeedActivity("http", 7.5, None, 0)
    vllm = activity[VLLM]
    assert (vllm.feed, vllm.seconds_since_applied, vllm.resets) == ("zmq", 7.5, 0)
    assert vllm.publish_lag is not None and 2.0 <= vllm.publish_lag < 3.0

    # A read that finds nothing new is still a read: the age starts again.
    index.apply_tokenfront_events(TOKENFRONT, log.read(index.tokenfront_cursor(TOKENFRONT)))
    assert index.feed_activity()[TOKENFRONT].seconds_since_applied == 0.0
    # The worker restarted (another log): the index drops what it knew, once.
    restarted = KvEventLog()
    _store(restarted, 100)
    index.apply_tokenfront_events(TOKENFRONT, restarted.read(0))
    assert index.feed_activity()[TOKENFRONT].resets == 1
    # A worker that left has no activity.
    index.forget(VLLM)
    assert set(index.feed_activity()) == {TOKENFRONT}


def test_fleet_metrics_show_the_feeds() -> None:
    clock = Clock()
    index = KvIndex(clock=clock)
    pool = WorkerPool(index, PoolSettings())
    registry = CollectorRegistry()
    registry.register(FleetMetrics(pool, ForwardingGate(None, has_model_path=False)))
    log = KvEventLog()
    _store(log, 0)
    index.apply_tokenfront_events(TOKENFRONT, log.read(0))
    index.apply_vllm_batch(VLLM, VllmEventBatch(ts=time.time() - 1.0, events=()))
    clock.now += 3.0

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("tokenfront_router_kv_events_age_seconds", worker=TOKENFRONT, feed="http") == 3.0
    assert value("tokenfront_router_kv_events_age_seconds", worker=VLLM, feed="zmq") == 3.0
    lag = value("tokenfront_router_kv_events_publish_lag_seconds", worker=VLLM)
    assert lag is not None and 1.0 <= lag < 2.0
    assert value("tokenfront_router_kv_events_publish_lag_seconds", worker=TOKENFRONT) is None
    assert value("tokenfront_router_kv_index_resets_total", worker=TOKENFRONT) == 0.0
    index.forget(TOKENFRONT)
    assert value("tokenfront_router_kv_events_age_seconds", worker=TOKENFRONT, feed="http") is None

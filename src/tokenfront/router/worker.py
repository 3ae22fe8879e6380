"""One worker as the router keeps it: its two connection pools, its last report, its health, its load.

A `Worker` is made by `WorkerPool.add` from a `WorkerSpec` and brought up to date by each health check
(`router.worker_health`); the proxy counts its requests on it and hands the policy its `load()`. `describe()` is
what the admin API and `/server_info` show of it.

Each worker has two pools of keep-alive connections: a `router.check_client.CheckClient` for the periodic checks
and event polls, and a `router.connections.WorkerConnections` pool for the proxied requests (the router's
per-request path); the first is built on the second's connections.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenfront.router.check_client import CheckClient
from tokenfront.router.connections import WorkerConnections
from tokenfront.router.policies.base import WorkerLoad
from tokenfront.router.worker_report import WorkerReport

__all__ = [
    "ADMIN_SOURCE",
    "FLAG_SOURCE",
    "NO_GENERATE_ROUTE",
    "ROUTER_ITSELF",
    "ROUTER_LOOP",
    "WORKER_API_KEY",
    "Worker",
]

# Why a worker that answers cannot be used (`Worker.unusable`).
ROUTER_ITSELF = "router_itself"
ROUTER_LOOP = "router_loop"
WORKER_API_KEY = "worker_api_key"
NO_GENERATE_ROUTE = "no_generate_route"

# Who added a worker (`Worker.source`), besides the worker sources (`router.worker_sources`).
FLAG_SOURCE = "flag"
ADMIN_SOURCE = "admin"


@dataclass
class Worker:
    """One worker: its connection pools, its last report, its health and its load."""

    url: str
    client: CheckClient  # the checks and event polls
    connections: WorkerConnections  # the proxied requests
    kv_events: str | None = None
    kv_replay: str | None = None
    protocol: str = "openai"  # how forwarded ids are sent (PROTOCOLS)
    verify: str | None = None  # "probe": probed on each check (VERIFY_MODES)
    # Who added it: FLAG_SOURCE, ADMIN_SOURCE, or a worker source's name ("file:PATH", "dns:NAME").
    source: str = "admin"
    healthy: bool = False
    checked: bool = False  # at least one check finished
    report: WorkerReport | None = None
    problem: str | None = None  # why it is out of the active set
    # Why it answers yet cannot be used (ROUTER_ITSELF, ROUTER_LOOP, WORKER_API_KEY): it is the router
    # itself, a router routing back here, or it refuses the router's key. None otherwise.
    unusable: str | None = None
    # The model it is pinned to (its spec's `model=NAME`); None: the names it reports place it.
    pinned_model: str | None = None
    # The key of the router's model it belongs to (`router.model_placement`; None: none, it gets no requests).
    model_group: str | None = None
    # Which of its model's names it does not serve (`WorkerPool.serving` keeps requests naming those away from
    # it), or why it belongs to no model of the router's; None when it serves them all or says no names.
    model_mismatch: str | None = None
    active_requests: int = 0
    # Requests other router replicas have in flight on it (`router.replica_sync`): the policy sees the sum.
    peer_requests: int = 0
    routed: int = 0
    failures: int = 0
    last_check: float | None = None
    subscriber: Any = None
    check_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # One read of its KV events at a time (the periodic reads and the start-up's `router.kv_warmup`).
    events_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Called when a health check finds the worker gone: requests still waiting for it stop waiting and go to
    # another worker. Each caller registers for the time it waits, and unregisters after.
    lost_watchers: set[Callable[[], None]] = field(default_factory=set, repr=False)
    # What `load` hands the policy: one object per worker, brought up to date on each call.
    _load: WorkerLoad | None = field(default=None, init=False, repr=False, compare=False)

    def lose(self) -> None:
        """A health check found the worker gone: tell every request waiting on it."""
        watchers = list(self.lost_watchers)
        self.lost_watchers.clear()
        for watcher in watchers:
            watcher()

    def serves(self, model: str) -> bool:
        """Whether it answers to `model` (a worker that says no names is taken to serve any)."""
        names = self.report.served_model_names if self.report is not None else None
        return names is None or model in names

    def load(self) -> WorkerLoad:
        """What the routing policy sees of this worker: the same object each time, its load brought up to date
        (a decision among 1,000 workers allocates no object per worker)."""
        block = self.report.tokens_per_block if self.report else None
        load = self._load
        if load is None:
            load = self._load = WorkerLoad(self.url, self.active_requests + self.peer_requests, block)
        else:
            load.active_requests = self.active_requests + self.peer_requests
            load.tokens_per_block = block
        return load

    def describe(self) -> dict[str, Any]:
        """The worker's state as the admin API and `/server_info` show it."""
        report = self.report
        fingerprint = report.fingerprint if report else None
        if self.healthy:
            state = "healthy"
        elif self.unusable is not None:
            state = "unusable"
        else:
            state = "unhealthy" if self.checked else "pending"
        return {
            "url": self.url,
            "state": state,
            "problem": self.problem,
            "unusable": self.unusable,
            "role": report.role if report else None,
            "router_id": report.router_id if report else None,
            "model": report.model if report else None,
            "served_model_names": list(report.served_model_names or ()) if report else None,
            "model_group": self.model_group,
            "pinned_model": self.pinned_model,
            "model_mismatch": self.model_mismatch,
            "tokens_per_block": report.tokens_per_block if report else None,
            "reasoning_parser": report.reasoning_parser if report else None,
            "fingerprint_digest": fingerprint.digest if fingerprint else None,
            "fingerprint_missing": report.missing if report else None,
            "kv_events": self._kv_events_source(),
            "protocol": self.protocol,
            "verify": self.verify,
            "source": self.source,
            "active_requests": self.active_requests,
            "peer_requests": self.peer_requests,
            "routed": self.routed,
            "failures": self.failures,
            "seconds_since_check": round(time.monotonic() - self.last_check, 3) if self.last_check else None,
        }

    def _kv_events_source(self) -> str | None:
        if self.kv_events is not None:
            return f"vllm-zmq:{self.kv_events}"
        if self.report is not None and self.report.publishes_kv_events:
            return "tokenfront:/kv_cache_events"
        return None

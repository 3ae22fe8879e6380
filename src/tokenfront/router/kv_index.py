"""What the router knows of its workers' prefix KV caches: the fleet's blocks and what feeds them.

``KvIndex`` is ``FleetBlocks`` (one structure for the whole fleet: which worker holds which block, named by
tokenfront's chained hash, routed guesses and their TTL, the per-worker cap; see ``router/fleet_blocks.py``)
with its three feeds attached:

- tokenfront workers' ``GET /kv_cache_events`` answers (``apply_tokenfront_events``, read from
  ``tokenfront_cursor``), which already use tokenfront's names (``router/tokenfront_feed.py``);
- vLLM workers' ZMQ event batches (``apply_vllm_batch``), whose own names are mapped onto tokenfront's by
  re-hashing each block's ids (``router/vllm_feed.py``; the wire itself is ``router/vllm_events.py``);
- what the router sent where (``record_routed``), a guess until events confirm or expire it.

A policy hashes a prompt once (``core.kv_blocks.block_hash_array``) and asks for every candidate at once
(``matched_blocks``): one walk of the prompt's blocks, whatever the number of workers.

How fresh each worker's feed is (``feed_activity``, for ``/metrics``): when its last answer or batch was
applied, how late a ZMQ batch arrived after its own timestamp, and how often the index dropped what it knew.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenfront.router.block_changes import DEVICE, Location
from tokenfront.router.fleet_blocks import DEFAULT_MAX_BLOCKS_PER_WORKER, DEFAULT_ROUTED_TTL_S, FleetBlocks
from tokenfront.router.tokenfront_feed import TokenfrontFeed
from tokenfront.router.vllm_events import parse_vllm_batch
from tokenfront.router.vllm_feed import VllmFeed

__all__ = [
    "DEFAULT_MAX_BLOCKS_PER_WORKER",
    "DEFAULT_ROUTED_TTL_S",
    "DEVICE",
    "FeedActivity",
    "KvIndex",
    "Location",
]


@dataclass(frozen=True)
class FeedActivity:
    """One worker's KV event feed as last seen: which feed, seconds since it last applied something (the
    ``http`` feed, ``GET /kv_cache_events``, is read every ``--kv-events-interval`` even when nothing is new; on
    the ``zmq`` feed, vLLM's wire, a worker publishes only when its cache changes), for ``zmq`` the seconds
    between the last batch's own timestamp and its application (two machines' wall clocks), and the times the
    index dropped the worker's blocks (restarts, missed events, a worker clearing its cache)."""

    feed: str  # "http" (GET /kv_cache_events) or "zmq" (vLLM's KVEventBatch)
    seconds_since_applied: float
    publish_lag: float | None
    resets: int


class KvIndex(FleetBlocks):
    """The fleet's prefix blocks, fed by tokenfront event logs, vLLM event batches and routed history.
    Thread-safe."""

    # The feeds, made on first use (so the constructor is FleetBlocks' own, settings and all).
    _attached: tuple[TokenfrontFeed, VllmFeed] | None = None
    # Per worker: (feed, the index's clock at the last application, a ZMQ batch's lag); made on first use too.
    _applied: dict[str, tuple[str, float, float | None]] | None = None

    @property
    def _feeds(self) -> tuple[TokenfrontFeed, VllmFeed]:
        with self.lock:
            if self._attached is None:
                self._attached = (TokenfrontFeed(self), VllmFeed(self))
            return self._attached

    def apply_tokenfront_events(self, worker: str, payload: Mapping[str, Any]) -> None:
        """Apply one ``GET /kv_cache_events`` answer (``{events, last_seq, oldest_seq, truncated, log_id}``).

        A new ``log_id`` (the worker restarted) or ``truncated`` (the router missed events) drops everything
        known of the worker before the returned events are applied; a truncated answer's ``snapshot`` (the
        worker's cache at ``last_seq``) is applied as its blocks. Events at or below the cursor (a repeated
        read) are skipped; a gap in sequence numbers is treated like ``truncated``. Read again with
        ``after=tokenfront_cursor(worker)``.
        """
        self._feeds[0].apply(worker, payload)
        self._note_applied(worker, "http", None)

    def tokenfront_cursor(self, worker: str) -> int:
        """The ``after`` for the next ``GET /kv_cache_events`` read of this worker (0 to start)."""
        return self._feeds[0].cursor(worker)

    def tokenfront_log_id(self, worker: str) -> str | None:
        """The ``log_id`` of the worker's event log as last read (None before the first read): sent with the
        next read, so a worker that restarted since answers with its snapshot."""
        return self._feeds[0].log_id(worker)

    def apply_vllm_batch(self, worker: str, batch: object) -> None:
        """Apply one vLLM ``KVEventBatch`` (a ``VllmEventBatch``, its msgpack bytes or its decoded form)."""
        parsed = parse_vllm_batch(batch)
        self._feeds[1].apply(worker, parsed)
        self._note_applied(worker, "zmq", time.time() - parsed.ts)

    def _note_applied(self, worker: str, feed: str, publish_lag: float | None) -> None:
        with self.lock:
            if self._applied is None:
                self._applied = {}
            self._applied[worker] = (feed, self._clock(), publish_lag)

    def feed_activity(self) -> dict[str, FeedActivity]:
        """Each worker's feed (module docstring), for the workers whose events the index has applied."""
        with self.lock:
            now = self._clock()
            return {
                worker: FeedActivity(feed, now - applied_at, lag, self._workers[worker].resets)
                for worker, (feed, applied_at, lag) in (self._applied or {}).items()
                if worker in self._workers
            }

    def reset(self, worker: str) -> None:
        """Drop every block known of the worker (it restarted, or events were lost); keep its event state."""
        with self.lock:
            super().reset(worker)
            self._feeds[1].forget(worker)  # a restarted vLLM names its blocks anew

    def forget(self, worker: str) -> None:
        """Drop everything about the worker (it left): blocks, event cursor, ``has_events``."""
        with self.lock:
            super().forget(worker)
            for feed in self._feeds:
                feed.forget(worker)
            if self._applied is not None:
                self._applied.pop(worker, None)

    def stats(self) -> dict[str, Any]:
        """``FleetBlocks.stats`` with each worker's tokenfront event cursor and log id."""
        with self.lock:
            stats = super().stats()
            workers: dict[str, dict[str, Any]] = stats["workers"]  # type: ignore[assignment]
            tokenfront = self._feeds[0]
            for url, entry in workers.items():
                entry["event_cursor"] = tokenfront.cursor(url)
                entry["log_id"] = tokenfront.log_id(url)
            return stats

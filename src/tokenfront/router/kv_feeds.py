"""Each worker's KV event feed, on the pool's side: read, subscribed to, stopped.

A tokenfront worker whose report says it publishes this router's block hashes (`WorkerReport.publishes_kv_events`)
is read on `GET /kv_cache_events?after=SEQ`, page by page, every `--kv-events-interval` s while it is active (the
pool's events loop) and once at start-up (`router.kv_warmup`); a worker given a vLLM ZMQ endpoint
(`kv-events=` in its spec) gets a `VllmEventSubscriber` for as long as it is in the pool. What a page or a batch
says is put into the index's own vocabulary by `router/tokenfront_feed.py` and `router/vllm_feed.py`.

A read goes over the worker's `CheckClient` (`router.check_client`): each page whole within `--health-timeout`
and at most `--max-response-bytes` (a snapshot of a large cache is several MB); a failed read is logged at debug
level and caught up on the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenfront.router.connections import WorkerTransportError, describe_error
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.worker import Worker

if TYPE_CHECKING:
    from tokenfront.router.worker_pool import PoolSettings

__all__ = ["KvFeeds"]

log = logging.getLogger(__name__)

# One read of a worker's KV event log returns at most this many events (the worker's own cap).
_EVENTS_PAGE = 10_000


class KvFeeds:
    """The KV event feeds of the pool's workers, into one index."""

    def __init__(self, kv_index: KvIndex, workers: Mapping[str, Worker], settings: PoolSettings) -> None:
        """`workers` is the pool's own map (a read whose worker left it meanwhile is dropped); a read waits
        `settings.health_timeout` at most."""
        self.kv_index = kv_index
        self.workers = workers
        self.settings = settings

    def publishers(self) -> list[Worker]:
        """The active workers whose KV events the router reads from `GET /kv_cache_events`."""
        return [w for w in self.workers.values() if self.publishes(w)]

    @staticmethod
    def publishes(worker: Worker) -> bool:
        """Whether the router reads this worker's KV events from `GET /kv_cache_events` (it is active)."""
        return bool(
            worker.healthy
            and worker.kv_events is None
            and worker.report
            and worker.report.publishes_kv_events
        )

    async def poll(self) -> None:
        """Read new KV events from every active tokenfront worker into the KV index."""
        await asyncio.gather(*(self.read(w) for w in self.publishers()))

    async def read(self, worker: Worker) -> bool | None:
        """Read the worker's KV events up to its `last_seq` into the index, page by page; None when a read
        failed or the worker left meanwhile (caught up on the next read), else whether a snapshot came."""
        async with worker.events_lock:
            return await self._read(worker)

    async def _read(self, worker: Worker) -> bool | None:
        # The index keeps the cursor and the log's id, and notices a restarted worker or missed events; the
        # id goes with the read, so a restarted worker answers with a snapshot (`worker/kv_events.py`).
        snapshot = False
        while True:
            params: dict[str, Any] = {
                "after": self.kv_index.tokenfront_cursor(worker.url),
                "limit": _EVENTS_PAGE,
            }
            log_id = self.kv_index.tokenfront_log_id(worker.url)
            if log_id is not None:
                params["log_id"] = log_id
            try:
                response = await worker.client.get(
                    "/kv_cache_events", params=params, timeout=self.settings.health_timeout
                )
                if response.status_code != 200:
                    # Liveness is the health check's business; a missed poll is caught up on the next one.
                    log.debug("reading KV events of %s: it answered %d", worker.url, response.status_code)
                    return None
                payload = response.json()  # orjson: a snapshot is ~20 digits a block, thousands of them
                if not worker.healthy or self.workers.get(worker.url) is not worker:
                    return None  # taken out or removed while reading: what it held was forgotten
                self.kv_index.apply_tokenfront_events(worker.url, payload)
            except (
                WorkerTransportError,
                ValueError,
                AttributeError,
            ) as exc:  # orjson's errors are ValueErrors
                log.debug("reading KV events of %s failed: %s", worker.url, describe_error(exc))
                return None
            snapshot = snapshot or payload.get("snapshot") is not None
            if len(payload.get("events") or ()) < _EVENTS_PAGE:
                return snapshot

    def subscribe(self, worker: Worker) -> None:
        """Start the vLLM ZMQ subscriber of a worker that has `kv_events` (nothing for the others)."""
        if worker.kv_events is None:
            return
        from tokenfront.router.vllm_events import VllmEventSubscriber

        worker.subscriber = VllmEventSubscriber(
            worker.kv_events, worker.url, self.kv_index, replay_endpoint=worker.kv_replay
        )
        worker.subscriber.start()

    def unsubscribe(self, worker: Worker) -> None:
        """Stop the worker's vLLM ZMQ subscriber, if it has one."""
        if worker.subscriber is not None:
            with contextlib.suppress(Exception):
                worker.subscriber.stop()
            worker.subscriber = None

"""The router's start-up read of its workers' KV events: it serves only once its index knows their caches.

A router that serves as soon as its workers answer routes its first requests blind: its index is empty until the
first event reads, and a worker that ran a while has cut the history a fresh reader would need (its log keeps
``--kv-events-buffer`` events). So the router's lifespan calls ``warm_kv_index`` after the workers' first
health checks and before it listens: every *active* worker that publishes ``GET /kv_cache_events`` is read
once up to its ``last_seq`` (right after its first check, while the others are still being checked:
``WorkerPool.read_events_when_added``; a read that did not get there is retried here) — its whole retained history, or, when that was cut, the cache's snapshot
(``worker/kv_snapshot.py``) — retried every ``--kv-events-interval`` while a read fails (a worker that leaves
the active set meanwhile is not waited for). The wait is bounded
by ``--kv-warmup-timeout`` (``PoolSettings.kv_warmup_timeout``), counted from the first check: at the deadline the router serves anyway,
logs one warning naming how many workers and which are not read yet (their blocks fill in as the periodic
reads reach them), and ``/server_info`` says so in ``kv_warmup``. Workers that are not answering yet, and
workers on vLLM's ZMQ feed (which has no snapshot to ask for: docs/routing.md), are not waited for.

Until this returns uvicorn does not listen, so a readiness probe on ``/health`` fails (connection refused)
and a load balancer keeps sending to the replicas that are up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenfront.router.worker_pool import WorkerPool

__all__ = ["KvWarmup", "warm_kv_index"]

log = logging.getLogger(__name__)

# How many of the workers not read at the deadline the warning names.
_NAMED = 5


@dataclass(frozen=True)
class KvWarmup:
    """How the start-up read went: of ``workers`` active event publishers, ``read`` were read up to their
    ``last_seq`` (``snapshots`` of them from a snapshot) in ``seconds``, ``left`` the active set first;
    ``pending`` were not read by the deadline ``timeout``."""

    workers: int
    read: int
    left: int  # taken out of the active set before they were read: not waited for
    snapshots: int
    blocks: int  # blocks the index holds of those workers afterwards
    seconds: float
    timeout: float
    pending: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """Whether every worker was read before the deadline."""
        return not self.pending

    def to_json(self) -> dict[str, Any]:
        """The ``kv_warmup`` of the router's ``/server_info``."""
        return {
            "complete": self.complete,
            "workers": self.workers,
            "read": self.read,
            "left": self.left,
            "snapshots": self.snapshots,
            "blocks": self.blocks,
            "seconds": round(self.seconds, 3),
            "timeout": self.timeout,
            "pending": list(self.pending),
        }


async def warm_kv_index(pool: WorkerPool) -> KvWarmup:
    """Read every active tokenfront event publisher of ``pool`` once up to its ``last_seq``, retrying failed
    reads every ``kv_events_interval``, for at most ``kv_warmup_timeout`` seconds (module docstring).

    Also kept as ``pool.kv_warmup``. A timeout of 0 reads nothing and says so."""
    settings = pool.settings
    first_reads, started = pool.take_first_reads()  # the workers read as they were added
    started = started or time.monotonic()
    publishers = pool.feeds.publishers()
    workers = len(publishers)
    read = [worker.url for worker in publishers if worker.url in first_reads]
    snapshots = sum(first_reads[url] for url in read)
    pending = {worker.url: worker for worker in publishers if worker.url not in first_reads}
    left = 0
    if pending and settings.kv_warmup_timeout > 0:
        try:
            async with asyncio.timeout(max(0.0, started + settings.kv_warmup_timeout - time.monotonic())):
                while True:
                    batch = list(pending.values())
                    results = await asyncio.gather(*(pool.feeds.read(worker) for worker in batch))
                    for worker, result in zip(batch, results, strict=True):
                        if result is not None:  # read to the end; True: from a snapshot
                            del pending[worker.url]
                            read.append(worker.url)
                            snapshots += int(result)
                    if not pending:
                        break
                    await asyncio.sleep(settings.kv_events_interval)
                    # A worker taken out of the active set meanwhile (a failed check) is not waited for.
                    active = {worker.url for worker in pool.feeds.publishers()}
                    for url in [url for url in pending if url not in active]:
                        del pending[url]
                        left += 1
                    if not pending:
                        break
        except TimeoutError:
            pass
    warmup = KvWarmup(
        workers=workers,
        read=len(read),
        left=left,
        snapshots=snapshots,
        blocks=sum(pool.kv_index.blocks_held(url) for url in read),
        seconds=time.monotonic() - started,
        timeout=settings.kv_warmup_timeout,
        pending=tuple(pending),
    )
    pool.kv_warmup = warmup
    if warmup.pending and not warmup.timeout:
        log.info("--kv-warmup-timeout 0: serving before the KV events of %d workers are read", workers)
    elif warmup.pending:
        named = ", ".join(warmup.pending[:_NAMED]) + (", ..." if len(warmup.pending) > _NAMED else "")
        log.warning(
            "KV events of %d of %d workers not read within --kv-warmup-timeout %gs: serving with their caches "
            "unknown until the periodic reads reach them (%s)",
            len(warmup.pending),
            workers,
            warmup.timeout,
            named,
        )
    elif workers:
        log.info(
            "KV events of %d workers read in %.2fs (%d from a snapshot): %d blocks known",
            workers,
            warmup.seconds,
            warmup.snapshots,
            warmup.blocks,
        )
    return warmup

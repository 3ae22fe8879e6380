"""Worker sources: membership that follows a file or a DNS name, beside `--worker` and the admin API.

A `WorkerSource` says which workers it lists now (`router.worker_file`, `router.worker_dns`). A `SourceMembers`
keeps the pool in step with one source, through the same two calls the admin API makes: a worker the source
lists and the pool lacks is added (`WorkerPool.add`: checked once, it takes requests once healthy), one it no
longer lists is removed as `DELETE /workers` removes one (`WorkerPool.remove`: no new requests, the in-flight
ones finish). A source owns the workers it added and touches no other: a worker of `--worker`, of the admin API
or of another source is left to its owner, and a source that lists it too waits until the owner lets it go.
`--worker-allow` and `--max-workers` apply as to `POST /workers`; a refused worker is logged once and tried
again at each refresh.

`WorkerSources` runs every source: once at start-up, before the router serves, then every
`--worker-source-interval` seconds, and at once on SIGHUP (`reload`, called by the router's one SIGHUP handler,
`router.hangup`). A source that cannot say what it lists (a file that
cannot be read, a name that does not resolve) keeps its last workers and logs once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenfront.router.worker import Worker
from tokenfront.router.worker_allow import WorkerAllowList
from tokenfront.router.worker_pool import DuplicateWorker, RouterItself, WorkerPool
from tokenfront.router.worker_spec import WorkerSpec
from tokenfront.server.tasks import cancel_and_wait
from tokenfront.server_address import worker_identity

__all__ = [
    "DEFAULT_INTERVAL",
    "Admission",
    "SourceMembers",
    "SourceUnavailable",
    "WorkerSource",
    "WorkerSources",
]

log = logging.getLogger(__name__)

# Seconds between two reads of each source (`--worker-source-interval`).
DEFAULT_INTERVAL = 5.0


class SourceUnavailable(Exception):
    """The source cannot say which workers it lists now; its last set stays. The message says why, in one line,
    the same each time for the same cause (it is logged once)."""


class WorkerSource(Protocol):
    """Where a set of workers comes from."""

    @property
    def name(self) -> str:
        """How `/workers` and the log name it: `file:PATH`, `dns:NAME`."""
        ...

    async def read(self) -> Sequence[WorkerSpec]:
        """The workers it lists now; SourceUnavailable when that cannot be known."""
        ...


@dataclass(frozen=True)
class Admission:
    """What a source's worker must pass before it is added, as a `POST /workers` one must (`--worker-allow`,
    `--max-workers`)."""

    allow: WorkerAllowList | None = None
    max_workers: int = 4096


class SourceMembers:
    """The workers one source added to the pool, kept in step with what it lists."""

    def __init__(self, source: WorkerSource, pool: WorkerPool, admission: Admission) -> None:
        self.source = source
        self.pool = pool
        self.admission = admission
        # url -> (the spec it was added with, the pool's worker): what this source owns.
        self._owned: dict[str, tuple[WorkerSpec, Worker]] = {}
        # url -> why a worker it lists is not in the pool as its own (logged when it changes).
        self._refused: dict[str, str] = {}
        self._unavailable = False
        self._lock = asyncio.Lock()

    @property
    def owned(self) -> list[str]:
        """The URLs of the workers this source added and the pool still holds."""
        return [url for url, (_, worker) in self._owned.items() if self.pool.workers.get(url) is worker]

    async def refresh(self) -> None:
        """Read the source and apply what it lists; a source that cannot be read changes nothing."""
        async with self._lock:
            try:
                specs = await self.source.read()
            except SourceUnavailable as exc:
                if not self._unavailable:
                    kept = len(self.owned)
                    log.warning(
                        "worker source %s: %s; keeping its last %d worker%s until it can be read again",
                        self.source.name,
                        exc,
                        kept,
                        "" if kept == 1 else "s",
                    )
                else:  # said once at warning level; each later read that fails, for whoever debugs it
                    log.debug("worker source %s is still unreadable: %s", self.source.name, exc)
                self._unavailable = True
                return
            if self._unavailable:
                log.info("worker source %s can be read again", self.source.name)
                self._unavailable = False
            await self._apply(specs)

    async def _apply(self, specs: Sequence[WorkerSpec]) -> None:
        wanted: dict[str, WorkerSpec] = {}
        identities: set[tuple[str, str, int]] = set()
        for spec in specs:  # one worker once, however spelled (the source logs its own duplicates)
            identity = worker_identity(spec.url)
            if identity not in identities:
                identities.add(identity)
                wanted[spec.url] = spec
        for url, (_, worker) in list(self._owned.items()):
            if self.pool.workers.get(url) is not worker:
                del self._owned[url]  # removed by other hands (DELETE /workers): added again below if listed
        for url, (spec, _) in list(self._owned.items()):
            if wanted.get(url) != spec:  # no longer listed, or listed with other options (added again)
                del self._owned[url]
                log.info("worker source %s no longer lists %s: removing it", self.source.name, url)
                with contextlib.suppress(KeyError):
                    await self.pool.remove(url)
        for url in [url for url in self._refused if url not in wanted]:
            del self._refused[url]
        new = [spec for url, spec in wanted.items() if url not in self._owned]
        await asyncio.gather(*(self._add(spec) for spec in new))

    async def _add(self, spec: WorkerSpec) -> None:
        refusal = await self._refusal(spec)
        if refusal is not None:
            self._refuse(spec.url, refusal)
            return
        # Nothing awaits between the pool's size being read (`_refusal`) and `add` taking the worker in: adds
        # running concurrently cannot pass --max-workers.
        try:
            worker = await self.pool.add(spec, refuse_loops=True, source=self.source.name)
        except DuplicateWorker as exc:
            holder = self.pool.workers.get(exc.existing)
            owner = holder.source if holder is not None else "another source"
            self._refuse(spec.url, f"it is in the pool already as {exc.existing} (from {owner}), left to it")
            return
        except RouterItself as exc:
            self._refuse(spec.url, f"{exc} (a router cannot be its own worker)")
            return
        except Exception as exc:  # e.g. its vLLM KV event subscriber cannot start: the others still apply
            log.exception("worker source %s: adding %s failed", self.source.name, spec.url)
            self._refused[spec.url] = f"adding it failed ({exc})"
            return
        self._owned[spec.url] = (spec, worker)
        self._refused.pop(spec.url, None)

    async def _refusal(self, spec: WorkerSpec) -> str | None:
        """Why the pool may not take this worker now (None: it may)."""
        allow = self.admission.allow
        if allow is not None:
            endpoints = (("kv-events", spec.kv_events), ("kv-replay", spec.kv_replay))
            refusal = await allow.refusal_in_thread(
                spec.url, endpoints, timeout=self.pool.settings.connect_timeout
            )
            if refusal is not None:
                return refusal[1]
        if len(self.pool.workers) >= self.admission.max_workers:
            return (
                f"the pool is full ({len(self.pool.workers)} workers, the router's --max-workers); it is added "
                "once there is room"
            )
        return None

    def _refuse(self, url: str, reason: str) -> None:
        if self._refused.get(url) != reason:
            log.warning("worker source %s lists %s, not added: %s", self.source.name, url, reason)
        self._refused[url] = reason


class WorkerSources:
    """Runs the worker sources with the app: a first read of each at start-up, then one every `interval`
    seconds and on SIGHUP, each source on its own (a slow DNS server delays no file)."""

    def __init__(
        self,
        sources: Sequence[WorkerSource],
        pool: WorkerPool,
        admission: Admission,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        self.members = [SourceMembers(source, pool, admission) for source in sources]
        self.interval = interval
        self._wakes: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Read every source once (its workers are added and checked), then keep reading them."""
        if not self.members:
            return
        await asyncio.gather(*(self._refresh(members) for members in self.members))
        loop = asyncio.get_running_loop()
        self._wakes = [asyncio.Event() for _ in self.members]
        self._tasks = [
            loop.create_task(self._follow(members, wake))
            for members, wake in zip(self.members, self._wakes, strict=True)
        ]

    def reload(self) -> None:
        """Read every source now (SIGHUP: `router.hangup`)."""
        log.info("reading the worker sources again (SIGHUP)")
        for wake in self._wakes:
            wake.set()

    async def stop(self) -> None:
        """Stop reading the sources (their workers stay in the pool, which the app stops next)."""
        await cancel_and_wait(self._tasks)
        self._tasks = []

    async def _follow(self, members: SourceMembers, wake: asyncio.Event) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), self.interval)
            wake.clear()
            await self._refresh(members)

    async def _refresh(self, members: SourceMembers) -> None:
        try:
            await members.refresh()
        except Exception:  # a bug must not stop the source: the next refresh tries again
            log.exception("reading worker source %s failed", members.source.name)

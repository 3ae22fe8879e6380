"""Worker membership: which workers the router may send to, and how each one is doing.

A `WorkerPool` holds one `Worker` per URL (`router.worker`). It adds and removes workers (`--worker`, the admin
API, the worker sources), checks every worker periodically (`router.worker_health`: `/health`, `/v1/models`,
`/server_info`, and the render probe of a `verify=probe` worker), takes a worker out of the active set when a
check or a request to it fails and puts it back when it answers again, and keeps the router's KV index fed
(`router.kv_feeds`). Whenever the active set or what an active worker reports changes, `on_change` is called
(the app re-evaluates the forwarding gate there); a changed probe result counts as a changed report.

It gives each worker its two pools of keep-alive connections: a `router.check_client.CheckClient` for the
periodic checks and event polls, and a `router.connections.WorkerConnections` pool for the proxied requests, both
with the router's headers (`VIA_HEADER`, the worker key) and one TLS context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tokenfront.router.check_client import CheckClient
from tokenfront.router.connections import WorkerConnections, describe_error
from tokenfront.router.kv_feeds import KvFeeds
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.kv_warmup import KvWarmup
from tokenfront.router.model_placement import ModelPlacement
from tokenfront.router.probe import Prober
from tokenfront.router.worker import ADMIN_SOURCE, FLAG_SOURCE, ROUTER_ITSELF, ROUTER_LOOP, Worker
from tokenfront.router.worker_health import VIA_HEADER, HealthCheck
from tokenfront.router.worker_spec import WorkerSpec
from tokenfront.server.tasks import cancel_and_wait
from tokenfront.server_address import worker_identity
from tokenfront.tls import ClientTls

__all__ = ["DuplicateWorker", "PoolSettings", "RouterItself", "WorkerPool"]

log = logging.getLogger(__name__)

# uvicorn closes idle keep-alive connections after 5 s: expire ours first, so a reused connection is never
# one the worker is closing (which would look like a worker failure).
_KEEPALIVE_EXPIRY = 4.0
# Connections for the checks and event polls (the proxied requests have their own pool).
_CHECK_CONNECTIONS = 4


@dataclass(frozen=True)
class PoolSettings:
    """Timings and limits of the worker pool."""

    health_interval: float = 2.0
    health_timeout: float = 5.0
    kv_events_interval: float = 0.5
    # How long start-up waits for every active worker's KV events to be read once (`router.kv_warmup`).
    kv_warmup_timeout: float = 10.0
    connect_timeout: float = 5.0
    request_timeout: float = 600.0
    # The proxied requests' bounds on a worker's answer (router.worker_answers).
    first_byte_timeout: float = 120.0
    idle_timeout: float = 60.0
    max_response_bytes: int = 64 * 1024 * 1024
    max_connections: int = 256
    # Sent to workers as `Authorization: Bearer KEY` (`--worker-api-key`); the router's own `--api-key`, which
    # guards its clients' requests, is the app's, never sent on.
    worker_api_key: str | None = None
    # How HTTPS workers are verified, and the client certificate shown to those that ask (`--worker-ca-certs`,
    # `--worker-certfile`, `--worker-keyfile`); the system's trust when None.
    worker_tls: ClientTls | None = None

    @property
    def key_for_workers(self) -> str | None:
        """The key sent to workers (None: none)."""
        return self.worker_api_key


class DuplicateWorker(KeyError):
    """The worker is in the pool already, maybe spelled otherwise (`existing` is the entry)."""

    def __init__(self, url: str, existing: str) -> None:
        super().__init__(url)
        self.url, self.existing = url, existing

    def __str__(self) -> str:
        return f"worker {self.url} is already in the pool as {self.existing}"


class RouterItself(ValueError):
    """The worker URL reaches this router (or a router that routes back to it): it would route to itself."""


class WorkerPool:
    """The router's workers: membership, the active set (each check's and failed request's conclusion acted
    on) and the loops that check the workers and read their KV events."""

    def __init__(
        self,
        kv_index: KvIndex,
        settings: PoolSettings,
        *,
        on_change: Callable[[], None] = lambda: None,
        prober: Prober | None = None,
        probers: Mapping[str, Prober] | None = None,
        router_id: str | None = None,
        placement: ModelPlacement | None = None,
    ) -> None:
        """`prober` probes the `verify=probe` workers; None when the router cannot render (no pipeline).
        `probers`, by model key, instead: each worker is probed by its own model's (a router of several models).

        `router_id` is the router's instance id (sent as `VIA_HEADER`, and looked for in a worker's
        `/server_info`); `placement` holds the router's models and places each worker in one
        (`router.model_placement`; None: one model without names, it serves what its workers do).
        """
        self.kv_index = kv_index
        self.settings = settings
        self._tls_context: ssl.SSLContext | None = None
        self.on_change = on_change
        self.router_id = router_id
        self.workers: dict[str, Worker] = {}
        self._identities: dict[tuple[str, str, int], str] = {}  # each worker's identity -> its URL (`find`)
        # What a check asks a worker and concludes (`router.worker_health`); the pool acts on it.
        self.health = HealthCheck(
            settings,
            prober=prober,
            probers=probers,
            router_id=router_id,
            placement=placement or ModelPlacement([()]),
        )
        # Each worker's KV event feed into `kv_index` (`router.kv_feeds`).
        self.feeds = KvFeeds(kv_index, self.workers, settings)
        # Addresses the router listens on (host, port): a worker URL naming one is the router itself.
        self._own: set[tuple[str, int]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # One-off tasks (re-checks, closing a removed worker's pool), held so that they are not collected.
        self._one_offs: set[asyncio.Task[None]] = set()
        # How the start-up read of KV events went (`router.kv_warmup`); None before it ran.
        self.kv_warmup: KvWarmup | None = None
        # During start-up (`read_events_when_added`): each worker's KV events read right after its first check,
        # worker URL -> whether from a snapshot, and when those reads began; None afterwards.
        self._first_reads: dict[str, bool] | None = None
        self._first_reads_began = 0.0

    # -- membership ------------------------------------------------------------------------------------------

    def active(self) -> list[Worker]:
        """The workers requests may go to: checked and healthy."""
        return [worker for worker in self.workers.values() if worker.healthy]

    def serving(self, model: str | None, group: str | None = None) -> list[Worker]:
        """The active workers a request naming `model` may go to: those that answer to that name, or say no
        names (a worker serving another name would answer 404). `model` None (the client named none): every
        active worker, each answers with its own model. `group`: only the workers of that model of the
        router's (`Worker.model_group`; None: any). The proxy chooses among these.
        """
        active = self.members(group) if group is not None else self.active()
        if model is None:
            return active
        return [worker for worker in active if worker.serves(model)]

    def members(self, group: str) -> list[Worker]:
        """The active workers of the router's model `group` (its key): the ones its forwarding gate looks at."""
        return [worker for worker in self.workers.values() if worker.healthy and worker.model_group == group]

    def use_models(self, placement: ModelPlacement, probers: Mapping[str, Prober]) -> None:
        """The router's models changed (a reload of `--config`): place every worker that reported again, at once
        (its next check would), probe with each model's prober from its next check, and call `on_change`."""
        self.health.placement = placement
        self.health.probers = dict(probers)
        for worker in list(self.workers.values()):
            if worker.report is not None:
                self.health.place(worker, worker.report)
        self.on_change()

    def find(self, url: str) -> Worker | None:
        """The worker at `url` however it is spelled (loopback names, default port, case, trailing slash)."""
        worker = self.workers.get(url)
        if worker is not None:
            return worker
        try:
            identity = worker_identity(url)
        except ValueError:
            return None
        known = self._identities.get(identity)
        if known is None and len(self._identities) != len(self.workers):
            # Workers put in `workers` without `add` (a test's pool): look through them all.
            return next((w for key, w in self.workers.items() if worker_identity(key) == identity), None)
        return self.workers.get(known) if known is not None else None

    def _forget_identity(self, url: str) -> None:
        with contextlib.suppress(ValueError):
            identity = worker_identity(url)
            if self._identities.get(identity) == url:
                del self._identities[identity]

    def note_own_address(self, host: Any, port: Any) -> None:
        """An address the router listens on (its `--host`/`--port`, or where a request came in)."""
        if isinstance(host, str) and isinstance(port, int) and not isinstance(port, bool):
            self._own.add((host, port))

    def own_address(self, url: str) -> str | None:
        """The router's own `host:port` that `url` names (None: it names none)."""
        try:
            _, host, port = worker_identity(url)
        except ValueError:
            return None
        for own_host, own_port in self._own:
            try:
                _, own_key, _ = worker_identity(f"http://{_bracketed(own_host)}:{own_port}")
            except ValueError:
                continue
            if own_port == port and own_key == host:
                return f"{own_host}:{own_port}"
        return None

    async def add(
        self, spec: WorkerSpec, *, refuse_loops: bool = False, source: str = ADMIN_SOURCE
    ) -> Worker:
        """Add a worker and check it once before returning; `source` says who added it (`Worker.source`).

        DuplicateWorker (a KeyError) when it is in the pool already under any spelling; RouterItself when its
        URL is one the router listens on, or — with `refuse_loops` — when that first check finds it is this
        router, or a router routing back to this one (it is removed again then).
        """
        existing = self.find(spec.url)
        if existing is not None:
            raise DuplicateWorker(spec.url, existing.url)
        own = self.own_address(spec.url)
        if own is not None:
            raise RouterItself(f"{spec.url} is this router itself (it listens on {own})")
        worker = Worker(
            spec.url,
            self._client(spec.url),
            self._connections(spec.url),
            kv_events=spec.kv_events,
            kv_replay=spec.kv_replay,
            protocol=spec.protocol,
            verify=spec.verify,
            source=source,
            pinned_model=spec.model,
        )
        self.workers[spec.url] = worker
        with contextlib.suppress(ValueError):  # a spec's URL is checked where it is read; `find` spells it so
            self._identities[worker_identity(spec.url)] = spec.url
        notes = [f"from {source}"] if source not in (FLAG_SOURCE, ADMIN_SOURCE) else []
        notes += [f"vLLM KV events on {spec.kv_events}"] if spec.kv_events else []
        notes += [f"protocol {spec.protocol}"] if spec.protocol != "openai" else []
        notes += ["verified by a render probe"] if spec.verify == "probe" else []
        notes += [f"pinned to model {spec.model}"] if spec.model is not None else []
        log.info("worker %s added%s", spec.url, f" ({', '.join(notes)})" if notes else "")
        try:
            self.feeds.subscribe(worker)
        except Exception:
            self._discard(worker)
            raise
        await self.check(worker)
        if refuse_loops and worker.unusable in (ROUTER_ITSELF, ROUTER_LOOP):
            problem = worker.problem
            self._discard(worker)
            raise RouterItself(f"{spec.url}: {problem}")
        if self._first_reads is not None and self.feeds.publishes(worker):
            await self._first_read(worker)
        return worker

    async def _first_read(self, worker: Worker) -> None:
        """Read a worker's KV events at start-up, within what is left of `--kv-warmup-timeout`; a read not done
        by then is the warm-up's to retry or report (`router.kv_warmup`)."""
        left = self._first_reads_began + self.settings.kv_warmup_timeout - time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, left)):
                snapshot = await self.feeds.read(worker)
        except TimeoutError:
            return
        if snapshot is not None and self._first_reads is not None:
            self._first_reads[worker.url] = snapshot

    def read_events_when_added(self) -> None:
        """From now until `take_first_reads`, read each worker's KV events right after its first check: at
        start-up, the index fills while the other workers are still being checked (`router.kv_warmup`)."""
        self._first_reads = {}
        self._first_reads_began = time.monotonic()

    def take_first_reads(self) -> tuple[dict[str, bool], float]:
        """The reads done since `read_events_when_added` (worker URL -> whether from a snapshot) and when they
        began; later workers are read by the events loop only."""
        reads, self._first_reads = self._first_reads or {}, None
        return reads, self._first_reads_began

    def _discard(self, worker: Worker) -> None:
        """Take back a worker that was refused while it was being added."""
        if self.workers.get(worker.url) is worker:
            del self.workers[worker.url]
            self._forget_identity(worker.url)
        self.feeds.unsubscribe(worker)
        self.kv_index.forget(worker.url)
        worker.connections.close()
        worker.client.close()

    async def remove(self, url: str) -> Worker:
        """Remove a worker; KeyError when there is none with that URL. Its in-flight requests finish."""
        worker = self.workers.pop(url)
        self._forget_identity(url)
        was_active = worker.healthy
        worker.healthy = False
        self.feeds.unsubscribe(worker)
        self.kv_index.forget(url)
        # Requests still streaming from it hold the client; they end on their own, so close it afterwards.
        self._spawn(self._close_when_idle(worker))
        log.info("worker %s removed", url)
        if was_active:
            self.on_change()
        return worker

    def _headers(self) -> dict[str, str]:
        headers = {VIA_HEADER: self.router_id} if self.router_id else {}
        key = self.settings.key_for_workers
        return {**headers, "authorization": f"Bearer {key}"} if key else headers

    def _client(self, url: str) -> CheckClient:
        """The client of the checks and event polls (each request gives its own timeout)."""
        settings = self.settings
        return CheckClient(
            url,
            connect_timeout=settings.connect_timeout,
            timeout=settings.health_timeout,
            max_response_bytes=settings.max_response_bytes,
            max_connections=_CHECK_CONNECTIONS,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
            headers=self._headers(),
            ssl_context=self._ssl_context() if urlsplit(url).scheme == "https" else None,
        )

    def _ssl_context(self) -> ssl.SSLContext:
        """The one client context of every HTTPS worker (checks and proxied requests alike)."""
        if self._tls_context is None:
            self._tls_context = (self.settings.worker_tls or ClientTls()).context()
        return self._tls_context

    def check_client_for(self, url: str) -> CheckClient:
        """A new client of the checks and event polls to ``url``, as the pool gives each worker it adds (its
        timeouts, headers and TLS context)."""
        return self._client(url)

    def connections_for(self, url: str) -> WorkerConnections:
        """A new pool of keep-alive connections to ``url`` for proxied requests, as the pool gives each worker it
        adds (its timeouts, headers and TLS context)."""
        return self._connections(url)

    def _connections(self, url: str) -> WorkerConnections:
        """The pool of the proxied requests."""
        settings = self.settings
        return WorkerConnections(
            url,
            connect_timeout=settings.connect_timeout,
            timeout=settings.request_timeout,
            idle_timeout=settings.idle_timeout,
            max_connections=settings.max_connections,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
            headers=self._headers(),
            ssl_context=self._ssl_context() if urlsplit(url).scheme == "https" else None,
        )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._one_offs.add(task)
        task.add_done_callback(self._one_offs.discard)

    async def _close_when_idle(self, worker: Worker) -> None:
        deadline = time.monotonic() + self.settings.request_timeout
        while worker.active_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        worker.connections.close()
        worker.client.close()

    # -- health ----------------------------------------------------------------------------------------------

    async def check(self, worker: Worker) -> None:
        """Check one worker now: `/health` (200), `GET /v1/models` with the router's worker key, then
        `/server_info` (and the render probe of a `verify=probe` worker); update the active set and its report.

        Never raises: a check that fails in the router itself takes the worker out, saying why (logged once
        per distinct failure).
        """
        async with worker.check_lock:
            if self.workers.get(worker.url) is not worker:
                return  # removed (or refused) while this check waited for the previous one
            try:
                await self._check(worker)
            except Exception as exc:
                problem = f"checking it failed in the router ({describe_error(exc)})"
                if problem != worker.problem:
                    log.exception("checking worker %s failed", worker.url)
                self._take_out(worker, problem)
                worker.lose()

    async def _check(self, worker: Worker) -> None:
        # `/server_info` asked beside the questions that may rule the worker out (its answer is dropped when one
        # does): a check is one round trip where it was three in a row.
        server_info = asyncio.ensure_future(self.health.read_report(worker))
        try:
            problem, unusable, listed = await self.health.answer_problem(worker)
            if problem is not None:
                self._take_out(worker, problem, unusable)
                worker.lose()
                return
            report = await self.health.report(worker, listed, server_info)
        finally:
            if not server_info.done():
                server_info.cancel()
            elif not server_info.cancelled():
                server_info.exception()  # retrieved: it raised only if the report was used, and then it counted
        if self.workers.get(worker.url) is not worker:
            return  # removed while we were asking
        changed = report != worker.report or not worker.healthy
        worker.report = report
        problem, unusable = self.health.report_problem(worker, report)
        if problem is not None:
            self._take_out(worker, problem, unusable)
            worker.lose()
            return
        worker.checked = True
        worker.last_check = time.monotonic()
        if not worker.healthy:
            worker.healthy, worker.problem, worker.unusable = True, None, None
            log.info("worker %s is in the active set", worker.url)
        if changed:
            self.on_change()

    def mark_failed(self, worker: Worker, reason: str) -> None:
        """A request to the worker failed at the connection: take it out now and re-check it soon.

        The re-check puts a worker that merely dropped one connection straight back; a dead one stays out
        until a periodic check finds it answering again.
        """
        worker.failures += 1
        self._take_out(worker, reason)
        if self.workers.get(worker.url) is worker:
            self._spawn(self._recheck(worker))

    async def _recheck(self, worker: Worker) -> None:
        with contextlib.suppress(Exception):
            await self.check(worker)

    def _take_out(self, worker: Worker, problem: str, unusable: str | None = None) -> None:
        """Out of the active set for `problem`; `unusable` when the worker answers yet cannot be used."""
        first_check = not worker.checked
        newly_unusable = unusable is not None and unusable != worker.unusable
        worker.checked = True
        worker.last_check = time.monotonic()
        worker.problem = problem
        worker.unusable = unusable
        if not worker.healthy:
            if first_check or newly_unusable:
                log.warning(
                    "worker %s %s: %s",
                    worker.url,
                    "cannot be used" if unusable is not None else "is not answering yet",
                    problem,
                )
            return
        worker.healthy = False
        # Whatever it held may be gone (a restart empties its cache); its event log is read again from the
        # start when it returns.
        self.kv_index.forget(worker.url)
        log.warning("worker %s taken out of the active set: %s", worker.url, problem)
        self.on_change()

    # -- background loops ------------------------------------------------------------------------------------

    async def start(self, specs: Iterable[WorkerSpec]) -> None:
        """Add the configured workers (checked once, concurrently) and start the periodic loops.

        A worker refused (already present under another spelling, or the router's own address) is logged and
        left out; `tokenfront route` refuses those before it starts (`router.app.check_worker_specs`).
        """
        specs = list(specs)
        results = await asyncio.gather(
            *(self.add(spec, source=FLAG_SOURCE) for spec in specs), return_exceptions=True
        )
        for spec, result in zip(specs, results, strict=True):
            if isinstance(result, (DuplicateWorker, RouterItself)):
                log.error("worker %s left out: %s", spec.url, result)
            elif isinstance(result, BaseException):
                raise result
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._health_loop()), loop.create_task(self._events_loop())]

    async def stop(self) -> None:
        """Stop the loops and subscribers and close every connection pool."""
        await cancel_and_wait([*self._tasks, *self._one_offs])
        for worker in self.workers.values():
            self.feeds.unsubscribe(worker)
            worker.connections.close()
            worker.client.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval)
            workers = list(self.workers.values())
            results = await asyncio.gather(*(self.check(w) for w in workers), return_exceptions=True)
            for worker, result in zip(workers, results, strict=True):
                if isinstance(result, Exception):
                    log.exception("checking worker %s failed", worker.url, exc_info=result)

    async def _events_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.kv_events_interval)
            await self.feeds.poll()


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host

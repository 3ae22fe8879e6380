"""Worker membership: which workers the router may send to, what each one reports, and how it is doing.

A `WorkerPool` holds one `Worker` per URL. It checks every worker periodically (`GET /health`, then
`GET /server_info`), takes a worker out of the active set when a check or a request to it fails and puts it
back when it answers again, and keeps the router's KV index fed: tokenfront workers are polled on
`GET /kv_cache_events?after=SEQ`; a worker given a vLLM ZMQ endpoint gets a `VllmEventSubscriber`. Whenever
the active set or what an active worker reports changes, `on_change` is called (the app re-evaluates the
forwarding gate there).

A worker added with `verify=probe` is also probed on each check (`router.probe`): the router renders a fixed
corpus and compares with the worker's `POST /tokenize`, for workers that publish no fingerprint (vLLM). The
result is part of the worker's report, so a changed result re-evaluates the gate like a changed fingerprint.

Each worker has two clients: an `httpx.AsyncClient` for the periodic checks and event polls, and a
`router.connections.WorkerConnections` pool for the proxied requests (the router's per-request path).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from tokenfront.core.fingerprint import Fingerprint
from tokenfront.core.kv_blocks import KV_CACHE_HASH
from tokenfront.core.reasoning import ReasoningParser, get_reasoning_parser
from tokenfront.router.connections import WorkerConnections, describe_error
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies.base import WorkerLoad
from tokenfront.router.probe import NO_PROBER, Prober, ProbeResult, ProbeUnreachable

log = logging.getLogger(__name__)

# One read of a worker's KV event log returns at most this many events (the worker's own cap).
_EVENTS_PAGE = 10_000
# uvicorn closes idle keep-alive connections after 5 s: expire ours first, so a reused connection is never
# one the worker is closing (which would look like a worker failure).
_KEEPALIVE_EXPIRY = 4.0
# Connections for the checks and event polls (the proxied requests have their own pool).
_CHECK_CONNECTIONS = 4


# How the router sends a worker its rendered ids: OpenAI bodies with `prompt_token_ids`, or vLLM's
# `POST /inference/v1/generate`.
PROTOCOLS = ("openai", "generate")
# How a worker that publishes no fingerprint may still be found to render like the router.
VERIFY_MODES = ("probe",)
_SPEC_SYNTAX = (
    "URL[,kv-events=tcp://HOST:PORT[,kv-replay=tcp://HOST:PORT]][,protocol=openai|generate][,verify=probe]"
)


@dataclass(frozen=True)
class WorkerSpec:
    """A worker as configured: its base URL, optionally a vLLM worker's ZMQ KV-event endpoints, the protocol
    its ids go by, and whether it is verified by a render probe (`router.probe`)."""

    url: str
    kv_events: str | None = None
    kv_replay: str | None = None
    protocol: str = "openai"
    verify: str | None = None

    @classmethod
    def parse(cls, text: str) -> WorkerSpec:
        """Read `URL[,kv-events=E[,kv-replay=E]][,protocol=openai|generate][,verify=probe]` (`--worker`).

        ValueError says what is wrong, in one line.
        """
        url, *options = text.split(",")
        found: dict[str, str] = {}
        for option in options:
            key, _, value = option.partition("=")
            key, value = key.strip().replace("_", "-"), value.strip()
            problem = _option_problem(key, value)
            if problem is None and key in found:
                problem = f"{key} given twice"
            if problem is not None:
                raise ValueError(f"{text!r}: {problem}; expected {_SPEC_SYNTAX}")
            found[key] = value
        if "kv-replay" in found and "kv-events" not in found:
            raise ValueError(f"{text!r}: kv-replay needs kv-events too")
        return cls(
            normalize_url(url),
            found.get("kv-events"),
            found.get("kv-replay"),
            protocol=found.get("protocol", "openai"),
            verify=found.get("verify"),
        )


def _option_problem(key: str, value: str) -> str | None:
    """What is wrong with one `KEY=VALUE` of a worker spec (None: nothing)."""
    if key in ("kv-events", "kv-replay"):
        return None if value else f"{key} needs a value (a vLLM worker's ZMQ endpoint)"
    if key == "protocol":
        return None if value in PROTOCOLS else f"protocol must be {' or '.join(PROTOCOLS)}, not {value!r}"
    if key == "verify":
        return None if value in VERIFY_MODES else f"verify must be {' or '.join(VERIFY_MODES)}, not {value!r}"
    return f"unknown option {key!r}"


def normalize_url(url: str) -> str:
    """A worker's base URL without a trailing slash; ValueError unless it is an http(s) URL with a host."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not a worker URL: expected http://HOST:PORT")
    return url


@dataclass(frozen=True)
class WorkerReport:
    """What a worker's `/server_info` said, or why there is nothing to read.

    `fingerprint` is None when the worker publishes none; `missing` then says why, in words that go into
    the gate's warning ("/server_info answered 404", "/server_info unreachable (ConnectError)", ...).
    `probe` is the last render probe of a `verify=probe` worker (None for the others).
    """

    fingerprint: Fingerprint | None
    missing: str | None = None
    role: str | None = None
    model: str | None = None
    tokens_per_block: int | None = None
    kv_cache_hash: str | None = None
    reasoning_parser: str | None = None
    probe: ProbeResult | None = None

    @classmethod
    def from_server_info(cls, info: Any) -> WorkerReport:
        """Read a `/server_info` body; anything unexpected in it counts as absent."""
        if not isinstance(info, dict):
            return cls(None, missing="/server_info is not a JSON object")
        fingerprint = Fingerprint.from_json(info.get("render_fingerprint"))
        block = info.get("tokens_per_block")
        return cls(
            fingerprint=fingerprint,
            missing=None if fingerprint is not None else "/server_info has no render_fingerprint",
            role=_text(info.get("role")),
            model=_text(info.get("model")),
            tokens_per_block=block
            if isinstance(block, int) and not isinstance(block, bool) and block > 0
            else None,
            kv_cache_hash=_text(info.get("kv_cache_hash")),
            reasoning_parser=_text(info.get("reasoning_parser")),
        )

    @property
    def prompt_mode_parser(self) -> ReasoningParser | None:
        """The worker's reasoning parser when it reads the reasoning mode from the prompt text."""
        if self.reasoning_parser is None:
            return None
        try:
            parser = get_reasoning_parser(self.reasoning_parser)
        except ValueError:
            return None  # a parser this router does not know: it cannot say what that parser reads
        return parser if parser.reads_mode_from_prompt else None

    @property
    def publishes_kv_events(self) -> bool:
        """A tokenfront worker whose block hashes this router computes the same way."""
        return self.role == "worker" and self.kv_cache_hash == KV_CACHE_HASH


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass
class Worker:
    """One worker: its connection pools, its last report, its health and its load."""

    url: str
    client: httpx.AsyncClient  # the checks and event polls
    connections: WorkerConnections  # the proxied requests
    kv_events: str | None = None
    kv_replay: str | None = None
    protocol: str = "openai"  # how forwarded ids are sent (PROTOCOLS)
    verify: str | None = None  # "probe": probed on each check (VERIFY_MODES)
    healthy: bool = False
    checked: bool = False  # at least one check finished
    report: WorkerReport | None = None
    problem: str | None = None  # why it is out of the active set
    active_requests: int = 0
    routed: int = 0
    failures: int = 0
    last_check: float | None = None
    subscriber: Any = None
    check_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Called when a health check finds the worker gone: requests still waiting for it stop waiting and go to
    # another worker. Each caller registers for the time it waits, and unregisters after.
    lost_watchers: set[Callable[[], None]] = field(default_factory=set, repr=False)

    def lose(self) -> None:
        """A health check found the worker gone: tell every request waiting on it."""
        watchers = list(self.lost_watchers)
        self.lost_watchers.clear()
        for watcher in watchers:
            watcher()

    def load(self) -> WorkerLoad:
        """What the routing policy sees of this worker."""
        block = self.report.tokens_per_block if self.report else None
        return WorkerLoad(self.url, active_requests=self.active_requests, tokens_per_block=block)

    def describe(self) -> dict[str, Any]:
        """The worker's state as the admin API and `/server_info` show it."""
        report = self.report
        fingerprint = report.fingerprint if report else None
        return {
            "url": self.url,
            "state": "healthy" if self.healthy else ("unhealthy" if self.checked else "pending"),
            "problem": self.problem,
            "role": report.role if report else None,
            "model": report.model if report else None,
            "tokens_per_block": report.tokens_per_block if report else None,
            "reasoning_parser": report.reasoning_parser if report else None,
            "fingerprint_digest": fingerprint.digest if fingerprint else None,
            "fingerprint_missing": report.missing if report else None,
            "kv_events": self._kv_events_source(),
            "protocol": self.protocol,
            "verify": self.verify,
            "active_requests": self.active_requests,
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


@dataclass(frozen=True)
class PoolSettings:
    """Timings and limits of the worker pool."""

    health_interval: float = 2.0
    health_timeout: float = 5.0
    kv_events_interval: float = 0.5
    connect_timeout: float = 5.0
    request_timeout: float = 600.0
    max_connections: int = 256
    api_key: str | None = None


class WorkerPool:
    """The router's workers: membership, periodic checks, failure handling and KV event feeds."""

    def __init__(
        self,
        kv_index: KvIndex,
        settings: PoolSettings,
        *,
        on_change: Callable[[], None] = lambda: None,
        prober: Prober | None = None,
    ) -> None:
        """`prober` probes the `verify=probe` workers; None when the router cannot render (no pipeline)."""
        self.kv_index = kv_index
        self.settings = settings
        self.on_change = on_change
        self.prober = prober
        self.workers: dict[str, Worker] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # One-off tasks (re-checks, closing a removed worker's pool), held so that they are not collected.
        self._one_offs: set[asyncio.Task[None]] = set()

    # -- membership ------------------------------------------------------------------------------------------

    def active(self) -> list[Worker]:
        """The workers requests may go to: checked and healthy."""
        return [worker for worker in self.workers.values() if worker.healthy]

    async def add(self, spec: WorkerSpec) -> Worker:
        """Add a worker and check it once before returning; KeyError when its URL is already in the pool."""
        if spec.url in self.workers:
            raise KeyError(spec.url)
        worker = Worker(
            spec.url,
            self._client(spec.url),
            self._connections(spec.url),
            kv_events=spec.kv_events,
            kv_replay=spec.kv_replay,
            protocol=spec.protocol,
            verify=spec.verify,
        )
        self.workers[spec.url] = worker
        notes = [f"vLLM KV events on {spec.kv_events}"] if spec.kv_events else []
        notes += [f"protocol {spec.protocol}"] if spec.protocol != "openai" else []
        notes += ["verified by a render probe"] if spec.verify == "probe" else []
        log.info("worker %s added%s", spec.url, f" ({', '.join(notes)})" if notes else "")
        self._start_subscriber(worker)
        await self.check(worker)
        return worker

    async def remove(self, url: str) -> Worker:
        """Remove a worker; KeyError when there is none with that URL. Its in-flight requests finish."""
        worker = self.workers.pop(url)
        was_active = worker.healthy
        worker.healthy = False
        self._stop_subscriber(worker)
        self.kv_index.forget(url)
        # Requests still streaming from it hold the client; they end on their own, so close it afterwards.
        self._spawn(self._close_when_idle(worker))
        log.info("worker %s removed", url)
        if was_active:
            self.on_change()
        return worker

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}

    def _client(self, url: str) -> httpx.AsyncClient:
        """The client of the checks and event polls (each request gives its own timeout)."""
        settings = self.settings
        timeout = httpx.Timeout(settings.health_timeout, connect=settings.connect_timeout)
        limits = httpx.Limits(
            max_connections=_CHECK_CONNECTIONS,
            max_keepalive_connections=_CHECK_CONNECTIONS,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
        )
        return httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits, headers=self._headers())

    def _connections(self, url: str) -> WorkerConnections:
        """The pool of the proxied requests."""
        settings = self.settings
        return WorkerConnections(
            url,
            connect_timeout=settings.connect_timeout,
            timeout=settings.request_timeout,
            max_connections=settings.max_connections,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
            headers=self._headers(),
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
        await worker.client.aclose()

    # -- health ----------------------------------------------------------------------------------------------

    async def check(self, worker: Worker) -> None:
        """Check one worker now: `/health`, then `/server_info` (and the render probe of a `verify=probe`
        worker); update the active set and its report."""
        async with worker.check_lock:
            problem = await self._health_problem(worker)
            if problem is not None:
                self._take_out(worker, problem)
                worker.lose()
                return
            report = await self._read_report(worker)
            if worker.verify == "probe":
                report = dataclasses.replace(report, probe=await self._probe(worker))
            if self.workers.get(worker.url) is not worker:
                return  # removed while we were asking
            changed = report != worker.report or not worker.healthy
            worker.report = report
            worker.checked = True
            worker.last_check = time.monotonic()
            if not worker.healthy:
                worker.healthy, worker.problem = True, None
                log.info("worker %s is in the active set", worker.url)
            if changed:
                self.on_change()

    async def _health_problem(self, worker: Worker) -> str | None:
        try:
            response = await worker.client.get("/health", timeout=self.settings.health_timeout)
        except httpx.HTTPError as exc:
            return f"/health unreachable ({describe_error(exc)})"
        # 404: a plain OpenAI server without a health route. It answered HTTP, so it is up.
        if response.status_code not in (200, 404):
            return f"/health answered {response.status_code}"
        return None

    async def _read_report(self, worker: Worker) -> WorkerReport:
        try:
            response = await worker.client.get("/server_info", timeout=self.settings.health_timeout)
        except httpx.HTTPError as exc:
            if worker.report is not None and worker.report.fingerprint is not None:
                # /health answered, so it is the same process: a slow /server_info says nothing new.
                return worker.report
            return WorkerReport(None, missing=f"/server_info unreachable ({describe_error(exc)})")
        if response.status_code != 200:
            return WorkerReport(None, missing=f"/server_info answered {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            return WorkerReport(None, missing="/server_info is not JSON")
        return WorkerReport.from_server_info(body)

    async def _probe(self, worker: Worker) -> ProbeResult:
        """The worker's render probe; a `/tokenize` that cannot be reached keeps a passing last result."""
        if self.prober is None:
            return ProbeResult(0, difference=NO_PROBER)
        try:
            return await self.prober.run(worker.client, self.settings.health_timeout)
        except ProbeUnreachable as exc:
            last = worker.report.probe if worker.report is not None else None
            if last is not None and last.difference is None:
                # /health answered, so it is the same process: a slow /tokenize says nothing new.
                return last
            return ProbeResult(0, difference=str(exc))
        except Exception as exc:  # the router's own rendering failed: say so, and keep checking the worker
            log.exception("probing worker %s failed", worker.url)
            return ProbeResult(0, difference=f"the probe failed in the router ({describe_error(exc)})")

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

    def _take_out(self, worker: Worker, problem: str) -> None:
        first_check = not worker.checked
        worker.checked = True
        worker.last_check = time.monotonic()
        worker.problem = problem
        if first_check:
            log.warning("worker %s is not answering yet: %s", worker.url, problem)
        if not worker.healthy:
            return
        worker.healthy = False
        # Whatever it held may be gone (a restart empties its cache); its event log is read again from the
        # start when it returns.
        self.kv_index.forget(worker.url)
        log.warning("worker %s taken out of the active set: %s", worker.url, problem)
        self.on_change()

    # -- background loops ------------------------------------------------------------------------------------

    async def start(self, specs: Iterable[WorkerSpec]) -> None:
        """Add the configured workers (checked once, concurrently) and start the periodic loops."""
        await asyncio.gather(*(self.add(spec) for spec in specs))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._health_loop()), loop.create_task(self._events_loop())]

    async def stop(self) -> None:
        """Stop the loops and subscribers and close every connection pool."""
        for task in [*self._tasks, *self._one_offs]:
            task.cancel()
        for task in [*self._tasks, *self._one_offs]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for worker in self.workers.values():
            self._stop_subscriber(worker)
            worker.connections.close()
            await worker.client.aclose()

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
            await self.poll_events()

    async def poll_events(self) -> None:
        """Read new KV events from every active tokenfront worker into the KV index."""
        workers = [
            w for w in self.active() if w.kv_events is None and w.report and w.report.publishes_kv_events
        ]
        await asyncio.gather(*(self._poll_worker_events(w) for w in workers))

    async def _poll_worker_events(self, worker: Worker) -> None:
        # The index keeps the cursor, and notices a restarted worker (another log_id) or missed events.
        while True:
            try:
                response = await worker.client.get(
                    "/kv_cache_events",
                    params={"after": self.kv_index.tokenfront_cursor(worker.url), "limit": _EVENTS_PAGE},
                    timeout=self.settings.health_timeout,
                )
                response.raise_for_status()
                payload = response.json()
                if not worker.healthy or self.workers.get(worker.url) is not worker:
                    return  # taken out or removed while reading: what it held was forgotten
                self.kv_index.apply_tokenfront_events(worker.url, payload)
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                # Liveness is the health check's business; a missed poll is caught up on the next one.
                log.debug("reading KV events of %s failed: %s", worker.url, describe_error(exc))
                return
            if len(payload.get("events") or ()) < _EVENTS_PAGE:
                return

    # -- vLLM KV events --------------------------------------------------------------------------------------

    def _start_subscriber(self, worker: Worker) -> None:
        if worker.kv_events is None:
            return
        from tokenfront.router.vllm_events import VllmEventSubscriber

        worker.subscriber = VllmEventSubscriber(
            worker.kv_events, worker.url, self.kv_index, replay_endpoint=worker.kv_replay
        )
        worker.subscriber.start()

    def _stop_subscriber(self, worker: Worker) -> None:
        if worker.subscriber is not None:
            with contextlib.suppress(Exception):
                worker.subscriber.stop()
            worker.subscriber = None

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
import ssl
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from tokenfront.core.fingerprint import Fingerprint
from tokenfront.core.kv_blocks import KV_CACHE_HASH
from tokenfront.core.reasoning import ReasoningParser, get_reasoning_parser
from tokenfront.router.connections import WorkerConnections, describe_error
from tokenfront.router.generate import GENERATE_PATH
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.kv_warmup import KvWarmup
from tokenfront.router.model_placement import ModelPlacement
from tokenfront.router.policies.base import WorkerLoad
from tokenfront.router.probe import NO_PROBER, Prober, ProbeResult, ProbeUnreachable
from tokenfront.server.tasks import cancel_and_wait
from tokenfront.server_address import (
    check_kv_endpoint,
    normalize_url,
    quoted,
    worker_identity,
)
from tokenfront.tls import ClientTls

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
    "[,model=NAME]"
)


@dataclass(frozen=True)
class WorkerSpec:
    """A worker as configured: its base URL, optionally a vLLM worker's ZMQ KV-event endpoints, the protocol
    its ids go by, whether it is verified by a render probe (`router.probe`), and the model it is pinned to
    (`model`, one of the router's served names; None: the names it reports place it, `router.model_placement`)."""

    url: str
    kv_events: str | None = None
    kv_replay: str | None = None
    protocol: str = "openai"
    verify: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.verify == "probe" and self.protocol != "generate":
            # Only tokenfront's OpenAI routes take prompt_token_ids, and tokenfront publishes a fingerprint:
            # a probed worker on its OpenAI route would render the request itself, whatever the probe said.
            raise ValueError(
                "verify=probe needs protocol=generate: a worker's OpenAI routes render the request themselves "
                "(vLLM's ignores prompt_token_ids), so only its /inference/v1/generate takes the router's ids"
            )

    @classmethod
    def parse(cls, text: str) -> WorkerSpec:
        """Read `URL[,kv-events=E[,kv-replay=E]][,protocol=openai|generate][,verify=probe][,model=NAME]`
        (`--worker`).

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
                raise ValueError(f"{quoted(text)}: {problem}; expected {_SPEC_SYNTAX}")
            found[key] = value
        if "kv-replay" in found and "kv-events" not in found:
            raise ValueError(f"{quoted(text)}: kv-replay needs kv-events too")
        base = normalize_url(url)
        try:
            return cls(
                base,
                found.get("kv-events"),
                found.get("kv-replay"),
                protocol=found.get("protocol", "openai"),
                verify=found.get("verify"),
                model=found.get("model"),
            )
        except ValueError as exc:
            raise ValueError(f"{quoted(text)}: {exc}") from None


def _option_problem(key: str, value: str) -> str | None:
    """What is wrong with one `KEY=VALUE` of a worker spec (None: nothing)."""
    if key in ("kv-events", "kv-replay"):
        if not value:
            return f"{key} needs a value (a vLLM worker's ZMQ endpoint)"
        try:
            check_kv_endpoint(value, key)
        except ValueError as exc:
            return str(exc)
        return None
    if key == "protocol":
        return None if value in PROTOCOLS else f"protocol must be {' or '.join(PROTOCOLS)}, not {value!r}"
    if key == "verify":
        return None if value in VERIFY_MODES else f"verify must be {' or '.join(VERIFY_MODES)}, not {value!r}"
    if key == "model":
        return None if value else "model needs a value (one of the router's served model names)"
    return f"unknown option {key!r}"


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
    # The model names it answers to (`/server_info` "served_model_names" or "model", else `GET /v1/models`);
    # None when it says none.
    served_model_names: tuple[str, ...] | None = None
    # A tokenfront router as a worker: its instance id, and those of the routers among its own workers.
    router_id: str | None = None
    routes_to: tuple[str, ...] = ()

    @classmethod
    def from_server_info(cls, info: Any) -> WorkerReport:
        """Read a `/server_info` body; anything unexpected in it counts as absent."""
        if not isinstance(info, dict):
            return cls(None, missing="/server_info is not a JSON object")
        fingerprint = Fingerprint.from_json(info.get("render_fingerprint"))
        block = info.get("tokens_per_block")
        model = _text(info.get("model"))
        names = _names(info.get("served_model_names")) or ((model,) if model else None)
        workers = info.get("workers")
        return cls(
            fingerprint=fingerprint,
            missing=None if fingerprint is not None else "/server_info has no render_fingerprint",
            role=_text(info.get("role")),
            model=model,
            tokens_per_block=block
            if isinstance(block, int) and not isinstance(block, bool) and block > 0
            else None,
            kv_cache_hash=_text(info.get("kv_cache_hash")),
            reasoning_parser=_text(info.get("reasoning_parser")),
            served_model_names=names,
            router_id=_text(info.get("router_id")),
            routes_to=tuple(
                worker["router_id"]
                for worker in (workers if isinstance(workers, list) else ())
                if isinstance(worker, dict) and isinstance(worker.get("router_id"), str)
            ),
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


def _names(value: Any) -> tuple[str, ...] | None:
    """A list of model names (None unless it is a non-empty list of strings)."""
    if not isinstance(value, list) or not value or not all(isinstance(name, str) for name in value):
        return None
    return tuple(value)


def _listed_models(body: Any) -> tuple[str, ...] | None:
    """The ids of an OpenAI `GET /v1/models` answer (None when it lists none)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return _names([item.get("id") for item in data if isinstance(item, dict)])


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


# Why a worker that answers cannot be used (`Worker.unusable`).
ROUTER_ITSELF = "router_itself"
ROUTER_LOOP = "router_loop"
WORKER_API_KEY = "worker_api_key"
NO_GENERATE_ROUTE = "no_generate_route"
# Every request the router sends a worker carries its instance id here; a router that receives its own id
# answers 508 `router_loop` (`router.app`), so a URL that reaches the router itself is found at its first
# health check, however it is spelled.
VIA_HEADER = "x-tokenfront-via"
LOOP_CODE = "router_loop"
# Who added a worker (`Worker.source`), besides the worker sources (`router.worker_sources`).
FLAG_SOURCE = "flag"
ADMIN_SOURCE = "admin"


class WorkerPool:
    """The router's workers: membership, periodic checks, failure handling and KV event feeds."""

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
        self.prober = prober
        self.probers = dict(probers or {})
        self.router_id = router_id
        self.placement = placement or ModelPlacement([()])
        self.workers: dict[str, Worker] = {}
        # Addresses the router listens on (host, port): a worker URL naming one is the router itself.
        self._own: set[tuple[str, int]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # One-off tasks (re-checks, closing a removed worker's pool), held so that they are not collected.
        self._one_offs: set[asyncio.Task[None]] = set()
        # How the start-up read of KV events went (`router.kv_warmup`); None before it ran.
        self.kv_warmup: KvWarmup | None = None

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

    def find(self, url: str) -> Worker | None:
        """The worker at `url` however it is spelled (loopback names, default port, case, trailing slash)."""
        worker = self.workers.get(url)
        if worker is not None:
            return worker
        try:
            identity = worker_identity(url)
        except ValueError:
            return None
        return next((w for key, w in self.workers.items() if worker_identity(key) == identity), None)

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
        notes = [f"from {source}"] if source not in (FLAG_SOURCE, ADMIN_SOURCE) else []
        notes += [f"vLLM KV events on {spec.kv_events}"] if spec.kv_events else []
        notes += [f"protocol {spec.protocol}"] if spec.protocol != "openai" else []
        notes += ["verified by a render probe"] if spec.verify == "probe" else []
        notes += [f"pinned to model {spec.model}"] if spec.model is not None else []
        log.info("worker %s added%s", spec.url, f" ({', '.join(notes)})" if notes else "")
        try:
            self._start_subscriber(worker)
        except Exception:
            await self._discard(worker)
            raise
        await self.check(worker)
        if refuse_loops and worker.unusable in (ROUTER_ITSELF, ROUTER_LOOP):
            problem = worker.problem
            await self._discard(worker)
            raise RouterItself(f"{spec.url}: {problem}")
        return worker

    async def _discard(self, worker: Worker) -> None:
        """Take back a worker that was refused while it was being added."""
        if self.workers.get(worker.url) is worker:
            del self.workers[worker.url]
        self._stop_subscriber(worker)
        self.kv_index.forget(worker.url)
        worker.connections.close()
        await worker.client.aclose()

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
        headers = {VIA_HEADER: self.router_id} if self.router_id else {}
        key = self.settings.key_for_workers
        return {**headers, "authorization": f"Bearer {key}"} if key else headers

    def _client(self, url: str) -> httpx.AsyncClient:
        """The client of the checks and event polls (each request gives its own timeout)."""
        settings = self.settings
        timeout = httpx.Timeout(settings.health_timeout, connect=settings.connect_timeout)
        limits = httpx.Limits(
            max_connections=_CHECK_CONNECTIONS,
            max_keepalive_connections=_CHECK_CONNECTIONS,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
        )
        return httpx.AsyncClient(
            base_url=url, timeout=timeout, limits=limits, headers=self._headers(), verify=self._ssl_context()
        )

    def _ssl_context(self) -> ssl.SSLContext:
        """The one client context of every HTTPS worker (checks and proxied requests alike)."""
        if self._tls_context is None:
            self._tls_context = (self.settings.worker_tls or ClientTls()).context()
        return self._tls_context

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
        await worker.client.aclose()

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
        problem, unusable = await self._health_problem(worker)
        listed: tuple[str, ...] | None = None
        if problem is None:
            problem, listed = await self._read_models(worker)
            unusable = WORKER_API_KEY if problem is not None else None
        if problem is None and worker.protocol == "generate":
            problem = await self._generate_problem(worker)
            unusable = NO_GENERATE_ROUTE if problem is not None else None
        if problem is not None:
            self._take_out(worker, problem, unusable)
            worker.lose()
            return
        report = await self._read_report(worker)
        if report.served_model_names is None and listed is not None:
            report = dataclasses.replace(report, served_model_names=listed)
        if worker.verify == "probe":
            placement = self.placement.place(worker.pinned_model, report.served_model_names)
            report = dataclasses.replace(report, probe=await self._probe(worker, placement.model))
        if self.workers.get(worker.url) is not worker:
            return  # removed while we were asking
        changed = report != worker.report or not worker.healthy
        worker.report = report
        problem, unusable = self._report_problem(worker, report)
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

    async def _generate_problem(self, worker: Worker) -> str | None:
        """Why a `protocol=generate` worker cannot take ids (None: its generate route is there).

        An empty body is sent: a worker with the route refuses it as invalid (400 or 422); one without it
        answers 404 (or vLLM's 403 when `--enable-scale-out` is off).
        """
        try:
            response = await worker.client.post(GENERATE_PATH, json={}, timeout=self.settings.health_timeout)
        except httpx.HTTPError as exc:
            return f"{GENERATE_PATH} unreachable ({describe_error(exc)})"
        if response.status_code in (403, 404, 405):
            return (
                f"it has no tokens-in route: {GENERATE_PATH} answered {response.status_code} (start vLLM with "
                "--enable-scale-out, or add the worker without protocol=generate)"
            )
        return None

    async def _health_problem(self, worker: Worker) -> tuple[str | None, str | None]:
        """Why `/health` says the worker is not up, and whether that makes it unusable (None, None: it is up)."""
        try:
            response = await worker.client.get("/health", timeout=self.settings.health_timeout)
        except httpx.HTTPError as exc:
            return f"/health unreachable ({describe_error(exc)})", None
        if response.status_code == 508 and _error_code(response) == LOOP_CODE:
            # Only the router that sent VIA_HEADER answers its own id so: this URL reaches this router.
            return (
                "this URL reaches this router itself (its /health answered the router's own 508 router_loop): "
                "a router cannot be its own worker",
                ROUTER_ITSELF,
            )
        if response.status_code in (401, 403):
            return self._key_problem("/health", response.status_code), WORKER_API_KEY
        if response.status_code != 200:
            return f"/health answered {response.status_code} (a worker is up only when it answers 200)", None
        return None, None

    def _key_problem(self, route: str, status: int) -> str:
        sent = (
            "the router's --worker-api-key"
            if self.settings.key_for_workers
            else "no key (the router has no --worker-api-key)"
        )
        return (
            f"it refuses the router's requests: {route} answered {status} to {sent}; start the router with "
            "--worker-api-key set to the worker's --api-key"
        )

    async def _read_models(self, worker: Worker) -> tuple[str | None, tuple[str, ...] | None]:
        """`GET /v1/models` with the router's worker key: (why the worker refuses that key, the names it lists).

        `/health` needs no key, so this is where a worker that will refuse every request is found. Any other
        failure says nothing (a server without the route lists no names).
        """
        try:
            response = await worker.client.get("/v1/models", timeout=self.settings.health_timeout)
        except httpx.HTTPError:
            return None, None
        if response.status_code in (401, 403):
            return self._key_problem("GET /v1/models", response.status_code), None
        if response.status_code != 200:
            return None, None
        try:
            return None, _listed_models(response.json())
        except ValueError:
            return None, None

    def _report_problem(self, worker: Worker, report: WorkerReport) -> tuple[str | None, str | None]:
        """Why what the worker reports makes it unusable (None, None: nothing does); notes on the worker (and
        logs once) which of the router's model names it does not serve."""
        if self.router_id is not None and report.role == "router":
            if report.router_id == self.router_id:
                problem = (
                    "this URL reaches this router itself (same router_id): a router cannot be its own worker"
                )
                return problem, ROUTER_ITSELF
            if self.router_id in report.routes_to:
                return (
                    f"it is a router (router_id {report.router_id}) that has this router among its workers: "
                    "requests would go round in a loop",
                    ROUTER_LOOP,
                )
        placement = self.placement.place(worker.pinned_model, report.served_model_names)
        note = placement.note
        if note != worker.model_mismatch:
            if note is not None and placement.model is not None:
                log.warning(
                    "worker %s: %s; requests naming those models are not sent to it", worker.url, note
                )
            elif note is not None:
                log.warning("worker %s: %s", worker.url, note)
            worker.model_mismatch = note
        if placement.model != worker.model_group and worker.model_group is not None and placement.model:
            log.info(
                "worker %s now serves model %s (it served %s)",
                worker.url,
                placement.model,
                worker.model_group,
            )
        worker.model_group = placement.model
        return None, None

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

    async def _probe(self, worker: Worker, group: str | None) -> ProbeResult:
        """The worker's render probe, by its model's `group` prober; a `/tokenize` that cannot be reached keeps
        a passing last result."""
        prober = self.probers.get(group, self.prober) if group is not None else self.prober
        if prober is None:
            return ProbeResult(0, difference=NO_PROBER)
        try:
            return await prober.run(worker.client, self.settings.health_timeout)
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

    def event_publishers(self) -> list[Worker]:
        """The active workers whose KV events the router reads from `GET /kv_cache_events`."""
        return [w for w in self.active() if w.kv_events is None and w.report and w.report.publishes_kv_events]

    async def poll_events(self) -> None:
        """Read new KV events from every active tokenfront worker into the KV index."""
        await asyncio.gather(*(self.read_kv_events(w) for w in self.event_publishers()))

    async def read_kv_events(self, worker: Worker) -> bool | None:
        """Read the worker's KV events up to its `last_seq` into the index, page by page; None when a read
        failed or the worker left meanwhile (caught up on the next read), else whether a snapshot came."""
        async with worker.events_lock:
            return await self._read_kv_events(worker)

    async def _read_kv_events(self, worker: Worker) -> bool | None:
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
                response.raise_for_status()
                payload = response.json()
                if not worker.healthy or self.workers.get(worker.url) is not worker:
                    return None  # taken out or removed while reading: what it held was forgotten
                self.kv_index.apply_tokenfront_events(worker.url, payload)
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                # Liveness is the health check's business; a missed poll is caught up on the next one.
                log.debug("reading KV events of %s failed: %s", worker.url, describe_error(exc))
                return None
            snapshot = snapshot or payload.get("snapshot") is not None
            if len(payload.get("events") or ()) < _EVENTS_PAGE:
                return snapshot

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


def _error_code(response: httpx.Response) -> str | None:
    """The `error.code` of an OpenAI-shaped error answer (None when it has none)."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host

"""The router app (`tokenfront route`): an OpenAI-compatible proxy in front of workers (docs/contract.md §8).

It renders with the same `RenderPipeline` as the renderer (loaded the same way: tokenizer, config and
template files, never weights, never torch), routes with a policy from `router.policies`, forwards its ids
only when the gate allows, and keeps its workers' membership in a `WorkerPool`. Several models (`route
--config`) are several `router.model_group.ModelGroup`s (each its pipeline, gate and policy) over one pool.
Importing this module keeps torch out of the process, as the renderer app does.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from tokenfront.core.torch_guard import hide_torch

if not hide_torch():
    logging.getLogger(__name__).warning("torch is already imported: the router app cannot keep it out")

from fastapi import FastAPI  # after the torch guard, on purpose
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenfront.core.errors import TokenfrontError
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol.limits import DEFAULT_LIMITS, RequestLimits
from tokenfront.renderer.derender import derender_router
from tokenfront.renderer.routes import render_router
from tokenfront.router.bounded_render import RenderSettings
from tokenfront.router.config_reload import ConfigReloader, ConfigSettings, GroupBuilder
from tokenfront.router.fleet_metrics import FleetMetrics
from tokenfront.router.hangup import Hangup
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.kv_warmup import warm_kv_index
from tokenfront.router.metrics import RouterMetrics
from tokenfront.router.model_group import ModelGroup, ModelGroups
from tokenfront.router.policies import build_policy
from tokenfront.router.policies.base import Policy
from tokenfront.router.proxy import Proxy
from tokenfront.router.replica_sync import DEFAULT_HEARTBEAT, DEFAULT_PEER_TIMEOUT, ReplicaSync
from tokenfront.router.routes import (
    ADMIN_PATHS,
    inference_router,
    render_unavailable_router,
    router_info,
    served_model_names,
    workers_router,
)
from tokenfront.router.routing_metrics import RoutingMetrics
from tokenfront.router.worker_allow import WorkerAllowList
from tokenfront.router.worker_health import LOOP_CODE, VIA_HEADER
from tokenfront.router.worker_pool import PoolSettings, WorkerPool
from tokenfront.router.worker_sources import DEFAULT_INTERVAL, Admission, WorkerSource, WorkerSources
from tokenfront.router.worker_spec import WorkerSpec
from tokenfront.server.admin_auth import AdminAccess
from tokenfront.server.app import create_app
from tokenfront.server.errors import error_response
from tokenfront.server.inspector import inspector_router
from tokenfront.server.limits import DEFAULT_MAX_BODY_BYTES
from tokenfront.server.metrics import ServerMetrics
from tokenfront.server.tracing import Tracing
from tokenfront.server_address import worker_identity

log = logging.getLogger(__name__)

POLICIES = ("kv_cache_aware", "load_balancing", "predicted_ttft", "round_robin")
# Seconds after it serves that the router starts building its pipelines' fast tokenizer backend (the lifespan).
BACKEND_BUILD_DELAY = 2.0


@dataclass(frozen=True)
class RouterSettings:
    """How the router routes: its workers, policy and weights, and its pool's timings."""

    workers: Sequence[WorkerSpec] = ()
    policy: str = "predicted_ttft"
    load_weight: float = 1.0
    default_tokens_per_block: int = 16
    cache_threshold: float = 0.5
    # Policies' own settings dataclasses (e.g. `PredictedTtftConfig`): each policy takes its own.
    policy_options: tuple[object, ...] = ()
    served_model_names: Sequence[str] = ()
    pool: PoolSettings = field(default_factory=PoolSettings)
    # Where the router listens (`--host`, `--port`): a `--worker` naming it is refused at start-up. A router
    # without it still finds itself, at the first health check after it listens (VIA_HEADER).
    listen: tuple[str, int] | None = None
    # Where workers may be (`--worker-allow`; None: anywhere, the admin is trusted), and how many at most
    # (`--max-workers`), for `--worker` and `POST /workers` alike.
    worker_allow: WorkerAllowList | None = None
    max_workers: int = 4096
    # How long a render for routing may take (`--render-timeout`), and where it runs (`--render-processes`).
    render: RenderSettings = field(default_factory=RenderSettings)
    # Where more workers come from (`--worker-file`, `--worker-dns`: `router.worker_sources`), read every
    # `--worker-source-interval` seconds and on SIGHUP.
    worker_sources: Sequence[WorkerSource] = ()
    worker_source_interval: float = DEFAULT_INTERVAL
    # `--config`: the file the models were read from, followed while the router serves (`router.config_reload`:
    # read every `worker_source_interval` seconds and on SIGHUP); None: `--model`, read once.
    config: ConfigSettings | None = None
    # Load shared with other router replicas (`--replica-sync-bind`, `--replica-peer`: `router.replica_sync`);
    # None: this router counts only its own requests.
    replica_sync: ReplicaSyncSettings | None = None


@dataclass(frozen=True)
class ReplicaSyncSettings:
    """Where this replica publishes its routed requests, and the peers it hears."""

    bind: str
    peers: Sequence[str] = ()
    heartbeat: float = DEFAULT_HEARTBEAT
    peer_timeout: float = DEFAULT_PEER_TIMEOUT


def create_router_app(
    pipeline: RenderPipeline | Sequence[RenderPipeline] | None,
    settings: RouterSettings,
    *,
    api_key: str | None = None,
    admin_api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_limits: RequestLimits = DEFAULT_LIMITS,
    show_paths: bool = False,
    tracing: Tracing | None = None,
) -> FastAPI:
    """The router: proxied inference routes, render routes, `/workers`, and the common routes (role router).

    `pipeline` None is a router without a tokenizer: it routes by load only and never forwards ids. Several
    pipelines are several models behind one router (`route --config`, `router.model_group`), each with its
    own served names, gate and policy; their workers are placed by the names they report
    (`router.model_placement`).
    `admin_api_key` opens the admin writes (`POST`/`DELETE /workers`); None: they are off. `tracing`: its
    spans (`server.tracing`), each worker call's context sent on in `traceparent`.
    TokenfrontError (one line) when two `settings.workers` are one worker, one is the router itself, one is
    outside `settings.worker_allow`, one is pinned to a model the router does not serve, or there are more
    than `settings.max_workers`; when render processes are asked for without a pipeline; when two models
    share a served name; and when replica sync is asked for with several models. The render processes start
    with the app's lifespan, before it serves.
    """
    pipelines = _pipelines(pipeline)
    if settings.render.processes and not pipelines:
        raise TokenfrontError(
            "--render-processes needs --model or --tokenizer: the router has nothing to render"
        )
    if len(pipelines) > 1 and settings.replica_sync is not None:
        raise TokenfrontError(
            "--replica-sync-bind shares one model's load: a router of several models (--config) cannot use it "
            "yet; run one router per model, or drop --replica-sync-bind"
        )
    kv_index = KvIndex()
    server_metrics = ServerMetrics()
    metrics = RouterMetrics(server_metrics.registry)
    build_group = _group_builder(settings, kv_index, metrics)
    groups = _model_groups(pipelines, settings, build_group)
    # This process's id: sent to workers with every request (VIA_HEADER) and published on /server_info, so
    # that a URL reaching this router, or a router routing back to it, is found however it is spelled.
    router_id = secrets.token_hex(8)
    # Probes `verify=probe` workers (no fingerprint, e.g. vLLM) against their model's own rendering.
    pool = WorkerPool(
        kv_index,
        settings.pool,
        probers=groups.probers(),
        router_id=router_id,
        placement=groups.placement,
    )
    if settings.listen is not None:
        pool.note_own_address(*settings.listen)
    admission = Admission(settings.worker_allow, settings.max_workers)
    config = (
        ConfigReloader(
            settings.config,
            groups,
            pool,
            admission,
            build_group=build_group,
            reloads=metrics.config_reloads,
            interval=settings.worker_source_interval,
            render_grace=settings.render.timeout,
            on_render_replaced=metrics.render_processes_replaced.inc,
            one_model=_ONE_MODEL if settings.replica_sync is not None else None,
            on_swap=lambda: setattr(app.state, "pipeline", groups.default.pipeline),
        )
        if settings.config is not None
        else None
    )
    configured = [*settings.workers, *(config.pinned_workers if config is not None else ())]
    check_worker_specs(pool, configured)
    check_worker_admission(settings, configured)
    routing_metrics = RoutingMetrics(server_metrics.registry, groups.default.policy, pool, groups.policy_of)
    server_metrics.registry.register(FleetMetrics(pool, gates_of=lambda: [g.gate for g in groups.groups]))
    pool.on_change = lambda: _reevaluate(pool, groups, metrics)
    proxy = Proxy(
        pipeline=groups.default.pipeline,
        pool=pool,
        gate=groups.default.gate,
        policy=groups.default.policy,
        metrics=metrics,
        routing_metrics=routing_metrics,
        served_model_names=settings.served_model_names,
        render=settings.render,
        tracing=tracing,
        groups=groups,
    )
    if settings.replica_sync is not None:
        proxy.sync = ReplicaSync(
            router_id=router_id,
            bind=settings.replica_sync.bind,
            peers=settings.replica_sync.peers,
            policy=groups.default.policy,
            pool=pool,
            heartbeat=settings.replica_sync.heartbeat,
            peer_timeout=settings.replica_sync.peer_timeout,
        )
    app = create_app(
        role="router",
        title="tokenfront router",
        server_info=lambda: router_info(proxy, kv_index, settings.policy, config),
        model_names=lambda: served_model_names(proxy),
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        request_limits=request_limits,
        metrics=server_metrics,
        admin=AdminAccess(ADMIN_PATHS, admin_api_key),
        show_paths=show_paths,
        tracing=tracing,
    )
    app.state.pipeline = groups.default.pipeline
    # The render routes render with the requested model's pipeline (`renderer.routes.pipeline_for`).
    app.state.choose_pipeline = groups.pipeline_for
    app.state.model_groups = groups
    app.state.pool = pool
    app.state.kv_index = kv_index
    app.state.policy_name = settings.policy
    app.state.proxy = proxy
    app.state.router_id = router_id
    app.state.worker_allow = settings.worker_allow
    app.state.max_workers = settings.max_workers
    app.include_router(inference_router())
    app.include_router(workers_router())
    app.include_router(render_router(tracing) if pipelines else render_unavailable_router())
    app.include_router(derender_router())
    app.include_router(inspector_router())  # its workers; a router with a tokenizer renders there too
    sources = WorkerSources(settings.worker_sources, pool, admission, settings.worker_source_interval)
    app.state.worker_sources = sources
    app.state.config = config
    # One SIGHUP handler reads every file the router follows (none: SIGHUP ends the router, as any process).
    readers = [*([sources.reload] if sources.members else []), *([config.reload] if config else [])]
    parts = _Parts(pool, groups, metrics, proxy, sources, config, Hangup(readers))
    app.router.lifespan_context = _lifespan(parts, settings.workers)
    # Outermost on both paths (FastAPI's and the lean routes'), before auth: a request carrying this router's
    # own id came back to it.
    app.add_middleware(LoopGuard, router_id=router_id)
    if app.lean_front is not None:
        app.lean_front = LoopGuard(app.lean_front, router_id=router_id)
    return app


def _pipelines(pipeline: RenderPipeline | Sequence[RenderPipeline] | None) -> list[RenderPipeline]:
    """The router's pipelines, one per model (none: a router without a tokenizer)."""
    if pipeline is None:
        return []
    if isinstance(pipeline, RenderPipeline):
        return [pipeline]
    return list(pipeline)


def _or_none(pipelines: Sequence[RenderPipeline]) -> Sequence[RenderPipeline | None]:
    """The pipelines, or one None (a router without a tokenizer is one model that cannot render)."""
    return pipelines if pipelines else [None]


# Why a router with replica sync keeps one model on a reload of --config.
_ONE_MODEL = (
    "--replica-sync-bind shares one model's load, so this router keeps one model; run one router per model"
)


def _group_builder(settings: RouterSettings, kv_index: KvIndex, metrics: RouterMetrics) -> GroupBuilder:
    """How a model's group is made (at start-up and on a reload of --config): its pipeline, the policy to keep
    (None: a new one, with the router's --policy and weights), and whether the router serves several models."""

    def build(pipeline: RenderPipeline | None, policy: Policy | None, several: bool) -> ModelGroup:
        return ModelGroup.build(
            pipeline,
            served_model_names=settings.served_model_names,
            policy=policy
            or build_policy(
                settings.policy,
                kv_index=kv_index,
                load_weight=settings.load_weight,
                default_tokens_per_block=settings.default_tokens_per_block,
                cache_threshold=settings.cache_threshold,
                options=settings.policy_options,
            ),
            render=settings.render,
            renders=metrics.renders,
            render_seconds=metrics.render_seconds,
            name_in_logs=several,
        )

    return build


def _model_groups(
    pipelines: Sequence[RenderPipeline], settings: RouterSettings, build_group: GroupBuilder
) -> ModelGroups:
    """One group per pipeline (one group without a pipeline when there is none), each with its own policy.
    TokenfrontError (one line) when two models share a served name, or a worker is pinned to a name none
    serves."""
    several = len(pipelines) > 1
    groups = [build_group(pipeline, None, several) for pipeline in _or_none(pipelines)]
    try:
        model_groups = ModelGroups(groups)
    except ValueError as exc:
        raise TokenfrontError(
            f"{exc}: each served model name must name one model (a model given no served_model_name is served "
            "under its checkpoint folder's name)"
        ) from None
    names = model_groups.placement.key_of
    for spec in settings.workers:
        if spec.model is not None and spec.model not in names:
            raise TokenfrontError(
                f"--worker {spec.url}: model={spec.model} is not a model this router serves (it serves "
                f"{', '.join(model_groups.served_model_names()) or 'no named model'})"
            )
    return model_groups


def check_worker_specs(pool: WorkerPool, specs: Sequence[WorkerSpec]) -> None:
    """TokenfrontError (one line) when two configured workers are one (another spelling of the same scheme,
    host and port) or one names an address the router listens on."""
    seen: dict[tuple[str, str, int], str] = {}
    for spec in specs:
        identity = worker_identity(spec.url)
        if identity in seen:
            raise TokenfrontError(f"--worker {spec.url} is given twice (also as {seen[identity]})")
        seen[identity] = spec.url
        own = pool.own_address(spec.url)
        if own is not None:
            raise TokenfrontError(
                f"--worker {spec.url} is this router itself (it listens on {own}): a router cannot be its own "
                "worker"
            )


def check_worker_admission(settings: RouterSettings, workers: Sequence[WorkerSpec] | None = None) -> None:
    """TokenfrontError (one line) when the configured `workers` (default: `settings.workers`) are more than
    `--max-workers`, or one of them (or its KV event endpoint) is outside `--worker-allow`. Resolves names:
    called at start-up."""
    workers = settings.workers if workers is None else workers
    if len(workers) > settings.max_workers:
        raise TokenfrontError(
            f"{len(workers)} --worker given, more than --max-workers {settings.max_workers}"
        )
    if settings.worker_allow is None:
        return
    for spec in workers:
        endpoints = (("kv-events", spec.kv_events), ("kv-replay", spec.kv_replay))
        refusal = settings.worker_allow.refusal(spec.url, endpoints)
        if refusal is not None:
            raise TokenfrontError(f"--worker {spec.url}: {refusal[1]}")


class LoopGuard:
    """Answers 508 `router_loop` to a request carrying this router's own id in VIA_HEADER: it was sent by this
    router, so a worker URL reaches the router itself (the health check then marks that worker unusable)."""

    def __init__(self, app: ASGIApp, *, router_id: str) -> None:
        self.app = app
        self._id = router_id.encode()
        self._header = VIA_HEADER.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == self._header and self._id in (part.strip() for part in value.split(b",")):
                    response = error_response(
                        508,
                        "this request came back to the router that sent it: one of its worker URLs reaches the "
                        "router itself (GET /workers)",
                        code=LOOP_CODE,
                        error_type="server_error",
                    )
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _reevaluate(pool: WorkerPool, groups: ModelGroups, metrics: RouterMetrics) -> None:
    """The active set or a report changed: decide every model's forwarding again (each gate logs only its
    changes). `tokenfront_router_forwarding` is 1 when every model forwards."""
    states = groups.evaluate(pool)
    for group, state in zip(groups.groups, states, strict=True):
        metrics.model_forwarding.labels(group.key).set(1 if state.forwarding else 0)
    keys = {group.key for group in groups.groups}
    for gone in metrics.model_keys - keys:  # a model a reload of --config removed
        metrics.model_forwarding.remove(gone)
    metrics.model_keys = keys
    metrics.forwarding.set(1 if all(state.forwarding for state in states) else 0)
    metrics.active_workers.set(len(pool.active()))


@dataclass(frozen=True)
class _Parts:
    """What the app's lifespan starts and stops."""

    pool: WorkerPool
    groups: ModelGroups
    metrics: RouterMetrics
    proxy: Proxy
    sources: WorkerSources
    config: ConfigReloader | None
    hangup: Hangup


def _lifespan(parts: _Parts, workers: Sequence[WorkerSpec]) -> Any:
    pool, groups, metrics, sync = parts.pool, parts.groups, parts.metrics, parts.proxy.sync

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if sync is not None:
            await sync.start()  # first: a --replica-sync-bind that cannot be bound stops the start at once
        for group in groups.groups:
            # Spawned here, in the process that serves (never before a fork), and ready before it serves; each
            # model's render processes load that model's pipeline.
            if group.renders is not None:
                await group.renders.start(on_replaced=metrics.render_processes_replaced.inc)
        if pool.settings.kv_warmup_timeout > 0:
            pool.read_events_when_added()  # each worker's events read as soon as it is checked
        await pool.start(workers)
        if parts.config is not None:
            await parts.config.start()  # the --config tables' workers, added and checked before it serves
        await parts.sources.start()  # their workers added and checked, as the --worker ones, before it serves
        parts.hangup.install()
        _reevaluate(pool, groups, metrics)  # also with no worker answering yet: the router's own reasons
        warmup = await warm_kv_index(pool)  # its index knows their caches before it serves
        # The fast tokenizer backend is built once the router has served a moment: the build holds the
        # interpreter in stretches (at a low CPU priority, so for longer on a busy machine), which held up the
        # checks and KV reads of a 256-worker start by seconds, and then its first /health answers. Until it is
        # built the tokenizer itself encodes: the same ids, more CPU a render.
        building = asyncio.get_running_loop().call_later(BACKEND_BUILD_DELAY, _start_backend_builds, groups)
        log.info(
            "router ready: %d of %d workers active, forwarding ids: %s, KV events of %d of %d read",
            len(pool.active()),
            len(pool.workers),
            _forwarding_summary(groups),
            warmup.read,
            warmup.workers,
        )
        try:
            yield
        finally:
            building.cancel()
            parts.hangup.remove()
            if parts.config is not None:
                await parts.config.stop()
            await parts.sources.stop()
            await pool.stop()
            for group in groups.groups:  # the models served now (a reload may have changed them)
                if group.renders is not None:
                    await group.renders.stop()
            if sync is not None:
                await sync.stop()

    return lifespan


def _start_backend_builds(groups: ModelGroups) -> None:
    for group in groups.groups:
        if group.pipeline is not None:
            group.pipeline.start_backend_build()


def _forwarding_summary(groups: ModelGroups) -> str:
    """`yes`/`no` for one model; `NAME yes, NAME no` for several."""
    if not groups.several:
        return "yes" if groups.default.gate.state.forwarding else "no"
    return ", ".join(
        f"{group.key} {'yes' if group.gate.state.forwarding else 'no'}" for group in groups.groups
    )

"""The router app (`tokenfront route`): an OpenAI-compatible proxy in front of workers (SPEC §8).

It renders with the same `RenderPipeline` as the renderer (loaded the same way: tokenizer, config and
template files, never weights, never torch), routes with a policy from `router.policies`, forwards its ids
only when the gate allows, and keeps its workers' membership in a `WorkerPool`. Importing this module keeps
torch out of the process, as the renderer app does.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from tokenfront.core.torch_guard import hide_torch

if not hide_torch():
    logging.getLogger(__name__).warning("torch is already imported: the router app cannot keep it out")

from fastapi import FastAPI  # after the torch guard, on purpose

from tokenfront.core.render import RenderPipeline
from tokenfront.renderer.derender import derender_router
from tokenfront.renderer.routes import render_router
from tokenfront.router.gate import ForwardingGate
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies import build_policy
from tokenfront.router.probe import Prober
from tokenfront.router.proxy import Proxy, RouterMetrics
from tokenfront.router.routes import (
    inference_router,
    render_unavailable_router,
    router_info,
    served_model_names,
    workers_router,
)
from tokenfront.router.workers import PoolSettings, WorkerPool, WorkerSpec
from tokenfront.server.app import create_app
from tokenfront.server.limits import DEFAULT_MAX_BODY_BYTES
from tokenfront.server.metrics import ServerMetrics

log = logging.getLogger(__name__)

POLICIES = ("kv_cache_aware", "load_balancing", "round_robin")


@dataclass(frozen=True)
class RouterSettings:
    """How the router routes: its workers, policy and weights, and its pool's timings."""

    workers: Sequence[WorkerSpec] = ()
    policy: str = "kv_cache_aware"
    load_weight: float = 1.0
    default_tokens_per_block: int = 16
    cache_threshold: float = 0.5
    served_model_names: Sequence[str] = ()
    pool: PoolSettings = field(default_factory=PoolSettings)


def create_router_app(
    pipeline: RenderPipeline | None,
    settings: RouterSettings,
    *,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The router: proxied inference routes, render routes, `/workers`, and the common routes (role router).

    `pipeline` None is a router without a tokenizer: it routes by load only and never forwards ids.
    """
    kv_index = KvIndex()
    policy = build_policy(
        settings.policy,
        kv_index=kv_index,
        load_weight=settings.load_weight,
        default_tokens_per_block=settings.default_tokens_per_block,
        cache_threshold=settings.cache_threshold,
    )
    has_model_path = pipeline is not None and pipeline.checkpoint.model_path is not None
    gate = ForwardingGate(pipeline.fingerprint if pipeline else None, has_model_path=has_model_path)
    # Probes `verify=probe` workers (no fingerprint, e.g. vLLM) against the router's own rendering.
    pool = WorkerPool(kv_index, settings.pool, prober=Prober(pipeline) if pipeline is not None else None)
    server_metrics = ServerMetrics()
    metrics = RouterMetrics(server_metrics.registry)
    pool.on_change = lambda: _reevaluate(pool, gate, metrics)
    proxy = Proxy(
        pipeline=pipeline,
        pool=pool,
        gate=gate,
        policy=policy,
        metrics=metrics,
        served_model_names=settings.served_model_names,
    )
    app = create_app(
        role="router",
        title="tokenfront router",
        server_info=lambda: router_info(proxy, kv_index, settings.policy),
        model_names=lambda: served_model_names(proxy),
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        metrics=server_metrics,
    )
    app.state.pipeline = pipeline
    app.state.pool = pool
    app.state.kv_index = kv_index
    app.state.policy_name = settings.policy
    app.state.proxy = proxy
    app.include_router(inference_router())
    app.include_router(workers_router())
    app.include_router(render_router() if pipeline is not None else render_unavailable_router())
    app.include_router(derender_router())
    app.router.lifespan_context = _lifespan(pool, gate, metrics, settings.workers)
    return app


def _reevaluate(pool: WorkerPool, gate: ForwardingGate, metrics: RouterMetrics) -> None:
    """The active set or a report changed: decide forwarding again (the gate logs only changes)."""
    active = pool.active()
    state = gate.evaluate({worker.url: worker.report for worker in active})
    metrics.forwarding.set(1 if state.forwarding else 0)
    metrics.active_workers.set(len(active))


def _lifespan(
    pool: WorkerPool, gate: ForwardingGate, metrics: RouterMetrics, workers: Sequence[WorkerSpec]
) -> Any:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.start(workers)
        _reevaluate(pool, gate, metrics)  # also with no worker answering yet: the router's own reasons
        log.info(
            "router ready: %d of %d workers active, forwarding ids: %s",
            len(pool.active()),
            len(pool.workers),
            "yes" if gate.state.forwarding else "no",
        )
        try:
            yield
        finally:
            await pool.stop()

    return lifespan

"""The worker app (`tokenfront serve`): the inference routes, the common routes, and optionally render routes.

The worker renders with the same `RenderPipeline` as the standalone renderer (built the same way, from the
same options), so the fingerprint it publishes matches a renderer's and so do the ids. The render routes are
mounted only when TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1, as the reference text says of its worker; they are
the renderer's own routes on this worker's pipeline.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.routing import APIRoute

from tokenfront.core.render import RenderPipeline
from tokenfront.protocol.limits import DEFAULT_LIMITS, RequestLimits
from tokenfront.renderer.derender import derender_router
from tokenfront.renderer.routes import render_router
from tokenfront.server.app import create_app, pipeline_info
from tokenfront.server.errors import APIError
from tokenfront.server.inspector import inspector_router
from tokenfront.server.limits import DEFAULT_MAX_BODY_BYTES
from tokenfront.server.tracing import Tracing
from tokenfront.worker.engine import Engine
from tokenfront.worker.metrics import WorkerMetrics
from tokenfront.worker.routes import kv_events_router, worker_router
from tokenfront.worker.service import WorkerService

log = logging.getLogger(__name__)

ENABLE_RENDER_ENDPOINTS = "TOKENFRONT_ENABLE_RENDER_ENDPOINTS"


def render_endpoints_enabled(environ: Any = os.environ) -> bool:
    """Whether TOKENFRONT_ENABLE_RENDER_ENDPOINTS asks for the render routes ("1", "true", "yes", "on")."""
    return str(environ.get(ENABLE_RENDER_ENDPOINTS, "")).strip().lower() in ("1", "true", "yes", "on")


def create_worker_app(
    pipeline: RenderPipeline,
    engine: Engine,
    *,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_limits: RequestLimits = DEFAULT_LIMITS,
    enable_render_endpoints: bool | None = None,
    show_paths: bool = False,
    tracing: Tracing | None = None,
) -> FastAPI:
    """The worker: inference routes on `engine`, common routes, and the render routes when enabled.

    `enable_render_endpoints` None reads TOKENFRONT_ENABLE_RENDER_ENDPOINTS; `show_paths`: the checkpoint's
    paths on `/server_info`; `tracing`: its spans (`server.tracing`). The engine is started and stopped with
    the app (its lifespan).
    """

    def worker_info() -> dict[str, Any]:
        info = engine.info
        return {
            **pipeline_info(pipeline),
            "tokens_per_block": info.tokens_per_block,
            "kv_cache_hash": info.kv_cache_hash,
            "max_batch_size": info.max_batch_size,
            "kv_cache_max_tokens": info.kv_cache_max_tokens,
            "engine": info.name,
            "device": info.device,
            "render_endpoints": enabled,
        }

    enabled = render_endpoints_enabled() if enable_render_endpoints is None else enable_render_endpoints
    app = create_app(
        role="worker",
        title="tokenfront worker",
        server_info=worker_info,
        model_names=lambda: pipeline.served_model_names,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        request_limits=request_limits,
        show_paths=show_paths,
        tracing=tracing,
    )
    app.state.pipeline = pipeline
    service = WorkerService(pipeline, engine, WorkerMetrics(app.state.metrics, engine), tracing=tracing)
    app.state.service = service
    app.state.engine = engine
    app.include_router(worker_router())
    app.include_router(kv_events_router())
    if enabled:
        app.include_router(render_router(tracing))
        app.include_router(derender_router())
        app.include_router(inspector_router())  # the page at `/` renders through these routes
    else:
        app.include_router(_render_routes_off())
    app.router.lifespan_context = _lifespan(service)
    # At the shutdown deadline (`--shutdown-timeout`), before the requests still in flight are cut: stop
    # generating for them, so their choices end with "abort" and the engine is idle for `stop`.
    app.drain.on_deadline(lambda: _abort_in_flight(engine))
    return app


def _render_routes_off() -> APIRouter:
    """The render and derender paths on a worker that does not mount them: a 404 that says how to."""
    router = APIRouter(include_in_schema=False)

    async def off(request: Request) -> None:
        raise APIError(
            404,
            f"no route {request.method} {request.url.path} on this worker: its render routes are mounted only "
            f"when it is started with {ENABLE_RENDER_ENDPOINTS}=1 in its environment (`tokenfront render` "
            "serves them without a model)",
            code="render_endpoints_disabled",
        )

    for route in [*render_router().routes, *derender_router().routes]:
        if isinstance(route, APIRoute):
            router.add_api_route(route.path, off, methods=sorted(route.methods or ()))
    return router


def _abort_in_flight(engine: Engine) -> None:
    abort_all = getattr(engine, "abort_all", None)
    if callable(abort_all):
        count = abort_all()
        if count:
            log.warning("shutdown timeout is over: aborted %d engine sequence(s) still generating", count)


def _lifespan(service: WorkerService) -> Any:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.engine.start()
        if service.pipeline.tool_call_parser is not None:
            # Named tool_choice needs the grammar index of the vocabulary: build it now, not on a request.
            await service.guided()
        log.info("worker engine started (%s on %s)", service.engine.info.name, service.engine.info.device)
        try:
            yield
        finally:
            # After the graceful shutdown: in-flight requests have finished, their clients left, or the
            # shutdown timeout cut them (their sequences aborted); `stop` aborts whatever is left.
            await service.engine.stop()
            log.info("worker engine stopped")

    return lifespan

"""The app factory every tokenfront server is built from: common routes, errors, auth, limits, metrics."""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from tokenfront import __version__
from tokenfront.core.render import RenderPipeline
from tokenfront.server.errors import error_response, install_error_handlers
from tokenfront.server.limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit

SCHEMA_VERSION = 1
# Paths that answer without an API key: load balancers probe health without credentials.
_OPEN_PATHS = frozenset({"/health"})


class ServerMetrics:
    """Prometheus metrics of one app, in its own registry (no process-global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tokenfront_requests", "HTTP requests answered", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "tokenfront_request_seconds",
            "Time to answer a request",
            ["route"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.rendered_prompts = Counter(
            "tokenfront_rendered_prompts", "Prompts rendered into ids", ["kind"], registry=self.registry
        )
        self.rendered_tokens = Counter(
            "tokenfront_rendered_tokens",
            "Prompt tokens produced by rendering",
            ["kind"],
            registry=self.registry,
        )


def create_app(
    *,
    role: str,
    pipeline: RenderPipeline,
    title: str,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    server_info: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """Build a FastAPI app with the routes every tokenfront server has (SPEC §6)."""
    app = FastAPI(title=title, version=__version__, docs_url="/docs", openapi_url="/openapi.json")
    app.state.pipeline = pipeline
    app.state.metrics = ServerMetrics()
    app.state.role = role
    install_error_handlers(app)
    _install_auth_and_metrics(app, api_key)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)

    @app.get("/health", tags=["common"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/server_info", tags=["common"])
    async def get_server_info() -> dict[str, Any]:
        info = {
            "role": role,
            "version": __version__,
            "model": pipeline.served_model_names[0],
            "served_model_names": list(pipeline.served_model_names),
            "schema_version": SCHEMA_VERSION,
            "render_fingerprint": pipeline.fingerprint.to_json(),
            "reasoning_parser": pipeline.options.reasoning_parser,
            "tool_call_parser": pipeline.options.tool_call_parser,
        }
        if server_info is not None:
            info.update(server_info())
        return info

    @app.get("/v1/models", tags=["common"])
    async def list_models() -> dict[str, Any]:
        created = int(app.state.started)
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": "tokenfront", "root": name}
                for name in pipeline.served_model_names
            ],
        }

    @app.get("/metrics", tags=["common"])
    async def metrics() -> Response:
        return Response(generate_latest(app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.state.started = time.time()
    return app


def _install_auth_and_metrics(app: FastAPI, api_key: str | None) -> None:
    @app.middleware("http")
    async def auth_and_metrics(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        path = request.url.path
        if api_key is not None and path not in _OPEN_PATHS and not _authorized(request, api_key):
            return error_response(
                401,
                "missing or incorrect API key: send it as `Authorization: Bearer <key>`",
                code="invalid_api_key",
            )
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        label = getattr(route, "path", "unmatched")
        app.state.metrics.requests.labels(label, str(response.status_code)).inc()
        app.state.metrics.latency.labels(label).observe(time.perf_counter() - start)
        return response


def _authorized(request: Request, api_key: str) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), api_key.encode())


__all__ = ["SCHEMA_VERSION", "ServerMetrics", "create_app"]

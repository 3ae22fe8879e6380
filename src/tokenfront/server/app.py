"""The app factory every tokenfront server is built from: common routes, errors, auth, limits, metrics.

A server passes what it knows as providers — its `/server_info` body and the model names it serves — so
the renderer, the worker and the router (which may have no pipeline at all) share one factory and one copy
of each common route.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Response
from starlette.datastructures import State
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenfront import __version__
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol.limits import DEFAULT_LIMITS, RequestLimits, validation_context
from tokenfront.server.admin_auth import AdminAccess
from tokenfront.server.api_docs import api_docs_router
from tokenfront.server.direct import DirectAnswer
from tokenfront.server.errors import install_error_handlers
from tokenfront.server.lean_routes import LeanRoute
from tokenfront.server.limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit
from tokenfront.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics, exposition
from tokenfront.server.middleware import AuthAndMetrics
from tokenfront.server.models import ModelNames, models_body
from tokenfront.server.responses import JSONBytesResponse
from tokenfront.server.shutdown import Drain
from tokenfront.server.tracing import Tracing

__all__ = [
    "PATH_INFO_KEYS",
    "SCHEMA_VERSION",
    "ServerInfo",
    "TokenfrontApp",
    "create_app",
    "pipeline_info",
    "without_paths",
]

SCHEMA_VERSION = 1
# A provider of the role-specific part of `/server_info`.
ServerInfo = Callable[[], dict[str, Any]]
# The fields of a fingerprint's `info` that name this machine's files: on `/server_info` only with
# `--show-paths` (any client may read it; the digest does not depend on them).
PATH_INFO_KEYS = ("model_path", "tokenizer_path")


class AppState(State):
    """Starlette's `app.state`, its values also kept as plain attributes: read without a `__getattr__` call (a
    Python function, and an exception for an absent name), several of which every request makes."""

    def __setattr__(self, key: Any, value: Any) -> None:
        super().__setattr__(key, value)
        object.__setattr__(self, key, value)

    def __delattr__(self, key: Any) -> None:
        super().__delattr__(key)
        object.__delattr__(self, key)


class TokenfrontApp(FastAPI):
    """A FastAPI app that answers its lean routes (`server.lean_routes.LeanRoute`) itself.

    A POST to a lean route's exact path goes straight to the route through the app's own auth, metrics and
    body-limit layers, skipping Starlette's middleware stack and FastAPI's routing layers, which cost more
    than rendering a short chat. Everything else (other routes, 404, 405, OpenAPI, lifespan) takes FastAPI's
    usual path. Both paths answer the same: the same handler, the same errors.

    Every HTTP request goes through the app's `drain` (`server.shutdown`): on shutdown, new requests get 503
    and those still in flight at the deadline are cut in their API's shape.
    """

    lean_front: ASGIApp | None = None
    # Its spans (`server.tracing`, `--otlp-traces-endpoint`); None: the app traces nothing.
    tracing: Tracing | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state = AppState()
        self.lean_routes: dict[str, LeanRoute] = {}
        # The lean routes that offer a direct answer (`server.direct`), by path.
        self.direct_routes: dict[str, DirectAnswer] = {}
        self.max_body_bytes = DEFAULT_MAX_BODY_BYTES
        self.drain = Drain()
        self.request_limits = DEFAULT_LIMITS

    @property
    def request_limits(self) -> RequestLimits:
        """What one request may ask for here (`protocol.limits`); every body is validated with it."""
        return self._request_limits

    @request_limits.setter
    def request_limits(self, limits: RequestLimits) -> None:
        self._request_limits = limits
        self.validation_context = validation_context(limits)

    def include_router(self, router: APIRouter, *, prefix: str = "", **kwargs: Any) -> None:  # type: ignore[override]
        """FastAPI's `include_router`, noting the router's lean POST routes for the direct path."""
        super().include_router(router, prefix=prefix, **kwargs)
        if kwargs.get("dependencies"):
            return  # dependencies run on FastAPI's path only: leave these routes to it
        for route in router.routes:
            if isinstance(route, LeanRoute) and route.methods == {"POST"} and "{" not in route.path:
                self.lean_routes[prefix + route.path] = route
                if route.direct is not None:
                    self.direct_routes[prefix + route.path] = route.direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.drain.serve(self._dispatch, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "POST" and self.lean_front is not None:
            route = self.lean_routes.get(scope["path"])
            if route is not None:
                scope["app"] = self
                scope["route"] = route
                await self.lean_front(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _serve_lean_route(scope: Scope, receive: Receive, send: Send) -> None:
    await scope["route"].serve(scope, receive, send)


def create_app(
    *,
    role: str,
    title: str,
    server_info: ServerInfo,
    model_names: ModelNames,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: ServerMetrics | None = None,
    admin: AdminAccess | None = None,
    show_paths: bool = False,
    tracing: Tracing | None = None,
    request_limits: RequestLimits = DEFAULT_LIMITS,
    server_info_ready: Callable[[], bool] | None = None,
) -> TokenfrontApp:
    """A FastAPI app with the routes every tokenfront server has (docs/contract.md §6): `/health`, `/server_info`,
    `/v1/models`, `/metrics`, OpenAPI at `/openapi.json`, `/docs` and `/redoc` (their files served by the app);
    OpenAI-shaped errors; Bearer auth on everything but `/health` and the inspector's static files; a body size
    limit (413). `metrics` lets a server register its own metrics in the app's registry before the app exists;
    `admin` gives its admin paths and their key (`server.admin_auth`); `show_paths` keeps the checkpoint's
    paths in `/server_info` (`--show-paths`; else `without_paths`); `tracing` its spans (`server.tracing`: a
    server span per request, and the direct lane off); `request_limits` what one request may ask for (the
    bodies are validated with it: `protocol.limits`); `server_info_ready` whether `server_info` answers at once
    (when not — a renderer's fingerprint being computed just after start-up — it is called off the event
    loop, and `/server_info` answers once it has the final body)."""
    app = TokenfrontApp(
        title=title,
        version=__version__,
        # `/docs` and `/redoc` are `server.api_docs`' pages, on files the app serves (FastAPI's use a CDN).
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        default_response_class=JSONBytesResponse,
    )
    metrics = metrics or ServerMetrics()
    app.tracing = tracing
    app.state.metrics = metrics
    app.state.role = role
    app.state.started = time.time()
    # A router that serves several models sets its own (`renderer.routes.pipeline_for`): set here, looking it
    # up costs no AttributeError on the render path.
    app.state.choose_pipeline = None
    app.max_body_bytes = max_body_bytes
    app.request_limits = request_limits
    install_error_handlers(app)
    # Added last = outermost: auth is checked before a body is read, and 413s are counted too.
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_middleware(AuthAndMetrics, metrics=metrics, api_key=api_key, admin=admin)
    # The same two layers in front of the lean routes.
    app.lean_front = AuthAndMetrics(
        BodySizeLimit(_serve_lean_route, max_bytes=max_body_bytes),
        metrics=metrics,
        api_key=api_key,
        admin=admin,
    )

    app.include_router(api_docs_router(title=title, openapi_url="/openapi.json"))

    @app.get("/health", tags=["common"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/server_info", tags=["common"])
    async def get_server_info() -> dict[str, Any]:
        ready = server_info_ready is None or server_info_ready()
        body = server_info() if ready else await asyncio.to_thread(server_info)
        info = {"role": role, "version": __version__, "schema_version": SCHEMA_VERSION, **body}
        return info if show_paths else without_paths(info)

    @app.get("/v1/models", tags=["common"])
    async def list_models() -> dict[str, Any]:
        return models_body(model_names(), int(app.state.started))

    @app.get("/metrics", tags=["common"])
    async def get_metrics() -> Response:
        metrics.flush()  # this turn's counts too
        return Response(exposition(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def pipeline_info(pipeline: RenderPipeline) -> dict[str, Any]:
    """The `/server_info` fields of a server that renders with `pipeline` (renderer and worker)."""
    return {
        "model": pipeline.served_model_names[0],
        "served_model_names": list(pipeline.served_model_names),
        "render_fingerprint": pipeline.fingerprint.to_json(),
        "reasoning_parser": pipeline.options.reasoning_parser,
        "tool_call_parser": pipeline.options.tool_call_parser,
    }


def without_paths(info: dict[str, Any]) -> dict[str, Any]:
    """A `/server_info` body without the fields that name this machine's files (`PATH_INFO_KEYS` of its
    `render_fingerprint.info`); the body given is left as it is."""
    fingerprint = info.get("render_fingerprint")
    if not isinstance(fingerprint, dict):
        return info
    details = fingerprint.get("info")
    if not isinstance(details, dict) or not any(key in details for key in PATH_INFO_KEYS):
        return info
    kept = {key: value for key, value in details.items() if key not in PATH_INFO_KEYS}
    return {**info, "render_fingerprint": {**fingerprint, "info": kept}}

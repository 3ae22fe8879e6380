"""The fleet benchmark: one workload, one fleet of simulated GPUs, every routing policy; hit rate and TTFT.

    python -m benchmarks.fleet [--workers 64] [--workload agentic|groups|mooncake:FILE] [--load 0.7]
                               [--rate-scale X] [--seed 0] [--duration 60]
                               [--policies kv_cache_aware,predicted_ttft,round_robin,load_balancing]
                               [--load-weight 1.0] [--cache-threshold 0.5] [--offline [--routers N]
                               [--no-share-load]] [--sim-speedup 0.1] [--sim-processes K]
                               [--kv-events-interval 0.5] [--concurrency 4096] [--request-timeout 1800] [--json]

The workload (`scenario.py`) is cut at `--duration` modelled seconds and its arrival rate scaled until it puts
`--load` on the fleet: the share of the fleet's prefill capacity it uses under round-robin (`load.py`); or
`--rate-scale` gives the scale, and the load it makes is measured. The oracle (`oracle.py`) says the hit
rate a perfect router could reach with the fleet's cache pooled. Then, for each policy of `--policies`, on a
fresh fleet (empty caches, zeroed counters):

- live (the default): `tokenfront simulate --workers N --processes K --port 0 --sim-speedup S` (0.1) and a fresh
  `tokenfront route --policy P` in front of it, both real processes on loopback, stopped by their pids after the
  policy's run. The fleet is spread over `--sim-processes` K processes (default: one per 128 workers, at most one
  per core: 2 at 256 workers), each an event loop on one core, so that it keeps up with its clock; each worker
  keeps the offline replay's event history (1,000 events) and idle connections for a minute
  (`servers.SIM_KEEP_ALIVE_SECONDS`). The router's periodic work keeps the modelled clock: it reads each worker's
  events every `--kv-events-interval` and checks its health every 2 modelled seconds (5 and 20 wall seconds at
  0.1), as often as a router on real GPUs would, not ten times as often. The requests are sent open loop, each at
  its `at` on a clock `--sim-speedup` times slower than the modelled one, as streaming `/v1/completions` of its
  ids (`TimedRequest.completion_body`, usage included), at most `--concurrency` in flight (a request due while
  that many are in flight waits, and its wait counts in its TTFT) and each given `--request-timeout` wall seconds.
  TTFT is the client's: from when the request was due to its first content event, converted to modelled seconds (x
  the speedup); the hit rate comes from `usage.prompt_tokens_details.cached_tokens`. An answer that is not a 200,
  breaks off or has no content is an error. A policy `tokenfront route` does not know is skipped with a note.
- `--offline`: the same engines, index and policy in this process on a virtual clock (`replay.py`), no HTTP.
  `--routers N`: N router replicas, the requests dealt to them in turn, each with its own index and policy fed
  by every engine's events, sharing their in-flight load as `--replica-sync-bind` does (at once: the live
  sync's milliseconds left out), or not with `--no-share-load`.

The report, per policy: requests, errors, hit rate, oracle hit rate and their ratio, mean/p50/p99 TTFT,
throughput, the busiest worker's share of requests and of busy GPU time (`results.py`); live runs add whether
the fleet kept up: the engines' step lateness, mean and largest (`tokenfront_engine_lag_seconds_*`, wall
milliseconds: a mean near a step's wall time, ~8-25 modelled ms over the speedup, means the machine, not the
model, set the pace — slow the clock down or add fleet processes), how many times the router took a worker
out of its active set (`router_workers_taken_out`, and `router_take_out_reasons` from its log: a check that
timed out, a worker too busy to answer; 0 when the fleet kept up), the cores the fleet, the router and this
client used while the requests were sent, and the router's decision and render times (mean, and the bucket its
p99 is under, from its /metrics) and its renders by outcome (a `late` one is routed by load alone). `--json`
prints one object:

    {"policies": {NAME: {"requests", "errors", "hit_rate", "oracle_hit_rate", "ttft_mean_ms", "ttft_p50_ms",
                         "ttft_p99_ms", "max_worker_share", ...}}, "workers": N, "load": L, ...}

Every TTFT and throughput is in modelled time. The simulated GPU is the engine's default model
(docs/simulation.md) with a 131,072-token context, so the agentic workload's longest prompts fit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import uvloop

from benchmarks.fleet.live_client import send_all
from benchmarks.fleet.load import Calibration, calibrate, round_robin_load
from benchmarks.fleet.oracle import achievable_hit_rate, fleet_cache_blocks
from benchmarks.fleet.replay import FLEET_CONTEXT_TOKENS, FLEET_EVENT_HISTORY, ReplaySettings, replay_policy
from benchmarks.fleet.requests import TimedRequest
from benchmarks.fleet.results import PolicyRun, summary
from benchmarks.fleet.scenario import WORKLOADS, WorkloadSpec
from benchmarks.servers import (
    WORKERS_PER_SIM_PROCESS,
    Server,
    engine_gauges,
    launch,
    launch_tokenfront,
    sim_processes,
    simulate_command,
    step_lag,
    stop_all,
    taken_out,
    wait_for_urls,
    wait_healthy,
)
from tokenfront import fixtures
from tokenfront.router.policies import POLICIES, PredictedTtftConfig
from tokenfront.router.worker_pool import PoolSettings

# predicted_ttft's settings a tuning run may change: the router's flag and PredictedTtftConfig's field.
_PREDICTED_TTFT_FLAGS = {
    "--overlap-credit": "overlap_credit",
    "--occupancy-weight": "occupancy_weight",
    "--affinity-threshold": "affinity_threshold",
    "--decode-seconds-per-request": "decode_seconds_per_request",
    "--occupancy-linger": "occupancy_linger_seconds",
}
# Of those, the durations: modelled seconds, which the live router (on wall time) gets as the slowed clock's.
_PREDICTED_TTFT_DURATIONS = frozenset({"occupancy_linger_seconds"})
DEFAULT_POLICIES = "kv_cache_aware,predicted_ttft,round_robin,load_balancing"
# The live fleet's clock: a tenth of real time. 256 workers at load 0.7 over 60 s are ~165 requests a modelled
# second, ~16 a wall second at 0.1, what this 2-core machine's one fleet process, router and client carry; at
# 0.25 a 256-worker run failed (docs/routing.md has the lateness measured; 0.1 itself was not measured at 256).
DEFAULT_SIM_SPEEDUP = 0.1


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, build the workload at the load, run every policy, print the report."""
    args = _parser().parse_args(argv)
    try:
        spec = WorkloadSpec.parse(args.workload, seed=args.seed, duration=args.duration)
        _check(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    settings = ReplaySettings(
        args.workers,
        kv_events_interval=args.kv_events_interval,
        load_weight=args.load_weight,
        cache_threshold=args.cache_threshold,
        predicted_ttft=_predicted_ttft(args),
        routers=args.routers,
        share_load=args.share_load,
    )
    started = time.perf_counter()
    try:
        if args.rate_scale is None:
            calibration = calibrate(spec.requests, args.load, args.workers, settings.gpu)
        else:  # the scale given (a tuning loop reuses one): the load it makes is measured, not sought
            given = spec.requests(args.rate_scale)
            measured = round_robin_load(given, args.workers, settings.gpu)
            calibration = Calibration(args.rate_scale, measured, given, ((args.rate_scale, measured.load),))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    requests = calibration.requests
    gpu = settings.gpu
    oracle = achievable_hit_rate(
        requests, fleet_cache_blocks(args.workers, gpu.kv_cache_tokens, gpu.tokens_per_block)
    )
    _note(
        args,
        f"{len(requests)} requests over {calibration.load.span_seconds:.0f} s at {calibration.scale:.3g}x the "
        f"workload's arrival rate: load {calibration.load.load:.3f} ({len(calibration.passes)} passes, "
        f"{time.perf_counter() - started:.0f} s); oracle hit rate {oracle.hit_rate:.3f}",
    )
    report: dict[str, Any] = {
        "policies": {},
        "workers": args.workers,
        "load": round(calibration.load.load, 4),
        "target_load": args.load,
        "workload": args.workload,
        "seed": args.seed,
        "duration": args.duration,
        "requests": len(requests),
        "rate_scale": calibration.scale,
        "mode": "offline" if args.offline else "live",
        "sim_speedup": None if args.offline else args.sim_speedup,
        "sim_processes": None if args.offline else _sim_processes(args),
        "load_weight": args.load_weight,
        "cache_threshold": args.cache_threshold,
        "routers": args.routers,
        "share_load": args.share_load,
        "predicted_ttft": {name: getattr(args, name) for name in _PREDICTED_TTFT_FLAGS.values()},
        "skipped": {},
    }
    for policy in args.policies.split(","):
        if policy not in POLICIES:
            report["skipped"][policy] = (
                f"`tokenfront route` has no policy {policy!r} (it has {sorted(POLICIES)})"
            )
            _note(args, f"{policy}: skipped, {report['skipped'][policy]}")
            continue
        run = replay_policy(policy, requests, settings) if args.offline else _live_run(policy, requests, args)
        report["policies"][policy] = summary(run, oracle.hit_rate)
        _note(args, _line(policy, report["policies"][policy]))
    if args.json:
        print(json.dumps(report))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    parser.add_argument("--workers", type=int, default=64, help="simulated GPUs in the fleet (default: 64)")
    parser.add_argument(
        "--workload",
        default="agentic",
        help=f"the workload: {', '.join(WORKLOADS)} (default: agentic)",
    )
    parser.add_argument(
        "--load",
        type=float,
        default=0.7,
        help="the share of the fleet's prefill capacity the workload uses under round-robin (default: 0.7)",
    )
    parser.add_argument(
        "--rate-scale",
        type=float,
        default=None,
        help="use this multiple of the workload's arrival rate instead of seeking --load (the report's "
        "rate_scale of an earlier run; the load it makes is reported)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the workload's seed (default: 0)")
    parser.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="modelled seconds of arrivals to send (default: 60)",
    )
    parser.add_argument(
        "--policies", default=DEFAULT_POLICIES, help=f"comma-separated (default: {DEFAULT_POLICIES})"
    )
    parser.add_argument(
        "--load-weight",
        type=float,
        default=1.0,
        help="kv_cache_aware's --load-weight, live and offline (default: 1.0, the router's)",
    )
    parser.add_argument(
        "--cache-threshold",
        type=float,
        default=0.5,
        help="kv_cache_aware's --cache-threshold, live and offline (default: 0.5, the router's)",
    )
    for flag, name in _PREDICTED_TTFT_FLAGS.items():
        default = getattr(PredictedTtftConfig(), name)
        parser.add_argument(
            flag,
            dest=name,
            type=float,
            default=default,
            help=f"predicted_ttft's {flag}, live and offline (default: {default:g}, the router's)",
        )
    parser.add_argument(
        "--routers",
        type=int,
        default=1,
        help="offline: router replicas, requests dealt to them in turn, each with its own index (default: 1)",
    )
    parser.add_argument(
        "--no-share-load",
        dest="share_load",
        action="store_false",
        help="offline, with --routers above 1: each replica counts only its own requests (the gap sharing closes)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="replay in this process on a virtual clock instead of through real servers",
    )
    parser.add_argument(
        "--sim-speedup",
        type=float,
        default=DEFAULT_SIM_SPEEDUP,
        help=f"live: the fleet's clock against the modelled GPUs' (default: {DEFAULT_SIM_SPEEDUP})",
    )
    parser.add_argument(
        "--sim-processes",
        type=int,
        default=None,
        metavar="K",
        help="live: the fleet's processes, `tokenfront simulate --processes` (default: one per "
        f"{WORKERS_PER_SIM_PROCESS} workers, at most one per core)",
    )
    parser.add_argument(
        "--kv-events-interval",
        type=float,
        default=0.5,
        help="modelled seconds between the index's reads of each engine's events (default: 0.5, the "
        "router's default); live, the router's --kv-events-interval is that on the slowed clock",
    )
    parser.add_argument(
        "--concurrency", type=int, default=4096, help="live: requests in flight at most (default: 4096)"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=1800.0,
        help="live: wall seconds a request may take, from when it is sent (default: 1800)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return parser


def _predicted_ttft(args: argparse.Namespace) -> PredictedTtftConfig:
    """predicted_ttft's settings from the flags (ValueError naming the field for a bad one)."""
    return PredictedTtftConfig(**{name: getattr(args, name) for name in _PREDICTED_TTFT_FLAGS.values()})


def _check(args: argparse.Namespace) -> None:
    """The flags' mistakes, each a ValueError with one line to print."""
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, not {args.workers}")
    if args.routers < 1 or (args.routers > 1 and not args.offline):
        raise ValueError("--routers above 1 is an --offline replay's (at least 1)")
    if not args.load > 0:
        raise ValueError(f"--load must be more than 0, not {args.load}")
    if args.rate_scale is not None and not args.rate_scale > 0:
        raise ValueError(f"--rate-scale must be more than 0, not {args.rate_scale}")
    if not args.sim_speedup > 0:
        raise ValueError(f"--sim-speedup must be more than 0, not {args.sim_speedup}")
    if args.sim_processes is not None and not 1 <= args.sim_processes <= args.workers:
        raise ValueError(f"--sim-processes must be between 1 and --workers, not {args.sim_processes}")
    if args.load_weight < 0 or not 0 <= args.cache_threshold <= 1:
        raise ValueError("--load-weight must not be negative and --cache-threshold must be between 0 and 1")
    if not args.kv_events_interval > 0:
        raise ValueError(f"--kv-events-interval must be more than 0, not {args.kv_events_interval}")
    if args.concurrency < 1 or not args.request_timeout > 0:
        raise ValueError("--concurrency must be at least 1 and --request-timeout more than 0")
    _predicted_ttft(args)
    if not [policy for policy in args.policies.split(",") if policy]:
        raise ValueError("--policies names no policy")


def _note(args: argparse.Namespace, text: str) -> None:
    """A progress line: on stderr under --json (stdout is the report's), else on stdout."""
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def _line(policy: str, result: dict[str, Any]) -> str:
    return (
        f"{policy}: {result['requests']} requests, {result['errors']} errors; hit rate {result['hit_rate']:.3f} "
        f"(oracle {result['oracle_hit_rate']:.3f}, {result['achieved_over_oracle']}); TTFT mean "
        f"{result['ttft_mean_ms']} ms, p50 {result['ttft_p50_ms']} ms, p99 {result['ttft_p99_ms']} ms; "
        f"{result['throughput_requests_per_s']} req/s, {result['output_tokens_per_s']} tokens/s; busiest worker "
        f"{result['max_worker_share']}x the mean requests, {result['max_worker_busy_share']}x the mean GPU time"
        + (
            f"; step lag mean {result['engine_lag_mean_ms']} ms, max {result['engine_lag_max_ms']} ms; workers "
            f"taken out by the router {result['router_workers_taken_out']}; cores used by the fleet "
            f"{result['fleet_cores']}, the router {result['router_cores']}, the client {result['client_cores']}; "
            f"router decision mean {result['router_decision_ms']['mean']} ms (p99 under "
            f"{result['router_decision_ms']['p99_under']} ms); router renders {result['router_renders']}"
            if "engine_lag_mean_ms" in result
            else ""
        )
        + (f"; {result['wall_seconds']} s wall" if "wall_seconds" in result else "")
        + (f" ({result['cpu_seconds']} s CPU)" if "cpu_seconds" in result else "")
    )


# ---------------------------------------------------------------------------------------------------- live


def _sim_processes(args: argparse.Namespace) -> int:
    """The live fleet's processes: `--sim-processes`, else `servers.sim_processes`' default."""
    return int(args.sim_processes) if args.sim_processes is not None else sim_processes(args.workers)


def _live_run(policy: str, requests: Sequence[TimedRequest], args: argparse.Namespace) -> PolicyRun:
    """A fresh fleet and router for `policy`, the requests sent through the router, both stopped by pid."""
    model = fixtures.ensure_checkpoint("qwen3")
    started: list[Server] = []
    started_at = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tokenfront-bench-fleet-") as logs:
        try:
            command = simulate_command(
                model,
                args.workers,
                _sim_processes(args),
                *("--sim-speedup", str(args.sim_speedup), "--kv-events-history", str(FLEET_EVENT_HISTORY)),
                *("--sim-max-context-tokens", str(FLEET_CONTEXT_TOKENS), "--log-level", "warning"),
            )
            fleet = launch(f"simulate-{policy}", command, port=0, log_dir=Path(logs))
            started.append(fleet)
            ports = wait_for_urls(fleet, args.workers)
            urls = [f"http://127.0.0.1:{port}" for port in ports]
            route = ["route", "--model", str(model), "--policy", policy, "--log-level", "warning"]
            if policy == "kv_cache_aware":
                route += [
                    "--load-weight",
                    str(args.load_weight),
                    "--cache-threshold",
                    str(args.cache_threshold),
                ]
            if policy == "predicted_ttft":
                for flag, name in _PREDICTED_TTFT_FLAGS.items():
                    value = getattr(args, name)
                    if name in _PREDICTED_TTFT_DURATIONS:  # the router's clock is wall time: slowed seconds
                        value /= args.sim_speedup
                    route += [flag, str(value)]
            # The router's periods are wall seconds: its event reads and health checks come as often in modelled
            # time as a router's on real GPUs (every 0.5 and 2 modelled seconds), not 1 / speedup times as often.
            route += ["--kv-events-interval", str(args.kv_events_interval / args.sim_speedup)]
            route += ["--health-interval", str(PoolSettings.health_interval / args.sim_speedup)]
            # A request may wait long for its first token at a slowed clock (its stream's head comes first):
            # the router must not give up before the client does.
            route += ["--first-byte-timeout", str(args.request_timeout)]
            route += ["--idle-timeout", str(args.request_timeout)]
            route += ["--request-timeout", str(args.request_timeout)]
            for url in urls:
                route += ["--worker", url]
            router = launch_tokenfront(route, log_dir=Path(logs), name=f"route-{policy}")
            started.append(router)
            wait_healthy([router])
            _wait_for_workers(router, len(urls))
            cpu_before = fleet.cpu_seconds(), router.cpu_seconds(), time.process_time()
            sending = time.perf_counter()
            # uvloop, as the servers run: the stock loop spent a third of this client's CPU in its selector.
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                outcomes = runner.run(
                    send_all(
                        router.url,
                        requests,
                        speedup=args.sim_speedup,
                        concurrency=args.concurrency,
                        request_timeout=args.request_timeout,
                    )
                )
            sending = time.perf_counter() - sending
            cpu = [
                after - before
                for before, after in zip(
                    cpu_before, (fleet.cpu_seconds(), router.cpu_seconds(), time.process_time()), strict=True
                )
            ]
            counters = engine_gauges(urls)
            reasons = taken_out(router)
            metrics = httpx.get(f"{router.url}/metrics", timeout=30).text
            decisions = _histogram(metrics, "tokenfront_router_decision_seconds")
            renders = _histogram(metrics, "tokenfront_router_render_seconds")
            render_outcomes = {
                outcome: int(float(count))
                for outcome, count in re.findall(
                    r'^tokenfront_router_renders_total\{outcome="(\w+)"\} (\S+)$', metrics, re.MULTILINE
                )
            }
        finally:
            stop_all(started)
    return PolicyRun(
        policy,
        outcomes,
        [int(c.get("requests_submitted", 0)) for c in counters],
        [c.get("model_seconds", 0.0) for c in counters],
        extra={
            # Lateness is on the clock (wall seconds): compare it with a step's wall time, step / speedup.
            **step_lag(counters),
            "router_workers_taken_out": sum(reasons.values()),
            "router_take_out_reasons": reasons,
            # The router's own time per request (wall ms): its routing decision, and the render step (for a
            # prompt of ids, checking them), from its /metrics.
            "router_decision_ms": decisions,
            "router_render_ms": renders,
            # Renders by outcome: a "late" one (not done within the router's --render-timeout) is routed by
            # load alone, without its prefix.
            "router_renders": render_outcomes,
            # Where the machine's CPU went while the requests were sent: cores used by each party.
            "fleet_cores": round(cpu[0] / sending, 3),
            "router_cores": round(cpu[1] / sending, 3),
            "client_cores": round(cpu[2] / sending, 3),
            "wall_seconds": round(time.perf_counter() - started_at, 1),
        },
    )


def _histogram(text: str, name: str) -> dict[str, float | None]:
    """A histogram of a /metrics text in wall milliseconds: its mean, and the bucket bound its p99 is under
    (None above the last bound)."""
    total = float(re.search(rf"^{name}_sum (\S+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    buckets = [
        (float(bound), float(count))
        for bound, count in re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.MULTILINE)
    ]
    count = buckets[-1][1] if buckets else 0.0
    p99 = next((bound for bound, seen in buckets if seen >= 0.99 * count), None) if count else None
    return {
        "mean": round(1000 * total / count, 3) if count else None,
        "p99_under": round(1000 * p99, 3) if p99 is not None and p99 != float("inf") else None,
    }


def _wait_for_workers(router: Server, workers: int, timeout: float = 120.0) -> None:
    """Until the router's GET /workers shows every worker healthy, publishing KV events."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=10) as client:
        while True:
            listed = client.get(f"{router.url}/workers").json()["workers"]
            ready = [w for w in listed if w.get("state") == "healthy" and w.get("kv_events")]
            if len(ready) >= workers:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the router has {len(ready)} of {workers} workers ready:\n{router.log_tail()}"
                )
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())

"""A router replica killed and restarted under traffic: how soon it is ready, how warm, and what the others lost.

Issue 21, item 2's acceptance: at 256 simulated workers a restarted router reports ready within 5 s, its KV
index within 5 % of a live replica's block count, and the replicas that stayed lose no request.

    python -m benchmarks.router_restart [--workers 256] [--routers 3] [--clients 24] [--fill-tokens 16384]
                                        [--kv-events-history 4] [--before-seconds 20] [--after-seconds 10]
                                        [--health-interval 10] [--kv-events-interval 2] [--sim-speedup 1]
                                        [--sim-processes K] [--json]

1. `tokenfront simulate --workers N --processes K --port 0 --kv-events-history H` (K processes: by default one
   per 128 workers, at most one per core; docs/simulation.md), and
   `--routers` `tokenfront route --policy kv_cache_aware --worker-file FILE` replicas in front of it, each
   waited for until it answers /health and lists every worker healthy. The routers check their workers every
   `--health-interval` and read their events every `--kv-events-interval` seconds: three routers at their
   defaults (2 s: 3-4 requests a worker; 0.5 s) would send a 256-worker fleet ~2,700 requests a second, more
   than a 2-core machine carries beside them.
2. Caches filled: `--fill-tokens` prompt tokens per worker (prompts of 8,192 ids) sent straight to the
   workers, so the index is large; the routers learn them from the workers' events as they run.
   `--kv-events-history` is shorter than what each worker writes, so the restarted router's reads are
   answered with snapshots (a fresh router reads an uncut history from its start instead).
3. Traffic through the routers: `--clients` closed-loop clients, each an agentic session on one of 16 system
   prompts (4,096 ids), a task, then turns adding 500-2,000 ids of tool output (`/v1/completions` of ids, 16
   tokens answered, not streamed), 10-30 turns a session and at most 32,000 ids; each request goes to the next live router.
4. After `--before-seconds`, router 0 leaves the clients' rotation and is killed by its pid (SIGKILL: nothing
   graceful); its requests in flight are lost with it (counted apart). At once it is started again on its port;
   reported: seconds from its launch to its first /health 200 (``ready_seconds``; the router listens only after
   its start-up read of the workers' KV events, `router/kv_warmup.py`), its /server_info ``kv_warmup`` (how many
   workers came from a snapshot: with `--kv-events-history` shorter than what each worker wrote, all of them),
   and then at once the confirmed blocks of its index against a live replica's and the workers' own count
   (``tokenfront_engine_kv_cache_blocks`` summed). It rejoins the rotation, and traffic goes on for
   `--after-seconds`.
5. Per router: requests sent, answered 200, lost (any other status, an error, a broken answer). The replicas that
   stayed must have lost none. Whether the fleet kept up: its engines' step lateness (mean and largest, wall
   ms) and how many times each router took a worker out of its active set, by reason (from its log).

Everything started is stopped by its pid. On a shared 2-core machine the figures are noisy; the client, the
fleet and three routers share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks import servers
from benchmarks.servers import Server, free_port, launch, stop_all, wait_for_urls
from tokenfront import fixtures

_BLOCKS = re.compile(r"^tokenfront_engine_kv_cache_blocks (\S+)$", re.MULTILINE)
_SYSTEM_PROMPTS = 16
_SYSTEM_TOKENS = 4096
_FILL_PROMPT_TOKENS = 8192
_MAX_PROMPT_TOKENS = 32_000  # Qwen3's context is 40,960


@dataclass
class RouterTally:
    """What one router was sent and what came back."""

    sent: int = 0
    ok: int = 0
    lost: int = 0
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class Replica:
    """A router replica and whether the clients send to it."""

    server: Server
    command: list[str]
    live: bool = True
    tally: RouterTally = field(default_factory=RouterTally)
    # Requests to it after the restart, counted apart from those before the kill.
    after_restart: RouterTally = field(default_factory=RouterTally)
    restarted: bool = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--routers", type=int, default=3)
    parser.add_argument("--clients", type=int, default=24, help="closed-loop sessions in flight")
    parser.add_argument(
        "--fill-tokens", type=int, default=16384, help="prompt tokens sent to each worker first"
    )
    parser.add_argument("--kv-events-history", type=int, default=4, help="events each worker's log keeps")
    parser.add_argument("--before-seconds", type=float, default=20.0)
    parser.add_argument("--after-seconds", type=float, default=10.0)
    parser.add_argument("--sim-speedup", type=float, default=1.0)
    parser.add_argument(
        "--sim-processes",
        type=int,
        default=None,
        help="the fleet's processes (default: one per 128 workers, at most one per core)",
    )
    parser.add_argument("--health-interval", type=float, default=10.0, help="the routers' (default: 10)")
    parser.add_argument("--kv-events-interval", type=float, default=2.0, help="the routers' (default: 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON document")
    args = parser.parse_args(argv)
    if args.routers < 2:
        parser.error("--routers must be at least 2: one is killed, one stays")
    result = asyncio.run(_run(args))
    print(json.dumps(result, indent=2) if args.json else _report(result))
    return 0 if result["lost_on_replicas_that_stayed"] == 0 else 1


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    model = fixtures.ensure_checkpoint("qwen3")
    started: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="tokenfront-router-restart-") as logs_dir:
        logs = Path(logs_dir)
        try:
            processes = args.sim_processes or servers.sim_processes(args.workers)
            command = servers.simulate_command(
                model,
                args.workers,
                processes,
                *("--kv-events-history", str(args.kv_events_history), "--log-level", "warning"),
                *("--sim-speedup", str(args.sim_speedup)),
            )
            fleet = launch("simulate", command, port=0, log_dir=logs)
            started.append(fleet)
            fleet_started = time.monotonic()
            urls = [f"http://127.0.0.1:{port}" for port in wait_for_urls(fleet, args.workers)]
            fleet_seconds = time.monotonic() - fleet_started
            worker_file = logs / "workers.txt"
            worker_file.write_text("".join(f"{url}\n" for url in urls))
            replicas = []
            for number in range(args.routers):
                port = free_port()
                route = [sys.executable, "-m", "tokenfront.cli", "route", "--model", str(model)]
                route += ["--policy", "kv_cache_aware", "--worker-file", str(worker_file)]
                route += ["--health-interval", str(args.health_interval)]
                route += ["--kv-events-interval", str(args.kv_events_interval)]
                route += ["--host", "127.0.0.1", "--port", str(port)]
                server = launch(f"route-{number}", route, port=port, log_dir=logs)
                started.append(server)
                replicas.append(Replica(server, route))
            async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
                first_ready = [await _ready(client, replica.server) for replica in replicas]
                for replica in replicas:
                    await _all_workers_healthy(client, replica.server, args.workers)
                fill_started = time.monotonic()
                await _fill(client, urls, args)
                fill_seconds = time.monotonic() - fill_started
                result = await _traffic_and_restart(client, replicas, urls, logs, started, args)
            result.update(servers.step_lag(await asyncio.to_thread(servers.engine_gauges, urls)))
            result["router_take_outs"] = {
                server.name: servers.taken_out(server)
                for server in started
                if server.name.startswith("route")
            }
        finally:
            stop_all(started)
    result.update(
        workers=args.workers,
        routers=args.routers,
        clients=args.clients,
        fill_tokens_per_worker=args.fill_tokens,
        kv_events_history=args.kv_events_history,
        sim_speedup=args.sim_speedup,
        sim_processes=processes,
        router_health_interval=args.health_interval,
        router_kv_events_interval=args.kv_events_interval,
        fleet_start_seconds=round(fleet_seconds, 1),
        first_start_ready_seconds=[round(seconds, 2) for seconds in first_ready],
        fill_seconds=round(fill_seconds, 1),
    )
    return result


async def _ready(client: httpx.AsyncClient, server: Server, timeout: float = 300.0) -> float:
    """Seconds from the server's launch to its first /health 200 (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            if (await client.get(f"{server.url}/health", timeout=1.0)).status_code == 200:
                return time.monotonic() - server.launched_at
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{server.name} did not answer /health in {timeout} s:\n{server.log_tail()}")


async def _all_workers_healthy(client: httpx.AsyncClient, server: Server, workers: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = (await client.get(f"{server.url}/workers")).json()["workers"]
        if sum(1 for w in listed if w.get("state") == "healthy" and w.get("kv_events")) >= workers:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{server.name} does not list {workers} healthy workers:\n{server.log_tail()}")


async def _fill(client: httpx.AsyncClient, urls: list[str], args: argparse.Namespace) -> None:
    """`--fill-tokens` of distinct prompts straight to each worker, 32 requests in flight."""
    prompts_per_worker = max(0, args.fill_tokens // _FILL_PROMPT_TOKENS)
    rng = random.Random(args.seed + 1)
    jobs = [(url, n) for url in urls for n in range(prompts_per_worker)]
    gate = asyncio.Semaphore(32)

    async def send(url: str) -> None:
        prompt = [rng.randrange(1000, 100_000) for _ in range(_FILL_PROMPT_TOKENS)]
        async with gate:
            answer = await client.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1})
        answer.raise_for_status()

    await asyncio.gather(*(send(url) for url, _ in jobs))


async def _traffic_and_restart(
    client: httpx.AsyncClient,
    replicas: list[Replica],
    urls: list[str],
    logs: Path,
    started: list[Server],
    args: argparse.Namespace,
) -> dict[str, Any]:
    stop = asyncio.Event()
    rotation = {"next": 0}
    rng = random.Random(args.seed)
    systems = [[rng.randrange(1000, 100_000) for _ in range(_SYSTEM_TOKENS)] for _ in range(_SYSTEM_PROMPTS)]

    def next_replica() -> Replica:
        live = [replica for replica in replicas if replica.live]
        rotation["next"] += 1
        return live[rotation["next"] % len(live)]

    async def session_client(number: int) -> None:
        own = random.Random(args.seed * 1000 + number)
        while not stop.is_set():
            prompt = list(own.choice(systems)) + [
                own.randrange(1000, 100_000) for _ in range(own.randrange(200, 800))
            ]
            for _ in range(own.randrange(10, 30)):
                if stop.is_set():
                    return
                if len(prompt) > _MAX_PROMPT_TOKENS:
                    break  # the session ends before its prompt would not fit Qwen3's context
                replica = next_replica()
                tally = replica.after_restart if replica.restarted else replica.tally
                tally.sent += 1
                try:
                    answer = await client.post(
                        f"{replica.server.url}/v1/completions", json={"prompt": prompt, "max_tokens": 16}
                    )
                    body = answer.json() if answer.status_code == 200 else None
                    if body is None or not body.get("choices"):
                        raise RuntimeError(f"status {answer.status_code}")
                    tally.ok += 1
                except Exception as exc:  # every failure counts as a lost request, by kind
                    tally.lost += 1
                    kind = type(exc).__name__ if not isinstance(exc, RuntimeError) else str(exc)
                    tally.errors[kind] = tally.errors.get(kind, 0) + 1
                    break  # the session starts over, as an agent whose call failed would
                prompt += [own.randrange(1000, 100_000) for _ in range(own.randrange(500, 2000))]

    tasks = [asyncio.create_task(session_client(number)) for number in range(args.clients)]
    await asyncio.sleep(args.before_seconds)

    # Kill router 0 by its pid, out of the rotation first (a load balancer whose probe saw it go).
    victim = replicas[0]
    before_kill = await _index_blocks(client, replicas[1].server)
    victim.live = False
    os.kill(victim.server.pid, signal.SIGKILL)
    victim.server.process.wait(timeout=30)
    killed_at = time.monotonic()
    launched_wall = time.time()
    restarted = launch("route-0-restarted", victim.command, port=victim.server.port, log_dir=logs)
    started.append(restarted)
    ready_seconds = await _ready(client, restarted)
    killed_to_ready = time.monotonic() - killed_at
    # At once, before any request reaches it: its index, a live replica's, the workers' own count.
    restarted_index, live_index, held = await asyncio.gather(
        _index_blocks(client, restarted),
        _index_blocks(client, replicas[1].server),
        _workers_blocks(client, urls),
    )
    victim.server = restarted
    victim.restarted = True
    victim.live = True
    await asyncio.sleep(args.after_seconds)
    stop.set()
    await asyncio.gather(*tasks)
    stayed = replicas[1:]
    return {
        "ready_seconds": round(ready_seconds, 2),
        "killed_to_ready_seconds": round(killed_to_ready, 2),
        "kv_warmup": restarted_index["kv_warmup"],
        "restart_phases_seconds": _phases(restarted.log_path.read_text(errors="replace"), launched_wall),
        "restarted_confirmed_blocks": restarted_index["confirmed"],
        "live_confirmed_blocks": live_index["confirmed"],
        "live_blocks_with_routed_guesses": live_index["blocks"],
        "live_confirmed_blocks_before_kill": before_kill["confirmed"],
        "workers_held_blocks": held,
        "restarted_vs_live_ratio": round(restarted_index["confirmed"] / live_index["confirmed"], 4)
        if live_index["confirmed"]
        else None,
        "restarted_vs_workers_ratio": round(restarted_index["confirmed"] / held, 4) if held else None,
        "per_router": {
            f"route-{number}": {
                "before_kill": vars(replica.tally),
                **({"after_restart": vars(replica.after_restart)} if replica.restarted else {}),
            }
            for number, replica in enumerate(replicas)
        },
        "lost_on_killed_replica": victim.tally.lost,
        "lost_on_replicas_that_stayed": sum(replica.tally.lost for replica in stayed),
        "lost_on_restarted_replica": victim.after_restart.lost,
        "requests_ok": sum(r.tally.ok + r.after_restart.ok for r in replicas),
    }


# What the router's log says as it starts, in order: the pipeline loaded, the workers checked (the first one
# added, the last one active), the KV events read, ready.
_PHASES = {
    "pipeline_loaded": "router rendering with model",
    "first_worker_added": "added",
    "kv_events_read": "tokenfront.router.kv_warmup:",
    "ready": "router ready:",
}
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _phases(log: str, launched: float) -> dict[str, float | None]:
    """Seconds from the router's launch to each of `_PHASES`' first line in its log (None: not there)."""
    phases: dict[str, float | None] = dict.fromkeys(_PHASES)
    for line in log.splitlines():
        stamp = _STAMP.match(line)
        if stamp is None:
            continue
        for phase, needle in _PHASES.items():
            if phases[phase] is None and needle in line:
                at = time.mktime(time.strptime(stamp.group(1)[:19], "%Y-%m-%d %H:%M:%S"))
                phases[phase] = round(at + int(stamp.group(1)[20:]) / 1000 - launched, 2)
    return phases


async def _index_blocks(client: httpx.AsyncClient, server: Server) -> dict[str, Any]:
    """A router's index: blocks confirmed by events and all blocks (with routed guesses), over its workers."""
    info = (await client.get(f"{server.url}/server_info", timeout=60)).json()
    workers = info["kv_index"]["workers"].values()
    return {
        "confirmed": sum(w["confirmed_blocks"] for w in workers),
        "blocks": sum(w["blocks"] for w in workers),
        "kv_warmup": info.get("kv_warmup"),
    }


async def _workers_blocks(client: httpx.AsyncClient, urls: list[str]) -> int:
    """The blocks the workers hold, from their /metrics."""
    gate = asyncio.Semaphore(32)

    async def one(url: str) -> int:
        async with gate:
            text = (await client.get(f"{url}/metrics", timeout=60)).text
        match = _BLOCKS.search(text)
        return int(float(match.group(1))) if match else 0

    return sum(await asyncio.gather(*(one(url) for url in urls)))


def _report(result: dict[str, Any]) -> str:
    warmup = result["kv_warmup"] or {}
    lines = [
        f"{result['workers']} simulated workers, {result['routers']} routers, {result['clients']} clients, "
        f"{result['fill_tokens_per_worker']} tokens filled per worker, event history {result['kv_events_history']}",
        f"restarted router ready in {result['ready_seconds']} s (its start-up read: {warmup.get('seconds')} s, "
        f"{warmup.get('read')}/{warmup.get('workers')} workers, {warmup.get('snapshots')} from a snapshot)",
        f"index: restarted {result['restarted_confirmed_blocks']} confirmed blocks, live replica "
        f"{result['live_confirmed_blocks']} (ratio {result['restarted_vs_live_ratio']}), workers hold "
        f"{result['workers_held_blocks']} (ratio {result['restarted_vs_workers_ratio']})",
        f"restart phases (seconds from launch): {result['restart_phases_seconds']}",
        f"the fleet ({result['sim_processes']} processes): step lag mean {result['engine_lag_mean_ms']} ms, max "
        f"{result['engine_lag_max_ms']} ms; workers taken out by each router: {result['router_take_outs']}",
        f"lost: {result['lost_on_replicas_that_stayed']} on the replicas that stayed, "
        f"{result['lost_on_killed_replica']} in flight on the killed one, "
        f"{result['lost_on_restarted_replica']} on the restarted one; {result['requests_ok']} answered",
    ]
    for name, tallies in result["per_router"].items():
        lines.append(f"  {name}: {tallies}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""Load and faults, measured: the renderer under many connections, a router fleet losing a worker, a router restart.

Starts real processes on loopback (each stopped by its own pid at the end) and runs three sections:

1. `renderer`: `tokenfront render` (one process) on the Qwen3 fixture, and a load generator in this process
   holding `--connections` concurrent keep-alive connections for `--duration` seconds, sending a mix of chat
   render bodies (short chats, a chat with tools, a long multi-turn chat) to `/v1/chat/completions/render`.
   Counts requests, errors (any non-200 or exception), latency p50/p99 (as this client sees it: its own
   Python overhead included), samples the server's RSS every second (after a 10 s warm-up vs at the end), and
   checks `/health` once a second during the run.
2. `fleet`: two `tokenfront serve` workers (tiny-random fixture) behind `tokenfront route --health-interval
   0.5`; `--fleet-clients` clients send non-streaming (max_tokens 8) and streaming chats for
   `--fleet-duration` seconds; at 1/4 of it worker A is SIGKILLed, at 1/2 it is restarted on the same port.
   Counts non-streaming requests answered 200 / lost, streams completed / ended with an error event and
   [DONE] / cut without [DONE], and requests served by each worker before / during / after the outage.
3. `restart`: two workers behind a router; multi-turn conversations fill the workers' prefix caches and
   their `/kv_cache_events` logs; the router's `kv_index` stats (`/server_info`) are read, the router is
   stopped (SIGTERM) and a new one started on the same workers; after the event polls its stats are read
   again, and each conversation's last turn is re-sent: it should go to the worker that holds it.

    python -m benchmarks.robustness [--duration 60] [--connections 256] [--only renderer|fleet|restart] [--json]

The machine's other load shares the cores with the servers and the load generator: numbers are as measured.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import HOST, Server, free_port, launch, launch_tokenfront, stop_all, wait_healthy
from tokenfront import fixtures

SECTIONS = ("renderer", "fleet", "restart")
_WORDS = ("harbor", "stone", "window", "morning", "letter", "bridge", "candle", "meadow", "ledger", "lantern")
WARM_UP_S = 10.0
FLAT_GROWTH = 0.05  # RSS growth under this share counts as flat


def _tokenfront_command(args: list[str], port: int) -> list[str]:
    return [sys.executable, "-m", "tokenfront.cli", *args, "--host", HOST, "--port", str(port)]


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


# --- 1. the renderer under load ------------------------------------------------------------------------------

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "the city"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
]


def _render_bodies() -> list[tuple[str, dict[str, Any]]]:
    """The mix: (kind, body). Short chats most often, one with tools, one long multi-turn."""
    rng = random.Random(7)
    words = _WORDS
    short = [
        ("short", {"messages": [{"role": "user", "content": f"Question {i}: what is {i} plus {i + 1}?"}]})
        for i in range(4)
    ]
    short.append(
        (
            "short",
            {
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Name three rivers."},
                ]
            },
        )
    )
    tools = (
        "tools",
        {
            "messages": [{"role": "user", "content": "What is the weather in Paris, and any news there?"}],
            "tools": _TOOLS,
            "tool_choice": "auto",
        },
    )
    long_messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(12):
        text = " ".join(rng.choice(words) for _ in range(60))
        long_messages.append({"role": "user", "content": f"Turn {turn}: {text}"})
        long_messages.append(
            {"role": "assistant", "content": f"Reply {turn}: " + " ".join(reversed(text.split()))}
        )
    long_messages.append({"role": "user", "content": "Summarize everything."})
    return [*short, tools, ("long", {"messages": long_messages})]


@dataclass
class _Sampler:
    """A thread sampling the server's RSS and checking its /health, once a second."""

    server: Server
    started: float
    rss: list[tuple[float, int]] = field(default_factory=list)
    health: list[tuple[float, int | None, float]] = field(default_factory=list)  # (t, status, seconds)
    stop_event: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop_event.is_set():
            now = time.monotonic() - self.started
            self.rss.append((now, self.server.memory()["rss_bytes"]))
            began = time.monotonic()
            connection = http.client.HTTPConnection(HOST, self.server.port, timeout=10.0)
            status: int | None
            try:
                connection.request("GET", "/health")
                status = connection.getresponse().status
            except (OSError, http.client.HTTPException):
                status = None
            finally:
                connection.close()
            self.health.append((now, status, time.monotonic() - began))
            self.stop_event.wait(max(0.0, 1.0 - (time.monotonic() - self.started - now)))


async def _render_load(url: str, connections: int, duration: float) -> dict[str, Any]:
    bodies = _render_bodies()
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    counter = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:
        deadline = time.monotonic() + duration

        async def connection_loop(index: int) -> None:
            nonlocal counter
            while time.monotonic() < deadline:
                counter += 1
                kind, body = bodies[(counter + index) % len(bodies)]
                began = time.perf_counter()
                try:
                    response = await client.post("/v1/chat/completions/render", json=body)
                    if response.status_code != 200:
                        errors[f"HTTP {response.status_code}"] += 1
                        continue
                except Exception as exc:
                    errors[type(exc).__name__] += 1
                    continue
                latencies.append(time.perf_counter() - began)
                by_kind[kind] += 1

        started = time.monotonic()
        await asyncio.gather(*(connection_loop(i) for i in range(connections)))
        wall = time.monotonic() - started
    ok = len(latencies)
    return {
        "requests": ok + sum(errors.values()),
        "ok": ok,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "by_kind": dict(by_kind),
        "wall_s": wall,
        "rps": ok / wall if wall else 0.0,
        "p50_ms": _percentile(latencies, 0.5) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


def run_renderer(args: argparse.Namespace, log_dir: Path, started: list[Server]) -> dict[str, Any]:
    model = fixtures.ensure_checkpoint("qwen3")
    server = launch_tokenfront(["render", "--model", str(model)], log_dir=log_dir, name="render")
    started.append(server)
    wait_healthy([server])
    server.wait_settled(timeout=60)
    rss_idle = server.memory()["rss_bytes"]
    sampler = _Sampler(server, time.monotonic())
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    try:
        load = asyncio.run(_render_load(server.url, args.connections, args.duration))
    finally:
        sampler.stop_event.set()
        thread.join(timeout=15)
    after_warm = [rss for t, rss in sampler.rss if t >= WARM_UP_S]
    rss_warm = after_warm[0] if after_warm else sampler.rss[-1][1]
    rss_end = sampler.rss[-1][1]
    growth = (rss_end - rss_warm) / rss_warm if rss_warm else float("nan")
    health_ok = [seconds for _, status, seconds in sampler.health if status == 200]
    return {
        "model": "qwen3",
        "connections": args.connections,
        "duration_s": args.duration,
        **load,
        "server_alive": server.process.poll() is None,
        "rss_idle_mb": rss_idle / 2**20,
        "rss_after_warm_up_mb": rss_warm / 2**20,
        "rss_end_mb": rss_end / 2**20,
        "rss_max_mb": max(rss for _, rss in sampler.rss) / 2**20,
        "rss_growth": growth,
        "rss_flat": growth < FLAT_GROWTH,
        "health_checks": len(sampler.health),
        "health_ok": len(health_ok),
        "health_max_ms": max(health_ok) * 1000 if health_ok else None,
    }


# --- 2. the fleet losing a worker ----------------------------------------------------------------------------


@dataclass
class _FleetStats:
    kill_at: float
    restart_at: float
    restarted_healthy_at: float | None = None
    sent: int = 0
    answered: int = 0
    lost: Counter[str] = field(default_factory=Counter)
    streams: int = 0
    streams_completed: int = 0
    streams_error_event: int = 0
    streams_cut: Counter[str] = field(default_factory=Counter)
    streams_rejected: Counter[str] = field(default_factory=Counter)
    served: dict[str, Counter[str]] = field(default_factory=dict)  # phase -> worker url -> count

    def phase(self, t: float) -> str:
        if t < self.kill_at:
            return "before"
        if self.restarted_healthy_at is None or t < self.restarted_healthy_at:
            return "during"
        return "after"

    def count(self, t: float, worker: str | None) -> None:
        if worker:
            self.served.setdefault(self.phase(t), Counter())[worker] += 1


def _chat(index: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"Request {index}: tell me about the sea."}],
        "max_tokens": 32 if stream else 8,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
    return body


async def _fleet_client(
    client: httpx.AsyncClient, index: int, stats: _FleetStats, clock: Callable[[], float], end: float
) -> None:
    n = 0
    while clock() < end:
        n += 1
        stream = (index + n) % 2 == 0
        t = clock()
        body = _chat(index * 100000 + n, stream)
        if not stream:
            stats.sent += 1
            try:
                response = await client.post("/v1/chat/completions", json=body)
            except Exception as exc:
                stats.lost[type(exc).__name__] += 1
                continue
            if response.status_code == 200:
                stats.answered += 1
                stats.count(t, response.headers.get("x-tokenfront-worker"))
            else:
                stats.lost[f"HTTP {response.status_code}"] += 1
            continue
        stats.streams += 1
        done = error_event = False
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    stats.streams_rejected[f"HTTP {response.status_code}"] += 1
                    await response.aread()
                    continue
                worker = response.headers.get("x-tokenfront-worker")
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: ") and '"error"' in line:
                        error_event = "error" in json.loads(line[len("data: ") :])
        except Exception as exc:
            stats.streams_cut[type(exc).__name__] += 1
            continue
        stats.count(t, worker)
        if not done:
            stats.streams_cut["no [DONE]"] += 1
        elif error_event:
            stats.streams_error_event += 1
        else:
            stats.streams_completed += 1


def _launch_worker(name: str, model: Path, port: int, log_dir: Path) -> Server:
    return launch(
        name,
        _tokenfront_command(["serve", "--model", str(model)], port),
        port=port,
        log_dir=log_dir,
        env={"OMP_NUM_THREADS": "1"},
    )


def _restart_worker(name: str, model: Path, port: int, log_dir: Path, started: list[Server]) -> Server:
    """Start a worker on `port` again; retry a few times if the port is not free yet."""
    for attempt in range(10):
        server = _launch_worker(f"{name}-{attempt}", model, port, log_dir)
        started.append(server)
        try:
            wait_healthy([server], timeout=180)
            return server
        except RuntimeError:
            if server.process.poll() is None:
                raise
            time.sleep(0.5)
    raise RuntimeError(f"could not restart {name} on port {port}")


def _warm_up(workers: list[Server]) -> None:
    for worker in workers:
        body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
        httpx.post(f"{worker.url}/v1/chat/completions", json=body, timeout=300.0).raise_for_status()


def run_fleet(args: argparse.Namespace, log_dir: Path, started: list[Server]) -> dict[str, Any]:
    model = fixtures.ensure_checkpoint("tiny-random")
    port_a, port_b = free_port(), free_port()
    worker_a = _launch_worker("worker-a", model, port_a, log_dir)
    worker_b = _launch_worker("worker-b", model, port_b, log_dir)
    started += [worker_a, worker_b]
    wait_healthy([worker_a, worker_b])
    _warm_up([worker_a, worker_b])
    router = launch_tokenfront(
        [
            "route",
            "--model",
            str(model),
            "--worker",
            worker_a.url,
            "--worker",
            worker_b.url,
            "--health-interval",
            "0.5",
        ],
        log_dir=log_dir,
        name="router",
    )
    started.append(router)
    wait_healthy([router])

    duration = args.fleet_duration
    stats = _FleetStats(kill_at=duration / 4, restart_at=duration / 2)
    events: dict[str, float] = {}
    restarted: list[Server] = []

    async def scenario() -> None:
        origin = time.monotonic()

        def clock() -> float:
            return time.monotonic() - origin

        async def faults() -> None:
            await asyncio.sleep(stats.kill_at)
            worker_a.process.kill()
            await asyncio.to_thread(worker_a.process.wait)
            events["killed"] = clock()
            await asyncio.sleep(max(0.0, stats.restart_at - clock()))
            events["restart_launched"] = clock()
            server = await asyncio.to_thread(
                _restart_worker, "worker-a-restarted", model, port_a, log_dir, started
            )
            restarted.append(server)
            stats.restarted_healthy_at = events["restarted_healthy"] = clock()

        limits = httpx.Limits(max_connections=args.fleet_clients * 2)
        async with httpx.AsyncClient(base_url=router.url, limits=limits, timeout=120.0) as client:
            await asyncio.gather(
                faults(),
                *(_fleet_client(client, i, stats, clock, duration) for i in range(args.fleet_clients)),
            )

    asyncio.run(scenario())
    names = {worker_a.url: "A", worker_b.url: "B"}
    served = {
        phase: {
            names.get(url, url): count for url, count in sorted(stats.served.get(phase, Counter()).items())
        }
        for phase in ("before", "during", "after")
    }
    return {
        "workers": 2,
        "clients": args.fleet_clients,
        "duration_s": duration,
        "killed_at_s": events.get("killed"),
        "restart_launched_at_s": events.get("restart_launched"),
        "restarted_healthy_at_s": events.get("restarted_healthy"),
        "requests_sent": stats.sent,
        "requests_200": stats.answered,
        "requests_lost": sum(stats.lost.values()),
        "lost_kinds": dict(stats.lost),
        "streams": stats.streams,
        "streams_completed": stats.streams_completed,
        "streams_error_event": stats.streams_error_event,
        "streams_cut": sum(stats.streams_cut.values()),
        "cut_kinds": dict(stats.streams_cut),
        "streams_rejected": sum(stats.streams_rejected.values()),
        "rejected_kinds": dict(stats.streams_rejected),
        "served": served,
    }


# --- 3. the router restarted ---------------------------------------------------------------------------------


def _kv_stats(router: Server, names: dict[str, str]) -> dict[str, dict[str, int]]:
    info = httpx.get(f"{router.url}/server_info", timeout=10.0).json()
    workers = info["kv_index"]["workers"]
    return {
        names.get(url, url): {key: view[key] for key in ("blocks", "confirmed_blocks", "events_applied")}
        for url, view in sorted(workers.items(), key=lambda item: names.get(item[0], item[0]))
    }


def _converse(router: Server, index: int, turns: int) -> tuple[list[dict[str, str]], str]:
    """A conversation of `turns` turns through the router; returns the last turn's messages and its worker."""
    rng = random.Random(index)
    words = _WORDS
    first = " ".join(rng.choice(words) for _ in range(150))
    messages = [{"role": "user", "content": f"Conversation {index}: {first}. Summarize."}]
    worker = ""
    for turn in range(turns):
        body = {"messages": messages, "max_tokens": 8, "temperature": 0}
        response = httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=120.0)
        response.raise_for_status()
        worker = response.headers["x-tokenfront-worker"]
        if turn == turns - 1:
            break
        reply = response.json()["choices"][0]["message"].get("content") or ""
        messages = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": f"Now say more about the {rng.choice(words)} (turn {turn + 1})."},
        ]
    return messages, worker


def _launch_router(model: Path, workers: list[Server], log_dir: Path, name: str) -> Server:
    command = ["route", "--model", str(model), "--health-interval", "0.5"]
    for worker in workers:
        command += ["--worker", worker.url]
    return launch_tokenfront(command, log_dir=log_dir, name=name)


def _wait_events(router: Server, names: dict[str, str], timeout: float) -> dict[str, dict[str, int]]:
    """Read the kv_index stats once they stop changing (the event polls caught up), or after `timeout`."""
    deadline = time.monotonic() + timeout
    previous = _kv_stats(router, names)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        current = _kv_stats(router, names)
        if current == previous and any(v["confirmed_blocks"] for v in current.values()):
            return current
        previous = current
    return previous


def run_restart(args: argparse.Namespace, log_dir: Path, started: list[Server]) -> dict[str, Any]:
    model = fixtures.ensure_checkpoint("tiny-random")
    workers = [_launch_worker(f"kv-worker-{i}", model, free_port(), log_dir) for i in range(2)]
    started += workers
    wait_healthy(workers)
    names = {worker.url: "AB"[i] for i, worker in enumerate(workers)}
    first = _launch_router(model, workers, log_dir, "router-1")
    started.append(first)
    wait_healthy([first])
    conversations = [_converse(first, index, args.turns) for index in range(args.conversations)]
    time.sleep(2.0)
    before = _wait_events(first, names, timeout=10.0)
    code = first.stop()
    second = _launch_router(model, workers, log_dir, "router-2")
    started.append(second)
    wait_healthy([second])
    time.sleep(2.0)
    after = _wait_events(second, names, timeout=10.0)
    routed_back = []
    for messages, worker in conversations:
        body = {"messages": messages, "max_tokens": 8, "temperature": 0}
        response = httpx.post(f"{second.url}/v1/chat/completions", json=body, timeout=120.0)
        response.raise_for_status()
        usage = response.json().get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        routed_back.append(
            {
                "held_by": names.get(worker, worker),
                "routed_to": names.get(response.headers["x-tokenfront-worker"], "?"),
                "prompt_tokens": usage.get("prompt_tokens"),
                "cached_tokens": cached,
            }
        )
    return {
        "conversations": args.conversations,
        "turns": args.turns,
        "first_router_exit_code": code,
        "before": before,
        "after": after,
        "blocks_before": sum(v["confirmed_blocks"] for v in before.values()),
        "blocks_after": sum(v["confirmed_blocks"] for v in after.values()),
        "routed_back": routed_back,
        "routed_to_holder": sum(r["held_by"] == r["routed_to"] for r in routed_back),
    }


# --- the report ----------------------------------------------------------------------------------------------


def _print_renderer(r: dict[str, Any]) -> None:
    print(
        f"\n1. renderer (qwen3, 1 process) under {r['connections']} connections for {r['duration_s']:.0f} s"
    )
    rows = [
        ("requests", f"{r['requests']} ({r['rps']:.0f}/s over {r['wall_s']:.1f} s)"),
        ("by kind (ok)", json.dumps(r["by_kind"])),
        ("errors", f"{r['errors']} {json.dumps(r['error_kinds']) if r['errors'] else ''}"),
        ("latency p50 / p99", f"{r['p50_ms']:.1f} ms / {r['p99_ms']:.1f} ms"),
        ("RSS idle", f"{r['rss_idle_mb']:.1f} MB"),
        ("RSS after 10 s warm-up", f"{r['rss_after_warm_up_mb']:.1f} MB"),
        ("RSS at end / max", f"{r['rss_end_mb']:.1f} MB / {r['rss_max_mb']:.1f} MB"),
        ("RSS growth", f"{r['rss_growth']:+.1%} ({'flat' if r['rss_flat'] else 'NOT flat'}, < 5%)"),
        (
            "/health during run",
            f"{r['health_ok']}/{r['health_checks']} answered 200, max {r['health_max_ms'] or 0:.0f} ms",
        ),
        ("server alive at end", str(r["server_alive"])),
    ]
    _print_rows(rows)


def _print_fleet(f: dict[str, Any]) -> None:
    print(
        f"\n2. router fleet (2 tiny-random workers), {f['clients']} clients for {f['duration_s']:.0f} s: "
        f"A SIGKILLed at {f['killed_at_s']:.1f} s, restarted at {f['restart_launched_at_s']:.1f} s, "
        f"healthy at {f['restarted_healthy_at_s']:.1f} s"
    )
    rows = [
        ("non-streaming sent", str(f["requests_sent"])),
        ("  answered 200", str(f["requests_200"])),
        (
            "  lost (must be 0)",
            f"{f['requests_lost']} {json.dumps(f['lost_kinds']) if f['requests_lost'] else ''}",
        ),
        ("streams", str(f["streams"])),
        ("  completed", str(f["streams_completed"])),
        ("  error event + [DONE]", str(f["streams_error_event"])),
        (
            "  cut without [DONE] (must be 0)",
            f"{f['streams_cut']} {json.dumps(f['cut_kinds']) if f['streams_cut'] else ''}",
        ),
        (
            "  rejected (non-200)",
            f"{f['streams_rejected']} {json.dumps(f['rejected_kinds']) if f['streams_rejected'] else ''}",
        ),
    ]
    for phase, counts in f["served"].items():
        rows.append((f"served {phase}", ", ".join(f"{k}: {v}" for k, v in counts.items()) or "-"))
    _print_rows(rows)


def _print_restart(k: dict[str, Any]) -> None:
    print(
        f"\n3. router restart: {k['conversations']} conversations x {k['turns']} turns, "
        f"router 1 exited {k['first_router_exit_code']}"
    )
    rows = [
        ("kv blocks (confirmed) before", f"{k['blocks_before']}  {json.dumps(k['before'])}"),
        ("kv blocks (confirmed) after", f"{k['blocks_after']}  {json.dumps(k['after'])}"),
        ("last turns routed to holder", f"{k['routed_to_holder']}/{len(k['routed_back'])}"),
    ]
    for i, r in enumerate(k["routed_back"]):
        rows.append(
            (
                f"  conversation {i}",
                f"held by {r['held_by']}, routed to {r['routed_to']}, "
                f"cached {r['cached_tokens']}/{r['prompt_tokens']} tokens",
            )
        )
    _print_rows(rows)


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


def main(argv: list[str] | None = None) -> int:
    """Run the sections and print their tables."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=60.0, help="renderer load, seconds (default: 60)")
    parser.add_argument(
        "--connections", type=int, default=256, help="renderer load connections (default: 256)"
    )
    parser.add_argument("--only", choices=SECTIONS, help="run one section only")
    parser.add_argument("--fleet-duration", type=float, default=40.0, help="fleet run, seconds (default: 40)")
    parser.add_argument("--fleet-clients", type=int, default=8, help="fleet concurrent clients (default: 8)")
    parser.add_argument("--conversations", type=int, default=4, help="restart: conversations (default: 4)")
    parser.add_argument("--turns", type=int, default=3, help="restart: turns per conversation (default: 3)")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args(argv)

    log_dir = Path(tempfile.mkdtemp(prefix="tokenfront-robustness-"))
    runners = {"renderer": run_renderer, "fleet": run_fleet, "restart": run_restart}
    printers = {"renderer": _print_renderer, "fleet": _print_fleet, "restart": _print_restart}
    report: dict[str, Any] = {"logs": str(log_dir)}
    failed = False
    for section in SECTIONS:
        if args.only and section != args.only:
            continue
        started: list[Server] = []
        try:
            report[section] = runners[section](args, log_dir, started)
            printers[section](report[section])
        except Exception as exc:
            failed = True
            report[section] = {"failed": f"{type(exc).__name__}: {exc}"}
            print(f"\n{section}: FAILED: {type(exc).__name__}: {exc}")
        finally:
            stop_all(started)
        sys.stdout.flush()
    print(f"\nlogs: {log_dir}")
    if args.json:
        print(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

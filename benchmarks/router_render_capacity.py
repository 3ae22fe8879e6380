"""The router's render capacity: long chats through a router rendering in 0, 1, 2 ... render processes.

Starts real processes on loopback: one simulated GPU worker (`tokenfront serve --engine simulated`, sped up so
that it is never the bottleneck; it takes the router's ids and renders nothing) and, for each
`--render-processes` value in turn, a router in front of it (`tokenfront route --render-processes N`). Each
router gets `--requests` distinct long chats (~15k tokens with the Qwen3 checkpoint: random common words, seeded by the
request's number, so every prompt is distinct throughout), `--concurrency` at a time, after `--warmup` unmeasured ones; `max_tokens: 1`.

It prints, for each N: renders a second (answered requests / wall time), the router process's own CPU time per
request (utime + stime from /proc/PID/stat: the event loop's process, the one that cannot grow past a core) and
that of its whole process tree (render processes included), the prompt's tokens and body size, and the render
outcomes the router counted (`tokenfront_router_renders_total`: a late render would be routed by load).

    python -m benchmarks.router_render_capacity [--processes 0 1 2] [--requests 100] [--concurrency 4]
                                                [--warmup 8] [--words 15000] [--json]

Everything started is stopped by its own pid at the end. The figures depend on the machine's free cores: on a
machine of two cores the client and the worker take a share of them too.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.servers import CLOCK_TICKS, HOST, Server, launch_tokenfront, stop_all, wait_healthy
from tokenfront import fixtures

# Words the prompts are drawn from: every prompt is distinct throughout (a tokenizer's caches see no repeats).
WORDS = [
    "the",
    "report",
    "committee",
    "quarter",
    "shipping",
    "delay",
    "cost",
    "material",
    "region",
    "market",
    "price",
    "supply",
    "demand",
    "growth",
    "energy",
    "policy",
    "budget",
    "staff",
    "office",
    "project",
    "plan",
    "review",
    "meeting",
    "customer",
    "product",
    "service",
    "quality",
    "team",
    "result",
    "figure",
    "table",
    "chart",
    "trend",
    "risk",
    "issue",
    "change",
    "update",
    "schedule",
    "contract",
    "partner",
    "sale",
    "order",
    "stock",
    "network",
    "system",
    "data",
    "model",
    "test",
    "design",
    "feature",
    "release",
    "version",
    "support",
    "training",
    "process",
    "method",
    "goal",
]


def _chat_body(index: int, words: int) -> bytes:
    pick = random.Random(index)
    text = " ".join(pick.choice(WORDS) for _ in range(words)) + ". Summarize this in one sentence."
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0}
    return json.dumps(body).encode()


def _post(port: int, body: bytes) -> dict[str, Any]:
    connection = http.client.HTTPConnection(HOST, port, timeout=600)
    try:
        connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data[:300]!r}")
        return dict(json.loads(data))
    finally:
        connection.close()


def _process_cpu_seconds(pid: int) -> float:
    """utime + stime of one process (not its children)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _outcomes(port: int) -> dict[str, float]:
    connection = http.client.HTTPConnection(HOST, port, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    found = {}
    for line in text.splitlines():
        if line.startswith("tokenfront_router_renders_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


def _wait_forwarding(router: Server, timeout: float = 60.0) -> None:
    """Until the router's gate is open (its first check of the worker), so that its ids are forwarded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection(HOST, router.port, timeout=10)
        connection.request("GET", "/workers")
        gate = json.loads(connection.getresponse().read())["gate"]
        connection.close()
        if gate["forwarding"]:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the router does not forward ids: {gate}")


def measure(router: Server, args: argparse.Namespace) -> dict[str, Any]:
    """Send the chats through `router` and report its render capacity and CPU per request."""
    bodies = [_chat_body(index, args.words) for index in range(args.warmup + args.requests)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        answers = list(pool.map(lambda body: _post(router.port, body), bodies[: args.warmup]))
        own, tree = _process_cpu_seconds(router.pid), router.cpu_seconds()
        started = time.perf_counter()
        answers = list(pool.map(lambda body: _post(router.port, body), bodies[args.warmup :]))
        wall = time.perf_counter() - started
        own, tree = _process_cpu_seconds(router.pid) - own, router.cpu_seconds() - tree
    return {
        "renders_per_second": round(args.requests / wall, 1),
        "router_process_cpu_ms_per_request": round(own / args.requests * 1000, 2),
        "router_tree_cpu_ms_per_request": round(tree / args.requests * 1000, 2),
        "prompt_tokens": answers[0]["usage"]["prompt_tokens"],
        "body_bytes": len(bodies[-1]),
        "render_outcomes": _outcomes(router.port),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[0, 1, 2], help="--render-processes values"
    )
    parser.add_argument("--requests", type=int, default=100, help="measured chats per router")
    parser.add_argument("--concurrency", type=int, default=4, help="chats in flight at once")
    parser.add_argument("--warmup", type=int, default=8, help="unmeasured chats first")
    parser.add_argument("--words", type=int, default=15000, help="words of each prompt (15000: ~15k tokens)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    model = str(fixtures.ensure_checkpoint("qwen3"))
    log_dir = Path(tempfile.mkdtemp(prefix="router-render-capacity-"))
    worker = launch_tokenfront(
        [
            "serve",
            "--engine",
            "simulated",
            "--model",
            model,
            "--sim-speedup",
            "1000",
            "--max-batch-size",
            "64",
        ],
        log_dir=log_dir,
        name="worker",
    )
    started = [worker]
    report: dict[str, Any] = {}
    try:
        wait_healthy([worker])
        for processes in args.processes:
            router = launch_tokenfront(
                ["route", "--model", model, "--worker", worker.url, "--render-processes", str(processes)],
                log_dir=log_dir,
                name=f"router-{processes}",
            )
            started.append(router)
            wait_healthy([router])
            _wait_forwarding(router)
            # Until its fast tokenizer backend, built in the background after /health, has taken over.
            router.wait_settled()
            report[str(processes)] = measure(router, args)
            router.stop()
            started.remove(router)
    finally:
        stop_all(started)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for processes, figures in report.items():
        print(f"--render-processes {processes}: {json.dumps(figures)}")


if __name__ == "__main__":
    main()

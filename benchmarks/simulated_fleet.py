"""What a simulated fleet costs the machine: `tokenfront simulate` at N workers, idle and under load.

For each `--workers` count, starts `tokenfront simulate --workers N --port 0 --processes K` (K processes of
N/K workers each, one event loop apiece, the real worker API on each port; docs/simulation.md) on Qwen3's
tokenizer and measures:

- start-up: seconds until every worker listens (the URLs are printed);
- idle: the fleet's CPU (in cores, its processes together) over `--idle-seconds` with nothing to do, and its
  resident memory (RSS summed over its processes, and PSS: the children share the pipeline's pages);
- loaded: `--load-seconds` of closed-loop traffic, one request in flight per worker, sent straight to the
  workers (no router) from this process over keep-alive connections: completions whose prompts are
  `--prompt-tokens` ids, of which the first `--shared-tokens` repeat per worker (prefix cache hits), answering
  `--max-tokens` tokens, not streamed. Reported: requests and generated tokens a second, the fleet's CPU and
  memory, this client's CPU, and how late the engines' steps ran (`tokenfront_engine_lag_seconds_total` over
  `..._steps`, and the largest): a lateness near the step time (~8 ms) means the machine, not the modelled
  GPU, sets the pace, and the fleet then runs slower than the GPUs it models.

Everything started is stopped by its pid. Figures on a shared machine are noisy: run it on a quiet one.

    python -m benchmarks.simulated_fleet [--workers 64,256] [--processes 1] [--idle-seconds 10]
                                         [--load-seconds 20] [--prompt-tokens 2048] [--shared-tokens 1536]
                                         [--max-tokens 32] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.servers import engine_gauges, launch, simulate_command, step_lag, wait_for_urls
from tokenfront import fixtures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="64,256", help="fleet sizes, comma-separated (default: 64,256)")
    parser.add_argument(
        "--processes",
        default="1",
        help="simulate's --processes, comma-separated: each size with each (default: 1)",
    )
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--shared-tokens", type=int, default=1536)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON document")
    args = parser.parse_args(argv)
    model = fixtures.ensure_checkpoint("qwen3")
    results = []
    with tempfile.TemporaryDirectory(prefix="tokenfront-fleet-") as logs:
        for workers in (int(n) for n in args.workers.split(",")):
            for processes in (int(k) for k in args.processes.split(",")):
                results.append(_measure(model, workers, processes, Path(logs), args))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            print(_line(result))
    return 0


def _measure(
    model: Path, workers: int, processes: int, logs: Path, args: argparse.Namespace
) -> dict[str, Any]:
    command = simulate_command(model, workers, processes)
    fleet = launch(f"simulate-{workers}x{processes}", command, port=0, log_dir=logs)
    try:
        ports = wait_for_urls(fleet, workers)
        started = time.monotonic() - fleet.launched_at
        fleet.wait_settled(timeout=60)
        before = fleet.cpu_seconds()
        time.sleep(args.idle_seconds)
        idle_cores = (fleet.cpu_seconds() - before) / args.idle_seconds
        idle_memory = fleet.memory()
        before, client_before = fleet.cpu_seconds(), time.process_time()
        load = asyncio.run(_load(ports, args))
        loaded_cores = (fleet.cpu_seconds() - before) / load["seconds"]
        client_cores = (time.process_time() - client_before) / load["seconds"]
        lag = step_lag(engine_gauges([f"http://127.0.0.1:{port}" for port in ports]))
        return {
            "workers": workers,
            "processes": processes,
            "startup_seconds": round(started, 2),
            "idle_cores": round(idle_cores, 3),
            "idle_rss_mb": round(idle_memory["rss_bytes"] / 2**20, 1),
            "idle_pss_mb": round(idle_memory["pss_bytes"] / 2**20, 1),
            "loaded_cores": round(loaded_cores, 3),
            "loaded_rss_mb": round(fleet.memory()["rss_bytes"] / 2**20, 1),
            "client_cores": round(client_cores, 3),
            "requests_per_second": round(load["requests"] / load["seconds"], 1),
            "tokens_per_second": round(load["tokens"] / load["seconds"], 1),
            "errors": load["errors"],
            "mean_step_lag_ms": lag["engine_lag_mean_ms"],
            "max_step_lag_ms": lag["engine_lag_max_ms"],
            "settings": {k: getattr(args, k) for k in ("prompt_tokens", "shared_tokens", "max_tokens")},
        }
    finally:
        fleet.stop()


async def _load(ports: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """One closed loop per worker for `--load-seconds`: a request, its answer, the next request."""
    totals = {"requests": 0, "tokens": 0, "errors": 0}
    stop_at = time.monotonic() + args.load_seconds

    async def loop(index: int, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        shared = [1000 + (index * 7919 + i) % 100_000 for i in range(args.shared_tokens)]
        sent = 0
        try:
            while time.monotonic() < stop_at:
                fresh = [
                    101_000 + (sent * 4099 + i) % 40_000 for i in range(args.prompt_tokens - len(shared))
                ]
                body = orjson.dumps(
                    {"prompt": shared + fresh, "max_tokens": args.max_tokens, "temperature": 0}
                )
                status, answer = await _post(reader, writer, port, "/v1/completions", body)
                sent += 1
                if status != 200:
                    totals["errors"] += 1
                    continue
                totals["requests"] += 1
                totals["tokens"] += orjson.loads(answer)["usage"]["completion_tokens"]
        finally:
            writer.close()

    started = time.monotonic()
    await asyncio.gather(*(loop(index, port) for index, port in enumerate(ports)))
    return {**totals, "seconds": time.monotonic() - started}


async def _post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, path: str, body: bytes
) -> tuple[int, bytes]:
    """One keep-alive HTTP/1.1 POST, as light on this client's CPU as it gets: the answer's status and body."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body)
    answer_head = await reader.readuntil(b"\r\n\r\n")
    status = int(answer_head[9:12])
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", answer_head).group(1))  # type: ignore[union-attr]
    return status, await reader.readexactly(length)


def _line(result: dict[str, Any]) -> str:
    return (
        f"{result['workers']} workers in {result['processes']} processes: up in {result['startup_seconds']} s; "
        f"idle {result['idle_cores']} cores, {result['idle_rss_mb']} MB RSS ({result['idle_pss_mb']} MB PSS); loaded {result['requests_per_second']} req/s, "
        f"{result['tokens_per_second']} tokens/s, {result['loaded_cores']} cores, {result['loaded_rss_mb']} MB "
        f"RSS (client {result['client_cores']} cores); step lag mean {result['mean_step_lag_ms']} ms, max "
        f"{result['max_step_lag_ms']} ms; {result['errors']} errors"
    )


if __name__ == "__main__":
    sys.exit(main())

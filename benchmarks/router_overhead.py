"""The router's own per-request overhead: the same short chats sent straight to a worker and through a router.

Starts real processes on loopback: one worker (`tokenfront serve`) and one router in front of it
(`tokenfront route --model <same checkpoint> --worker <it>`, with the default health and KV-event intervals).
Then it sends `--requests` short chats one at a time (each one distinct: a counter in the text; `max_tokens: 1`,
`temperature: 0`), alternating direct and routed requests, and which of the two goes first, so that any drift
in the worker's speed hits both paths equally. Then it does the same with `stream: true`. The client is one
`http.client` connection per path, kept alive, with TCP_NODELAY, each request written in a single `send`: it
costs little, and the same on both paths.

It prints p50 / p90 / mean latency for each path, the added p50 (routed p50 - direct p50) and the median of
the paired differences (each routed request against the direct one sent next to it), all in ms, and the
router's own CPU time per routed request: utime + stime from /proc/PID/stat (its child processes included)
around each phase, and the same less what its background loops (health checks, KV-event polls) spend, as
measured in an idle window after the phases (the kernel counts CPU time in 10 ms ticks: a rough correction).
The phases start once the router has logged that its tokenizer backend is built (it builds it a moment after
it serves) and its CPU use has fallen idle.

    python -m benchmarks.router_overhead [--checkpoint smollm2|tiny-random] [--requests 200] [--warmup 20]
                                         [--router-tree DIR] [--worker-tree DIR] [--py-spy OUT] [--json]
                                         [-- extra router arguments...]

`tiny-random` (a 2-layer random Llama) makes the worker's own time small, so the router's share shows best.
Routed requests carry the router's ids, so the worker skips rendering them: the added time is what a client
sees. `--py-spy OUT` records the router with py-spy during the measured phases (`pip install py-spy`; raw
collapsed stacks). `--router-tree DIR` / `--worker-tree DIR` start that process from another checkout's
`DIR/src` (`git worktree add --detach DIR COMMIT`), the other from this one: a before/after of either side.
Everything started is stopped by its own pid at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks import checkpoint_or_tiny
from benchmarks.servers import Server, launch_tokenfront, stop_all, wait_healthy

# --- the client ----------------------------------------------------------------------------------------------


class Client:
    """One keep-alive HTTP/1.1 connection with TCP_NODELAY; every request goes out in a single write."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.connection is None:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=600)
            connection.connect()
            assert connection.sock is not None
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connection = connection
        return self.connection

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-case names) and body; a kept-alive connection the server closed is replaced."""
        for attempt in (0, 1):
            connection = self._connect()
            try:
                # A bytes body goes out in the same send() as the headers.
                connection.request("POST", path, body=body, headers={"content-type": "application/json"})
                response = connection.getresponse()
                data = response.read()
                return response.status, {k.lower(): v for k, v in response.getheaders()}, data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _body(counter: int, stream: bool) -> bytes:
    request: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"Request number {counter}: say hello."}],
        "max_tokens": 1,
        "temperature": 0,
    }
    if stream:
        request["stream"] = True
    return json.dumps(request).encode()


def _timed(client: Client, body: bytes, stream: bool) -> tuple[float, dict[str, str]]:
    started = time.perf_counter()
    status, headers, data = client.post("/v1/chat/completions", body)
    elapsed = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"answered {status}: {data[:300]!r}")
    if stream and not data.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError(f"the stream did not end with [DONE]: {data[-200:]!r}")
    return elapsed, headers


# --- the measurement -----------------------------------------------------------------------------------------


@dataclass
class Phase:
    stream: bool
    direct: list[float] = field(default_factory=list)  # ms
    routed: list[float] = field(default_factory=list)  # ms
    router_cpu: float = 0.0  # s
    wall: float = 0.0  # s
    forwarded: int = 0


def _run_phase(
    worker: Server, router: Server, requests: int, warmup: int, stream: bool, counter: int
) -> Phase:
    direct, routed = Client(worker.url), Client(router.url)
    phase = Phase(stream)
    try:
        for _ in range(warmup):
            for client in (direct, routed):
                _timed(client, _body(counter, stream), stream)
                counter += 1
        cpu_before = router.cpu_seconds()
        wall_before = time.perf_counter()
        for index in range(requests):
            order = [(direct, phase.direct), (routed, phase.routed)]
            for client, samples in order if index % 2 == 0 else reversed(order):
                elapsed, headers = _timed(client, _body(counter, stream), stream)
                counter += 1
                samples.append(elapsed * 1000)
                if client is routed and headers.get("x-tokenfront-forwarded") == "true":
                    phase.forwarded += 1
        phase.wall = time.perf_counter() - wall_before
        phase.router_cpu = router.cpu_seconds() - cpu_before
    finally:
        direct.close()
        routed.close()
    return phase


def _idle_cpu_rate(router: Server, seconds: float) -> float:
    """CPU seconds per second the router spends with no request (health checks, KV-event polls)."""
    before = router.cpu_seconds()
    time.sleep(seconds)
    return (router.cpu_seconds() - before) / seconds


def _start_profiler(router: Server, output: str) -> subprocess.Popen[bytes]:
    """py-spy sampling the router and its child processes (their stacks in "raw" collapsed format)."""
    py_spy = Path(sys.executable).with_name("py-spy")
    command = [str(py_spy), "record", "--subprocesses", "--format", "raw", "--rate", "250"]
    profiler = subprocess.Popen([*command, "-o", output, "-p", str(router.pid)])
    time.sleep(1.0)  # attached before the first measured request
    return profiler


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))],
        "mean": statistics.fmean(ordered),
    }


def _summary(phase: Phase, idle_rate: float) -> dict[str, Any]:
    direct, routed = _stats(phase.direct), _stats(phase.routed)
    count = len(phase.routed)
    background = idle_rate * phase.wall
    return {
        "stream": phase.stream,
        "requests": count,
        "direct_ms": direct,
        "routed_ms": routed,
        "added_p50_ms": routed["p50"] - direct["p50"],
        "added_mean_ms": routed["mean"] - direct["mean"],
        "added_median_of_pairs_ms": statistics.median(
            r - d for r, d in zip(phase.routed, phase.direct, strict=True)
        ),
        "router_cpu_ms_per_request": 1000 * phase.router_cpu / count,
        "router_cpu_ms_per_request_less_idle": 1000 * max(0.0, phase.router_cpu - background) / count,
        "forwarded": phase.forwarded / count,
    }


BUILD_DEADLINE_SECONDS = 30.0


def _start(args: list[str], log_dir: Path, name: str, tree: str | None = None) -> Server:
    """`tokenfront ARGS`, healthy; `tree`: from that checkout's `src` (another commit's code) instead."""
    env = None
    if tree is not None:
        env = {**os.environ, "PYTHONPATH": str(Path(tree) / "src")}
    server = launch_tokenfront(args, log_dir=log_dir, name=name, env=env)
    try:
        wait_healthy([server])
    except BaseException:
        server.stop()
        raise
    return server


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start a worker and a router in front of it, measure both paths, and stop everything."""
    name, folder = checkpoint_or_tiny(args.checkpoint)
    log_dir = Path(tempfile.mkdtemp(prefix="tokenfront-router-overhead-"))
    started: list[Server] = []
    try:
        worker = _start(["serve", "--model", str(folder)], log_dir, "worker", args.worker_tree)
        started.append(worker)
        command = ["route", "--model", str(folder), "--worker", worker.url, *args.router_args]
        router = _start(command, log_dir, "router", args.router_tree)
        started.append(router)
        # Its fast tokenizer backend is built a moment after it serves (router/app.py): measured after that.
        # (A router older than that log line built it before serving: the wait then ends at its deadline.)
        built = router.wait_for_log("tokenizer backend", BUILD_DEADLINE_SECONDS)
        router.wait_settled()
        profiler = _start_profiler(router, args.py_spy) if args.py_spy else None
        phases = []
        try:
            for number, stream in enumerate((False, True)):
                counter = 1_000_000 * (number + 1)
                phases.append(_run_phase(worker, router, args.requests, args.warmup, stream, counter))
        finally:
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                profiler.wait(timeout=60)
        # Measured last: a router just started is still busy for a few seconds (lazy loading, first polls).
        idle_rate = _idle_cpu_rate(router, args.idle_seconds)
        results = [_summary(phase, idle_rate) for phase in phases]
        return {
            "checkpoint": name,
            "requests": args.requests,
            "router_idle_cpu_ms_per_s": 1000 * idle_rate,
            "backend_built_before_measuring": built,
            "results": results,
        }
    finally:
        stop_all(started)


def _print_report(report: dict[str, Any]) -> None:
    print(
        f"router overhead: {report['checkpoint']} worker, {report['requests']} requests per path and mode, one "
        f"at a time, max_tokens 1; router idle CPU {report['router_idle_cpu_ms_per_s']:.1f} ms/s; its tokenizer "
        f"backend built before measuring: {'yes' if report['backend_built_before_measuring'] else 'not logged'}"
    )
    print(
        f"{'mode':7} {'path':7} {'p50 ms':>7} {'p90 ms':>7} {'mean ms':>7}  {'added p50':>9} {'paired':>6}  "
        f"{'router CPU ms/req':>17} {'less idle':>9}  {'forwarded':>9}"
    )
    for row in report["results"]:
        mode = "stream" if row["stream"] else "plain"
        for path in ("direct", "routed"):
            stats = row[f"{path}_ms"]
            line = f"{mode:7} {path:7} {stats['p50']:7.2f} {stats['p90']:7.2f} {stats['mean']:7.2f}"
            if path == "routed":
                line += (
                    f"  {row['added_p50_ms']:9.2f} {row['added_median_of_pairs_ms']:6.2f}"
                    f"  {row['router_cpu_ms_per_request']:17.2f} {row['router_cpu_ms_per_request_less_idle']:9.2f}"
                    f"  {row['forwarded']:9.0%}"
                )
            print(line)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its report."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.router_overhead", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--checkpoint", default="smollm2", help="fixture checkpoint (default: smollm2)")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per path and mode")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured requests per path first")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle window for the router's CPU")
    parser.add_argument("--py-spy", metavar="OUT", help="record the router with py-spy into OUT (raw stacks)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--router-tree", metavar="DIR", help="start the router from DIR/src (another checkout)"
    )
    parser.add_argument(
        "--worker-tree", metavar="DIR", help="start the worker from DIR/src (another checkout)"
    )
    parser.add_argument("router_args", nargs="*", help="extra `tokenfront route` arguments (after --)")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

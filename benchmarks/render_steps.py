"""The render server's request path step by step, live: where a request's server CPU goes over loopback.

`benchmarks.render_lane` times the request path in-process, in a tight loop; over loopback the same code runs
beside the kernel's network work and the client, and costs more. This starts `tokenfront render` on core 0
with a clock around four steps of the request path, installed in the server process before the app is built:

- `data_received`: all the server's Python for a read (`BoundedHttpProtocol.data_received`); less
  `answer_whole`, the write of the answer to the socket and the connection's bookkeeping;
- `answer_whole`: the whole request on the direct lane (`DirectLane.answer_whole`: the head read without the
  parser, the key and body checks, the request id, the route's answer, the metrics, the answer's head);
- `validate`: the body's validation (`ChatCompletionRequest`'s validator, `validate_python`);
- `render_chat`: the render itself (`RenderPipeline.render_chat`: template, tokenizer, the prompt's record),

drives `--requests` fresh requests of each workload from core 1 with `benchmarks.render_http`'s client (8
keep-alive connections), and reports the server's CPU per request from /proc beside each step's mean wall
time per request (a step's clock costs ~0.1 µs). Then the floor, with the same client on the same cores: a
bare uvloop server in Python (`asyncio.Protocol`, no parsing) answering every request with the bytes of a real
render answer: what the event loop and the kernel cost a request, below any request handling.

    python -m benchmarks.render_steps [--checkpoint qwen3] [--workloads one_line,tool_question]
                                      [--requests 30000] [--rounds 3] [--json]

Each workload runs `--rounds` times on fresh bodies; the round with the least server CPU per request is
reported. Needs 2 cores (`taskset`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.render_http import _encode_body, _generate, run_client, workload_requests
from benchmarks.servers import Server, free_port, launch, stop_all, wait_healthy
from tokenfront import fixtures

SERVER_CORE, CLIENT_CORE = "0", "1"
STEPS = ("data_received", "answer_whole", "validate", "render_chat")
ROUTE = "/v1/chat/completions/render"
_DUMP_DEADLINE_S = 10.0


# --- in the server process ----------------------------------------------------------------------------------


def _timed(function: Callable[..., Any], totals: list[float]) -> Callable[..., Any]:
    clock = time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return function(*args, **kwargs)
        finally:
            totals[0] += 1
            totals[1] += clock() - started

    return timed


class _TimedValidator:
    """A pydantic model's validator with a clock around `validate_python`; the rest as the validator's."""

    def __init__(self, validator: Any, totals: list[float]) -> None:
        self.validator = validator
        self.validate_python = _timed(validator.validate_python, totals)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.validator, name)


def _serve_timed(out: str, tokenfront_args: list[str]) -> int:
    """Run `tokenfront ARGS` with the steps' clocks; on SIGUSR1, write their totals to `out` and start again."""
    from tokenfront.cli import main as tokenfront_main
    from tokenfront.core.render import RenderPipeline
    from tokenfront.protocol import ChatCompletionRequest
    from tokenfront.server.direct import DirectLane
    from tokenfront.server.http_protocol import BoundedHttpProtocol

    totals = {step: [0.0, 0.0] for step in STEPS}
    # The model's validator itself: `model_validate` calls it, and so does the direct lane (bound when the routes
    # are built, after this).
    ChatCompletionRequest.__pydantic_validator__ = _TimedValidator(  # type: ignore[assignment]
        ChatCompletionRequest.__pydantic_validator__, totals["validate"]
    )
    RenderPipeline.render_chat = _timed(RenderPipeline.render_chat, totals["render_chat"])  # type: ignore[method-assign]
    BoundedHttpProtocol.data_received = _timed(BoundedHttpProtocol.data_received, totals["data_received"])  # type: ignore[method-assign]
    DirectLane.answer_whole = _timed(DirectLane.answer_whole, totals["answer_whole"])  # type: ignore[method-assign]

    def dump(*_: Any) -> None:
        snapshot = {step: list(value) for step, value in totals.items()}
        for value in totals.values():
            value[:] = [0.0, 0.0]
        Path(out + ".part").write_text(json.dumps(snapshot))
        os.replace(out + ".part", out)

    signal.signal(signal.SIGUSR1, dump)
    return int(tokenfront_main(tokenfront_args) or 0)


def _serve_bare(port: int, answer_path: str) -> int:
    """A bare uvloop server: every read is answered with the bytes in `answer_path` (GET /health with ok)."""
    import uvloop

    answer = Path(answer_path).read_bytes()
    health = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"

    class Bare(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(health if data.startswith(b"GET ") else answer)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        server = await loop.create_server(Bare, "127.0.0.1", port)
        async with server:
            await stop.wait()

    uvloop.run(serve())
    return 0


# --- the driver ---------------------------------------------------------------------------------------------


def _drive(server: Server, requests: list[list[bytes]]) -> tuple[float, float, int]:
    """Send `requests` from the client's core; (server CPU seconds, wall seconds, failures)."""
    os.sched_setaffinity(0, {int(CLIENT_CORE)})
    cpu = server.cpu_seconds()
    run = run_client(server.port, requests, 8)
    return server.cpu_seconds() - cpu, run.wall, len(run.failures)


def _steps(server: Server, out: Path) -> dict[str, list[float]]:
    """The steps' totals since the last call (SIGUSR1, then the file the server writes)."""
    out.unlink(missing_ok=True)
    os.kill(server.pid, signal.SIGUSR1)
    deadline = time.monotonic() + _DUMP_DEADLINE_S
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the server wrote no step times in {_DUMP_DEADLINE_S:g} s:\n{server.log_tail()}"
            )
        time.sleep(0.01)
    steps: dict[str, list[float]] = json.loads(out.read_text())
    return steps


def _measure(server: Server, out: Path, workload: str, count: int, rounds: int) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    for number in range(rounds):
        requests = workload_requests(workload, count, f"render-steps-{workload}-{number}", server.port)
        sent = sum(len(turns) for turns in requests)
        _steps(server, out)
        cpu, wall, failures = _drive(server, requests)
        steps = _steps(server, out)
        if failures:
            raise RuntimeError(f"{failures} of {sent} {workload} requests were not answered 200 with ids")
        row = {
            "workload": workload,
            "requests": sent,
            "server_cpu_us": cpu / sent * 1e6,
            "requests_per_s": sent / wall,
            "steps_us": {step: total / sent * 1e6 for step, (_, total) in steps.items()},
            "steps_calls": {step: int(calls) for step, (calls, _) in steps.items()},
        }
        if best is None or row["server_cpu_us"] < best["server_cpu_us"]:
            best = row
    assert best is not None
    return best


def _floor(answer: bytes, workload: str, count: int, rounds: int, log_dir: Path) -> dict[str, Any]:
    answer_path = log_dir / "answer.bin"
    answer_path.write_bytes(answer)
    port = free_port()
    command = ["taskset", "-c", SERVER_CORE, sys.executable, "-m", "benchmarks.render_steps"]
    bare = launch("bare", [*command, "--bare", str(port), str(answer_path)], port=port, log_dir=log_dir)
    try:
        wait_healthy([bare], timeout=30.0)
        best = None
        for number in range(rounds):
            requests = workload_requests(workload, count, f"render-steps-floor-{number}", port)
            cpu, wall, failures = _drive(bare, requests)
            sent = sum(len(turns) for turns in requests)
            if failures:
                raise RuntimeError(f"the bare server failed {failures} of {sent} requests")
            row = {"requests": sent, "server_cpu_us": cpu / sent * 1e6, "requests_per_s": sent / wall}
            if best is None or row["server_cpu_us"] < best["server_cpu_us"]:
                best = row
        assert best is not None
        return {**best, "answer_bytes": len(answer)}
    finally:
        stop_all([bare])


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = fixtures.ensure_checkpoint(args.checkpoint)
    log_dir = Path(tempfile.mkdtemp(prefix="tokenfront-render-steps-"))
    out = log_dir / "steps.json"
    port = free_port()
    command = [
        "taskset",
        "-c",
        SERVER_CORE,
        sys.executable,
        "-m",
        "benchmarks.render_steps",
        "--timed",
        str(out),
    ]
    tokenfront_args = ["render", "--model", str(folder), "--tool-call-parser", "hermes"]
    server = launch(
        "tokenfront", [*command, "--", *tokenfront_args, "--port", str(port)], port=port, log_dir=log_dir
    )
    workloads = args.workloads.split(",")
    try:
        wait_healthy([server], timeout=120.0)
        server.wait_for_log("tokenizer backend", 60.0)
        server.wait_settled()
        rows = [_measure(server, out, workload, args.requests, args.rounds) for workload in workloads]
        sample = _generate(workloads[0], 1, "render-steps-answer")[0][0]
        reply = httpx.post(f"{server.url}{ROUTE}", content=_encode_body(sample), timeout=30.0)
        reply.raise_for_status()
        head = "".join(f"{name}: {value}\r\n" for name, value in reply.headers.items())
        answer = f"HTTP/1.1 200 OK\r\n{head}\r\n".encode("latin-1") + reply.content
    finally:
        stop_all([server])
    floor = _floor(answer, workloads[0], args.requests, args.rounds, log_dir)
    return {"checkpoint": args.checkpoint, "workloads": rows, "floor": floor}


def _print_report(report: dict[str, Any]) -> None:
    print(
        f"{'workload':14s} {'requests':>8s} {'req/s':>7s} {'server CPU':>11s}  "
        + "  ".join(f"{s:>12s}" for s in STEPS)
    )
    for row in report["workloads"]:
        steps = "  ".join(f"{row['steps_us'][step]:9.1f} us" for step in STEPS)
        print(
            f"{row['workload']:14s} {row['requests']:8d} {row['requests_per_s']:7.0f} "
            f"{row['server_cpu_us']:8.1f} us  {steps}"
        )
    floor = report["floor"]
    print(
        f"{'bare uvloop':14s} {floor['requests']:8d} {floor['requests_per_s']:7.0f} {floor['server_cpu_us']:8.1f} us"
        f"  (a fixed {floor['answer_bytes']}-byte answer to every read)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--timed"]:  # the server process, with the steps' clocks
        return _serve_timed(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
    if argv[:1] == ["--bare"]:  # the floor's server process
        return _serve_bare(int(argv[1]), argv[2])
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.render_steps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint", default="qwen3")
    parser.add_argument("--workloads", default="one_line,tool_question")
    parser.add_argument("--requests", type=int, default=30000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        print("render_steps needs 2 cores: the server on one, the client on the other", file=sys.stderr)
        return 2
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

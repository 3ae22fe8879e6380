"""The render server's request path in-process: CPU per request with no socket, no kernel and no client.

`benchmarks.render_http` measures the server as a client sees it, over loopback, where the kernel, the event
loop and a Python client share two cores. This measures what is left when those are taken away: the renderer's
real app (`renderer.app.create_renderer_app`) behind the real connection protocol (`server.http_protocol`,
with the direct lane a served renderer has), on a running event loop (uvloop when importable), fed complete
HTTP/1.1 requests (`benchmarks.render_http`'s bytes and workloads) over `--concurrency` connections, one request
to each per turn of the loop, by transports that keep what is written and go nowhere. Every answer is checked: a
200 whose `token_ids` equal the pipeline's own `render_chat` ids for that body (counted in the report).

    python -m benchmarks.render_lane [--checkpoint qwen3] [--workloads one_line,tool_question]
                                     [--requests 20000] [--concurrency 8] [--rounds 3] [--profile] [--json]

It reports, per workload, CPU per request (the best round of `--rounds`) for the whole HTTP request and for
`render_chat` alone on the same bodies, and their difference: the HTTP layer's share. `--profile` prints
cProfile's top functions of one more pass of the whole request.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import random
import sys
import time
from typing import Any

import orjson

from benchmarks.render import WORKLOADS
from benchmarks.render_http import _encode_body, _http_request
from tokenfront import RenderOptions, RenderPipeline, fixtures
from tokenfront.protocol import ChatCompletionRequest

DEFAULT_WORKLOADS = ("one_line", "tool_question", "agent_session", "cold_mid")


class SinkTransport(asyncio.Transport):
    """A transport that keeps what is written, in order, and sends nothing (also the direct lane's tests')."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def lane_connections(
    app: Any, loop: asyncio.AbstractEventLoop, count: int
) -> list[tuple[Any, SinkTransport]]:
    """`count` connections to `app` as a served renderer has them (the bounded protocol with the app's direct
    lane, sharing one connection table), each made on a `SinkTransport`: (protocol, transport) pairs."""
    import uvicorn
    from uvicorn.server import ServerState

    from tokenfront.server.connection_limits import ConnectionLimits
    from tokenfront.server.direct import DirectLane
    from tokenfront.server.http_protocol import bounded_protocol
    from tokenfront.server.middleware import RequestIdLayer

    config = uvicorn.Config(RequestIdLayer(app), log_config=None, access_log=False, ws="none")
    config.load()
    direct = DirectLane.of(app)
    if direct is None:
        raise SystemExit("the renderer app has no direct lane")
    create = bounded_protocol(ConnectionLimits(), direct)
    state = ServerState()
    connections = []
    for _ in range(count):
        protocol, transport = create(config, state, {}, loop), SinkTransport()
        protocol.connection_made(transport)
        connections.append((protocol, transport))
    return connections


def _ids(answer: bytes) -> list[int]:
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"not a 200: {answer[:300]!r}")
    return list(orjson.loads(body)["token_ids"])


def _cpu_per_request(run: Any, count: int) -> float:
    gc.collect()
    start = time.process_time()
    run()
    return (time.process_time() - start) / count


def measure(
    pipeline: RenderPipeline, workload: str, count: int, concurrency: int, rounds: int, profile: bool
) -> dict[str, Any]:
    from tokenfront.renderer.app import create_renderer_app

    # Fresh bodies for every pass (the first checks the answers): no pass is timed on a body seen before.
    passes = []
    for index in range(2 * rounds + 2):
        bodies = WORKLOADS[workload](count, random.Random(f"lane-{workload}-{index}"))
        encoded = [_encode_body(body) for body in bodies]
        passes.append((encoded, [_http_request(payload, 8000) for payload in encoded]))
    payloads = passes[0][0]
    app = create_renderer_app(pipeline)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    connections = lane_connections(app, loop, concurrency)
    answers: list[bytes] = []

    async def turns(requests: list[bytes]) -> None:
        for start in range(0, count, concurrency):
            for (protocol, _), request in zip(
                connections, requests[start : start + concurrency], strict=False
            ):
                protocol.data_received(request)
            await asyncio.sleep(0)

    def http() -> None:
        requests = passes.pop(0)[1]
        for _, transport in connections:
            transport.written.clear()
        loop.run_until_complete(turns(requests))
        answers[:] = [
            transport.written[turn]
            for turn in range(-(-count // concurrency))
            for _, transport in connections
            if turn < len(transport.written)
        ]
        if len(answers) != count:
            raise SystemExit(f"{len(answers)} answers to {count} requests: some took the ASGI path")

    def in_process() -> None:
        for payload in passes.pop(0)[0]:
            body = orjson.loads(payload)
            pipeline.render_chat(ChatCompletionRequest.model_validate(body), body=body)

    http()  # warm: and every answer checked
    compared = 0
    for payload, answer in zip(payloads, answers, strict=True):
        body = orjson.loads(payload)
        expected = pipeline.render_chat(ChatCompletionRequest.model_validate(body), body=body).token_ids
        if _ids(answer) != list(expected):
            raise SystemExit(f"ids differ from render_chat's for {payload[:200]!r}")
        compared += 1
    whole = min(_cpu_per_request(http, count) for _ in range(rounds))
    render = min(_cpu_per_request(in_process, count) for _ in range(rounds))
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        http()
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(30)
    loop.close()
    return {
        "workload": workload,
        "requests": count,
        "ids_compared": compared,
        "http_us": whole * 1e6,
        "render_chat_us": render * 1e6,
        "http_layer_us": (whole - render) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default="qwen3")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    folder = str(fixtures.ensure_checkpoint(args.checkpoint))
    pipeline = RenderPipeline.load(RenderOptions(model=folder, tool_call_parser="hermes"))
    pipeline.wait_until_ready()
    results = []
    for workload in args.workloads.split(","):
        count = args.requests if workload in ("one_line", "tool_question") else max(1, args.requests // 10)
        results.append(measure(pipeline, workload, count, args.concurrency, args.rounds, args.profile))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'workload':16s} {'requests':>8s} {'HTTP request':>14s} {'render_chat':>12s} {'HTTP layer':>11s}")
    for row in results:
        print(
            f"{row['workload']:16s} {row['requests']:8d} {row['http_us']:11.1f} us {row['render_chat_us']:9.1f} us "
            f"{row['http_layer_us']:8.1f} us   ({row['ids_compared']} answers' ids equal render_chat's)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

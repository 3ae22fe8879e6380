"""Render over HTTP: tokenfront's render server against vLLM's render servers, side by side, in one run.

All servers run on the same checkpoint, on loopback: `tokenfront render --model CKPT` (this interpreter,
`python -m tokenfront.cli`); with `--vllm VENV`, vLLM's Python render server (`VLLM_TARGET_DEVICE=cpu
HF_HUB_OFFLINE=1 VENV/bin/vllm launch render CKPT`, a venv holding vllm==0.33.0); with `--vllm-rs BINARY|VENV`,
vLLM's Rust renderer (`vllm-rs render CKPT`, the binary in that wheel's `site-packages/vllm/`). Each answers
POST /v1/chat/completions/render with an object holding `token_ids`.

Workloads are the generators of `benchmarks.render` (short chats, chats with tools, growing multi-turn
conversations, cold long prompts; and one-line chats, a question with two tools, an agent's growing session,
cold mid-length prompts), regenerated with a new seed for every tokenfront configuration and round: every
server gets the same list, each server sees each body exactly once, and the warm-up requests come from another
seed, so no server is ever timed on a body it has seen (the run checks that no body repeats). A
conversation's turns are sent in order, the next one only after the previous answer; conversations are
interleaved over the connections.

The client is cheap on purpose (on a 2-core machine it would otherwise decide the ratio): every request is
built as complete HTTP/1.1 bytes before the clock starts, and `--concurrency` keep-alive connections (a raw
asyncio.Protocol, uvloop when importable) run a closed loop, reading the status line, headers and body
length without parsing JSON. Per server and workload it reports, first, the server's CPU time per request
(utime + stime of its process tree from /proc: the fair figure on a shared machine), then requests/s, p50/p99
latency, the client's own CPU per request, and the CPU every other process on the machine took meanwhile (a
warning when the machine was not quiet); and tokenfront's CPU per request and req/s over each peer's. /proc
counts CPU in clock ticks (10 ms here): a CPU figure resting on fewer than 100 of them is coarser than 1 % and
the report says so (a one-line chat's round at `--scale 0.5` is about 13 ticks: use `--requests`).

`--pinning unpinned,pinned` (the default) runs everything twice: unpinned, every process may use every core;
pinned, each server runs on its own core (`taskset -c`; `--workers N`: N cores) and the client on the last one,
so requests/s are per core, directly. On a 2-core machine `--workers 2` pinned shares the client's core: its
req/s then say what the client left over, not what two cores give.

Each workload runs `--rounds` times per server, which server goes first turning per workload and round; the
best round is reported, all of them are in the JSON. Then: start-up (seconds to a 200 on /health), RSS once
idle and after the run, the ids of a sample of requests compared across the servers and the in-process
transformers reference (tokenfront, vLLM's Python renderer and the reference must agree; vLLM's Rust renderer
is not an oracle, so its differences are listed, not errors), and the floor: the bare tokenizer on the same
rendered texts against tokenfront's in-process `render_chat`. Any non-200 answer from tokenfront or vLLM's
Python renderer, or any ids mismatch among them, makes the exit status non-zero.

    python -m benchmarks.render_http [--checkpoint qwen3] [--vllm ~/.cache/tokenfront-peers/vllm]
                                     [--vllm-rs ~/.cache/tokenfront-peers/vllm] [--pinning unpinned,pinned]
                                     [--workloads one_line,...] [--concurrency 8] [--requests N | --scale F]
                                     [--rounds 3] [--workers 1,2] [--tokenfront-arg=--server=granian ...]
                                     [--vllm-arg=ARG ...] [--vllm-rs-arg=ARG ...] [--floor-rounds 5] [--json]

`--workers 1,2` runs tokenfront once per value (adding `--workers N` to its command line when N > 1), each
against the peers again on fresh requests. Every server gets `--tool-call-parser hermes` (`--tool-call-parser`;
vLLM's Python server refuses `tools` without one, and also gets `--enable-auto-tool-choice`) and logs no line
per request (tokenfront's default; vLLM gets `--disable-uvicorn-access-log` unless `--vllm-access-log`);
`--tokenfront-arg=...`, `--vllm-arg=...` and `--vllm-rs-arg=...` pass anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import inspect
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.render import CONVERSATIONS, WORKLOADS, reference_renderer
from benchmarks.servers import (
    CLOCK_TICKS,
    HOST,
    Server,
    launch_tokenfront,
    launch_vllm_render,
    launch_vllm_rs,
    machine_cpu_seconds,
    machine_interrupt_seconds,
    stop_all,
    vllm_rs_option,
    wait_healthy,
    wait_quiet,
)
from tokenfront import RenderOptions, RenderPipeline, fixtures
from tokenfront.compiled import compiled_modules
from tokenfront.protocol import ChatCompletionRequest

ROUTE = "/v1/chat/completions/render"
# A server's CPU in a round counted in fewer clock ticks than this is coarser than 1 %: the report says so.
FINE_CPU_TICKS = 100
# Requests per workload by default: about half a minute of vLLM time in all at concurrency 8 on 2 cores.
DEFAULT_REQUESTS = {
    "short_chats": 4000,
    "tool_chats": 2000,
    "multi_turn": 2000,
    "long_prompts": 400,
    "one_line": 6000,
    "tool_question": 4000,
    "agent_session": 2000,
    "cold_mid": 1000,
}
# The floor's requests per workload at most (plain `tokenizers` takes ~25 ms on a long prompt, per round).
FLOOR_REQUESTS = {
    "short_chats": 2000,
    "tool_chats": 1000,
    "multi_turn": 1000,
    "long_prompts": 200,
    "one_line": 2000,
    "tool_question": 1000,
    "agent_session": 1000,
    "cold_mid": 400,
}
_KEEP = 512  # bytes of each answer's body kept: enough for `token_ids` to show up, and for error messages
_TOKEN_IDS = b'"token_ids"'

Body = dict[str, Any]


# --- the workloads -----------------------------------------------------------------------------------------


def _sequences(name: str, bodies: list[Body]) -> list[list[Body]]:
    """Requests that must go in order: a conversation's turns for `CONVERSATIONS`, else each request alone."""
    if name not in CONVERSATIONS:
        return [[body] for body in bodies]
    conversations: dict[str, list[Body]] = {}
    for body in bodies:  # the generator emits one conversation's turns in order, all opening alike
        conversations.setdefault(json.dumps(body["messages"][0]), []).append(body)
    return list(conversations.values())


def _generate(name: str, count: int, seed: str) -> list[list[Body]]:
    return _sequences(name, WORKLOADS[name](count, random.Random(seed)))


def _encode_body(body: Body) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _http_request(payload: bytes, port: int) -> bytes:
    head = (
        f"POST {ROUTE} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + payload


def workload_requests(workload: str, count: int, seed: str, port: int) -> list[list[bytes]]:
    """`count` fresh requests of `workload` (drawn with `seed`) as the HTTP bytes sent to `port`: one list per
    connection's sequence of turns."""
    return [
        [_http_request(_encode_body(body), port) for body in turns]
        for turns in _generate(workload, count, seed)
    ]


# --- the client --------------------------------------------------------------------------------------------

_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER = range(5)


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: send a prebuilt request, wait for the whole answer.

    Reads the status line and headers, then a Content-Length or chunked body; keeps only the body's first
    bytes and never parses JSON."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._state = _HEAD
        self._status = 0
        self._remaining = 0
        self._kept = bytearray()
        self._closing = False
        self._lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        if self._lost is not None or self._transport is None or self._closing:
            raise ConnectionError(f"the connection is closed ({self._lost})")
        self._waiter = self._loop.create_future()
        self._state, self._kept = _HEAD, bytearray()
        self._transport.write(request)
        return self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._waiter is None or self._waiter.done():
            return
        try:
            self._advance()
        except Exception as exc:  # a malformed answer: fail the request loudly
            self._waiter.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or ConnectionError("closed by the server")
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(
                ConnectionError(f"the server closed the connection mid-answer ({exc})")
            )

    def _keep(self, data: bytes | bytearray) -> None:
        if len(self._kept) < _KEEP:
            self._kept += data[: _KEEP - len(self._kept)]

    def _finish(self) -> None:
        assert self._waiter is not None
        self._waiter.set_result((self._status, bytes(self._kept)))

    def _advance(self) -> None:
        buffer = self._buffer
        while True:
            if self._state == _HEAD:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = bytes(buffer[:end]).split(b"\r\n")
                del buffer[: end + 4]
                self._status = int(lines[0].split(b" ", 2)[1])
                headers = {}
                for line in lines[1:]:
                    key, _, value = line.partition(b":")
                    headers[key.strip().lower()] = value.strip().lower()
                self._closing = headers.get(b"connection") == b"close"
                if 100 <= self._status < 200:  # an interim answer: the real one follows
                    continue
                if b"chunked" in headers.get(b"transfer-encoding", b""):
                    self._state = _CHUNK_SIZE
                elif b"content-length" in headers:
                    self._state, self._remaining = _BODY, int(headers[b"content-length"])
                elif self._status in (204, 304):
                    self._finish()
                    return
                else:
                    raise RuntimeError(f"an answer with neither Content-Length nor chunks: {lines[0]!r}")
            elif self._state == _BODY:
                if len(buffer) < self._remaining:
                    return
                self._keep(buffer[: min(self._remaining, _KEEP)])
                del buffer[: self._remaining]
                self._finish()
                return
            elif self._state == _CHUNK_SIZE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buffer[:end]).split(b";")[0], 16)
                del buffer[: end + 2]
                self._state, self._remaining = (_CHUNK_DATA, size + 2) if size else (_TRAILER, 0)
            elif self._state == _CHUNK_DATA:
                if len(buffer) < self._remaining:
                    return
                self._keep(buffer[: min(self._remaining - 2, _KEEP)])
                del buffer[: self._remaining]
                self._state = _CHUNK_SIZE
            else:  # _TRAILER: header lines, then an empty line
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                del buffer[: end + 2]
                if end == 0:
                    self._finish()
                    return


@dataclass
class ClientRun:
    latencies: list[float]
    wall: float
    client_cpu: float
    failures: list[tuple[int, bytes]]


async def _drive(
    connection: _Connection,
    queue: deque[tuple[list[bytes], int]],
    latencies: list[float],
    failures: list[tuple[int, bytes]],
) -> None:
    clock = time.perf_counter
    while queue:
        sequence, position = queue.popleft()
        started = clock()
        status, kept = await connection.send(sequence[position])
        latencies.append(clock() - started)
        if status != 200 or _TOKEN_IDS not in kept:
            failures.append((status, kept))
        if position + 1 < len(sequence):  # the conversation's next turn, after this answer only
            queue.append((sequence, position + 1))


async def _closed_loop(
    port: int,
    sequences: list[list[bytes]],
    concurrency: int,
    on_start: Callable[[], None] = lambda: None,
    on_end: Callable[[], None] = lambda: None,
) -> ClientRun:
    loop = asyncio.get_running_loop()
    connections = []
    for _ in range(concurrency):
        _, connection = await loop.create_connection(lambda: _Connection(loop), HOST, port)
        connections.append(connection)
    queue = deque((sequence, 0) for sequence in sequences)
    latencies: list[float] = []
    failures: list[tuple[int, bytes]] = []
    on_start()
    gc.disable()
    cpu_started, started = time.process_time(), time.perf_counter()
    try:
        await asyncio.gather(*(_drive(c, queue, latencies, failures) for c in connections))
    finally:
        wall, client_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        gc.enable()
        on_end()
        for connection in connections:
            connection.close()
    return ClientRun(latencies, wall, client_cpu, failures)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_client(
    port: int,
    sequences: list[list[bytes]],
    concurrency: int,
    on_start: Callable[[], None] = lambda: None,
    on_end: Callable[[], None] = lambda: None,
) -> ClientRun:
    """Send every request in a closed loop over `concurrency` keep-alive connections; time each one."""
    loop = _new_loop()
    try:
        return loop.run_until_complete(_closed_loop(port, sequences, concurrency, on_start, on_end))
    finally:
        loop.close()


def _client_backend() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    return f"uvloop {uvloop.__version__}"


# --- one server, one workload ------------------------------------------------------------------------------


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _measure(
    server: Server,
    others: list[Server],
    timed: list[list[bytes]],
    warm_up: list[list[bytes]],
    concurrency: int,
    quiet_wait: float,
) -> dict[str, Any]:
    """Warm the server up on its own requests, wait for a quiet machine, then time the workload; raise on any
    non-200 answer."""
    warm = run_client(server.port, warm_up, concurrency) if warm_up else ClientRun([], 0.0, 0.0, [])
    waited = wait_quiet(quiet_wait) if quiet_wait > 0 else 0.0
    cpu: dict[str, float] = {}

    def snapshot(label: str) -> None:
        cpu[f"{label}_server"] = server.cpu_seconds()
        cpu[f"{label}_others"] = sum(other.cpu_seconds() for other in others)
        cpu[f"{label}_machine"] = machine_cpu_seconds()
        cpu[f"{label}_interrupts"], cpu[f"{label}_steal"] = machine_interrupt_seconds()

    run = run_client(
        server.port, timed, concurrency, on_start=lambda: snapshot("before"), on_end=lambda: snapshot("after")
    )
    failures = warm.failures + run.failures
    if failures:
        status, kept = failures[0]
        raise RuntimeError(
            f"{server.name}: {len(failures)} answers were not 200 with token_ids; the first: {status} "
            f"{kept[:300]!r}\n{server.log_tail(1500)}"
        )
    count = len(run.latencies)
    ordered = sorted(run.latencies)
    server_cpu = cpu["after_server"] - cpu["before_server"]
    others_cpu = cpu["after_others"] - cpu["before_others"]
    interrupts = cpu["after_interrupts"] - cpu["before_interrupts"]
    steal = cpu["after_steal"] - cpu["before_steal"]
    foreign_cpu = (
        cpu["after_machine"]
        - cpu["before_machine"]
        - server_cpu
        - others_cpu
        - run.client_cpu
        - interrupts
        - steal
    )
    return {
        "requests": count,
        "warm_up_requests": len(warm.latencies),
        "wall_s": run.wall,
        "rps": count / run.wall,
        "mean_ms": statistics.fmean(ordered) * 1000,
        "p50_ms": _percentile(ordered, 0.50) * 1000,
        "p90_ms": _percentile(ordered, 0.90) * 1000,
        "p99_ms": _percentile(ordered, 0.99) * 1000,
        "max_ms": ordered[-1] * 1000,
        "cpu_ms_per_request": server_cpu / count * 1000,
        # /proc counts CPU in whole clock ticks: the figure above is this many, give or take one.
        "server_cpu_ticks": round(server_cpu * CLOCK_TICKS),
        "server_cpu_share": server_cpu / run.wall,
        "client_cpu_ms_per_request": run.client_cpu / count * 1000,
        "client_cpu_share": run.client_cpu / run.wall,
        # The other server sits idle meanwhile: its CPU over the run should be about zero.
        "idle_others_cpu_ms": others_cpu * 1000,
        # Everything else on the machine meanwhile, in cores: should be about zero, or the numbers are off.
        "foreign_cpu_share": max(0.0, foreign_cpu) / run.wall,
        # Interrupts (on loopback, mostly the network's work for both ends, charged to no process) and time
        # the hypervisor stole, in cores.
        "interrupt_cpu_share": interrupts / run.wall,
        "steal_share": steal / run.wall,
        "waited_for_quiet_s": waited,  # None: the machine never went quiet within --quiet-wait
    }


# --- ids ---------------------------------------------------------------------------------------------------


def _spread(items: list[Body], count: int) -> list[Body]:
    if len(items) <= count:
        return list(items)
    return (
        [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)] if count > 1 else items[:1]
    )


def _first_difference(a: list[int], b: list[int]) -> str:
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"position {position}: {x} vs {y}"
    return f"lengths {len(a)} vs {len(b)}"


def _check_ids(
    servers: dict[str, Server], reference: Callable[[Body], list[int]], samples: dict[str, list[Body]]
) -> dict[str, Any]:
    """POST each sample body to every server, and compare the ids with each other and with the reference:
    ``mismatches`` between tokenfront, vLLM's Python renderer and the reference (they must agree),
    ``differences`` of a pair with vLLM's Rust renderer in it (reported, not an error)."""
    names = [*servers, "reference"]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    equal = dict.fromkeys((f"{a}={b}" for a, b in pairs), 0)
    mismatches: list[str] = []
    differences: list[str] = []
    compared = 0
    with httpx.Client(timeout=120.0) as client:
        for workload, bodies in samples.items():
            for index, body in enumerate(bodies):
                ids: dict[str, list[int]] = {}
                for name, server in servers.items():
                    response = client.post(f"{server.url}{ROUTE}", json=body)
                    if response.status_code != 200:
                        if name in _MUST_AGREE:
                            raise RuntimeError(
                                f"{name} answered {response.status_code}: {response.text[:300]}"
                            )
                        differences.append(
                            f"{workload} sample {index}: {name} answered {response.status_code}"
                        )
                        continue
                    ids[name] = response.json()["token_ids"]
                ids["reference"] = reference(body)
                compared += 1
                for a, b in pairs:
                    if a not in ids or b not in ids:
                        continue
                    if ids[a] == ids[b]:
                        equal[f"{a}={b}"] += 1
                    else:
                        found = mismatches if {a, b} <= _MUST_AGREE else differences
                        found.append(
                            f"{workload} sample {index}: {a} != {b} ({_first_difference(ids[a], ids[b])})"
                        )
    return {"compared": compared, "equal": equal, "mismatches": mismatches, "differences": differences}


# --- the floor ---------------------------------------------------------------------------------------------


def _fresh_plain_tokenizer(pipeline: RenderPipeline) -> Any:
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(pipeline.tokenizer._tokenizer.to_str())
    plain.no_truncation()
    plain.no_padding()
    return plain


def _bare_backend(pipeline: RenderPipeline) -> Any:
    """A freshly built tokenizer of the kind the pipeline encodes with (`pipeline.backend.name`): tokenfront's
    own class for it, without any wrapper the pipeline may put around it."""
    from tokenfront.core import tokenization

    classes = (
        tokenization.FastokensBackend,
        tokenization.RustTokenizersBackend,
        tokenization.TransformersBackend,
    )
    for backend_class in classes:
        if backend_class.name == pipeline.backend.name:
            return backend_class(pipeline.tokenizer)
    raise RuntimeError(f"no tokenizer class for the backend named {pipeline.backend.name!r}")


def _render_function(pipeline: RenderPipeline) -> Callable[[Body], list[int]]:
    """`render_chat` as the render route calls it: validation included, the body passed on when accepted."""
    takes_body = "body" in inspect.signature(pipeline.render_chat).parameters

    def render(body: Body) -> list[int]:
        request = ChatCompletionRequest.model_validate(body)
        if takes_body:
            return pipeline.render_chat(request, body=body).token_ids  # type: ignore[call-arg]
        return pipeline.render_chat(request).token_ids

    return render


def _cache_stats(backend: Any) -> dict[str, int] | None:
    stats = getattr(backend, "segment_cache_stats", None)  # fastokens only
    return dict(stats()) if callable(stats) else None


def measure_floor(
    folder: str,
    workloads: dict[str, list[Body]],
    text_pipeline: RenderPipeline,
    rounds: int,
    quiet_wait: float = 0.0,
) -> dict[str, Any]:
    """The bare tokenizer on the rendered texts against tokenfront's in-process render of the requests.

    Every round builds a fresh pipeline (for render_chat), a fresh tokenizer of the pipeline's backend class
    and a fresh plain `tokenizers.Tokenizer`, so no cache is warm; each first encodes one short unrelated
    text (fastokens pays a ~60 ms one-time set-up on its first call). The fresh backend and the pipeline see
    the same texts in the same order, so their caches help both alike. Best of `rounds`."""
    texts = {
        name: [
            text_pipeline.render_chat(ChatCompletionRequest.model_validate(b)).prompt_text or ""
            for b in bodies
        ]
        for name, bodies in workloads.items()
    }
    best: dict[str, dict[str, float]] = {name: {} for name in workloads}
    outputs: dict[str, dict[str, list[list[int]]]] = {name: {} for name in workloads}
    cache: dict[str, dict[str, int]] = {}
    backend_name = render_backend = ""
    foreign_by_round: list[float] = []
    for round_ in range(rounds):
        pipeline = RenderPipeline.load(RenderOptions(model=folder))
        backend_name = pipeline.backend.name
        backend = _bare_backend(pipeline)
        render = _render_function(pipeline)
        render_backend = f"{type(pipeline.backend).__name__}({pipeline.backend.name})"
        plain = _fresh_plain_tokenizer(pipeline)
        backend.encode("warm up", add_special_tokens=False)
        plain.encode("warm up", add_special_tokens=False)
        if quiet_wait > 0:
            wait_quiet(quiet_wait)
        machine_started, own_started = machine_cpu_seconds(), time.process_time()
        wall_started = time.perf_counter()
        for name, bodies in workloads.items():
            paths = ["floor", "tokenizers", "render"]
            if round_ % 2:
                paths.reverse()
            for path in paths:
                before = _cache_stats(backend)
                started = time.perf_counter()
                if path == "floor":
                    results = [backend.encode(text, add_special_tokens=False) for text in texts[name]]
                elif path == "tokenizers":
                    results = [plain.encode(text, add_special_tokens=False).ids for text in texts[name]]
                else:
                    results = [render(body) for body in bodies]
                elapsed = time.perf_counter() - started
                best[name][path] = min(best[name].get(path, math.inf), elapsed / len(bodies))
                outputs[name][path] = results
                after = _cache_stats(backend)
                if path == "floor" and before is not None and after is not None:
                    cache[name] = {key: after[key] - before[key] for key in ("hit_bytes", "miss_bytes")}
        foreign = machine_cpu_seconds() - machine_started - (time.process_time() - own_started)
        foreign_by_round.append(max(0.0, foreign) / (time.perf_counter() - wall_started))
    report: dict[str, Any] = {
        "backend": backend_name,
        "render_backend": render_backend,
        "rounds": rounds,
        # Cores every other process on the machine took during each round: ~0 when it was quiet.
        "foreign_cpu_share_by_round": foreign_by_round,
        "workloads": {},
        "mismatches": [],
    }
    for name in workloads:
        expected = outputs[name]["render"]
        for path in ("floor", "tokenizers"):
            wrong = sum(a != b for a, b in zip(outputs[name][path], expected, strict=True))
            if wrong:
                report["mismatches"].append(f"floor {name}: {path} ids differ from render_chat on {wrong}")
        hits = cache.get(name)
        report["workloads"][name] = {
            "requests": len(texts[name]),
            "mean_prompt_tokens": statistics.fmean(len(ids) for ids in expected),
            "floor_ms": best[name]["floor"] * 1000,
            "tokenizers_ms": best[name]["tokenizers"] * 1000,
            "render_ms": best[name]["render"] * 1000,
            "render_over_floor": best[name]["render"] / best[name]["floor"],
            # fastokens' segment cache, by bytes of text: how cold the workload really was.
            "segment_cache_hit_bytes": hits["hit_bytes"] / max(1, hits["hit_bytes"] + hits["miss_bytes"])
            if hits
            else None,
        }
    return report


# --- the run -----------------------------------------------------------------------------------------------


def _checkpoint(value: str) -> tuple[str, Path]:
    path = Path(value).expanduser()
    if path.is_dir():
        return path.name, path
    try:
        return value, fixtures.ensure_checkpoint(value)
    except fixtures.FixtureError as error:
        raise SystemExit(f"checkpoint {value} unavailable: {error}") from error


def _vllm_version(venv: Path) -> str:
    found = sorted(venv.glob("lib/python*/site-packages/vllm-*.dist-info"))
    return found[-1].name.removeprefix("vllm-").removesuffix(".dist-info") if found else "unknown"


def _tool_arguments(parser: str, *, vllm: bool) -> list[str]:
    """The tool-call parser for both servers: vLLM refuses requests with `tools` (tool_choice "auto" by
    default) unless it runs with --enable-auto-tool-choice and a parser."""
    if parser == "none":
        return []
    return (
        ["--enable-auto-tool-choice", "--tool-call-parser", parser]
        if vllm
        else ["--tool-call-parser", parser]
    )


def _counts(args: argparse.Namespace) -> dict[str, int]:
    if args.requests is not None:
        return dict.fromkeys(WORKLOADS, args.requests)
    return {workload: round(count * args.scale) or 1 for workload, count in DEFAULT_REQUESTS.items()}


class _Bodies:
    """Every body sent to the servers, to prove that none is sent twice."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.total = 0

    def add(self, payloads: list[bytes]) -> None:
        for payload in payloads:
            self.seen.add(hashlib.sha1(payload).digest())
            self.total += 1
        if len(self.seen) != self.total:
            raise RuntimeError("a request body repeats: the generators no longer make distinct requests")


# Where each server runs: "unpinned" lets the system schedule everything on every core; "pinned" gives a
# server its own cores (`taskset`: one for one process, N for `--workers N`) and the client the last core, so
# requests per second are per core, directly.
PINNINGS = ("unpinned", "pinned")
# Pairs of servers whose ids must agree (any difference fails the run); vLLM's Rust renderer is compared too,
# but it is not an oracle (it refuses or joins some contents differently): its differences are reported only.
_MUST_AGREE = frozenset({"tokenfront", "vllm", "reference"})


@dataclass(frozen=True)
class _Layout:
    """The cores of one run: the servers' (``None``: unpinned) and the client's."""

    pinning: str
    client_cpus: set[int] | None

    @classmethod
    def of(cls, pinning: str) -> _Layout:
        if pinning == "unpinned":
            return cls(pinning, None)
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            raise RuntimeError("pinned runs need two cores: one for the server, one for the client")
        return cls(pinning, {cores[-1]})

    def server_cpus(self, processes: int) -> str | None:
        """The cores a server of ``processes`` processes runs on: the first ones (with more processes than
        cores but the client's, the client's core too)."""
        if self.client_cpus is None:
            return None
        cores = sorted(os.sched_getaffinity(0))
        free = [core for core in cores if core not in self.client_cpus] or cores
        chosen = free[:processes] if processes <= len(free) else cores[:processes]
        return ",".join(map(str, chosen))

    @contextlib.contextmanager
    def client(self) -> Iterator[None]:
        """This process (the client) on its cores while the block runs."""
        if self.client_cpus is None:
            yield
            return
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.client_cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)


def _launch_peers(
    args: argparse.Namespace, folder: str, log_dir: Path, layout: _Layout, started: list[Server]
) -> dict[str, Server]:
    """vLLM's Python render server (``--vllm``) and its Rust one (``--vllm-rs``), healthy and settled."""
    peers: dict[str, Server] = {}
    if args.vllm is not None:
        venv = Path(args.vllm).expanduser()
        # tokenfront logs no line per request by default; vLLM does unless told not to: both alike.
        quiet_log = [] if args.vllm_access_log else ["--disable-uvicorn-access-log"]
        vllm_args = [*_tool_arguments(args.tool_call_parser, vllm=True), *quiet_log, *args.vllm_arg]
        peers["vllm"] = launch_vllm_render(
            venv, folder, log_dir=log_dir, extra_args=vllm_args, cpus=layout.server_cpus(1)
        )
        peers["vllm"].command_extra, peers["vllm"].version = vllm_args, _vllm_version(venv)
    if args.vllm_rs is not None:
        binary = vllm_rs_option(args.vllm_rs)
        rs_args = [*_tool_arguments(args.tool_call_parser, vllm=False), *args.vllm_rs_arg]
        peers["vllm-rs"] = launch_vllm_rs(
            binary, folder, log_dir=log_dir, extra_args=rs_args, cpus=layout.server_cpus(1)
        )
        peers["vllm-rs"].command_extra, peers["vllm-rs"].version = rs_args, _vllm_rs_version(binary)
    started.extend(peers.values())
    for peer in peers.values():  # one at a time: a start-up is timed on a machine the others leave alone
        wait_healthy([peer], timeout=args.start_timeout)
        peer.wait_settled()
        peer.idle_memory = peer.memory()
    return peers


def _vllm_rs_version(binary: Path) -> str:
    answer = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    return answer.stdout.strip() or "unknown"


def _server_info(server: Server) -> dict[str, Any]:
    return {
        "version": server.version,
        "command_extra": server.command_extra,
        "healthy_after_s": server.healthy_after,
        "settled_after_s": server.settled_after,
        "idle_memory": server.idle_memory,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    name, folder_path = _checkpoint(args.checkpoint)
    folder = str(folder_path)
    counts = _counts(args)
    workloads = args.workloads
    log_dir = Path(tempfile.mkdtemp(prefix="tokenfront-render-http-"))
    text_pipeline = RenderPipeline.load(RenderOptions(model=folder))
    reference = reference_renderer(text_pipeline)
    bodies_sent = _Bodies()
    compiled = compiled_modules()
    build = f"{len(compiled)} modules compiled by mypyc" if compiled else "pure Python"

    report: dict[str, Any] = {
        "checkpoint": name,
        "compiled_modules": compiled,
        "checkpoint_path": folder,
        "concurrency": args.concurrency,
        "client": _client_backend(),
        "tokenizer_backend": text_pipeline.backend.name,
        "logs": str(log_dir),
        "runs": [],
    }
    started: list[Server] = []
    try:
        run_index = 0
        for pinning in args.pinning:
            layout = _Layout.of(pinning)
            peers = _launch_peers(args, folder, log_dir, layout, started)
            for workers in args.workers:
                extra = [
                    *_tool_arguments(args.tool_call_parser, vllm=False),
                    *args.tokenfront_arg,
                    *(["--workers", str(workers)] if workers != 1 else []),
                ]
                tokenfront = launch_tokenfront(
                    ["render", "--model", folder, *extra],
                    log_dir=log_dir,
                    name=f"tokenfront-w{workers}-{pinning}",
                    cpus=layout.server_cpus(workers),
                )
                started.append(tokenfront)
                wait_healthy([tokenfront], timeout=args.start_timeout)
                tokenfront.wait_settled()
                tokenfront.idle_memory = tokenfront.memory()
                tokenfront.command_extra, tokenfront.version = extra, f"this tree, installed ({build})"
                servers = {"tokenfront": tokenfront, **peers}
                result: dict[str, Any] = {
                    "workers": workers,
                    "pinning": pinning,
                    "server_cpus": {
                        server_name: layout.server_cpus(workers if server_name == "tokenfront" else 1)
                        for server_name in servers
                    },
                    "client_cpus": sorted(layout.client_cpus) if layout.client_cpus else None,
                    "servers": {server_name: _server_info(server) for server_name, server in servers.items()},
                    "workloads": {},
                }
                samples: dict[str, list[Body]] = {}
                for workload_index, workload in enumerate(workloads):
                    result["workloads"][workload] = _measure_workload(
                        args,
                        workload,
                        count=counts[workload],
                        seed=f"{args.seed}/{run_index}",
                        first=run_index + workload_index,
                        servers=servers,
                        layout=layout,
                        text_pipeline=text_pipeline,
                        bodies_sent=bodies_sent,
                        samples=samples,
                    )
                result["memory"] = {server_name: server.memory() for server_name, server in servers.items()}
                result["ids"] = _check_ids(servers, reference, samples)
                report["runs"].append(result)
                tokenfront.stop()
                started.remove(tokenfront)
                run_index += 1
            for peer in peers.values():
                peer.stop()
                started.remove(peer)
    finally:
        stop_all(started)
    report["distinct_bodies_sent"] = bodies_sent.total
    # In-process, after every server has stopped: the machine is quiet.
    floor_bodies = {
        workload: [
            body
            for sequence in _generate(
                workload, min(counts[workload], FLOOR_REQUESTS[workload]), f"{args.seed}/floor/{workload}"
            )
            for body in sequence
        ]
        for workload in workloads
    }
    report["floor"] = (
        measure_floor(folder, floor_bodies, text_pipeline, args.floor_rounds, args.quiet_wait)
        if args.floor_rounds
        else None
    )
    return report


def _measure_workload(
    args: argparse.Namespace,
    workload: str,
    *,
    count: int,
    seed: str,
    first: int,
    servers: dict[str, Server],
    layout: _Layout,
    text_pipeline: RenderPipeline,
    bodies_sent: _Bodies,
    samples: dict[str, list[Body]],
) -> dict[str, Any]:
    """One workload on every server, `--rounds` times on fresh requests: the row of the report (the best
    round of each server, every round, and tokenfront over each peer). Adds the workload's sample to
    `samples`; `first` turns which server goes first."""
    row: dict[str, Any] = {}
    tokens: list[int] = []
    measured: dict[str, list[dict[str, Any]]] = {server_name: [] for server_name in servers}
    for round_ in range(args.rounds):
        round_seed = f"{seed}/{workload}/{round_}"
        timed = _generate(workload, count, round_seed + "/timed")
        # Warm-up requests (another seed) before each server's first timed round only.
        warm_up = _generate(workload, args.warm_up, round_seed + "/warm-up") if round_ == 0 else []
        flat = [body for sequence in timed for body in sequence]
        payloads = [[_encode_body(body) for body in sequence] for sequence in timed]
        warm_payloads = [[_encode_body(body) for body in sequence] for sequence in warm_up]
        bodies_sent.add([p for sequence in payloads + warm_payloads for p in sequence])
        tokens += [
            len(text_pipeline.render_chat(ChatCompletionRequest.model_validate(body)).token_ids)
            for body in flat
        ]
        if round_ == 0:
            samples[workload] = _spread(flat, args.sample)
            row.update(requests=len(flat), sequences=len(timed), orders=[])
        # Which server goes first turns with the workload and the round.
        order = list(servers)
        shift = (first + round_) % len(order)
        order = order[shift:] + order[:shift]
        row["orders"].append(order)
        for server_name in order:
            server = servers[server_name]
            build = [[_http_request(p, server.port) for p in sequence] for sequence in payloads]
            warm = [[_http_request(p, server.port) for p in sequence] for sequence in warm_payloads]
            others = [s for s in servers.values() if s is not server]
            with layout.client():
                measured[server_name].append(
                    _measure(server, others, build, warm, args.concurrency, args.quiet_wait)
                )
    row.update(mean_prompt_tokens=statistics.fmean(tokens), max_prompt_tokens=max(tokens))
    for server_name, rounds in measured.items():
        # The best round: the fewest interruptions from anything else on the machine.
        row[server_name] = {**max(rounds, key=lambda m: m["rps"]), "rounds": rounds}
    tf = row["tokenfront"]
    row["versus"] = {
        peer_name: {
            "cpu_ratio": tf["cpu_ms_per_request"] / row[peer_name]["cpu_ms_per_request"],
            "rps_ratio": tf["rps"] / row[peer_name]["rps"],
        }
        for peer_name in servers
        if peer_name != "tokenfront"
    }
    return row


# --- the report --------------------------------------------------------------------------------------------


def _mb(value: int) -> str:
    return f"{value / 2**20:.0f} MB"


def _print_report(report: dict[str, Any]) -> None:
    print(
        f"checkpoint {report['checkpoint']}, tokenfront backend {report['tokenizer_backend']}, "
        f"{report['concurrency']} keep-alive connections, closed loop, client {report['client']}; "
        f"{report['distinct_bodies_sent']} distinct bodies sent, none twice to a server"
    )
    for run in report["runs"]:
        servers = list(run["servers"])
        print()
        cores = ", ".join(
            f"{name} on {'every core' if cpus is None else 'core(s) ' + cpus}"
            for name, cpus in run["server_cpus"].items()
        )
        client = "every core" if run["client_cpus"] is None else f"core {run['client_cpus']}"
        print(f"{run['pinning']}, tokenfront --workers {run['workers']}: {cores}; client on {client}")
        for name, info in run["servers"].items():
            extra = " ".join(info["command_extra"])
            print(f"  {name}: {info['version']}{' (' + extra + ')' if extra else ''}")
        print(
            f"  {'workload':<14} {'tokens':>6} {'server':<11} {'CPU ms/req':>10} {'req/s':>8} {'p50 ms':>7} "
            f"{'p99 ms':>7} {'client ms':>9} {'srv cores':>9} {'irq':>5} {'others':>6} {'tf CPU/its':>10} "
            f"{'tf r/s/its':>10}"
        )
        foreign = 0.0
        for workload, row in run["workloads"].items():
            for index, name in enumerate(servers):
                cell = row[name]
                foreign = max(foreign, cell["foreign_cpu_share"])
                versus = row["versus"].get(name)
                ratios = (
                    f" {versus['cpu_ratio']:>9.2f}x {versus['rps_ratio']:>9.2f}x"
                    if versus
                    else f" {'':>10} {'':>10}"
                )
                label = f"{workload:<14} {row['mean_prompt_tokens']:>6.0f}" if index == 0 else f"{'':<21}"
                print(
                    f"  {label} {name:<11} {cell['cpu_ms_per_request']:>10.3f} {cell['rps']:>8.0f} {cell['p50_ms']:>7.2f} "
                    f"{cell['p99_ms']:>7.2f} {cell['client_cpu_ms_per_request']:>9.3f} "
                    f"{cell['server_cpu_share']:>9.2f} {cell['interrupt_cpu_share']:>5.2f} "
                    f"{cell['foreign_cpu_share']:>6.2f}" + ratios
                )
        print(
            "  CPU ms/req = the server's process tree (utime + stime from /proc) per request; client ms = this "
            "benchmark's own CPU per request; srv cores / irq / others = cores the server, interrupts (on "
            "loopback mostly the network's work) and every other process took on average; tf CPU/its, tf r/s/its = tokenfront's CPU per request and req/s over that server's "
            "(CPU under 1x and req/s over 1x: tokenfront cheaper, faster)"
        )
        print("  req/s of every round (the best one is reported above):")
        for workload, row in run["workloads"].items():
            print(
                f"    {workload:<14}"
                + "".join(
                    f" | {name:<10} " + " ".join(f"{r['rps']:>7.0f}" for r in row[name]["rounds"])
                    for name in servers
                )
            )
        never = sum(
            r["waited_for_quiet_s"] is None
            for row in run["workloads"].values()
            for name in servers
            for r in row[name]["rounds"]
        )
        if never:
            print(f"  {never} timed round(s) started on a machine that did not go quiet within --quiet-wait")
        steal = max(row[name]["steal_share"] for row in run["workloads"].values() for name in servers)
        if steal > 0.05:
            print(
                f"  WARNING: the hypervisor took up to {steal:.2f} cores from this machine during a timed run"
            )
        if foreign > 0.1:
            print(
                f"  WARNING: other processes took up to {foreign:.2f} cores during a timed run: numbers skewed"
            )
        coarse = [
            f"{workload} {name} ({row[name]['server_cpu_ticks']})"
            for workload, row in run["workloads"].items()
            for name in servers
            if row[name]["server_cpu_ticks"] < FINE_CPU_TICKS
        ]
        if coarse:
            print(
                f"  WARNING: /proc counts CPU in ticks of 1/{CLOCK_TICKS} s, and these CPU ms/req rest on fewer than "
                f"{FINE_CPU_TICKS} (each +-1 tick, so +-1 % or worse): {', '.join(coarse)}; a ratio within that is "
                "no result: raise --requests (or --scale) for a finer figure"
            )
        print(
            "  start-up (launch to a 200 on /health; settled = its CPU use fell idle after that) and memory:"
        )
        for name, info in run["servers"].items():
            settled, idle, after = info["settled_after_s"], info["idle_memory"], run["memory"][name]
            print(
                f"    {name + ':':<11} healthy after {info['healthy_after_s']:.2f} s, settled after "
                f"{'-' if settled is None else f'{settled:.1f}'} s; RSS idle {_mb(idle['rss_bytes'])} -> "
                f"{_mb(after['rss_bytes'])} after the run (PSS {_mb(after['pss_bytes'])}, "
                f"{after['processes']} process(es))"
            )
        ids = run["ids"]
        pairs = ", ".join(f"{pair} on {count}/{ids['compared']}" for pair, count in ids["equal"].items())
        print(f"  ids: {ids['compared']} requests compared: {pairs}")
        for mismatch in ids["mismatches"]:
            print(f"    MISMATCH {mismatch}")
        for difference in ids["differences"]:
            print(f"    vllm-rs differs (not an error): {difference}")
    floor = report["floor"]
    if floor is None:
        return
    print()
    print(
        f"floor: in-process, fresh tokenizers and pipeline per round, best of {floor['rounds']}; "
        f"floor = a fresh {floor['backend']} tokenizer on the rendered text, render = RenderPipeline.render_chat "
        f"(validation included; its backend: {floor['render_backend']})"
    )
    print(
        f"{'workload':<13} {'reqs':>5} {'tokens':>7} {'floor ms':>9} {'tokenizers ms':>14} {'render ms':>10} "
        f"{'render/floor':>13} {'cache hit bytes':>16}"
    )
    for workload, row in floor["workloads"].items():
        hits = row["segment_cache_hit_bytes"]
        print(
            f"{workload:<13} {row['requests']:>5} {row['mean_prompt_tokens']:>7.0f} {row['floor_ms']:>9.3f} "
            f"{row['tokenizers_ms']:>14.3f} {row['render_ms']:>10.3f} {row['render_over_floor']:>12.2f}x "
            f"{'-' if hits is None else f'{hits:.1%}':>16}"
        )
    by_round = floor["foreign_cpu_share_by_round"]
    print(
        "  other processes on the machine during each round: "
        + " ".join(f"{x:.2f}" for x in by_round)
        + " cores"
    )
    if sum(x > 0.1 for x in by_round) * 2 > len(by_round):
        print("  WARNING: the machine was busy during most rounds: numbers skewed")
    for mismatch in floor["mismatches"]:
        print(f"  MISMATCH {mismatch}")


def _workers(value: str) -> list[int]:
    try:
        workers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of integers, got {value!r}"
        ) from error
    if not workers or min(workers) < 1:
        raise argparse.ArgumentTypeError("worker counts are integers >= 1")
    return workers


def _workload_names(value: str) -> list[str]:
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"workloads are some of {', '.join(WORKLOADS)}; got {value!r}")
    return names


def _pinnings(value: str) -> list[str]:
    names = [part.strip() for part in value.split(",") if part.strip()]
    if not names or any(name not in PINNINGS for name in names):
        raise argparse.ArgumentTypeError(f"pinning is unpinned, pinned or both; got {value!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint", default="qwen3", help="fixture checkpoint name or folder (default: qwen3)"
    )
    parser.add_argument("--vllm", help="a venv holding vllm==0.33.0: measure its Python render server too")
    parser.add_argument(
        "--vllm-rs",
        help="vLLM's Rust renderer: the vllm-rs binary, or a venv holding vllm (its site-packages/vllm/vllm-rs)",
    )
    parser.add_argument("--vllm-rs-arg", action="append", default=[], help="extra vllm-rs render argument")
    parser.add_argument(
        "--workloads",
        type=_workload_names,
        default=list(WORKLOADS),
        help=f"comma-separated, of {', '.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--pinning",
        type=_pinnings,
        default=list(PINNINGS),
        help="unpinned (every process on every core), pinned (each server on its own core(s) with taskset, "
        "the client on the last core), or both, comma-separated (default: unpinned,pinned)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply the default requests per workload (a quicker run: 0.25)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="keep-alive connections (default: 8)")
    parser.add_argument(
        "--requests",
        type=int,
        help="timed requests per workload (default: "
        + ", ".join(f"{name} {count}" for name, count in DEFAULT_REQUESTS.items())
        + ")",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timed rounds per workload and server, each on new requests; the best is reported (default: 3)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="before each timed round, wait up to this many seconds for the rest of the machine to use under "
        "0.1 cores (0: do not wait; default: 30)",
    )
    parser.add_argument(
        "--warm-up", type=int, default=16, help="untimed requests per workload and server first"
    )
    parser.add_argument(
        "--workers", type=_workers, default=[1], help="tokenfront --workers values, one run each (default: 1)"
    )
    parser.add_argument(
        "--tokenfront-arg", action="append", default=[], help="extra tokenfront render argument (repeatable)"
    )
    parser.add_argument(
        "--vllm-access-log",
        action="store_true",
        help="keep vLLM's access log (a line per request; by default it gets --disable-uvicorn-access-log, "
        "as tokenfront logs none by default)",
    )
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra vllm launch render argument")
    parser.add_argument(
        "--tool-call-parser",
        default="hermes",
        help="given to both servers (vLLM also gets --enable-auto-tool-choice), as a deployment serving tools "
        "runs them; hermes fits Qwen3, llama3_json Llama 3; `none` for neither (default: hermes)",
    )
    parser.add_argument("--sample", type=int, default=16, help="requests per workload whose ids are compared")
    parser.add_argument(
        "--floor-rounds", type=int, default=5, help="fresh-tokenizer rounds of the floor (0: no floor)"
    )
    parser.add_argument("--seed", default="render-http", help="seed of the request generators")
    parser.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds a server may take to start"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)

    try:
        report = run(args)
    except (RuntimeError, OSError) as error:  # a server failed to start, answered non-200, or hung up
        print(f"render_http: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    mismatches = [m for run_ in report["runs"] for m in run_["ids"]["mismatches"]]
    if report["floor"] is not None:
        mismatches += report["floor"]["mismatches"]
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

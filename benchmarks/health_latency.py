"""`/health` latency while each server serves the largest requests its limits allow.

Starts real processes on loopback (each stopped by its own pid at the end): a renderer
(`tokenfront render --allow-request-chat-template`), a worker with the render endpoints
(`TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1 tokenfront serve`) and a router in front of that worker, all on the
SmolLM2 fixture with a chat template that writes the tools into the prompt. Each case sends its big request from a thread and, meanwhile, polls `GET /health` on one
keep-alive connection, one request after the other, until the big request is answered; it reports how many
probes answered, their p50 and max latency, the big request's status and how long it took. The goal is
`/health` under 100 ms throughout. One case measures a normal render instead of `/health`: a chat render with
the checkpoint's template while request templates (`chat_template` in the body) render. One case
(`worker_grammar_and_echo`) starts a worker of its own, with `--tool-call-parser hermes`, and also reports the
worker's peak resident memory over its size before each request.

    python -m benchmarks.health_latency [--only CASE ...] [--servers renderer,worker,router] [--json]

Cases are functions named `case_*` below, one per case (`--only` takes their names without `case_`); each
returns one `Measurement` per server it ran on. The machine's other load shares the cores: the figures are
as measured, never asserted in a test (tests/robustness/test_event_loop.py asserts statuses and counts).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.servers import HOST, Server, launch_tokenfront, stop_all, wait_healthy
from tokenfront import fixtures
from tokenfront.protocol import MAX_STOP_CHARACTERS, MAX_TOOLS
from tokenfront.server.responses import dumps

SERVERS = ("renderer", "worker", "router")
GOAL_MS = 100.0
_BIG_REQUEST_TIMEOUT_S = 600.0


@dataclass
class Measurement:
    """One case on one server: the big request's outcome and the probes answered meanwhile."""

    case: str
    server: str
    request: str
    status: int | None
    request_s: float
    probes: int
    p50_ms: float | None
    max_ms: float | None
    note: str = ""


@dataclass
class _Probe:
    """A thread sending one request after the other on a keep-alive connection until stopped."""

    port: int
    method: str = "GET"
    path: str = "/health"
    body: bytes | None = None
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def _run(self) -> None:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=60)
        headers = {"Content-Type": "application/json"} if self.body is not None else {}
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                connection.request(self.method, self.path, body=self.body, headers=headers)
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
            if ok:
                self.latencies_ms.append((time.perf_counter() - started) * 1000)
            else:
                self.failures += 1
            self._stop.wait(0.005)  # a short pause between probes keeps the probe itself cheap
        connection.close()


def _post(port: int, path: str, body: bytes) -> tuple[int | None, bytes, float]:
    """POST `body`; (status or None on a connection failure, answer, seconds)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=_BIG_REQUEST_TIMEOUT_S)
    started = time.perf_counter()
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    except (OSError, http.client.HTTPException) as exc:
        return None, str(exc).encode(), time.perf_counter() - started
    finally:
        connection.close()


def _measure(
    case: str,
    server: Server,
    role: str,
    path: str,
    body: bytes,
    *,
    probe: _Probe | None = None,
    concurrent: int = 1,
) -> Measurement:
    """Send `body` to `path` (`concurrent` copies at once) while `probe` (default: /health) runs."""
    probe = probe or _Probe(server.port)
    results: list[tuple[int | None, bytes, float]] = []
    senders = [
        threading.Thread(target=lambda: results.append(_post(server.port, path, body)))
        for _ in range(concurrent)
    ]
    probe.start()
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    probe.stop()
    status, answer, seconds = max(results, key=lambda result: result[2])
    latencies = probe.latencies_ms
    note = "" if status == 200 else _error_message(answer)
    if probe.failures:
        note = f"{probe.failures} probes failed; {note}".rstrip("; ")
    size = f"{len(body) / 1e6:.1f} MB" if len(body) >= 100_000 else f"{len(body) / 1e3:.1f} kB"
    request = f"POST {path} ({size}{f', x{concurrent}' if concurrent > 1 else ''})"
    return Measurement(
        case=case,
        server=role,
        request=request,
        status=status,
        request_s=round(seconds, 3),
        probes=len(latencies),
        p50_ms=round(statistics.median(latencies), 1) if latencies else None,
        max_ms=round(max(latencies), 1) if latencies else None,
        note=note,
    )


def _error_message(answer: bytes) -> str:
    try:
        return str(json.loads(answer)["error"]["message"])[:120]
    except (ValueError, KeyError, TypeError):
        return answer[:120].decode(errors="replace")


# --- the cases: one function each ------------------------------------------------------------------------


def _derender_body(ids: int, stop: list[str] | None = None) -> bytes:
    body: dict[str, Any] = {
        "generate_responses": [
            {
                "choices": [
                    {"index": 0, "finish_reason": "length", "token_ids": [28 + i % 5000 for i in range(ids)]}
                ]
            }
        ]
    }
    if stop is not None:
        body["completion_request"] = {"prompt": "Hi", "stop": stop}
    return dumps(body)


def most_stop_strings(room: int = 0) -> list[str]:
    """Distinct stop strings of `MAX_STOP_CHARACTERS - room` characters in all (the most a request may send),
    none of which the output holds."""
    stops, used = [], 0
    while used + len(f"~{len(stops)}~") <= MAX_STOP_CHARACTERS - room:
        stops.append(f"~{len(stops)}~")
        used += len(stops[-1])
    if used < MAX_STOP_CHARACTERS - room:
        stops.append("~" * (MAX_STOP_CHARACTERS - room - used))
    return stops


def case_derender_many_ids(servers: dict[str, Server]) -> list[Measurement]:
    """`/v1/completions/derender` of 1,000,000 output ids (about 7 MB, inside the body limit)."""
    body = _derender_body(1_000_000)
    return [
        _measure("derender_many_ids", s, role, "/v1/completions/derender", body)
        for role, s in servers.items()
    ]


def case_derender_many_stop_strings(servers: dict[str, Server]) -> list[Measurement]:
    """`/v1/completions/derender` of 2,000 ids with the most stop strings the limit allows."""
    body = _derender_body(2_000, most_stop_strings())
    return [
        _measure("derender_many_stop_strings", s, role, "/v1/completions/derender", body)
        for role, s in servers.items()
    ]


def case_generate_many_stop_strings(servers: dict[str, Server]) -> list[Measurement]:
    """The worker generating 16 tokens with the most stop strings the limit allows (`/v1/completions`)."""
    worker = servers.get("worker")
    if worker is None:
        return []
    body = dumps(
        {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stop": most_stop_strings()}
    )
    return [_measure("generate_many_stop_strings", worker, "worker", "/v1/completions", body)]


def tools(count: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Look something up",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
        for i in range(count)
    ]


def case_render_most_tools(servers: dict[str, Server]) -> list[Measurement]:
    """A chat render with the most tools a request may have (`MAX_TOOLS`, 4096: about 0.6 MB)."""
    body = dumps({"messages": [{"role": "user", "content": "Hi"}], "tools": tools(MAX_TOOLS)})
    return [
        _measure("render_most_tools", s, role, "/v1/chat/completions/render", body)
        for role, s in servers.items()
    ]


def case_render_100000_tools(servers: dict[str, Server]) -> list[Measurement]:
    """A chat render with 100,000 tools (about 15 MB, inside the body limit): over `MAX_TOOLS` now, a 400."""
    body = dumps({"messages": [{"role": "user", "content": "Hi"}], "tools": tools(100_000)})
    return [
        _measure("render_100000_tools", s, role, "/v1/chat/completions/render", body)
        for role, s in servers.items()
    ]


def case_chat_most_tools(servers: dict[str, Server]) -> list[Measurement]:
    """The worker's `/v1/chat/completions` with `MAX_TOOLS` tools: validated and rendered, then longer than the
    model's context (a 400)."""
    worker = servers.get("worker")
    if worker is None:
        return []
    body = dumps(
        {"messages": [{"role": "user", "content": "Hi"}], "tools": tools(MAX_TOOLS), "max_tokens": 4}
    )
    return [_measure("chat_most_tools", worker, "worker", "/v1/chat/completions", body)]


_SLOW_TEMPLATE = (
    "{%- for i in range(1500) %}{%- for j in range(2000) %}{%- endfor %}{%- endfor %}"
    "{%- for message in messages %}{{ message['content'] }}{%- endfor %}"
)


def case_request_templates_delay_render(servers: dict[str, Server]) -> list[Measurement]:
    """A normal chat render (the checkpoint's template), timed while 6 request templates of 3 M loop steps
    each (inside the step bound) render: the probe is that render, not `/health`."""
    renderer = servers.get("renderer")
    if renderer is None:
        return []
    slow = dumps({"messages": [{"role": "user", "content": "Hi"}], "chat_template": _SLOW_TEMPLATE})
    normal = dumps({"messages": [{"role": "user", "content": "What is the capital of France?"}]})
    probe = _Probe(renderer.port, "POST", "/v1/chat/completions/render", normal)
    return [
        _measure(
            "request_templates_delay_render",
            renderer,
            "renderer",
            "/v1/chat/completions/render",
            slow,
            probe=probe,
            concurrent=6,
        )
    ]


class _PeakMemory:
    """The peak resident memory of a server while the block runs, read from /proc every 20 ms."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.bytes = server.memory()["rss_bytes"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.bytes = max(self.bytes, self.server.memory()["rss_bytes"])

    def __enter__(self) -> _PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.bytes = max(self.bytes, self.server.memory()["rss_bytes"])


def case_worker_grammar_and_echo(servers: dict[str, Server]) -> list[Measurement]:
    """The worker's grammar limits (worker/schema_limits.py) and a long echo, on a worker of its own started
    with `--tool-call-parser hermes` and warmed up by one forced call: the largest tool schema the limits
    allow (compiled cold), each schema of issue 17 (now a 400 at once), then `/v1/completions` echoing a
    7,000-id prompt (`max_tokens` 1). Each note adds the worker's peak resident memory over its size before."""
    if "worker" not in servers:
        return []
    import random

    from benchmarks.grammar_schemas import largest_allowed_schema, named_tool_body, over_limit_schemas

    rng = random.Random(17)
    chat = "/v1/chat/completions"
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("grammar_largest_allowed", chat, named_tool_body(largest_allowed_schema(), max_tokens=4))
    ]
    cases += [
        (f"grammar_{name}", chat, named_tool_body(schema)) for name, schema in over_limit_schemas().items()
    ]
    prompt = [rng.randrange(1000, 40000) for _ in range(7000)]
    cases.append(("echo_7000_ids", "/v1/completions", {"prompt": prompt, "max_tokens": 1, "echo": True}))
    with tempfile.TemporaryDirectory(prefix="tokenfront-grammar-") as log_dir:
        model = str(fixtures.ensure_checkpoint("smollm2"))
        worker = launch_tokenfront(
            ["serve", "--model", model, "--tool-call-parser", "hermes", "--device", "cpu"],
            log_dir=Path(log_dir),
            name="worker-hermes",
        )
        try:
            wait_healthy([worker])
            small = named_tool_body({"type": "object", "properties": {"q": {"type": "string"}}})
            # A first generation pages the weights in and compiles a first grammar.
            _post(worker.port, chat, dumps(small))
            measurements = []
            for case, path, body in cases:
                with _PeakMemory(worker) as peak:
                    before = worker.memory()["rss_bytes"]
                    measurement = _measure(case, worker, "worker", path, dumps(body))
                grown = f"RSS +{(peak.bytes - before) / 2**20:.0f} MB of {before / 2**20:.0f} MB"
                measurement.note = f"{measurement.note}; {grown}" if measurement.note else grown
                measurements.append(measurement)
            return measurements
        finally:
            stop_all([worker])


CASES: dict[str, Callable[[dict[str, Server]], list[Measurement]]] = {
    name.removeprefix("case_"): function
    for name, function in sorted(globals().items())
    if name.startswith("case_")
}


# --- the servers and the report -------------------------------------------------------------------------------


# SmolLM2's own template leaves tools out of the prompt; this one writes each into it, so the tool cases
# render what they send.
TOOLS_TEMPLATE = (
    "{%- for tool in tools or [] %}{{ tool | tojson }}\n{% endfor %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def start_servers(roles: list[str], log_dir: Path) -> dict[str, Server]:
    """The renderer, the worker (with render endpoints) and the router in front of it, on SmolLM2."""
    template = log_dir / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    common = ["--model", str(fixtures.ensure_checkpoint("smollm2")), "--chat-template", str(template)]
    started: dict[str, Server] = {}
    try:
        if "renderer" in roles:
            started["renderer"] = launch_tokenfront(
                ["render", *common, "--allow-request-chat-template"], log_dir=log_dir, name="renderer"
            )
        if "worker" in roles or "router" in roles:
            started["worker"] = launch_tokenfront(
                ["serve", *common, "--device", "cpu"],
                log_dir=log_dir,
                env={"TOKENFRONT_ENABLE_RENDER_ENDPOINTS": "1"},
                name="worker",
            )
        wait_healthy(started.values())
        if "router" in roles:
            started["router"] = launch_tokenfront(
                ["route", *common, "--worker", started["worker"].url], log_dir=log_dir, name="router"
            )
            wait_healthy([started["router"]])
        return started
    except BaseException:
        stop_all(started.values())
        raise


def _table(measurements: list[Measurement]) -> str:
    lines = [
        "| case | server | request | status | request s | /health probes | p50 ms | max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in measurements:
        status = f"{m.status}" + (f" ({m.note})" if m.note else "")
        lines.append(
            f"| {m.case} | {m.server} | {m.request} | {status} | {m.request_s} | {m.probes} | {m.p50_ms} | {m.max_ms} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print a Markdown table (or JSON); exit 1 when a probe went over the goal or failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", nargs="*", choices=sorted(CASES), help="run only these cases (default: all)"
    )
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help=f"which servers to run on (default: {','.join(SERVERS)})"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    args = parser.parse_args(argv)
    roles = [role for role in args.servers.split(",") if role]
    unknown = sorted(set(roles) - set(SERVERS))
    if unknown:
        parser.error(f"--servers: unknown {', '.join(unknown)} (choose from {', '.join(SERVERS)})")
    with tempfile.TemporaryDirectory(prefix="tokenfront-health-") as log_dir:
        servers = start_servers(roles, Path(log_dir))
        try:
            chosen = {role: servers[role] for role in roles}
            measurements = []
            for name in args.only or sorted(CASES):
                measured = CASES[name](chosen)
                for measurement in measured:
                    print(f"{measurement.case} on {measurement.server}: done", file=sys.stderr, flush=True)
                measurements.extend(measured)
        finally:
            stop_all(servers.values())
    print(json.dumps([asdict(m) for m in measurements], indent=2) if args.json else _table(measurements))
    over = [m for m in measurements if m.max_ms is None or m.max_ms > GOAL_MS or "probes failed" in m.note]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())

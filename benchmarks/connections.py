"""Bounded connections, measured: the renderer holding many idle connections, and the hostile ones closed.

Starts one `tokenfront render` (one process, Qwen3 fixture, default limits but `--keep-alive-timeout`) on
loopback, stopped by its own pid at the end, and runs four sections against it:

1. `idle`: `--connections` (10,000) keep-alive connections, each opened and sent one `GET /health`, then left
   idle. While they are open: the server's RSS, `/health` latency (fresh connections, one at a time) and a chat
   render's; then how long each stayed open after its request before the server closed it (the keep-alive
   timeout), and the RSS once they are gone.
2. `silent`: as many connections that send nothing: the same figures, the stay measured from the opening (the
   head timeout).
3. `slowloris`: 200 connections trickling a head a byte a second: when each was closed, how many were answered
   408, `/health` meanwhile.
4. `huge-headers`: 8 connections each sending an unterminated 32 MB header value: 431s, RSS before, peak, after.
5. `overhead`: what the bounds cost a request. The same trivial ASGI app (it reads the body and answers a
   17-byte JSON) served by uvicorn with its own httptools protocol and with tokenfront's bounded one, in turns
   (`--rounds` each, alternating), 8 keep-alive connections in a closed loop (`benchmarks.render_http`'s
   client) sending `--overhead-requests` small POSTs: the server's CPU time per request, best round of each.

    python -m benchmarks.connections [--connections 10000] [--keep-alive-timeout 30] [--only SECTION]
                                     [--overhead-requests 20000] [--rounds 3] [--json]

Latencies are as this Python client sees them, on a machine whose other load shares the cores: an upper bound.
Exits non-zero when a check fails (a connection dropped early or never closed, a /health or render not 200,
a hostile connection not answered as it should be).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import resource
import selectors
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.render_http import _http_request as render_request
from benchmarks.render_http import run_client
from benchmarks.servers import HOST, Server, free_port, launch, launch_tokenfront, stop_all, wait_healthy
from tokenfront import fixtures

SECTIONS = ("idle", "silent", "slowloris", "huge-headers", "overhead")
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
CHAT = json.dumps({"messages": [{"role": "user", "content": "What is the capital of France?"}]})
HEADER_TIMEOUT = 10.0  # the renderer's default --header-timeout, which this benchmark keeps


def _rss_mb(server: Server) -> float:
    return server.memory()["rss_bytes"] / 2**20


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] if ordered else float("nan")


def _timed_get(port: int, path: str = "/health", body: str | None = None) -> tuple[int, float]:
    """One request on a fresh connection: its status and seconds."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        if body is None:
            connection.request("GET", path)
        else:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status, time.perf_counter() - start
    finally:
        connection.close()


def _probe(port: int, count: int, path: str = "/health", body: str | None = None) -> dict[str, Any]:
    results = [_timed_get(port, path, body) for _ in range(count)]
    latencies = [seconds * 1000 for _, seconds in results]
    return {
        "count": count,
        "ok": sum(status == 200 for status, _ in results),
        "p50_ms": _percentile(latencies, 0.5),
        "p99_ms": _percentile(latencies, 0.99),
        "max_ms": max(latencies),
    }


class _Prober(threading.Thread):
    """`/health` once every 0.2 s on a fresh connection until stopped (while the server closes connections)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.results: list[tuple[int, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                self.results.append(_timed_get(self.port))
            except OSError:
                self.results.append((0, float("nan")))

    def summary(self) -> dict[str, Any]:
        self.done.set()
        self.join(60)
        latencies = [seconds * 1000 for status, seconds in self.results if status == 200]
        return {
            "count": len(self.results),
            "ok": len(latencies),
            "max_ms": max(latencies) if latencies else float("nan"),
        }


def _read_until_closed(
    sockets: list[socket.socket], timeout: float, *, tick: Callable[[list[socket.socket]], None] | None = None
) -> tuple[dict[socket.socket, float], dict[socket.socket, bytes]]:
    """When the server closed each socket (EOF or reset), up to `timeout` seconds from now, and what it sent on
    each first. `tick`, when given, is called once a second with the sockets still open (a slow client's pace)."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed: dict[socket.socket, float] = {}
    received: dict[socket.socket, bytes] = dict.fromkeys(sockets, b"")
    deadline = time.monotonic() + timeout
    next_tick = time.monotonic()
    while len(closed) < len(sockets) and time.monotonic() < deadline:
        if tick is not None and time.monotonic() >= next_tick:
            tick([sock for sock in sockets if sock not in closed])
            next_tick += 1.0
        wait = (next_tick if tick is not None else deadline) - time.monotonic()
        for key, _ in selector.select(max(0.0, wait)):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""
            if data:
                received[sock] += data
                continue
            closed[sock] = time.monotonic()
            selector.unregister(sock)
    selector.close()
    return closed, received


def _read_responses(sockets: list[socket.socket], timeout: float) -> dict[socket.socket, float]:
    """Read one whole `/health` answer from each socket; when each was complete."""
    selector = selectors.DefaultSelector()
    received: dict[socket.socket, bytes] = {}
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        received[sock] = b""
    answered: dict[socket.socket, float] = {}
    deadline = time.monotonic() + timeout
    while len(answered) < len(sockets) and time.monotonic() < deadline:
        for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            data = sock.recv(65536)
            received[sock] += data
            if not data or received[sock].endswith(b'{"status":"ok"}'):
                selector.unregister(sock)
                if data:
                    answered[sock] = time.monotonic()
    selector.close()
    return answered


def _still_open(sockets: list[socket.socket]) -> int:
    selector = selectors.DefaultSelector()
    for sock in sockets:
        selector.register(sock, selectors.EVENT_READ)
    readable = len(selector.select(0))
    selector.close()
    return len(sockets) - readable


def _stays(opened: dict[socket.socket, float], closed: dict[socket.socket, float]) -> dict[str, float]:
    stays = [closed[sock] - opened[sock] for sock in closed if sock in opened]
    return {
        "closed": len(closed),
        "min_s": min(stays) if stays else float("nan"),
        "median_s": _percentile(stays, 0.5),
        "max_s": max(stays) if stays else float("nan"),
    }


def run_idle(server: Server, args: argparse.Namespace, *, send_request: bool) -> dict[str, Any]:
    """`--connections` connections held open: idle keep-alive ones (after a request) or silent ones."""
    count = args.connections
    rss_before = _rss_mb(server)
    start = time.monotonic()
    sockets = []
    opened: dict[socket.socket, float] = {}
    for _ in range(count):
        sock = socket.create_connection((HOST, server.port), timeout=60)
        if send_request:
            sock.sendall(HEALTH)
        opened[sock] = time.monotonic()
        sockets.append(sock)
    result: dict[str, Any] = {"connections": count, "open_s": time.monotonic() - start}
    if send_request:
        answered = _read_responses(sockets, timeout=120)
        result["answered_200"] = len(answered)
        result["answered_s"] = time.monotonic() - start
        # The stay is counted from each request's sending (the server answers at once; this client reads the
        # answers only once all are open, which would shorten the stays by the time opening them took).
    result["rss_before_mb"] = rss_before
    result["rss_open_mb"] = _rss_mb(server)
    result["health_while_open"] = _probe(server.port, 100)
    result["render_while_open"] = _probe(server.port, 20, "/v1/chat/completions/render", CHAT)
    result["still_open_after_probes"] = _still_open(sockets)
    prober = _Prober(server.port)
    prober.start()
    timeout = args.keep_alive_timeout if send_request else HEADER_TIMEOUT
    closed, _ = _read_until_closed(sockets, timeout + 60)
    result["health_while_closing"] = prober.summary()
    result["stay"] = _stays(opened, closed)
    for sock in sockets:
        sock.close()
    result["rss_after_mb"] = _rss_mb(server)
    result["ok"] = (
        (not send_request or result["answered_200"] == count)
        and result["still_open_after_probes"] == count
        and result["stay"]["closed"] == count
        and result["health_while_open"]["ok"] == 100
        and result["render_while_open"]["ok"] == 20
        and result["health_while_closing"]["ok"] == result["health_while_closing"]["count"]
    )
    return result


def run_slowloris(server: Server, connections: int = 200) -> dict[str, Any]:
    """Connections that trickle a head a byte a second, for as long as the server keeps them."""
    prober = _Prober(server.port)
    prober.start()
    sockets = []
    opened: dict[socket.socket, float] = {}
    for _ in range(connections):
        sock = socket.create_connection((HOST, server.port), timeout=60)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        opened[sock] = time.monotonic()
        sockets.append(sock)

    def one_more_byte(still_open: list[socket.socket]) -> None:
        for sock in still_open:
            with contextlib.suppress(OSError):  # closed meanwhile: its EOF is read next
                sock.send(b"a")

    closed, answers = _read_until_closed(sockets, 120, tick=one_more_byte)
    for sock in sockets:
        sock.close()
    answered_408 = sum(answer.startswith(b"HTTP/1.1 408") for answer in answers.values())
    health = prober.summary()
    result = {
        "connections": connections,
        "answered_408": answered_408,
        "stay": _stays(opened, closed),
        "health": health,
    }
    result["ok"] = answered_408 == connections and health["ok"] == health["count"]
    return result


def run_huge_headers(server: Server, connections: int = 8, megabytes: int = 32) -> dict[str, Any]:
    """Connections each sending an unterminated header value of `megabytes` MB."""
    before = _rss_mb(server)
    answers: list[bytes] = []

    def send() -> None:
        sock = socket.create_connection((HOST, server.port), timeout=60)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Huge: ")
            chunk = b"a" * (1 << 20)
            for _ in range(megabytes):
                sock.sendall(chunk)
        except OSError:
            pass  # the server stopped reading after its limit
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except OSError:
            pass
        answers.append(data)
        sock.close()

    senders = [threading.Thread(target=send) for _ in range(connections)]
    start = time.monotonic()
    for sender in senders:
        sender.start()
    peak = before
    while any(sender.is_alive() for sender in senders):
        peak = max(peak, _rss_mb(server))
        time.sleep(0.01)  # the sampling pace
    answered_431 = sum(answer.startswith(b"HTTP/1.1 431") for answer in answers)
    result = {
        "connections": connections,
        "megabytes_each": megabytes,
        "answered_431": answered_431,
        "seconds": time.monotonic() - start,
        "rss_before_mb": before,
        "rss_peak_mb": peak,
        "rss_after_mb": _rss_mb(server),
    }
    result["ok"] = answered_431 == connections and peak - before < 100
    return result


# A trivial app answering what `run_client` counts as a success, served by either protocol (argv: the
# protocol, the port).
_TRIVIAL_SERVER = """
import sys
import uvicorn
from tokenfront.server.connection_limits import ConnectionLimits
from tokenfront.server.http_protocol import bounded_protocol

async def app(scope, receive, send):
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", b"17")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"token_ids":[1]}'})

http = bounded_protocol(ConnectionLimits()) if sys.argv[1] == "bounded" else "httptools"
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), http=http, loop="uvloop", lifespan="off",
            log_level="warning", access_log=False)
"""


def run_overhead(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Server CPU per request with uvicorn's httptools protocol and with the bounded one, in turns."""
    body = json.dumps({"messages": [{"role": "user", "content": "What is the capital of France? " * 8}]})
    rounds: dict[str, list[dict[str, float]]] = {"uvicorn": [], "bounded": []}
    for round_index in range(args.rounds):
        order = ("uvicorn", "bounded") if round_index % 2 == 0 else ("bounded", "uvicorn")
        for protocol in order:
            port = free_port()
            server = launch(
                f"trivial-{protocol}",
                [sys.executable, "-c", _TRIVIAL_SERVER, protocol, str(port)],
                port=port,
                log_dir=log_dir,
            )
            try:
                wait_healthy([server])
                request = render_request(body.encode(), port)
                run_client(port, [[request]] * 1000, 8)  # warm-up
                cpu_before = server.cpu_seconds()
                run = run_client(port, [[request]] * args.overhead_requests, 8)
                cpu = server.cpu_seconds() - cpu_before
            finally:
                stop_all([server])
            rounds[protocol].append(
                {
                    "failures": len(run.failures),
                    "requests_per_s": len(run.latencies) / run.wall,
                    "server_cpu_us_per_request": cpu / len(run.latencies) * 1e6,
                }
            )
    best = {
        protocol: min(results, key=lambda r: r["server_cpu_us_per_request"])
        for protocol, results in rounds.items()
    }
    result: dict[str, Any] = {
        "requests_per_round": args.overhead_requests,
        "best": best,
        "rounds": rounds,
        "added_cpu_us_per_request": best["bounded"]["server_cpu_us_per_request"]
        - best["uvicorn"]["server_cpu_us_per_request"],
    }
    result["ok"] = all(r["failures"] == 0 for results in rounds.values() for r in results)
    return result


def _print(results: dict[str, Any]) -> None:
    for section, r in results.items():
        if section == "server":
            continue
        print(f"\n## {section}")
        for key, value in r.items():
            shown = json.dumps(value) if isinstance(value, dict) else value
            if isinstance(value, float):
                shown = f"{value:.3f}"
            print(f"- {key}: {shown}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--keep-alive-timeout", type=float, default=30.0)
    parser.add_argument("--only", choices=SECTIONS, action="append")
    parser.add_argument("--overhead-requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = args.connections + 512
    if hard != resource.RLIM_INFINITY and hard < needed:
        parser.error(f"the hard open-file limit ({hard}) is below the {needed} descriptors this needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))

    log_dir = Path(tempfile.mkdtemp(prefix="tokenfront-bench-connections-"))
    qwen3 = str(fixtures.ensure_checkpoint("qwen3"))
    server = launch_tokenfront(
        ["render", "--model", qwen3, "--keep-alive-timeout", str(args.keep_alive_timeout)], log_dir=log_dir
    )
    results: dict[str, Any] = {}
    try:
        wait_healthy([server])
        server.wait_settled()
        results["server"] = {"rss_idle_mb": _rss_mb(server), "log": str(server.log_path)}
        sections = args.only or list(SECTIONS)
        if "idle" in sections:
            results["idle"] = run_idle(server, args, send_request=True)
        if "silent" in sections:
            results["silent"] = run_idle(server, args, send_request=False)
        if "slowloris" in sections:
            results["slowloris"] = run_slowloris(server)
        if "huge-headers" in sections:
            results["huge-headers"] = run_huge_headers(server)
        if "overhead" in sections:
            stop_all([server])  # the two trivial servers are measured alone
            results["overhead"] = run_overhead(args, log_dir)
    finally:
        stop_all([server])
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"renderer idle: {results['server']['rss_idle_mb']:.0f} MB RSS; log {results['server']['log']}")
        _print(results)
    failed = [name for name, r in results.items() if name != "server" and not r["ok"]]
    if failed:
        print(f"checks failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

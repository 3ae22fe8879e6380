"""Bounded connections (issue 17 items 2 and 7), on real servers: a renderer on Qwen3, a worker on SmolLM2 and
a router in front of it, each started with small limits so the cases are quick.

A connection that sends nothing, a head trickled a byte at a time, an unfinished head and a body shorter than
its Content-Length are each closed before a deadline of a few times their timeout (answered 408 where a head
was begun); an idle keep-alive connection is reused, then closed; a head one byte over `--max-header-bytes`
or one line over `--max-headers` is a 431 where one at the limit is served; 8 connections sending 32 MB header
values leave the server's RSS where it was; `/health` answers throughout. Then the connection cap
(`--max-connections`: idle ones reclaimed, a 503 when all are busy), the pre-fork children, the open-file limit
and 10,000 idle connections on a renderer.
"""

from __future__ import annotations

import json
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tokenfront import fixtures

HOST = "127.0.0.1"
TIMEOUT = 1.0  # --header-timeout, --body-timeout and --keep-alive-timeout of the servers under test
DEADLINE = 6 * TIMEOUT  # a connection must be closed this long after the clock it is held to started
MAX_HEADER_BYTES = 8192
MAX_HEADERS = 32
LIMIT_FLAGS = [
    "--header-timeout",
    str(TIMEOUT),
    "--body-timeout",
    str(TIMEOUT),
    "--keep-alive-timeout",
    str(TIMEOUT),
    "--max-header-bytes",
    str(MAX_HEADER_BYTES),
    "--max-headers",
    str(MAX_HEADERS),
]
SERVERS = ("renderer", "worker", "router")
CHAT_ROUTE = {
    "renderer": "/v1/chat/completions/render",
    "worker": "/v1/chat/completions",
    "router": "/v1/chat/completions",
}
CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}


class _Servers:
    """The three servers under test, each started when a test first needs it (the router with its worker)."""

    def __init__(self, launch: Callable[..., Any], log_dir: Any) -> None:
        self.launch = launch
        self.log_dir = log_dir
        self.started: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.started:
            self.started[name] = self._start(name)
        return self.started[name]

    def _start(self, name: str) -> Any:
        if name == "renderer":
            qwen3 = str(fixtures.ensure_checkpoint("qwen3"))
            return self.launch(["render", "--model", qwen3, *LIMIT_FLAGS], log_dir=self.log_dir)
        smollm2 = str(fixtures.ensure_checkpoint("smollm2"))
        if name == "worker":
            return self.launch(
                ["serve", "--model", smollm2, *LIMIT_FLAGS], log_dir=self.log_dir, timeout=240.0
            )
        worker = self["worker"]
        return self.launch(
            ["route", "--model", smollm2, "--worker", worker.url, *LIMIT_FLAGS], log_dir=self.log_dir
        )


@pytest.fixture(scope="module")
def servers(launch: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Servers]:
    started = _Servers(launch, tmp_path_factory.mktemp("connections"))
    try:
        yield started
    finally:
        for server in reversed(list(started.started.values())):
            server.stop()


# -- a raw HTTP/1.1 client: the cases are about bytes on the wire -------------------------------------------


def _connect(url: str) -> socket.socket:
    port = int(url.rsplit(":", 1)[1])
    return socket.create_connection((HOST, port), timeout=30)


def _until_closed(sock: socket.socket, within: float) -> bytes:
    """Everything the server sends until it closes the connection, which it must do within `within` s."""
    deadline = time.monotonic() + within
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"still open {within:g} s later; received {data[:200]!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def _response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a connection that stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole response: {data!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def _error_code(response: bytes) -> str | None:
    error = json.loads(response.partition(b"\r\n\r\n")[2])["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return str(error["code"])


def _is_open(sock: socket.socket) -> bool:
    """Whether the server has neither closed the connection nor sent anything on it (a look, not a wait)."""
    poll = select.poll()  # not select(): descriptors past 1024
    poll.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    return not poll.poll(0)


def _healthy(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=30).status_code == 200


def _handled(url: str, route: str) -> float:
    """Requests to `route` the server's handlers have finished, whatever their status (`/metrics`)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    prefix = f'tokenfront_requests_total{{route="{route}",'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def _wait_until(condition: Callable[[], bool], within: float = DEADLINE) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.05)  # polling pace


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def _head(*lines: bytes) -> bytes:
    return (
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n"
    )


class _Trickle(threading.Thread):
    """A slow-loris client: a head begun, then one more byte every 0.1 s while the connection lasts."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.sock = _connect(url)
        self.sent = 0
        self.sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")

    def run(self) -> None:
        while self.sent < 600:  # a minute of it at most
            try:
                self.sock.send(b"a")
            except OSError:
                return
            self.sent += 1
            time.sleep(0.1)  # the pace of the attack, not a wait for something


# -- every server ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SERVERS)
def test_slow_and_unfinished_requests_are_closed_within_their_timeouts(name: str, servers: _Servers) -> None:
    url, route = servers[name].url, CHAT_ROUTE[name]
    handled_before = _handled(url, route)
    silent = _connect(url)
    unfinished_head = _connect(url)
    unfinished_head.sendall(f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty".encode())
    short_body = _connect(url)
    short_body.sendall(
        f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
        + b"Content-Length: 100\r\n\r\n"
        + json.dumps(CHAT).encode()[:40]
    )
    trickle = _Trickle(url)
    trickle.start()
    assert _healthy(url)  # while all four are held open

    answers = {
        "silent": _until_closed(silent, DEADLINE),
        "unfinished head": _until_closed(unfinished_head, DEADLINE),
        "short body": _until_closed(short_body, DEADLINE),
        "slow loris": _until_closed(trickle.sock, DEADLINE),
    }
    trickle.join(10)
    assert len(answers) == 4
    assert answers["silent"] == b""  # nothing sent, nothing to answer
    for case, code in (
        ("unfinished head", "request_header_timeout"),
        ("short body", "request_body_timeout"),
        ("slow loris", "request_header_timeout"),
    ):
        assert _status(answers[case]) == 408, (case, answers[case][:300])
        assert _error_code(answers[case]) == code, case
    assert trickle.sent >= 5  # bytes kept coming, and the head's deadline held all the same
    # The handler that waited on the short body returned (it was told the client left): the server counts it.
    _wait_until(lambda: _handled(url, route) > handled_before)
    assert _handled(url, route) == handled_before + 1
    assert _healthy(url)
    assert "Traceback" not in servers[name].log()


@pytest.mark.parametrize("name", SERVERS)
def test_keep_alive_connection_is_reused_then_closed_when_idle(name: str, servers: _Servers) -> None:
    url = servers[name].url
    sock = _connect(url)
    for _ in range(2):
        sock.sendall(_head())
        assert _status(_response(sock)) == 200
    assert _until_closed(sock, DEADLINE) == b""  # idle: closed without an answer


@pytest.mark.parametrize("name", SERVERS)
def test_head_size_and_line_limits(name: str, servers: _Servers) -> None:
    url = servers[name].url
    fixed = len(_head(b"X-Pad: "))
    at_the_limit = _head(b"X-Pad: " + b"p" * (MAX_HEADER_BYTES - fixed))
    assert len(at_the_limit) == MAX_HEADER_BYTES
    over_it = _head(b"X-Pad: " + b"p" * (MAX_HEADER_BYTES - fixed + 1))
    lines = [b"X-Line-%d: 1" % index for index in range(MAX_HEADERS - 1)]  # with Host: MAX_HEADERS lines
    cases = [
        (at_the_limit, 200, None),
        (over_it, 431, "request_headers_too_large"),
        (_head(*lines), 200, None),
        (_head(*lines, b"X-One-More: 1"), 431, "too_many_request_headers"),
    ]
    for request, status, code in cases:
        sock = _connect(url)
        sock.sendall(request)
        answer = _response(sock)
        assert _status(answer) == status, (len(request), answer[:300])
        if code is not None:
            assert _error_code(answer) == code
            assert b"connection: close" in answer
            assert _until_closed(sock, DEADLINE) == b""  # and closed after the answer
        sock.close()
    # Pipelined behind a request still being answered, the refusal comes after that answer, not inside it. (A
    # head that arrives in the same read as the request before it is counted from the next read: it is bounded
    # at twice the limit.)
    sock = _connect(url)
    sock.sendall(_head() + _head(b"X-Pad: " + b"p" * 2 * MAX_HEADER_BYTES))
    answers = _until_closed(sock, DEADLINE)
    assert [_status(b"HTTP/1.1 " + part) for part in answers.split(b"HTTP/1.1 ")[1:]] == [200, 431], answers
    assert _healthy(url)


@pytest.mark.parametrize("name", SERVERS)
def test_huge_header_values_leave_memory_bounded(name: str, servers: _Servers) -> None:
    """8 connections each sending an unterminated 32 MB header value: each is a 431, and the server's resident
    memory stays where it was (on main it grew by ~400 MB)."""
    server = servers[name]
    before = _rss(server.process.pid)
    answers: list[bytes] = []

    def send_huge() -> None:
        sock = _connect(server.url)
        chunk = b"a" * (1 << 20)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Huge: ")
            for _ in range(32):
                sock.sendall(chunk)
        except OSError:
            pass  # the server stopped reading: what it would not buffer cannot be sent
        answers.append(_until_closed(sock, DEADLINE))

    senders = [threading.Thread(target=send_huge) for _ in range(8)]
    for sender in senders:
        sender.start()
    peak = before
    while any(sender.is_alive() for sender in senders):
        peak = max(peak, _rss(server.process.pid))
        time.sleep(0.01)  # sampling pace
    assert len(answers) == 8
    assert [_status(answer) for answer in answers] == [431] * 8, [answer[:100] for answer in answers]
    growth = max(peak, _rss(server.process.pid)) - before
    assert growth < 40 * 1024 * 1024, f"RSS grew by {growth / 2**20:.1f} MB"
    assert _healthy(server.url)


def test_router_still_proxies_after_the_hostile_connections(servers: _Servers) -> None:
    """The worker's short keep-alive timeout closes the router's pooled connections: requests still go."""
    for _ in range(2):
        answer = httpx.post(
            f"{servers['router'].url}/v1/chat/completions", json={**CHAT, "max_tokens": 2}, timeout=120
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 2
        time.sleep(2 * TIMEOUT)  # let the worker close the router's idle connection: the point of the test


# -- the connection cap, the pre-fork children, the open-file limit ----------------------------------------


def test_connection_cap_reclaims_idle_connections_then_refuses(
    launch: Callable[..., Any], tmp_path: Any, qwen3: Any
) -> None:
    server = launch(
        [
            "render",
            "--model",
            str(qwen3),
            "--max-connections",
            "4",
            "--header-timeout",
            "60",
            "--body-timeout",
            "2",
        ],
        log_dir=tmp_path,
    )
    try:
        idle = [_connect(server.url) for _ in range(4)]
        newcomer = _connect(server.url)  # the 5th: the longest-waiting idle one makes room
        newcomer.sendall(_head())
        assert _status(_response(newcomer)) == 200
        assert _until_closed(idle[0], DEADLINE) == b""
        assert [_is_open(sock) for sock in idle[1:]] == [True, True, True]

        busy = [*idle[1:], newcomer]  # 4 open: each now gets a request in progress
        for sock in busy:
            sock.sendall(
                b"POST /v1/chat/completions/render HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                b"application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"
            )
            assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"  # the app is reading its body
            sock.sendall(b'{"mess')
        refused = _until_closed(_connect(server.url), DEADLINE)
        assert _status(refused) == 503, refused[:300]
        assert _error_code(refused) == "too_many_connections"

        # The body timeout frees them, and the server answers again.
        answers = [_until_closed(sock, 3 * DEADLINE) for sock in busy]
        assert [_status(answer) for answer in answers] == [408] * 4
        assert _healthy(server.url)
        log = server.log()
        assert log.count("the connection cap (--max-connections 4) is reached") == 1, log[-2000:]
    finally:
        server.stop()


def test_prefork_children_hold_the_same_bounds(launch: Callable[..., Any], tmp_path: Any, qwen3: Any) -> None:
    """`render --workers 2`: each child serves with the same protocol and limits; the open-file limit, lowered
    here for the server's start, is raised to the hard limit in the parent and so in the children."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    try:
        server = launch(
            ["render", "--model", str(qwen3), "--workers", "2", *LIMIT_FLAGS, "--max-connections", "512"],
            log_dir=tmp_path,
        )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        children = _children(server.process.pid)
        assert len(children) == 2
        for pid in (server.process.pid, *children):
            assert _open_file_limit(pid) == (hard, hard)
        # SO_REUSEPORT spreads connections over the children: 12 of each case all on one child is 1 in 2048.
        silent = [_connect(server.url) for _ in range(12)]
        oversized = []
        for _ in range(12):
            sock = _connect(server.url)
            sock.sendall(_head(b"X-Pad: " + b"p" * MAX_HEADER_BYTES))
            oversized.append(sock)
        assert [_until_closed(sock, DEADLINE) for sock in silent] == [b""] * 12
        assert [_status(_until_closed(sock, DEADLINE)) for sock in oversized] == [431] * 12
        assert _healthy(server.url)
    finally:
        server.stop()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as children:
        return [int(child) for child in children.read().split()]


def _open_file_limit(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits", encoding="ascii") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


def test_a_hard_file_limit_below_the_cap_lowers_it_with_one_warning() -> None:
    """A real process whose hard limit is 2000: --max-connections 16384 cannot fit, so the cap is what fits,
    and one warning says how to raise it."""
    script = (
        "import logging, resource; logging.basicConfig(); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2000)); "
        "from tokenfront.server.open_files import fit_open_file_limit; "
        "print(fit_open_file_limit(16384)); print(resource.getrlimit(resource.RLIMIT_NOFILE)); "
        "print(fit_open_file_limit(500))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split("\n")[:3] == ["1000", "(2000, 2000)", "500"]
    assert done.stderr.count("WARNING") == 1, done.stderr
    assert "--max-connections 16384" in done.stderr and "ulimit -Hn" in done.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-header-bytes", "0"),
        ("--max-headers", "-1"),
        ("--header-timeout", "0"),
        ("--body-timeout", "nan"),
        ("--keep-alive-timeout", "soon"),
        ("--max-connections", "0"),
    ],
)
def test_a_bad_connection_flag_is_one_error_line(flag: str, value: str, qwen3: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tokenfront.cli", "render", "--model", str(qwen3), flag, value, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], done.stderr


# -- many idle connections -----------------------------------------------------------------------------------

IDLE_CONNECTIONS = 10_000


@pytest.mark.slow
def test_renderer_serves_with_ten_thousand_idle_connections(
    launch: Callable[..., Any], tmp_path: Any, qwen3: Any
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = IDLE_CONNECTIONS + 256
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the hard open-file limit ({hard}) is below the {needed} this test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    # Timeouts long enough for opening and answering them all on a busy machine: the load is the point here.
    server = launch(
        ["render", "--model", str(qwen3), "--keep-alive-timeout", "600", "--header-timeout", "600"],
        log_dir=tmp_path,
    )
    sockets: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            sockets.append(_connect(server.url))
        for sock in sockets:
            sock.sendall(_head())
        statuses = [_status(_response(sock)) for sock in sockets]
        assert statuses == [200] * IDLE_CONNECTIONS  # each is now an idle keep-alive connection
        assert _healthy(server.url)
        rendered = httpx.post(f"{server.url}/v1/chat/completions/render", json=CHAT, timeout=60)
        assert rendered.status_code == 200
        assert len(rendered.json()["token_ids"]) > 10
        assert sum(_is_open(sock) for sock in sockets) == IDLE_CONNECTIONS  # none was dropped meanwhile
    finally:
        for sock in sockets:
            sock.close()
        server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

"""Membership that follows the fleet, with real parts: a real router, two simulated workers, and a real DNS
server (Debian's dnsmasq, on 127.0.0.1 on a free port, serving a hosts file).

The workers listen on 127.0.0.2 and 127.0.0.3 on one port (Linux routes all of 127/8 to lo), as the pods of a
headless Service do on theirs. A worker added to the file or the DNS name joins within one refresh (healthy in
`/workers`, and a request lands on it); one removed while clients keep sending gets no new request, its
in-flight stream finishes, and no client request fails (nor is retried). The start-up mistakes are one line
and exit 2.

dnsmasq is `apt-get install dnsmasq-base` (`make install-test`); without it the DNS tests are skipped where one
runs them by hand, and fail under CI.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import WORKER_HEADER, Fleet, log_lines, metric, router_command, wait_until
from tokenfront.router.worker_dns import DnsServer, DnsWorkers, WorkerDns, make_resolver
from tokenfront.router.worker_sources import SourceUnavailable

pytestmark = pytest.mark.slow  # real server processes

# Seconds between two reads of a source in these routers; "within one refresh" allows the first check too.
INTERVAL = 0.5
JOIN_DEADLINE = INTERVAL + 4.0
HOSTS = ("127.0.0.2", "127.0.0.3")


def _shared_port() -> int:
    """A port free on every address of HOSTS."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind((HOSTS[0], 0))
            port = int(first.getsockname()[1])
            try:
                with socket.socket() as second:
                    second.bind((HOSTS[1], port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no port free on all of {HOSTS}")


@pytest.fixture(scope="module")
def workers(fleet: Fleet, qwen3: Path) -> list[Any]:
    """Two simulated workers on 127.0.0.2:P and 127.0.0.3:P (a decode step of 8 ms: a request of 24 tokens
    takes about 0.2 s, so requests are in flight when a worker leaves)."""
    port = _shared_port()
    command = ["serve", "--engine", "simulated", "--model", str(qwen3)]
    threads = []
    started: dict[str, Any] = {}
    for host in HOSTS:

        def start(host: str = host) -> None:
            started[host] = fleet.start_on_port(port, *command, host=host)

        threads.append(threading.Thread(target=start))
        threads[-1].start()
    for thread in threads:
        thread.join()
    assert set(started) == set(HOSTS), "a worker did not start"
    return [started[host] for host in HOSTS]


def _router(fleet: Fleet, *flags: str) -> Any:
    """A router without a model (it starts fast; membership is the same), routing round robin."""
    return fleet.start(*router_command(None, [], "--policy", "round_robin", *flags))


def _workers(router: Any) -> dict[str, dict[str, Any]]:
    listing = httpx.get(f"{router.url}/workers", timeout=10).json()["workers"]
    return {item["url"]: item for item in listing}


def _healthy_from(router: Any, url: str, source: str) -> bool:
    item = _workers(router).get(url)
    return item is not None and item["state"] == "healthy" and item["source"] == source


def _served_by(router: Any, count: int) -> list[str]:
    with httpx.Client(base_url=router.url, timeout=60) as client:
        return [_chat(client, index).headers[WORKER_HEADER] for index in range(count)]


def _chat(client: httpx.Client, index: int, *, max_tokens: int = 4) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": f"question {index}"}], "max_tokens": max_tokens}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


@dataclass
class Answered:
    started: float
    worker: str | None
    problem: str | None  # None: a whole answer (a stream ended with [DONE], no error event)


class ClientLoad:
    """Clients sending requests through the router, one after another each, streamed and not, until stopped."""

    def __init__(self, router: Any, clients: int = 3) -> None:
        self.url = router.url
        self.answered: list[Answered] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(n,)) for n in range(clients)]

    def __enter__(self) -> ClientLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _send(self, client_number: int) -> None:
        deadline = time.monotonic() + 90  # bounded, whatever happens to the test
        with httpx.Client(base_url=self.url, timeout=60) as client:
            index = 0
            while not self._stop.is_set() and time.monotonic() < deadline:
                index += 1
                started = time.monotonic()
                body = {
                    "messages": [{"role": "user", "content": f"client {client_number} asks {index}"}],
                    "max_tokens": 24,
                    "stream": index % 2 == 0,
                }
                try:
                    response = client.post("/v1/chat/completions", json=body)
                    problem = _problem(response, streamed=body["stream"])
                    worker = response.headers.get(WORKER_HEADER)
                except httpx.HTTPError as exc:
                    problem, worker = f"{type(exc).__name__}: {exc}", None
                self.answered.append(Answered(started, worker, problem))

    def wait_for(self, count: int) -> None:
        assert wait_until(lambda: len(self.answered) >= count, timeout=60), len(self.answered)


def _problem(response: httpx.Response, *, streamed: bool) -> str | None:
    if response.status_code != 200:
        return f"{response.status_code}: {response.text[:200]}"
    if streamed and (not response.text.rstrip().endswith("data: [DONE]") or '"error"' in response.text):
        return f"the stream did not end well: {response.text[-300:]}"
    return None


class LongStream:
    """One streamed request read slowly in a thread: a request in flight on a worker while it leaves."""

    def __init__(self, router: Any, index: int) -> None:
        self._client = httpx.Client(base_url=router.url, timeout=60)
        body = {
            "messages": [{"role": "user", "content": f"a long answer {index}"}],
            "max_tokens": 300,  # about 2.5 s of decode on the simulated GPU
            "stream": True,
        }
        self._response = self._client.send(
            self._client.build_request("POST", "/v1/chat/completions", json=body), stream=True
        )
        assert self._response.status_code == 200
        self.worker = self._response.headers[WORKER_HEADER]
        self.text = ""
        self._lines = self._response.iter_lines()
        self.text += next(self._lines) + "\n"  # its first event: it is running on the worker

    def finish(self) -> str:
        for line in self._lines:
            self.text += line + "\n"
        self._response.close()
        self._client.close()
        return self.text


def _stream_on(router: Any, worker_url: str) -> LongStream:
    """A long stream that landed on `worker_url` (round robin: within a few tries)."""
    for index in range(6):
        stream = LongStream(router, index)
        if stream.worker == worker_url:
            return stream
        stream.finish()
    raise AssertionError(f"no stream landed on {worker_url}")


def _assert_left_cleanly(router: Any, load: ClientLoad, stream: LongStream, gone: str, since: float) -> None:
    """No client request failed; nothing that started after the worker was gone went to it; its stream
    in flight finished; the router retried nothing on it."""
    failed = [a for a in load.answered if a.problem is not None]
    assert failed == [], failed
    after = [a for a in load.answered if a.started > since]
    assert len(after) >= 6, len(after)
    assert [a for a in after if a.worker == gone] == []
    assert {a.worker for a in load.answered if a.started < since} >= {gone}, "it served before it left"
    text = stream.finish()
    assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text, text[-300:]
    assert '"finish_reason":"length"' in text  # the whole answer (300 tokens), from the worker that left
    assert metric(router.url, "tokenfront_router_retries_total", worker=gone) == 0


# --- the file source -------------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    """Replace the file as an operator should (and as a ConfigMap's mount does): whole, by a rename."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def test_a_worker_added_to_the_file_joins_and_one_removed_leaves_without_a_failed_request(
    fleet: Fleet, workers: list[Any], tmp_path: Path
) -> None:
    a, b = (worker.url for worker in workers)
    listing = tmp_path / "workers.txt"
    _write(listing, f"# the fleet\n{a}\nnot-a-url\n")
    # Debug lines: each read of the file once it is gone says so (what the test waits on, below).
    router = _router(
        fleet,
        "--worker-file",
        str(listing),
        "--worker-source-interval",
        str(INTERVAL),
        "--log-level",
        "debug",
    )
    source = f"file:{listing}"
    try:
        # Read before the router serves: the worker is in, from the file; the bad line said with its number.
        assert _healthy_from(router, a, source), _workers(router)
        assert len(log_lines(router, f"worker file {listing} line 3 skipped: worker URL 'not-a-url'")) == 1
        assert set(_served_by(router, 2)) == {a}

        _write(listing, f"# the fleet\n{a}\n{b}\n")
        written = time.monotonic()
        assert wait_until(lambda: _healthy_from(router, b, source), timeout=JOIN_DEADLINE), _workers(router)
        joined = time.monotonic() - written
        assert joined < JOIN_DEADLINE, joined
        assert set(_served_by(router, 4)) == {a, b}

        with ClientLoad(router) as load:
            load.wait_for(6)
            stream = _stream_on(router, a)
            _write(listing, f"{b}\n")
            assert wait_until(lambda: a not in _workers(router), timeout=JOIN_DEADLINE)
            gone = time.monotonic()
            load.wait_for(len(load.answered) + 9)
        _assert_left_cleanly(router, load, stream, a, gone)
        assert len(log_lines(router, f"worker source {source} no longer lists {a}: removing it")) == 1

        # A file that vanishes keeps the workers it listed, said once.
        listing.unlink()
        # Three more reads that found no file (said at debug level): a repeated warning would show by now.
        unreadable = f"worker source {source} is still unreadable"
        assert wait_until(lambda: len(log_lines(router, unreadable)) >= 3, timeout=JOIN_DEADLINE * 3)
        assert _healthy_from(router, b, source)
        lines = log_lines(router, f"worker source {source}: no such file; keeping its last 1 worker until")
        assert len(lines) == 1, lines
        _write(listing, f"{a}\n{b}\n")
        assert wait_until(lambda: _healthy_from(router, a, source), timeout=JOIN_DEADLINE)
        assert len(log_lines(router, f"worker source {source} can be read again")) == 1
    finally:
        router.stop()


def test_sighup_reads_the_file_at_once(fleet: Fleet, workers: list[Any], tmp_path: Path) -> None:
    a, b = (worker.url for worker in workers)
    listing = tmp_path / "workers.txt"
    _write(listing, f"{a}\n")
    router = _router(fleet, "--worker-file", str(listing), "--worker-source-interval", "3600")
    try:
        assert _healthy_from(router, a, f"file:{listing}")
        _write(listing, f"{a}\n{b}\n")
        router.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: _healthy_from(router, b, f"file:{listing}"), timeout=5), _workers(router)
        assert router.process.poll() is None  # SIGHUP reloads; it does not end the router
        assert len(log_lines(router, "reading the worker sources again (SIGHUP)")) == 1
    finally:
        router.stop()


# --- the DNS source --------------------------------------------------------------------------------------------


def _dnsmasq_binary() -> str:
    found = shutil.which("dnsmasq") or next(
        (path for path in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if os.access(path, os.X_OK)), None
    )
    if found is not None:
        return found
    reason = (
        "dnsmasq is not installed (Debian's dnsmasq-base: apt-get install dnsmasq-base; make install-test)"
    )
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{reason}: under CI the DNS source must be tested")
    pytest.skip(reason)


class Dnsmasq:
    """Debian's dnsmasq on 127.0.0.1, serving the names of a hosts file (`set`), authoritative for the zone
    `test` or not; stopped by its own pid."""

    def __init__(self, folder: Path, *, authoritative: bool) -> None:
        self.hosts = folder / "hosts"
        self.hosts.write_text("")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        zone = (
            ["--auth-zone=test", "--auth-server=ns.test,127.0.0.1"] if authoritative else ["--local=/test/"]
        )
        command = [
            _dnsmasq_binary(),
            "--no-daemon",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            f"--addn-hosts={self.hosts}",
            f"--port={self.port}",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--pid-file",  # none
            f"--user={getpass.getuser()}",  # root keeps root, to read the test's files after a SIGHUP
            *zone,
        ]
        self.log_path = folder / "dnsmasq.log"
        with self.log_path.open("wb") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        self.server = DnsServer("127.0.0.1", self.port)
        assert wait_until(lambda: self._read() is not None, timeout=10), self.log_path.read_text()

    def set(self, name: str, *addresses: str) -> None:
        """`name` has these addresses now (dnsmasq reads its hosts file again on SIGHUP)."""
        self.hosts.write_text("".join(f"{address} {name}\n" for address in addresses))
        self.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: self._read(name) == set(addresses), timeout=10), self.log_path.read_text()

    def _read(self, name: str = "ns.test") -> set[str] | None:
        """The addresses dnsmasq gives `name` now (none: an empty set; None when it does not answer)."""
        if self.process.poll() is not None:
            raise RuntimeError(f"dnsmasq exited:\n{self.log_path.read_text()}")
        source = WorkerDns(DnsWorkers(name, 1), make_resolver(self.server, timeout=1.0))
        try:
            specs = asyncio.run(source.read())
        except SourceUnavailable as exc:
            return set() if "has no address" in str(exc) else None
        return {spec.url.removeprefix("http://").rsplit(":", 1)[0].strip("[]") for spec in specs}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture
def dns_server(tmp_path: Path) -> Iterator[Dnsmasq]:
    server = Dnsmasq(tmp_path, authoritative=True)
    yield server
    server.stop()


def test_a_worker_added_to_the_dns_name_joins_and_one_removed_leaves_without_a_failed_request(
    fleet: Fleet, workers: list[Any], dns_server: Dnsmasq
) -> None:
    a, b = (worker.url for worker in workers)
    port = a.rsplit(":", 1)[1]
    dns_server.set("workers.test", HOSTS[0])
    router = _router(
        fleet,
        "--worker-dns",
        f"workers.test:{port}",
        "--worker-dns-server",
        f"127.0.0.1:{dns_server.port}",
        "--worker-source-interval",
        str(INTERVAL),
        "--log-level",
        "debug",  # each failed read once the DNS server is gone says so (what the test waits on, below)
    )
    source = "dns:workers.test"
    try:
        assert _healthy_from(router, a, source), _workers(router)
        assert set(_served_by(router, 2)) == {a}

        dns_server.set("workers.test", *HOSTS)
        answered = time.monotonic()
        assert wait_until(lambda: _healthy_from(router, b, source), timeout=JOIN_DEADLINE), _workers(router)
        assert time.monotonic() - answered < JOIN_DEADLINE
        assert set(_served_by(router, 4)) == {a, b}

        with ClientLoad(router) as load:
            load.wait_for(6)
            stream = _stream_on(router, a)
            dns_server.set("workers.test", HOSTS[1])
            assert wait_until(lambda: a not in _workers(router), timeout=JOIN_DEADLINE)
            gone = time.monotonic()
            load.wait_for(len(load.answered) + 9)
        _assert_left_cleanly(router, load, stream, a, gone)

        # The name's own server says it has no address (a headless Service scaled to zero): no workers.
        dns_server.set("workers.test")
        assert wait_until(lambda: _workers(router) == {}, timeout=JOIN_DEADLINE), _workers(router)
        dns_server.set("workers.test", HOSTS[1])
        assert wait_until(lambda: _healthy_from(router, b, source), timeout=JOIN_DEADLINE)

        # The DNS server gone: the last workers stay, said once.
        dns_server.stop()
        failing = f"worker source {source}: resolving workers.test"
        assert wait_until(lambda: log_lines(router, failing) != [], timeout=15)
        # Three more reads that failed (said at debug level): a repeated warning would show by now.
        unreadable = f"worker source {source} is still unreadable"
        assert wait_until(lambda: len(log_lines(router, unreadable)) >= 3, timeout=30)
        assert _healthy_from(router, b, source)
        lines = log_lines(router, failing)
        assert len(lines) == 1 and "keeping its last 1 worker until" in lines[0], lines
        assert router.process.poll() is None
    finally:
        router.stop()


def test_no_address_from_a_server_that_is_not_authoritative_is_not_an_empty_fleet(tmp_path: Path) -> None:
    server = Dnsmasq(tmp_path, authoritative=False)
    try:
        source = WorkerDns(DnsWorkers.parse("workers.test:8000"), make_resolver(server.server))
        server.set("workers.test", "127.0.0.2", "::1")
        assert [spec.url for spec in asyncio.run(source.read())] == [
            "http://127.0.0.2:8000",
            "http://[::1]:8000",
        ]
        server.set("workers.test")
        with pytest.raises(SourceUnavailable, match="has no address, and the answer is not authoritative"):
            asyncio.run(source.read())
    finally:
        server.stop()


# --- start-up mistakes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--worker-file", "{missing}"],
            "error: --worker-file {missing}: no such file (give a file of worker specs",
        ),
        (
            ["--worker-dns", "workers.test"],
            "error: argument --worker-dns: 'workers.test': expected NAME:PORT[,protocol=openai|generate]",
        ),
        (
            ["--worker-dns", "workers.test:8000", "--worker-dns-server", "kube-dns"],
            "error: argument --worker-dns-server: 'kube-dns': the DNS server must be an IP address",
        ),
        (
            ["--worker-dns-server", "127.0.0.1"],
            "error: --worker-dns-server is the server --worker-dns asks: give --worker-dns NAME:PORT too",
        ),
    ],
)
def test_worker_source_mistakes_are_one_line_and_exit_2(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    missing = str(tmp_path / "missing.txt")
    command = [sys.executable, "-m", "tokenfront.cli", "route", *(f.format(missing=missing) for f in flags)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(message.format(missing=missing)), lines[0]

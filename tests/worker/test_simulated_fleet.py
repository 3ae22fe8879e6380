"""`tokenfront simulate`: many simulated workers in one process, each the real worker API on its own port; and a
real `tokenfront route` in front of them, routing a repeated prefix to the worker that cached it."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

Fleet = tuple[subprocess.Popen[str], list[str]]
SIMULATE = [sys.executable, "-m", "tokenfront.cli", "simulate"]


def _start_fleet(qwen3: Path, workers: int, log: Path, *extra: str) -> Fleet:
    """Run `tokenfront simulate --workers N --port 0` and read the N base URLs it prints when they all listen."""
    command = [*SIMULATE, "--model", str(qwen3), "--workers", str(workers)]
    command += ["--host", "127.0.0.1", "--port", "0", *extra]
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    urls: queue.Queue[str] = queue.Queue()

    def read_stdout() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            urls.put(line.strip())

    threading.Thread(target=read_stdout, daemon=True).start()
    printed: list[str] = []
    deadline = time.monotonic() + 120
    while len(printed) < workers and time.monotonic() < deadline and process.poll() is None:
        try:
            printed.append(urls.get(timeout=0.5))
        except queue.Empty:
            continue
    if len(printed) < workers:
        process.kill()
        process.wait(timeout=10)
        raise RuntimeError(
            f"the fleet printed {printed} and exited with {process.returncode}:\n{log.read_text()}"
        )
    return process, printed


def _stop(process: subprocess.Popen[str]) -> int:
    """SIGTERM by the fleet's own pid: a graceful shutdown; return its exit code."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    return int(process.returncode)


@pytest.fixture
def fleet_factory(qwen3: Path, tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    started: list[subprocess.Popen[str]] = []

    def start(workers: int, *extra: str) -> Fleet:
        process, urls = _start_fleet(qwen3, workers, tmp_path / f"fleet-{len(started)}.log", *extra)
        started.append(process)
        return process, urls

    yield start
    for process in started:
        _stop(process)


@pytest.mark.slow  # real processes: a fleet (and a router)
def test_eight_workers_each_answer_on_their_own_port(fleet_factory: Callable[..., Fleet]) -> None:
    process, urls = fleet_factory(8)
    assert len(set(urls)) == 8 and all(url.startswith("http://127.0.0.1:") for url in urls)
    digests = set()
    with httpx.Client(timeout=10) as client:
        for url in urls:
            assert client.get(f"{url}/health").json() == {"status": "ok"}
            info = client.get(f"{url}/server_info").json()
            assert (info["role"], info["engine"], info["model"]) == ("worker", "simulated", "qwen3")
            digests.add(info["render_fingerprint"]["digest"])
        assert len(digests) == 1  # one pipeline: every worker renders alike
        assert "libtorch" not in Path(f"/proc/{process.pid}/maps").read_text()
        # Each worker has its own engine and prefix cache: a request to the first leaves the others untouched.
        answer = client.post(
            f"{urls[0]}/v1/completions", json={"prompt": list(range(1000, 1040)), "max_tokens": 2}
        )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
        seqs = [client.get(f"{url}/kv_cache_events").json()["last_seq"] for url in urls]
        assert seqs[0] >= 1 and seqs[1:] == [0] * 7
    assert _stop(process) == 0


def test_ports_in_a_row_and_a_taken_port_is_one_line(qwen3: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*SIMULATE, "--model", str(qwen3), "--workers", "3", "--port", str(port - 1)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: the port is already in use (another server listens on it)"
    ]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenfront.cli",
            "simulate",
            "--model",
            str(qwen3),
            "--workers",
            "10",
            "--port",
            "65530",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "needs ports up to 65539" in result.stderr


@pytest.mark.slow  # real processes: a fleet (and a router)
def test_the_router_sends_a_repeated_prefix_to_the_worker_that_cached_it(
    fleet_factory: Callable[..., Fleet], launch: Callable[..., Any], qwen3: Path, tmp_path: Path
) -> None:
    _, urls = fleet_factory(4)
    workers = [arg for url in urls for arg in ("--worker", url)]
    router = launch(["route", "--model", str(qwen3), "--health-interval", "0.2", *workers], log_dir=tmp_path)
    try:
        with httpx.Client(base_url=router.url, timeout=60) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                listed = client.get("/workers").json()
                healthy = [w for w in listed["workers"] if w["state"] == "healthy"]
                if listed["gate"]["forwarding"] and len(healthy) == 4:
                    break
                time.sleep(0.1)
            else:
                pytest.fail(f"the router never took the 4 workers: {listed}")
            prefixes = [[10_000 + 7 * p + i for i in range(1000)] for p in range(4)]
            served: dict[int, list[str]] = {p: [] for p in range(4)}
            cached: list[int] = []
            for turn in range(3):
                for p, prefix in enumerate(prefixes):
                    suffix = [50_000 + 1000 * p + 100 * turn + i for i in range(100)]
                    response = client.post(
                        "/v1/completions", json={"prompt": prefix + suffix, "max_tokens": 2}
                    )
                    assert response.status_code == 200, response.text
                    served[p].append(response.headers["x-tokenfront-worker"])
                    if turn:
                        cached.append(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    finally:
        router.stop()
    assert len({workers_of[0] for workers_of in served.values()}) == 4  # new prefixes spread over the fleet
    assert all(len(set(workers_of)) == 1 for workers_of in served.values()), served  # repeats follow them
    assert cached == [992] * 8  # 8 repeats compared, each with the prefix's 62 full blocks cached


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.slow  # real processes: a fleet of three
def test_a_fleet_spread_over_processes_serves_every_worker_and_stops_as_one(
    fleet_factory: Callable[..., Fleet],
) -> None:
    process, urls = fleet_factory(5, "--processes", "2")
    assert len(set(urls)) == 5
    children = _children(process.pid)
    assert len(children) == 2  # the parent supervises; each child serves its share on its own event loop
    with httpx.Client(timeout=10) as client:
        for url in urls:
            answer = client.post(
                f"{url}/v1/completions", json={"prompt": list(range(1000, 1040)), "max_tokens": 2}
            )
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
        # Each worker still has its own engine and event log, in whichever process serves it.
        assert all(client.get(f"{url}/kv_cache_events").json()["last_seq"] == 1 for url in urls)
    assert _stop(process) == 0
    assert not any(Path(f"/proc/{child}").exists() for child in children)


@pytest.mark.slow  # real processes: a fleet of three
def test_a_fleet_process_that_dies_stops_the_fleet(
    fleet_factory: Callable[..., Fleet], tmp_path: Path
) -> None:
    process, _ = fleet_factory(4, "--processes", "2")
    first, second = sorted(_children(process.pid))
    # Its workers' caches and logs are gone: the fleet does not replace them behind the routers' backs.
    os.kill(first, signal.SIGKILL)
    assert process.wait(timeout=60) == 1
    assert not Path(f"/proc/{second}").exists()  # stopped, and waited for
    assert (
        "exited (killed by SIGKILL) while serving: stopping the fleet"
        in (tmp_path / "fleet-0.log").read_text()
    )


def test_more_processes_than_workers_is_one_line(qwen3: Path) -> None:
    result = subprocess.run(
        [*SIMULATE, "--model", str(qwen3), "--workers", "2", "--processes", "3", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --processes 3 with --workers 2: each process serves one worker at least"
    ]

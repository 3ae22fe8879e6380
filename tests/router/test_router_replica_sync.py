"""Router replicas sharing their in-flight load (`--replica-sync-bind`, `--replica-peer`), with real parts: two
real router processes over ZMQ on loopback, in front of two simulated workers.

A request one replica sends is counted by the other in that worker's `peer_requests` and its policy's load, so
the other replica sends its own requests elsewhere; the count ends with the request, and with the replica when
it dies (its messages stop: its requests end after the peer timeout).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import WORKER_HEADER, Fleet, router_command, wait_until

# A simulated decode step of 8 ms a token: 600 tokens keep a stream in flight for about 5 s.
LONG = 600


@pytest.fixture(scope="module")
def sim_workers(fleet: Fleet, qwen3: Path) -> list[Any]:
    command = ["serve", "--engine", "simulated", "--model", str(qwen3)]
    return fleet.start_many(command, command)


@pytest.fixture
def replicas(
    fleet: Fleet, qwen3: Path, sim_workers: list[Any], pick_port: Callable[[], int]
) -> Iterator[list[Any]]:
    """Two routers (load_balancing: the fewest requests in flight wins) given the same peer list, each
    naming itself too."""
    endpoints = [f"tcp://127.0.0.1:{pick_port()}" for _ in range(2)]
    peers = [arg for endpoint in endpoints for arg in ("--replica-peer", endpoint)]
    urls = [worker.url for worker in sim_workers]
    routers = fleet.start_many(
        *(
            router_command(qwen3, urls, "--policy", "load_balancing", "--replica-sync-bind", endpoint, *peers)
            for endpoint in endpoints
        )
    )
    for router in routers:  # each hears the other (ZMQ connects in the background)
        assert wait_until(lambda router=router: len(_sync(router)["heard"]) == 1, timeout=30), _sync(router)
    yield routers
    for router in routers:
        router.stop()


def _model(router: Any) -> str:
    return str(httpx.get(f"{router.url}/v1/models", timeout=10).json()["data"][0]["id"])


def _sync(router: Any) -> dict[str, Any]:
    return httpx.get(f"{router.url}/server_info", timeout=10).json()["replica_sync"]


def _peer_requests(router: Any) -> dict[str, int]:
    listed = httpx.get(f"{router.url}/workers", timeout=10).json()["workers"]
    return {worker["url"]: worker["peer_requests"] for worker in listed}


def _long_stream(router: Any, landed: dict[str, str], done: threading.Event) -> threading.Thread:
    """A streamed completion of LONG tokens through `router`, in a thread; `landed["worker"]` says where."""

    def run() -> None:
        body = {"model": _model(router), "prompt": "count to a thousand", "max_tokens": LONG, "stream": True}
        body["ignore_eos"] = True
        try:
            with httpx.stream("POST", f"{router.url}/v1/completions", json=body, timeout=60) as answer:
                landed["worker"] = answer.headers.get(WORKER_HEADER, "")
                landed["status"] = str(answer.status_code)
                for _ in answer.iter_lines():
                    pass
        except httpx.HTTPError as exc:
            landed["error"] = repr(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _short(router: Any) -> str:
    answer = httpx.post(
        f"{router.url}/v1/completions",
        json={"model": _model(router), "prompt": "hello", "max_tokens": 2},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer.headers[WORKER_HEADER]


def test_a_worker_loaded_by_one_replica_is_seen_loaded_by_the_other(replicas: list[Any]) -> None:
    first, second = replicas
    landed: dict[str, str] = {}
    done = threading.Event()
    thread = _long_stream(first, landed, done)
    assert wait_until(lambda: "worker" in landed, timeout=30), landed
    busy = landed["worker"]
    # The second replica counts the first's stream on that worker, and on no other.
    assert wait_until(lambda: _peer_requests(second).get(busy) == 1, timeout=10), (
        _peer_requests(second),
        landed,
        done.is_set(),
        _sync(second),
        _sync(first),
    )
    assert sorted(_peer_requests(second).values()) == [0, 1]
    assert _peer_requests(first) == dict.fromkeys(_peer_requests(first), 0)  # its own are not peers'
    # So the second replica's own requests go to the other worker, every one of them while the stream runs.
    chosen = [_short(second) for _ in range(6)]
    assert not done.is_set(), "the long stream ended before the check: make LONG longer"
    assert busy not in chosen and len(set(chosen)) == 1, chosen
    thread.join(timeout=60)
    assert landed.get("status") == "200" and "error" not in landed, landed
    assert wait_until(lambda: set(_peer_requests(second).values()) == {0}, timeout=10), _peer_requests(second)
    sync = _sync(first)
    assert sync["sent"] >= 3 and sync["dropped"] == 0 and sync["malformed"] == 0, sync


def test_a_replica_that_dies_takes_its_load_with_it(replicas: list[Any]) -> None:
    first, second = replicas
    landed: dict[str, str] = {}
    done = threading.Event()
    _long_stream(first, landed, done)
    assert wait_until(lambda: "worker" in landed, timeout=30), landed
    assert wait_until(lambda: _peer_requests(second).get(landed["worker"]) == 1, timeout=10)
    first.process.send_signal(signal.SIGKILL)  # no goodbye: its messages just stop
    first.process.wait(timeout=10)
    # The peer timeout (5 s) passes without a beat: its requests end, and it is no longer heard.
    assert wait_until(lambda: set(_peer_requests(second).values()) == {0}, timeout=15), _peer_requests(second)
    assert wait_until(lambda: _sync(second)["heard"] == {}, timeout=5), _sync(second)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--replica-peer", "tcp://127.0.0.1:5600"], "--replica-peer needs --replica-sync-bind"),
        (["--replica-sync-bind", "http://127.0.0.1:5600"], "--replica-sync-bind http://127.0.0.1:5600: give"),
        (
            ["--replica-sync-bind", "tcp://127.0.0.1:5600", "--replica-peer", "127.0.0.1:5601"],
            "--replica-peer '127.0.0.1:5601': expected tcp://HOST:PORT (or ipc://PATH)",
        ),
    ],
)
def test_replica_sync_mistakes_are_one_line_at_start_up(flags: list[str], message: str) -> None:
    command = [sys.executable, "-m", "tokenfront.cli", "route", "--port", "0", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_a_sync_address_already_bound_is_one_line(
    qwen3: Path, pick_port: Callable[[], int], tmp_path: Path
) -> None:
    import zmq

    context = zmq.Context()
    taken = context.socket(zmq.PUB)
    endpoint = f"tcp://127.0.0.1:{pick_port()}"
    taken.bind(endpoint)
    try:
        command = [
            sys.executable,
            "-m",
            "tokenfront.cli",
            "route",
            "--port",
            "0",
            "--replica-sync-bind",
            endpoint,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
        context.term()
    assert done.returncode == 2, done
    errors = [line for line in done.stderr.splitlines() if "Traceback" in line or line.startswith("error:")]
    assert errors == [
        f"error: --replica-sync-bind {endpoint}: cannot bind it (Address already in use (addr='{endpoint}'))"
    ], done.stderr

"""Workers that fail: killed with SIGKILL under load (no client request fails, the router stops sending to it
and sends again once a worker answers on its address), back with another fingerprint (the gate notices), or
hung (its requests are retried elsewhere once its health check times out).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import (
    GATE_WARNING,
    WORKER_HEADER,
    Fleet,
    forwarded,
    log_lines,
    metric,
    router_command,
    wait_until,
    words,
)

pytestmark = pytest.mark.slow  # real server processes

REQUESTS = 48
CLIENTS = 8
KILL_AFTER = 12  # answered requests before the kill


@pytest.fixture(scope="module")
def workers(fleet: Fleet, tiny_random: Path) -> list[Any]:
    return fleet.start_many(*(["serve", "--model", str(tiny_random)] for _ in range(3)))


@pytest.fixture(scope="module")
def router(fleet: Fleet, tiny_random: Path, workers: list[Any]) -> Any:
    # round_robin: every worker gets its share of the load, so the victim surely has requests in flight.
    return fleet.start(*router_command(tiny_random, [w.url for w in workers], "--policy", "round_robin"))


@pytest.fixture(scope="module")
def client(router: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router.url, timeout=120.0) as http:
        yield http


def _ask(client: httpx.Client, seed: int) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": words(seed, 30)}], "max_tokens": 48, "temperature": 0}
    return client.post("/v1/chat/completions", json=body)


def _state(client: httpx.Client, url: str) -> dict[str, Any]:
    return next(item for item in client.get("/workers").json()["workers"] if item["url"] == url)


def test_router_survives_a_worker_killed_under_load(
    client: httpx.Client, router: Any, workers: list[Any], fleet: Fleet, tiny_random: Path
) -> None:
    victim = workers[1]
    answered = threading.Semaphore(0)

    def ask(seed: int) -> httpx.Response:
        response = _ask(client, seed)
        answered.release()
        return response

    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(ask, seed) for seed in range(REQUESTS)]
        for _ in range(KILL_AFTER):
            answered.acquire(timeout=120)
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=10)
        responses = [future.result() for future in futures]

    failed = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 200]
    assert failed == [], failed
    served_by = [r.headers[WORKER_HEADER] for r in responses]
    assert {w.url for w in workers} == set(served_by), "every worker served before the kill"
    # Requests in flight on the victim were answered by another worker.
    assert metric(router.url, "tokenfront_router_retries_total", worker=victim.url) >= 1

    # Out of the active set; nothing more goes to it.
    assert wait_until(lambda: _state(client, victim.url)["state"] == "unhealthy", timeout=10)
    routed = _state(client, victim.url)["routed"]
    after = [_ask(client, 1000 + seed) for seed in range(6)]
    assert all(r.status_code == 200 and r.headers[WORKER_HEADER] != victim.url for r in after)
    assert _state(client, victim.url)["routed"] == routed

    # A worker answers on its address again: back in, and routed to.
    port = urlsplit(victim.url).port
    assert port is not None
    fleet.start_on_port(port, "serve", "--model", str(tiny_random))
    assert wait_until(lambda: _state(client, victim.url)["state"] == "healthy", timeout=30)
    again = [_ask(client, 2000 + seed) for seed in range(3)]
    assert all(r.status_code == 200 for r in again)
    assert victim.url in {r.headers[WORKER_HEADER] for r in again}


def test_router_rechecks_a_worker_that_comes_back_changed(
    client: httpx.Client, router: Any, workers: list[Any], fleet: Fleet, tiny_random: Path
) -> None:
    victim = workers[1]
    assert forwarded(_ask(client, 3000))
    assert log_lines(router, GATE_WARNING) == []
    fleet.running(victim.url).stop()
    port = urlsplit(victim.url).port
    assert port is not None
    template = (tiny_random / "chat_template.jinja").read_text().replace("helpful AI", "helpful")
    fleet.start_on_port(port, "serve", "--model", str(tiny_random), "--chat-template", template)
    # Same address, another fingerprint: the periodic /server_info check re-evaluates the gate.
    assert wait_until(lambda: len(log_lines(router, GATE_WARNING)) == 1, timeout=30)
    (warning,) = log_lines(router, GATE_WARNING)
    assert f"{victim.url}: chat template differs" in warning
    responses = [_ask(client, 3100 + seed) for seed in range(3)]
    assert all(r.status_code == 200 and not forwarded(r) for r in responses)
    assert victim.url in {r.headers[WORKER_HEADER] for r in responses}


def test_router_retries_the_requests_of_a_worker_that_hangs(
    fleet: Fleet, tiny_random: Path, workers: list[Any]
) -> None:
    frozen, alive = workers[0], workers[2]
    command = router_command(tiny_random, [frozen.url, alive.url], "--policy", "round_robin")
    router = fleet.start(*command, "--health-timeout", "1")
    os.kill(frozen.process.pid, signal.SIGSTOP)  # it keeps its connections open but answers nothing
    try:
        with httpx.Client(base_url=router.url, timeout=120.0) as client:
            started = time.monotonic()
            with ThreadPoolExecutor(4) as pool:
                responses = list(pool.map(lambda seed: _ask(client, 4000 + seed), range(4)))
            elapsed = time.monotonic() - started
            state = _state(client, frozen.url)
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    assert [r.status_code for r in responses] == [200] * 4
    assert {r.headers[WORKER_HEADER] for r in responses} == {alive.url}
    # Retried once its health check timed out, long before the 600 s request timeout.
    assert elapsed < 30, elapsed
    assert state["state"] == "unhealthy" and "/health unreachable (ReadTimeout" in state["problem"]
    assert metric(router.url, "tokenfront_router_retries_total", worker=frozen.url) >= 1

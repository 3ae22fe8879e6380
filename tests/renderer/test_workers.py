"""`tokenfront render --workers N`: several real processes on one port, one /metrics view, restarts, shutdown."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions/render"


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found.update(int(child) for child in handle.read().split())
    return found


def _counter(metrics: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    total = 0.0
    for line in metrics.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            total += float(match.group(2))
    return total


def _render(url: str, index: int) -> list[int]:
    # A fresh connection per request, so the kernel hands requests to both processes.
    body = {"messages": [{"role": "user", "content": f"request number {index}"}]}
    response = httpx.post(url + CHAT, json=body, timeout=30)
    assert response.status_code == 200, response.text
    return list(response.json()["token_ids"])


def test_two_worker_processes_share_the_port_and_one_metrics_view(
    server_factory: Callable[..., Any], qwen3: Path
) -> None:
    server = server_factory("render", "--model", str(qwen3), "--workers", "2")
    children = _children(server.process.pid)
    assert len(children) == 2, children
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: _render(server.url, i), range(60)))
    single = _render(server.url, 7)
    assert answers[7] == single  # same ids whichever process answered
    metrics = httpx.get(server.url + "/metrics").text
    # 61 renders, counted by whichever process answered, summed over both by whichever answers /metrics.
    assert _counter(metrics, "tokenfront_rendered_prompts_total", kind="chat") == 61
    assert _counter(metrics, "tokenfront_requests_total", route=CHAT, status="200") == 61
    # Both processes answered some (each wrote its own metrics file).
    directory = _metrics_dir(server.log())
    assert len([name for name in os.listdir(directory) if name.startswith("counter_")]) >= 2

    assert server.stop() == 0, server.log()
    assert not any(os.path.exists(f"/proc/{child}") for child in children)
    assert not os.path.exists(directory)  # the shared metrics files are removed with the server
    assert "Traceback" not in server.log()


def test_a_dead_worker_process_is_replaced(server_factory: Callable[..., Any], qwen3: Path) -> None:
    server = server_factory("render", "--model", str(qwen3), "--workers", "2")
    victim = min(_children(server.process.pid))
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = _children(server.process.pid)
        if len(children) == 2 and victim not in children:
            break
        time.sleep(0.05)
    assert len(children) == 2 and victim not in children, children
    assert all(len(_render(server.url, i)) > 5 for i in range(10))
    assert "exited (killed by SIGKILL)" in server.log()
    assert server.stop() == 0


def test_workers_must_be_positive(server_factory: Callable[..., Any], qwen3: Path) -> None:
    with pytest.raises(RuntimeError, match="must be at least 1"):
        server_factory("render", "--model", str(qwen3), "--workers", "0")


def _metrics_dir(log: str) -> str:
    match = re.search(r"metrics of the worker processes are kept in (\S+)", log)
    assert match, log
    return match.group(1)

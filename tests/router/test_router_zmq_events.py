"""The router reads tokenfront workers' KV events from ZMQ (`serve --kv-events-endpoint`), with the reader it uses
for vLLM workers (`URL,kv-events=...,kv-replay=...`), and routes by them: a conversation a worker cached from a
client that never went through the router is sent back to that worker, known only from its ZMQ events."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import WORKER_HEADER, Fleet, chat, router_command, wait_until, words

pytestmark = pytest.mark.slow  # real server processes


def _sample(url: str, name: str, **labels: str) -> float | None:
    """One sample of a server's /metrics, None when it is not there."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10.0).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


@pytest.fixture(scope="module")
def workers(fleet: Fleet, qwen3: Path, pick_port: Callable[[], int]) -> list[tuple[Any, str]]:
    """Two simulated workers, each publishing on ZMQ; (server, its --worker spec for the router)."""
    commands, specs = [], []
    for _ in range(2):
        endpoint, replay = f"tcp://127.0.0.1:{pick_port()}", f"tcp://127.0.0.1:{pick_port()}"
        commands.append(
            [
                "serve",
                "--engine",
                "simulated",
                "--model",
                str(qwen3),
                "--kv-events-endpoint",
                endpoint,
                "--kv-events-replay-endpoint",
                replay,
            ]
        )
        specs.append(f"kv-events={endpoint},kv-replay={replay}")
    servers = fleet.start_many(*commands)
    return [(server, f"{server.url},{spec}") for server, spec in zip(servers, specs, strict=True)]


def test_the_router_routes_by_a_tokenfront_workers_zmq_events(
    fleet: Fleet, qwen3: Path, workers: list[tuple[Any, str]]
) -> None:
    router = fleet.start(*router_command(qwen3, [spec for _, spec in workers], "--policy", "kv_cache_aware"))
    with httpx.Client(base_url=router.url, timeout=60.0) as client:
        listed = {item["url"]: item for item in client.get("/workers").json()["workers"]}
        for server, spec in workers:
            assert listed[server.url]["kv_events"] == "vllm-zmq:" + spec.split("kv-events=")[1].split(",")[0]
        assert wait_until(
            lambda: all(item["state"] == "healthy" for item in client.get("/workers").json()["workers"])
        )
        for seed, (server, _) in enumerate(workers):
            messages = [{"role": "user", "content": words(700 + seed, 300)}]
            # The worker caches the conversation from a client that bypasses the router.
            with httpx.Client(base_url=server.url, timeout=60.0) as direct:
                warmed = direct.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
            assert warmed.status_code == 200, warmed.text
            warmed_at = time.monotonic()

            def applied_since_warm(url: str = server.url, since: float = warmed_at) -> bool:
                age = _sample(router.url, "tokenfront_router_kv_events_age_seconds", worker=url, feed="zmq")
                return age is not None and age < time.monotonic() - since

            assert wait_until(applied_since_warm, timeout=20), router.log()[-2000:]
            routed = chat(client, messages, max_tokens=2)
            assert routed.headers[WORKER_HEADER] == server.url
            cached = routed.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= 16 * ((warmed.json()["usage"]["prompt_tokens"] - 1) // 16), routed.json()[
                "usage"
            ]
    # Only ZMQ fed the index: the HTTP event log was never polled.
    for server, _ in workers:
        assert (
            _sample(router.url, "tokenfront_router_kv_events_age_seconds", worker=server.url, feed="http")
            is None
        )

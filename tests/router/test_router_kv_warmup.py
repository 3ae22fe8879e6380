"""A router started after its workers' event history was cut is warm before it serves (issue 21, item 2):
`tokenfront simulate` workers keeping 4 events (`--kv-events-history`), their caches filled by a client that
never went through a router, then a fresh `tokenfront route`: at its first `/health` its index holds every
block each worker holds, from the workers' snapshots; and a worker whose events cannot be read holds the
router back only until `--kv-warmup-timeout`, said in its log."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from benchmarks.servers import Server, free_port, launch, wait_for_urls

from conftest import PlainOpenAIServer, router_command
from tokenfront.core.kv_blocks import KV_CACHE_HASH

pytestmark = pytest.mark.slow  # real processes: a simulated fleet and routers

HISTORY = 4  # events each worker's log keeps: far fewer than the requests below write


@pytest.fixture(scope="module")
def simulated(qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Three simulated workers, each cache filled with eight prompts sent straight to it (two branches off
    one shared prefix each time); their URLs."""
    logs = tmp_path_factory.mktemp("warmup-fleet")
    command = [sys.executable, "-m", "tokenfront.cli", "simulate", "--model", str(qwen3), "--workers", "3"]
    command += ["--host", "127.0.0.1", "--port", "0", "--kv-events-history", str(HISTORY)]
    fleet = launch("simulate", command, port=0, log_dir=logs)
    try:
        urls = [f"http://127.0.0.1:{port}" for port in wait_for_urls(fleet, 3, timeout=120)]
        with httpx.Client(timeout=60) as client:
            for number, url in enumerate(urls):
                shared = list(range(1000 + number * 10_000, 1000 + number * 10_000 + 320))
                for turn in range(8):
                    prompt = shared + list(range(50_000 + turn * 500, 50_000 + turn * 500 + 40 + 16 * turn))
                    answer = client.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 2})
                    assert answer.status_code == 200, answer.text
        yield urls
    finally:
        fleet.stop()


def held_by(url: str) -> dict[str, Any]:
    """What a worker says of its cache to a reader from before its history: truncated, and its snapshot."""
    answer = httpx.get(f"{url}/kv_cache_events", params={"after": 0}, timeout=10).json()
    assert answer["truncated"] and answer["events"] == [] and answer["last_seq"] > HISTORY
    return answer


def start_router(
    qwen3: Path, urls: list[str], logs: Path, *extra: str
) -> tuple[Server, float, dict[str, Any]]:
    """A router on the workers; (it, seconds from launch to its first /health 200, its /server_info then)."""
    port = free_port()
    command = [sys.executable, "-m", "tokenfront.cli", *router_command(qwen3, urls, *extra)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    router = launch("route", command, port=port, log_dir=logs)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert router.process.poll() is None, router.log_tail()
        try:
            if httpx.get(f"{router.url}/health", timeout=1).status_code == 200:
                ready = time.monotonic() - router.launched_at
                return router, ready, httpx.get(f"{router.url}/server_info", timeout=10).json()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    router.stop()
    raise AssertionError(f"the router did not answer /health in 120 s:\n{router.log_tail()}")


def test_a_fresh_router_knows_every_workers_blocks_when_it_first_answers(
    qwen3: Path, simulated: list[str], tmp_path: Path
) -> None:
    held = {url: held_by(url) for url in simulated}
    assert all(answer["snapshot_blocks"] > 30 for answer in held.values())
    router, _, info = start_router(qwen3, simulated, tmp_path)
    try:
        # At its first answer, before any request went through it: every block of every worker, confirmed.
        index = info["kv_index"]["workers"]
        for url, answer in held.items():
            assert index[url]["confirmed_blocks"] == index[url]["blocks"] == answer["snapshot_blocks"]
            assert index[url]["event_cursor"] == answer["last_seq"]
            assert index[url]["log_id"] == answer["log_id"]
        warmup = info["kv_warmup"]
        assert warmup["complete"] and (warmup["workers"], warmup["read"], warmup["snapshots"]) == (3, 3, 3)
        assert warmup["blocks"] == sum(answer["snapshot_blocks"] for answer in held.values())
        # Ready only after: the warm-up's line comes before the router says it is ready.
        text = router.log_path.read_text()
        read_line = text.index("KV events of 3 workers read")
        assert read_line < text.index("router ready:") < text.index("Application startup complete")
        # A prompt a worker holds is routed back to it, now, from what the snapshot said.
        shared = list(range(1000 + 10_000, 1000 + 10_000 + 320))
        answer = httpx.post(
            f"{router.url}/v1/completions", json={"prompt": shared, "max_tokens": 1}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-tokenfront-worker"] == simulated[1]
        assert answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 304
    finally:
        router.stop()


def test_a_worker_whose_events_cannot_be_read_holds_the_router_back_until_the_deadline(
    qwen3: Path, simulated: list[str], tmp_path: Path
) -> None:
    # A stand-in that says it is a tokenfront worker publishing KV events, and answers 404 on /kv_cache_events.
    info = {"role": "worker", "model": "qwen3", "tokens_per_block": 16, "kv_cache_hash": KV_CACHE_HASH}
    stand_in = PlainOpenAIServer(server_info=info)
    try:
        router, ready, server_info = start_router(
            qwen3, [*simulated, stand_in.url], tmp_path, "--kv-warmup-timeout", "3"
        )
        try:
            assert ready >= 3
            warmup = server_info["kv_warmup"]
            assert not warmup["complete"] and warmup["pending"] == [stand_in.url]
            assert (warmup["workers"], warmup["read"]) == (4, 3)
            lines = router.log_path.read_text().splitlines()
            [warning] = [line for line in lines if "not read within --kv-warmup-timeout 3s" in line]
            assert "1 of 4 workers" in warning and stand_in.url in warning
            index = server_info["kv_index"]["workers"]
            assert all(index[url]["confirmed_blocks"] > 30 for url in simulated)  # the others were read
        finally:
            router.stop()
    finally:
        stand_in.close()

"""`tokenfront serve --engine simulated` end to end: a real worker process on Qwen3's tokenizer files (no weights,
no torch) answering chat and completions, streamed and not, publishing its cached blocks on /kv_cache_events,
reporting shared prefixes in `usage`, and counting the modelled prefill time on /metrics; and the start-up
mistakes of the simulated engine, each one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.worker.engines.simulated import SimulatedGpu

SPEEDUP = 20.0  # the modelled durations on /metrics are GPU seconds whatever the clock runs at
GPU = SimulatedGpu(speedup=SPEEDUP)
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def server(module_servers: Callable[..., Any], qwen3: Path) -> Any:
    return module_servers(
        "serve", "--engine", "simulated", "--model", str(qwen3), "--sim-speedup", str(SPEEDUP)
    )


@pytest.fixture(scope="module")
def worker(server: Any, connect: Callable[[Any], Any]) -> Any:
    return connect(server)


def _ids(start: int, count: int) -> list[int]:
    """Ordinary Qwen3 token ids (below its special tokens at 151643)."""
    return [1000 + (start + i) % 100_000 for i in range(count)]


@pytest.mark.slow  # the module's simulated worker takes its seconds to start
def test_it_serves_as_a_simulated_worker_without_torch(server: Any, worker: Any) -> None:
    info = worker.get("/server_info").json()
    assert (info["role"], info["engine"], info["device"]) == ("worker", "simulated", "simulated-gpu")
    assert info["kv_cache_max_tokens"] == GPU.kv_cache_tokens and info["max_batch_size"] == GPU.max_batch_size
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "libtorch" not in maps


@pytest.mark.slow  # the module's simulated worker takes its seconds to start
def test_chat_whole_and_streamed(worker: Any) -> None:
    body = {
        "messages": [{"role": "user", "content": "Name three rivers."}],
        "max_tokens": 12,
        "temperature": 0,
    }
    answer = worker.post("/v1/chat/completions", json=body).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] == 12
    events = worker.sse("/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-2] if e["choices"])
    assert text == choice["message"]["content"]  # greedy: the same prompt, the same answer
    usage = events[-2]["usage"]
    assert usage["prompt_tokens"] == answer["usage"]["prompt_tokens"] and usage["completion_tokens"] == 12
    # The second time, the prompt's full blocks came from the prefix cache.
    assert usage["prompt_tokens_details"]["cached_tokens"] == (usage["prompt_tokens"] - 1) // 16 * 16


@pytest.mark.slow  # the module's simulated worker takes its seconds to start
def test_completions_of_ids_whole_and_streamed(worker: Any) -> None:
    body = {"prompt": _ids(0, 40), "max_tokens": 5, "temperature": 0}
    answer = worker.post(COMPLETIONS, json=body).json()
    assert answer["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 5,
        "total_tokens": 45,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    events = worker.sse(
        COMPLETIONS, {**body, "prompt": [*_ids(0, 40), 5], "stream_options": {"include_usage": True}}
    )
    assert events[-1] == "[DONE]" and events[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert [e["choices"][0]["finish_reason"] for e in events[:-2] if e["choices"]][-1] == "length"


@pytest.mark.slow  # the module's simulated worker takes its seconds to start
def test_kv_events_and_cached_tokens_follow_the_shared_blocks(worker: Any) -> None:
    last = worker.get("/kv_cache_events", params={"after": 0, "limit": 1}).json()["last_seq"]
    shared = _ids(5000, 100)
    first = shared + _ids(9000, 50)
    second = shared + _ids(7000, 60)
    one = worker.post(COMPLETIONS, json={"prompt": first, "max_tokens": 4, "temperature": 0}).json()
    assert one["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    events = worker.get("/kv_cache_events", params={"after": last}).json()["events"]
    stored = [h for event in events if event["type"] == "stored" for h in event["block_hashes"]]
    assert stored[:9] == block_hashes(first, 16)  # the prompt's 9 full blocks, named as a router names them
    two = worker.post(COMPLETIONS, json={"prompt": second, "max_tokens": 4, "temperature": 0}).json()
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == 96  # 6 full blocks of the 100 shared ids


@pytest.mark.slow  # the module's simulated worker takes its seconds to start
def test_the_modelled_prefill_time_grows_with_the_uncached_tokens(worker: Any) -> None:
    """Sequential requests, each alone on the modelled GPU: the engine's prefill seconds on /metrics grow by
    exactly what the model gives for its uncached tokens."""
    deltas = []
    cases = [
        (_ids(20_000, 300), 0),
        (_ids(30_000, 3000), 0),
        (_ids(40_000, 9000), 0),
        ([*_ids(40_000, 9000), 9], 8992),
    ]
    for prompt, cached in cases:
        before = worker.metric("tokenfront_engine_prefill_seconds")
        answer = worker.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": 1}).json()
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
        delta = worker.metric("tokenfront_engine_prefill_seconds") - before
        assert delta == pytest.approx(GPU.request_prefill_seconds(cached, len(prompt)), rel=1e-9)
        deltas.append(delta)
    assert deltas[0] < deltas[1] < deltas[2]  # 300, 3000, 9000 uncached tokens
    assert deltas[3] < deltas[0]  # 9001 tokens, 8992 of them cached: 9 to compute


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--tool-call-parser", "hermes"],
            "error: --tool-call-parser hermes: the simulated engine runs no grammar",
        ),
        (["--sim-speedup", "0"], "error: argument --sim-speedup: must be more than 0"),
        (
            ["--sim-max-context-tokens", "1"],
            "error: the simulated GPU: max_context_tokens must be at least 2",
        ),
    ],
)
def test_simulated_start_up_mistakes_are_one_line(qwen3: Path, args: list[str], line: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenfront.cli",
            "serve",
            "--engine",
            "simulated",
            "--model",
            str(qwen3),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(line) and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_simulated_flags_are_refused_with_the_transformers_engine(qwen3: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tokenfront.cli", "serve", "--model", str(qwen3), "--sim-speedup", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --sim-speedup sets the simulated engine: add --engine simulated, or leave it out"
    )

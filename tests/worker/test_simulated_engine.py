"""The simulated engine in process: its timing model (the modelled durations, which are deterministic, never
wall time), its scheduler (prefix hits, chunked prefill, batching, the running-token budget), its output
(deterministic ids, stop ids, max_tokens, the context) and its refusals."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from tokenfront.core.kv_blocks import KV_CACHE_HASH, block_hashes
from tokenfront.worker.engine import NO_TOKEN, GenerationRequest, SamplingParams, TokenOutput
from tokenfront.worker.engines.simulated import SimulatedEngine, SimulatedGpu

T = TypeVar("T")
VOCAB = 5000
# Fast on the clock (the modelled durations, which the tests read, do not change with it).
FAST = SimulatedGpu(speedup=1000.0)


def _run(make: Callable[[SimulatedEngine], Awaitable[T]], gpu: SimulatedGpu = FAST, **options: Any) -> T:
    async def main() -> T:
        engine = SimulatedEngine(gpu, vocab_size=VOCAB, **options)
        await engine.start()
        try:
            return await asyncio.wait_for(make(engine), timeout=60)
        finally:
            await engine.stop()

    return asyncio.run(main())


async def _generate(
    engine: SimulatedEngine, request_id: str, prompt: list[int], **params: Any
) -> tuple[list[TokenOutput], int | None]:
    stream = engine.submit(
        GenerationRequest(request_id, prompt, SamplingParams(**{"max_tokens": 8, **params}))
    )
    outputs = [output async for output in stream]
    return outputs, stream.cached_tokens


def _prompt(start: int, length: int) -> list[int]:
    return [(start + i) % (VOCAB - 1) + 1 for i in range(length)]


# ---------------------------------------------------------------------------- the timing model


def test_prefill_time_grows_with_the_uncached_tokens() -> None:
    gpu = SimulatedGpu()
    durations = [gpu.request_prefill_seconds(0, n) for n in (16, 512, 4096, 8192, 8193, 32768)]
    assert durations == sorted(durations) and len(set(durations)) == 6
    # The same prompt with more of it cached costs less, down to a last block computed alone.
    cached = [gpu.request_prefill_seconds(c, 4096) for c in (0, 1024, 4000, 4080)]
    assert cached == sorted(cached, reverse=True) and len(set(cached)) == 4


def test_the_prefill_formula() -> None:
    gpu = SimulatedGpu()
    # 4096 tokens cold, one step: overhead + tokens / rate + (4096**2 / 2) pairs x attention cost.
    expected = 0.005 + 4096 / 20_000 + (4096**2 / 2) * 1.05e-9
    assert gpu.request_prefill_seconds(0, 4096) == pytest.approx(expected, rel=1e-12)
    # 10,000 tokens: two steps (8192 then 1808), each with its overhead; attention counts every earlier position.
    two_steps = 2 * 0.005 + 10_000 / 20_000 + (10_000**2 / 2) * 1.05e-9
    assert gpu.request_prefill_seconds(0, 10_000) == pytest.approx(two_steps, rel=1e-12)
    # With 6000 cached: 4000 tokens in one step, attending to the cached 6000 too.
    assert gpu.request_prefill_seconds(6000, 10_000) == pytest.approx(
        0.005 + 4000 / 20_000 + ((10_000**2 - 6000**2) / 2) * 1.05e-9, rel=1e-12
    )


def test_the_decode_step_grows_with_the_batch_and_its_context() -> None:
    gpu = SimulatedGpu()
    assert gpu.decode_seconds(1, 1000) == pytest.approx(0.008 + 5e-5 + 1000 * 5.6e-8)
    steps = [gpu.decode_seconds(batch, batch * 8192) for batch in (1, 8, 32, 128)]
    assert steps == sorted(steps) and len(set(steps)) == 4
    # The docstring's example, 32 sequences of 8k context: 8 ms + 32 x 50 us + 262,144 x 56 ns, ~24 ms.
    assert gpu.decode_seconds(32, 32 * 8192) == pytest.approx(0.02428, abs=1e-5)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("prefill_tokens_per_second", 0.0),
        ("speedup", -1.0),
        ("decode_step_seconds", math.inf),
        ("max_batch_size", 0),
    ],
)
def test_settings_that_cannot_model_a_gpu_are_refused(setting: str, value: float) -> None:
    with pytest.raises(ValueError, match=setting):
        SimulatedGpu(**{setting: value})


# ---------------------------------------------------------------------------- the engine


def test_a_shared_prefix_is_cached_in_whole_blocks_and_counted() -> None:
    async def scenario(engine: SimulatedEngine) -> Any:
        first, cached_first = await _generate(engine, "a", _prompt(0, 100) + [7] * 50)
        _, cached_second = await _generate(engine, "b", _prompt(0, 100) + [9] * 60)
        return first, cached_first, cached_second, engine.stats(), engine.kv_events(0)

    first, cached_first, cached_second, stats, events = _run(scenario)
    assert cached_first == 0
    assert cached_second == 96  # 6 full blocks of the 100 shared ids; the 7th differs
    assert stats["prompt_tokens"] == 310 and stats["prompt_tokens_cached"] == 96
    assert stats["prefill_tokens_computed"] == 310 - 96
    # The modelled prefill of the two requests, alone on the GPU: exactly what the model says.
    assert stats["prefill_seconds"] == pytest.approx(
        FAST.request_prefill_seconds(0, 150) + FAST.request_prefill_seconds(96, 160), rel=1e-12
    )
    # The first prompt's 9 full blocks were stored as the real worker names them, in one event.
    stored = [event for event in events["events"] if event["type"] == "stored"]
    assert stored[0]["block_hashes"] == block_hashes(_prompt(0, 100) + [7] * 50, 16)
    assert stored[0]["parent_block_hash"] is None and stored[0]["tokens_per_block"] == 16
    assert [len(first), first[-1].finish_reason] == [8, "length"]


def test_a_long_prompt_is_prefilled_in_chunks() -> None:
    async def scenario(engine: SimulatedEngine) -> Any:
        await _generate(engine, "long", _prompt(0, 20_000), max_tokens=1)
        return engine.stats(), engine.kv_events(0)["events"]

    stats, events = _run(scenario)
    assert stats["steps"] == 3  # 8192 + 8192 + 3616 prompt tokens; the first token comes with the last chunk
    assert stats["prefill_seconds"] == pytest.approx(FAST.request_prefill_seconds(0, 20_000), rel=1e-12)
    # Each chunk's full blocks are stored as it is computed: 512, 512, then 226 blocks.
    assert [len(event["block_hashes"]) for event in events] == [512, 512, 226]


def test_requests_decode_together_and_the_batch_is_bounded() -> None:
    gpu = SimulatedGpu(speedup=1000.0, max_batch_size=3)

    async def scenario(engine: SimulatedEngine) -> Any:
        runs = [_generate(engine, f"r{i}", _prompt(1000 * i, 40), max_tokens=20) for i in range(5)]
        results = await asyncio.gather(*runs)
        return results, engine.stats()

    results, stats = _run(scenario, gpu)
    assert [len(outputs) for outputs, _ in results] == [20] * 5
    assert stats["decode_batch_size_max"] == 3
    assert stats["decode_tokens"] == 5 * 19  # each sequence's first token comes from its prefill


def test_the_running_token_budget_makes_requests_wait() -> None:
    # Each request reserves 100 + 10 tokens; a budget of 250 runs two at a time.
    gpu = SimulatedGpu(speedup=1000.0, max_running_tokens=250)

    async def scenario(engine: SimulatedEngine) -> Any:
        await asyncio.gather(
            *(_generate(engine, f"r{i}", _prompt(500 * i, 100), max_tokens=10) for i in range(4))
        )
        return engine.stats()

    stats = _run(scenario, gpu)
    assert stats["decode_batch_size_max"] == 2
    assert stats["running_reserved_tokens"] == 0  # all released


def test_output_ids_are_deterministic_and_from_the_pool() -> None:
    pool = [101, 202, 303, 404]

    async def scenario(engine: SimulatedEngine) -> Any:
        greedy_a, _ = await _generate(engine, "a", _prompt(0, 30), temperature=0.0, max_tokens=30)
        greedy_b, _ = await _generate(engine, "b", _prompt(0, 30), temperature=0.0, max_tokens=30)
        other, _ = await _generate(engine, "c", _prompt(1, 30), temperature=0.0, max_tokens=30)
        seeded_a, _ = await _generate(engine, "d", _prompt(5, 30), seed=7, max_tokens=30)
        seeded_b, _ = await _generate(engine, "e", _prompt(9, 30), seed=7, max_tokens=30)
        sampled_a, _ = await _generate(engine, "f", _prompt(0, 30), temperature=1.0, max_tokens=30)
        sampled_b, _ = await _generate(engine, "g", _prompt(0, 30), temperature=1.0, max_tokens=30)
        return [
            [o.token_id for o in run]
            for run in (greedy_a, greedy_b, other, seeded_a, seeded_b, sampled_a, sampled_b)
        ]

    greedy_a, greedy_b, other, seeded_a, seeded_b, sampled_a, sampled_b = _run(
        scenario, output_token_ids=pool
    )
    assert greedy_a == greedy_b != other  # greedy: the prompt decides
    assert seeded_a == seeded_b  # a seed decides whatever the prompt
    assert sampled_a != sampled_b  # sampled without a seed: each submission its own draw
    assert {i for run in (greedy_a, other, seeded_a, sampled_a) for i in run} <= set(pool)


def test_stop_ids_end_a_sequence_and_logprobs_are_uniform() -> None:
    async def scenario(engine: SimulatedEngine) -> Any:
        outputs, _ = await _generate(
            engine, "s", _prompt(0, 20), max_tokens=1000, stop_token_ids=frozenset({7}), logprobs=2
        )
        return outputs

    outputs = _run(scenario, output_token_ids=[5, 6, 7])
    assert outputs[-1].finish_reason == "stop" and outputs[-1].token_id == 7
    assert all(o.token_id != 7 for o in outputs[:-1])
    assert outputs[0].logprob == pytest.approx(-math.log(3))
    assert outputs[0].top_logprobs is not None and outputs[0].top_logprobs[0][0] == outputs[0].token_id
    assert len(outputs[0].top_logprobs) == 2


def test_the_context_ends_a_sequence() -> None:
    async def scenario(engine: SimulatedEngine) -> Any:
        outputs, _ = await _generate(engine, "c", _prompt(0, 60), max_tokens=100)
        return outputs

    outputs = _run(scenario, max_context=64)
    assert len(outputs) == 4 and outputs[-1].finish_reason == "length"


def test_abort_ends_the_stream_and_keeps_what_was_computed() -> None:
    async def scenario(engine: SimulatedEngine) -> Any:
        stream = engine.submit(GenerationRequest("x", _prompt(0, 64), SamplingParams(max_tokens=10_000)))
        outputs = []
        async for output in stream:
            outputs.append(output)
            if len(outputs) == 3:
                engine.abort("x")
        return outputs, engine.stats()

    outputs, stats = _run(scenario)
    assert outputs[-1].finish_reason == "abort" and outputs[-1].token_id == NO_TOKEN
    assert stats["requests_aborted"] == 1 and stats["running"] == 0
    assert stats["kv_cache_blocks"] >= 4  # the prompt's blocks stay cached


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], {"max_tokens": 1}, "no tokens"),
        ([VOCAB], {"max_tokens": 1}, "must be in"),
        ([1, 2], {"max_tokens": 0}, "max_tokens"),
    ],
)
def test_requests_the_engine_cannot_run_are_refused(prompt: list[int], params: dict, message: str) -> None:
    async def scenario(engine: SimulatedEngine) -> None:
        with pytest.raises(ValueError, match=message):
            engine.submit(GenerationRequest("bad", prompt, SamplingParams(**params)))

    _run(scenario)


def test_a_grammar_is_refused_and_the_info_says_what_it_is() -> None:
    class Anything:
        def mask_logits(self, logits: Any) -> None: ...
        def accept(self, token_id: int) -> None: ...
        def is_finished(self) -> bool:
            return False

    async def scenario(engine: SimulatedEngine) -> None:
        request = GenerationRequest("g", [1, 2, 3], SamplingParams(max_tokens=4), constraint=Anything())
        with pytest.raises(ValueError, match="does not run grammars"):
            engine.submit(request)
        assert (engine.info.name, engine.info.kv_cache_hash) == ("simulated", KV_CACHE_HASH)
        assert engine.info.kv_cache_max_tokens == FAST.kv_cache_tokens

    _run(scenario)


def test_the_simulated_path_imports_no_torch() -> None:
    """Importing the engine, its cache index, the worker app and the fleet server leaves torch out (the CLI also
    hides it, so that a stray import would fail loudly instead of loading it)."""
    modules = (
        "tokenfront.worker.engines.simulated, tokenfront.worker.app, tokenfront.server.fleet, tokenfront.cli"
    )
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

"""The transformers engine on real checkpoints: greedy parity with `generate`, continuous batching, sampling
controls, aborts, the prefix KV cache and its event log, graceful stop."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, LlamaConfig

from tokenfront import fixtures
from tokenfront.core.kv_blocks import KV_CACHE_HASH, block_hashes
from tokenfront.worker.engine import GenerationRequest, GenerationStream, SamplingParams, TokenOutput
from tokenfront.worker.engines.transformers import NO_TOKEN, TransformersEngine

T = TypeVar("T")
GREEDY = 0.0


# ---------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama whose greedy ids really depend on the context.

    Not the `tiny-random` fixture: its small initial weights (std 0.02) make it repeat one token whatever
    the prompt, so a batching or caching bug (KV padded on the wrong side, say) would go unseen. With std 0.5
    every prompt gets its own continuation, and the top-2 logit gaps stay far above float noise.
    """
    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.5,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct checkpoint, or a skip saying why it is not there."""
    if "smollm2" not in fixtures.CHECKPOINTS:
        pytest.skip("the fixture script has no smollm2 checkpoint")
    try:
        return fixtures.ensure_checkpoint("smollm2")
    except fixtures.FixtureError as error:
        pytest.skip(f"smollm2 checkpoint unavailable: {error}")


@pytest.fixture(scope="module")
def reference_model(tiny: Path) -> Any:
    """The tiny checkpoint loaded the plain transformers way, for `generate` references."""
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()


@pytest.fixture
def make_engine(tiny: Path) -> Iterator[Callable[..., TransformersEngine]]:
    """Build engines on the tiny checkpoint (EOS ends nothing unless asked for, so lengths are exact)."""

    def make(**options: Any) -> TransformersEngine:
        return TransformersEngine(tiny, **options)

    yield make


def run(engine: TransformersEngine, body: Callable[[], Awaitable[T]]) -> T:
    """Run `body` in a fresh event loop with the engine started, and stop the engine afterwards."""

    async def main() -> T:
        await engine.start()
        try:
            return await body()
        finally:
            await engine.stop()

    return asyncio.run(main())


async def collect(stream: GenerationStream) -> list[TokenOutput]:
    return [output async for output in stream]


def ids(outputs: list[TokenOutput]) -> list[int]:
    return [o.token_id for o in outputs]


def request(
    request_id: str,
    prompt: list[int],
    max_tokens: int = 8,
    temperature: float = GREEDY,
    cache_salt: str | None = None,
    **params: Any,
) -> GenerationRequest:
    return GenerationRequest(
        request_id, prompt, SamplingParams(max_tokens, temperature, **params), cache_salt=cache_salt
    )


def prompt_of(length: int, seed: int, vocab: int = 1000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def generate_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy decoding, EOS off: the reference the engine must equal."""
    output = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        pad_token_id=0,
    )
    return output[0, len(prompt) :].tolist()


class AllowedTokens:
    """A tiny grammar: only `allowed` ids, and done after `length` tokens."""

    def __init__(self, allowed: set[int], length: int) -> None:
        self.allowed, self.length, self.accepted = allowed, length, []

    def mask_logits(self, logits: Any) -> None:
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep[list(self.allowed)] = True
        logits.masked_fill_(~keep, float("-inf"))

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def is_finished(self) -> bool:
        return len(self.accepted) >= self.length


# ---------------------------------------------------------------------------- greedy parity and batching


def test_greedy_equals_transformers_generate(
    make_engine: Callable[..., TransformersEngine], reference_model: Any
) -> None:
    engine = make_engine()
    prompts = [prompt_of(n, seed) for seed, n in enumerate((5, 23, 41))]

    async def body() -> list[list[int]]:
        return [ids(await collect(engine.submit(request(f"r{i}", p, 12)))) for i, p in enumerate(prompts)]

    results = run(engine, body)
    assert results == [generate_greedy(reference_model, p, 12) for p in prompts]


def test_greedy_ids_do_not_depend_on_the_batch(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine(kv_cache_max_tokens=0)  # no cache: every prompt is computed in full, alone or not
    # Lengths differ, so rows are padded; the longest prompt leaves first, so the padding is trimmed under
    # the rows that stay.
    prompts = [prompt_of(n, 10 + n) for n in (3, 17, 30, 64)]
    max_tokens = [12, 9, 10, 3]

    async def body() -> tuple[list[list[int]], list[list[int]]]:
        alone = [
            ids(await collect(engine.submit(request(f"a{i}", p, n))))
            for i, (p, n) in enumerate(zip(prompts, max_tokens, strict=True))
        ]
        streams = [
            engine.submit(request(f"b{i}", p, n))
            for i, (p, n) in enumerate(zip(prompts, max_tokens, strict=True))
        ]
        return alone, [ids(r) for r in await asyncio.gather(*(collect(s) for s in streams))]

    alone, batched = run(engine, body)
    assert batched == alone
    assert engine.stats()["decode_batch_size_max"] == 4


def test_eight_concurrent_requests_all_complete_correctly(
    make_engine: Callable[..., TransformersEngine], reference_model: Any
) -> None:
    engine = make_engine(max_batch_size=8)
    prompts = [prompt_of(4 + 9 * i, 100 + i) for i in range(8)]
    lengths = [3 + i for i in range(8)]

    async def body() -> list[list[TokenOutput]]:
        streams = [
            engine.submit(request(f"c{i}", p, n))
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
        ]
        return list(await asyncio.gather(*(collect(s) for s in streams)))

    results = run(engine, body)
    for outputs, prompt, length in zip(results, prompts, lengths, strict=True):
        assert len(outputs) == length
        assert [o.finish_reason for o in outputs] == [None] * (length - 1) + ["length"]
        assert ids(outputs) == generate_greedy(reference_model, prompt, length)
    stats = engine.stats()
    assert stats["decode_batch_size_max"] == 8
    assert stats["requests_finished"] == 8 and stats["running"] == 0


def test_requests_beyond_max_batch_size_wait_their_turn(
    make_engine: Callable[..., TransformersEngine],
) -> None:
    engine = make_engine(max_batch_size=2)
    prompts = [prompt_of(6, 200 + i) for i in range(5)]

    async def body() -> list[list[TokenOutput]]:
        streams = [engine.submit(request(f"w{i}", p, 4)) for i, p in enumerate(prompts)]
        return list(await asyncio.gather(*(collect(s) for s in streams)))

    results = run(engine, body)
    assert [len(r) for r in results] == [4] * 5
    assert engine.stats()["decode_batch_size_max"] == 2


# ---------------------------------------------------------------------------- sampling controls


def test_same_seed_same_ids_whatever_runs_beside(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()
    prompt = prompt_of(12, 3)

    async def body() -> list[list[int]]:
        first = ids(await collect(engine.submit(request("s1", prompt, 12, 1.0, seed=7))))
        crowd = [engine.submit(request(f"x{i}", prompt_of(9, i), 12, 1.0)) for i in range(3)]
        seeded = engine.submit(request("s2", prompt, 12, 1.0, seed=7))
        other_seed = engine.submit(request("s3", prompt, 12, 1.0, seed=8))
        results = await asyncio.gather(collect(seeded), collect(other_seed), *(collect(s) for s in crowd))
        return [first, ids(results[0]), ids(results[1])]

    first, again, other = run(engine, body)
    assert again == first
    assert other != first


def test_top_k_one_is_greedy(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()
    prompt = prompt_of(10, 4)

    async def body() -> tuple[list[int], list[int]]:
        greedy = ids(await collect(engine.submit(request("g", prompt, 8))))
        top1 = ids(await collect(engine.submit(request("k", prompt, 8, 1.5, top_k=1, seed=1))))
        return greedy, top1

    greedy, top1 = run(engine, body)
    assert top1 == greedy


def test_stop_token_ids_end_with_stop_and_include_the_token(
    make_engine: Callable[..., TransformersEngine],
) -> None:
    engine = make_engine()
    prompt = prompt_of(10, 5)

    async def body() -> tuple[list[int], list[TokenOutput]]:
        free = ids(await collect(engine.submit(request("free", prompt, 10))))
        stop_id = free[3]
        stopped = await collect(
            engine.submit(request("stop", prompt, 10, stop_token_ids=frozenset({stop_id})))
        )
        return free, stopped

    free, stopped = run(engine, body)
    end = free.index(free[3]) + 1
    assert ids(stopped) == free[:end]
    assert stopped[-1].finish_reason == "stop"
    assert all(o.finish_reason is None for o in stopped[:-1])


def test_eos_ends_generation_only_when_asked(tiny: Path) -> None:
    stopping = TransformersEngine(tiny, stop_on_eos=True)
    plain = TransformersEngine(tiny)
    (eos,) = plain.eos_token_ids  # the checkpoint names its EOS

    def forced(engine: TransformersEngine) -> list[TokenOutput]:
        req = request("eos", prompt_of(8, 6), 6, 1.0, seed=0)
        req.constraint = AllowedTokens({eos}, 100)  # only EOS may come

        async def body() -> list[TokenOutput]:
            return await collect(engine.submit(req))

        return run(engine, body)

    assert forced(stopping) == [TokenOutput(eos, finish_reason="stop")]
    assert ids(forced(plain)) == [eos] * 6  # the engine follows the request's stop ids alone


def test_max_tokens_ends_with_length(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()

    async def body() -> list[list[TokenOutput]]:
        return [await collect(engine.submit(request(f"m{n}", prompt_of(7, n), n))) for n in (1, 5)]

    one, five = run(engine, body)
    assert len(one) == 1 and one[0].finish_reason == "length"
    assert len(five) == 5 and [o.finish_reason for o in five] == [None] * 4 + ["length"]


def test_logprobs_are_the_model_log_softmax(
    make_engine: Callable[..., TransformersEngine], reference_model: Any
) -> None:
    engine = make_engine()
    prompt = prompt_of(9, 7)

    async def body() -> list[TokenOutput]:
        return await collect(engine.submit(request("lp", prompt, 2, logprobs=3)))

    outputs = run(engine, body)
    with torch.inference_mode():
        expected = torch.log_softmax(reference_model(torch.tensor([prompt])).logits[0, -1], dim=-1)
    first = outputs[0]
    assert first.logprob == pytest.approx(float(expected[first.token_id]), abs=1e-4)
    assert first.top_logprobs is not None and len(first.top_logprobs) == 3
    assert first.top_logprobs[0][0] == first.token_id  # greedy picks the most likely
    top = torch.topk(expected, 3)
    assert [t for t, _ in first.top_logprobs] == top.indices.tolist()
    assert [v for _, v in first.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_constraint_masks_accepts_and_finishes(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()
    constraint = AllowedTokens({11, 12, 13}, 4)
    req = request("g", prompt_of(6, 8), 20, 1.0, seed=3, logprobs=0)
    req.constraint = constraint

    async def body() -> list[TokenOutput]:
        return await collect(engine.submit(req))

    outputs = run(engine, body)
    assert len(outputs) == 4 and outputs[-1].finish_reason == "stop"
    assert set(ids(outputs)) <= {11, 12, 13}
    assert constraint.accepted == ids(outputs)


class BrokenGrammar(AllowedTokens):
    """A grammar that fails after two tokens, as a buggy one might."""

    def accept(self, token_id: int) -> None:
        super().accept(token_id)
        if len(self.accepted) == 2:
            raise RuntimeError("grammar state corrupted")


def test_a_failing_constraint_fails_its_request_alone(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()
    broken = request("broken", prompt_of(6, 30), 10)
    broken.constraint = BrokenGrammar(set(range(1000)), 100)

    async def body() -> tuple[list[TokenOutput], BaseException | None, list[TokenOutput]]:
        healthy = engine.submit(request("healthy", prompt_of(6, 31), 10))
        failing = engine.submit(broken)
        seen: list[TokenOutput] = []
        error: BaseException | None = None
        try:
            async for output in failing:
                seen.append(output)
        except RuntimeError as raised:
            error = raised
        return seen, error, await collect(healthy)

    seen, error, healthy = run(engine, body)
    assert len(seen) == 1 and error is not None and "grammar state corrupted" in str(error)
    assert len(healthy) == 10 and healthy[-1].finish_reason == "length"
    assert engine.stats()["requests_failed"] == 1


# ---------------------------------------------------------------------------- abort, validation, stop


def test_abort_mid_generation_ends_with_abort_and_frees_the_slot(
    make_engine: Callable[..., TransformersEngine],
) -> None:
    engine = make_engine(max_batch_size=1)

    async def body() -> tuple[list[TokenOutput], list[TokenOutput], list[TokenOutput]]:
        long = engine.submit(request("long", prompt_of(5, 9), 1000))
        queued = engine.submit(request("queued", prompt_of(5, 10), 1000))
        seen: list[TokenOutput] = []
        async for output in long:
            seen.append(output)
            if len(seen) == 3:
                engine.abort("long")
                engine.abort("queued")  # still waiting: it never started
        after = await collect(engine.submit(request("after", prompt_of(5, 11), 3)))
        return seen, await collect(queued), after

    seen, queued, after = run(engine, body)
    assert seen[-1].finish_reason == "abort" and seen[-1].token_id == NO_TOKEN
    assert 3 <= len(seen) < 1000
    assert queued == [TokenOutput(NO_TOKEN, finish_reason="abort")]
    assert len(after) == 3 and after[-1].finish_reason == "length"
    assert engine.stats()["requests_aborted"] == 2


def test_a_reader_that_walks_away_aborts_its_request(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine(max_batch_size=1)

    async def body() -> list[TokenOutput]:
        iterator = aiter(engine.submit(request("gone", prompt_of(5, 12), 1000)))
        await anext(iterator)
        await iterator.aclose()  # type: ignore[attr-defined]
        return await collect(engine.submit(request("next", prompt_of(5, 13), 2)))

    after = run(engine, body)
    assert len(after) == 2
    assert engine.stats()["requests_aborted"] == 1
    assert engine.stats()["decode_tokens"] < 100


def test_invalid_requests_are_refused_at_submit(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()

    async def body() -> None:
        with pytest.raises(ValueError, match="no tokens"):
            engine.submit(request("a", [], 4))
        with pytest.raises(ValueError, match="token ids"):
            engine.submit(request("b", [engine.vocab_size], 4))
        with pytest.raises(ValueError, match="context"):
            engine.submit(request("c", [5] * 2048, 4))
        with pytest.raises(ValueError, match="max_tokens"):
            engine.submit(request("d", [5], 0))
        stream = engine.submit(request("e", [5, 6], 50))
        with pytest.raises(ValueError, match="already running"):
            engine.submit(request("e", [5, 6], 4))
        await collect(stream)

    run(engine, body)


def test_stop_is_graceful(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()

    async def main() -> tuple[list[TokenOutput], list[TokenOutput]]:
        await engine.start()
        running = engine.submit(request("run", prompt_of(5, 14), 10_000))
        waiting_iter = aiter(running)
        first = await anext(waiting_iter)
        await engine.stop()
        rest = [o async for o in waiting_iter]
        with pytest.raises(RuntimeError, match="start"):
            engine.submit(request("late", [5], 2))
        # It starts again after a stop.
        await engine.start()
        again = await collect(engine.submit(request("again", [5, 6], 2)))
        await engine.stop()
        return [first, *rest], again

    outputs, again = asyncio.run(main())
    assert outputs[-1].finish_reason == "abort"
    assert len(again) == 2
    assert not [t for t in threading.enumerate() if t.name == "tokenfront-engine"]  # joined


# ---------------------------------------------------------------------------- the prefix cache


def test_shared_prefix_is_served_from_cache_with_identical_ids(
    make_engine: Callable[..., TransformersEngine],
) -> None:
    cached_engine = make_engine()
    uncached_engine = make_engine(kv_cache_max_tokens=0)
    prefix = prompt_of(70, 15)
    first, second = [*prefix, 1, 2, 3], [*prefix, 7, 8, 9, 10, 11]

    def serve(engine: TransformersEngine) -> tuple[list[list[int]], list[int | None]]:
        async def body() -> tuple[list[list[int]], list[int | None]]:
            results, cached = [], []
            for i, prompt in enumerate((first, second)):
                stream = engine.submit(request(f"p{i}", prompt, 6))
                results.append(ids(await collect(stream)))
                cached.append(stream.cached_tokens)
            return results, cached

        return run(engine, body)

    with_cache, cached = serve(cached_engine)
    without_cache, not_cached = serve(uncached_engine)
    assert cached == [0, 64]  # 4 full blocks of the 70 shared ids
    assert not_cached == [0, 0]
    assert with_cache == without_cache
    stats = cached_engine.stats()
    assert stats["prompt_tokens_cached"] == 64
    assert stats["prefill_tokens_computed"] == len(first) + len(second) - 64


def test_at_least_the_last_prompt_token_is_computed(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()
    prompt = prompt_of(32, 16)  # exactly two blocks

    async def body() -> list[int | None]:
        cached = []
        for i in range(2):
            stream = engine.submit(request(f"b{i}", prompt, 1))
            await collect(stream)
            cached.append(stream.cached_tokens)
        return cached

    assert run(engine, body) == [0, 16]


def test_stored_blocks_appear_in_the_event_log(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()
    prompt = prompt_of(40, 17)

    async def body() -> list[TokenOutput]:
        return await collect(engine.submit(request("ev", prompt, 1, cache_salt="s")))

    run(engine, body)
    reply = engine.kv_events(0)
    assert reply["last_seq"] == 1 and not reply["truncated"]
    (event,) = reply["events"]
    assert event["type"] == "stored" and event["parent_block_hash"] is None
    assert event["block_hashes"] == block_hashes(prompt, 16, "s")
    assert event["token_ids"] == [prompt[:16], prompt[16:32]]
    assert engine.info.kv_cache_hash == KV_CACHE_HASH and engine.info.tokens_per_block == 16


def test_generated_tokens_are_cached_when_a_sequence_leaves(
    make_engine: Callable[..., TransformersEngine],
) -> None:
    engine = make_engine()
    prompt = prompt_of(20, 18)

    async def body() -> tuple[list[int], int | None]:
        answer = ids(await collect(engine.submit(request("turn1", prompt, 20))))
        follow_up = [*prompt, *answer, 5, 6, 7]
        stream = engine.submit(request("turn2", follow_up, 1))
        await collect(stream)
        return answer, stream.cached_tokens

    answer, cached = run(engine, body)
    # The first turn computed KV for prompt + all but its last answer token: 39 ids, 2 full blocks.
    assert cached == 32
    events = engine.kv_events(0)["events"]
    assert [e["type"] for e in events] == ["stored", "stored"]
    assert events[1]["parent_block_hash"] == events[0]["block_hashes"][-1]
    assert events[1]["token_ids"] == [[*prompt, *answer][16:32]]


def test_cache_salt_separates_requests(make_engine: Callable[..., TransformersEngine]) -> None:
    engine = make_engine()
    prompt = prompt_of(40, 19)

    async def body() -> list[int | None]:
        cached = []
        for i, salt in enumerate(("a", "b", "a", None)):
            stream = engine.submit(request(f"salt{i}", prompt, 1, cache_salt=salt))
            await collect(stream)
            cached.append(stream.cached_tokens)
        return cached

    assert run(engine, body) == [0, 0, 32, 0]


def test_a_small_budget_evicts_and_logs_removed_blocks(
    make_engine: Callable[..., TransformersEngine],
) -> None:
    engine = make_engine(kv_cache_max_tokens=64)  # room for 4 blocks
    a, b, c = (prompt_of(33, 20 + i) for i in range(3))  # 2 full blocks each

    async def body() -> list[int | None]:
        cached = []
        for i, prompt in enumerate((a, b, a, c, a, b)):
            stream = engine.submit(request(f"ev{i}", prompt, 1))
            await collect(stream)
            cached.append(stream.cached_tokens)
        return cached

    cached = run(engine, body)
    # a and b fill the budget; a is used again; c evicts b (the least recently used chain, leaf first);
    # a hits; b comes back and evicts c, now the least recently used.
    assert cached == [0, 0, 32, 0, 32, 0]
    events = engine.kv_events(0)["events"]
    removed = [e["block_hashes"] for e in events if e["type"] == "removed"]
    hb, hc = (block_hashes(p, 16) for p in (b, c))
    assert removed == [[hb[1], hb[0]], [hc[1], hc[0]]]
    assert engine.stats()["kv_cache_tokens"] == 64


def test_a_reader_behind_the_event_history_is_told_to_resync(
    make_engine: Callable[..., TransformersEngine],
) -> None:
    engine = make_engine(kv_event_history=2)

    async def body() -> None:
        for i in range(3):
            await collect(engine.submit(request(f"h{i}", prompt_of(20, 40 + i), 1)))

    run(engine, body)
    behind, current = engine.kv_events(0), engine.kv_events(1)
    assert behind["truncated"] and behind["oldest_seq"] == 2 and behind["last_seq"] == 3
    # Behind the history: no events, the cache itself as of event 3 (its blocks, chains parents first).
    assert behind["events"] == [] and behind["snapshot_blocks"] == engine.prefix_cache.num_blocks > 0
    held = {block for _, chain in behind["snapshot"] for block in chain}
    assert len(held) == engine.prefix_cache.num_blocks and all(block in engine.prefix_cache for block in held)
    assert not current["truncated"] and [e["seq"] for e in current["events"]] == [2, 3]


# ---------------------------------------------------------------------------- the real model


def test_smollm2_long_shared_prefix_hits_the_cache(smollm2: Path) -> None:
    engine = TransformersEngine(smollm2)
    reference = TransformersEngine(smollm2, kv_cache_max_tokens=0)
    tokenizer = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    text = " ".join(
        f"Item {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7} marbles." for i in range(40)
    )
    prefix = tokenizer.encode(text).ids[:200]
    question = tokenizer.encode(" How many marbles does the blue box of item 2 hold?").ids

    async def serve(
        engine: TransformersEngine, prompts: list[list[int]]
    ) -> list[tuple[list[int], int | None]]:
        results = []
        for i, prompt in enumerate(prompts):
            stream = engine.submit(request(f"s{i}", prompt, 8))
            results.append((ids(await collect(stream)), stream.cached_tokens))
        return results

    first, second = [*prefix, *tokenizer.encode(" Hello.").ids], [*prefix, *question]
    (_, cold), (warm_ids, warm) = run(engine, lambda: serve(engine, [first, second]))
    ((reference_ids, _),) = run(reference, lambda: serve(reference, [second]))
    assert cold == 0 and warm is not None and warm >= 192
    assert warm_ids == reference_ids


def test_smollm2_greedy_ids_do_not_depend_on_the_batch(smollm2: Path) -> None:
    engine = TransformersEngine(smollm2, kv_cache_max_tokens=0)
    tokenizer = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    questions = [
        "What is the capital of France?",
        "Name three colors.",
        "Write a haiku about the sea and the wind.",
    ]
    prompts = [
        tokenizer.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n").ids for q in questions
    ]

    async def body() -> tuple[list[list[int]], list[list[int]]]:
        alone = [ids(await collect(engine.submit(request(f"a{i}", p, 8)))) for i, p in enumerate(prompts)]
        streams = [engine.submit(request(f"b{i}", p, 8)) for i, p in enumerate(prompts)]
        together = [ids(r) for r in await asyncio.gather(*(collect(s) for s in streams))]
        return alone, together

    alone, together = run(engine, body)
    assert together == alone
    assert tokenizer.decode(alone[0]).startswith("The capital of France is Paris")

"""The KV policies' two ways of doing a decision's arithmetic choose alike: on Python numbers up to
``SCALAR_CANDIDATES`` candidates, on numpy columns above it. Randomized fleets and traffic, each run twice,
once with every decision forced onto numpy: every choice, prediction and explained row must be the same."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies import (
    PredictedTtftConfig,
    RouteRequest,
    WorkerLoad,
    build_policy,
    kv_cache_aware,
    predicted_ttft,
    prefix_match,
)

VOCAB = range(1000, 1400)  # a small vocabulary: prompts share openings by chance too


def decisions(policy_name: str, n_workers: int, seed: int, temperature: float = 0.0) -> list[Any]:
    """Route 200 requests of conversations growing turn by turn (some without ids, some salted, some to a
    subset of the workers), completing some in between and feeding events now and then: what each decision
    chose, predicted and explained."""
    rng = random.Random(seed)
    clock = [0.0]
    index = KvIndex(clock=lambda: clock[0], max_blocks_per_worker=rng.choice([48, 4096]))
    urls = [f"http://w{i}" for i in range(n_workers)]
    system = rng.choices(VOCAB, k=rng.choice([0, 16, 40]))
    for url in urls[: n_workers // 2 + 1]:
        stored(index, url, system)
    settings = PredictedTtftConfig(temperature=temperature, seed=seed)
    policy = build_policy(policy_name, kv_index=index, options=(settings,))
    sizes = [16, 16, 8, None] if seed % 2 else [16]
    loads = [WorkerLoad(url, rng.randrange(3), rng.choice(sizes)) for url in urls]
    conversations = [list(system) for _ in range(max(2, n_workers))]
    in_flight: list[tuple[WorkerLoad, RouteRequest]] = []
    seen = []
    for _ in range(200):
        clock[0] += rng.random() * 2
        conversation = conversations[rng.randrange(len(conversations))]
        conversation += rng.choices(VOCAB, k=rng.randrange(1, 40))
        request = RouteRequest(
            None if rng.random() < 0.03 else list(conversation), rng.choice([None, "salt"])
        )
        candidates = loads if rng.random() < 0.8 else rng.sample(loads, rng.randrange(1, n_workers + 1))
        routing = policy.route(candidates, request)
        policy.on_routed(routing.worker, request)
        seen.append((routing.worker.url, routing.predicted_cached_tokens, policy.explain()))
        routing.worker.active_requests += 1
        in_flight.append((routing.worker, request))
        if rng.random() < 0.5:
            worker, done = in_flight.pop(rng.randrange(len(in_flight)))
            policy.on_first_token(worker, done)
            policy.on_complete(worker, done, True)
            worker.active_requests -= 1
        if rng.random() < 0.05:
            stored(index, rng.choice(urls), rng.choice(conversations))
    return seen


def stored(index: KvIndex, url: str, token_ids: list[int]) -> None:
    hashes = block_hashes(token_ids, 16)
    if hashes:
        seq = index.tokenfront_cursor(url) + 1
        event = {"seq": seq, "type": "stored", "block_hashes": hashes, "parent_block_hash": None}
        index.apply_tokenfront_events(url, {"events": [event], "last_seq": seq, "log_id": url})


@pytest.mark.parametrize("policy_name", ["kv_cache_aware", "predicted_ttft"])
@pytest.mark.parametrize("n_workers", [1, 2, 5, 17, prefix_match.SCALAR_CANDIDATES])
def test_python_numbers_and_numpy_columns_choose_alike(
    policy_name: str, n_workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for seed in range(3):
        scalar = decisions(policy_name, n_workers, seed)
        with monkeypatch.context() as forced:
            for module in (prefix_match, kv_cache_aware, predicted_ttft):
                forced.setattr(module, "SCALAR_CANDIDATES", 0)
            columns = decisions(policy_name, n_workers, seed)
        assert scalar == columns
        # The runs made real choices: more than one worker chosen where there were several, cache predicted.
        if n_workers > 1:
            assert len({url for url, _, _ in scalar}) > 1
        assert any(cached for _, cached, _ in scalar)


def test_python_numbers_and_numpy_columns_draw_alike_with_a_temperature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scalar = decisions("predicted_ttft", 6, 0, temperature=0.01)
    for module in (prefix_match, predicted_ttft):
        monkeypatch.setattr(module, "SCALAR_CANDIDATES", 0)
    assert decisions("predicted_ttft", 6, 0, temperature=0.01) == scalar

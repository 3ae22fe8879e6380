"""Routing policies: kv_cache_aware, load_balancing, round_robin, and the factory that builds them."""

from __future__ import annotations

from collections import Counter

import pytest

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies import (
    POLICIES,
    KvCacheAwarePolicy,
    LoadBalancingPolicy,
    RoundRobinPolicy,
    RouteRequest,
    WorkerLoad,
    build_policy,
)
from tokenfront.worker.kv_events import KvEventLog

TPB = 4


def workers(*loads: int, tokens_per_block: int | None = TPB) -> list[WorkerLoad]:
    return [WorkerLoad(f"http://w{i}", load, tokens_per_block) for i, load in enumerate(loads)]


def ids(n_tokens: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_tokens))


def holds(index: KvIndex, worker: WorkerLoad, token_ids: list[int], salt: str | None = None) -> None:
    """Make ``worker`` hold ``token_ids`` the way a tokenfront worker reports it: through its event log."""
    log = KvEventLog()
    hashes = block_hashes(token_ids, TPB, salt)
    log.stored(hashes, None, [token_ids[i : i + TPB] for i in range(0, len(hashes) * TPB, TPB)], TPB)
    index.apply_tokenfront_events(worker.url, log.read(0))


# --- kv_cache_aware ---------------------------------------------------------------------------------------


def test_kv_cache_aware_picks_the_longest_cached_prefix() -> None:
    index = KvIndex()
    policy = build_policy("kv_cache_aware", kv_index=index)
    pool = workers(0, 0, 0)
    prompt = ids(40)
    holds(index, pool[0], prompt[:8])
    holds(index, pool[1], prompt[:20])
    holds(index, pool[2], ids(40, start=7))
    assert policy.select(pool, RouteRequest(prompt)).url == "http://w1"
    scores = policy.explain()["workers"]
    assert [scores[w.url]["matched_blocks"] for w in pool] == [2, 5, 0]


def test_kv_cache_aware_falls_back_to_load_without_a_prefix() -> None:
    policy = build_policy("kv_cache_aware", kv_index=KvIndex())
    pool = workers(3, 1, 2)
    assert policy.select(pool, RouteRequest(ids(32))).url == "http://w1"
    assert policy.select(pool, RouteRequest(None)).url == "http://w1"  # no ids at all: load alone


def test_load_penalty_overrides_a_small_prefix_advantage_but_not_a_large_one() -> None:
    index = KvIndex()
    policy = build_policy("kv_cache_aware", kv_index=index, load_weight=1.0)
    busy, idle = workers(3, 0)
    prompt = ids(64)
    holds(index, busy, prompt[:8])  # 2 blocks ahead, 3 requests busier
    assert policy.select([busy, idle], RouteRequest(prompt)).url == idle.url
    holds(index, busy, prompt)  # 16 blocks ahead
    assert policy.select([busy, idle], RouteRequest(prompt)).url == busy.url

    # The weight is the knob: a heavy penalty prefers the idle worker even against 16 blocks.
    heavy = build_policy("kv_cache_aware", kv_index=index, load_weight=10.0)
    assert heavy.select([busy, idle], RouteRequest(prompt)).url == idle.url
    assert heavy.explain()["workers"][busy.url]["score"] == pytest.approx(16 - 30)


def test_kv_cache_aware_spreads_ties_evenly() -> None:
    policy = build_policy("kv_cache_aware", kv_index=KvIndex())
    pool = workers(0, 0, 0)
    picks = Counter()
    for n in range(300):
        request = RouteRequest(ids(12, start=1000 * n))  # a new prompt each time: no prefix anywhere
        chosen = policy.select(pool, request)
        policy.on_routed(chosen, request)
        picks[chosen.url] += 1
    assert picks == {"http://w0": 100, "http://w1": 100, "http://w2": 100}


def test_routed_prompts_attract_their_followers_before_any_event() -> None:
    index = KvIndex()
    policy = build_policy("kv_cache_aware", kv_index=index)
    pool = workers(0, 0, 0)
    conversation = ids(20)
    first = policy.select(pool, RouteRequest(conversation))
    policy.on_routed(first, RouteRequest(conversation))
    for _ in range(5):  # the same conversation, one turn longer each time, keeps its worker
        conversation = conversation + ids(8, start=len(conversation) * 10)
        request = RouteRequest(conversation)
        assert policy.select(pool, request).url == first.url
        policy.on_routed(first, request)
    assert index.match(first.url, conversation, TPB, None) == len(conversation) // TPB
    # Another salt shares nothing with it.
    assert policy.select(pool, RouteRequest(conversation, cache_salt="other")).url != first.url


def test_workers_without_a_block_size_use_the_learned_or_default_one() -> None:
    index = KvIndex()
    policy = KvCacheAwarePolicy(index, default_tokens_per_block=8)
    vllm_a, vllm_b = workers(0, 0, tokens_per_block=None)
    prompt = ids(32)
    request = RouteRequest(prompt)
    chosen = policy.select([vllm_a, vllm_b], request)
    policy.on_routed(chosen, request)
    assert index.match(chosen.url, prompt, 8, None) == 4  # recorded in blocks of the default size
    assert policy.select([vllm_a, vllm_b], RouteRequest(prompt)).url == chosen.url


def test_mixed_block_sizes_compare_cached_tokens() -> None:
    index = KvIndex()
    policy = build_policy("kv_cache_aware", kv_index=index)
    small = WorkerLoad("http://small", 0, 4)
    large = WorkerLoad("http://large", 0, 16)
    prompt = ids(64)
    index.record_routed(small.url, prompt[:20], 4, None)  # 5 blocks = 20 tokens
    index.record_routed(large.url, prompt[:32], 16, None)  # 2 blocks = 32 tokens
    assert policy.select([small, large], RouteRequest(prompt)).url == large.url
    assert policy.explain()["workers"][large.url]["score"] == pytest.approx(8)


def test_build_policy_passes_the_weights() -> None:
    policy = build_policy("kv_cache_aware", kv_index=KvIndex(), load_weight=0.25, default_tokens_per_block=32)
    assert isinstance(policy, KvCacheAwarePolicy)
    assert (policy.load_weight, policy.default_tokens_per_block) == (0.25, 32)
    with pytest.raises(ValueError, match="load_weight"):
        build_policy("kv_cache_aware", kv_index=KvIndex(), load_weight=-1)


# --- load_balancing and round_robin -----------------------------------------------------------------------


def test_load_balancing_picks_the_least_loaded_and_rotates_ties() -> None:
    policy = build_policy("load_balancing", kv_index=KvIndex())
    assert isinstance(policy, LoadBalancingPolicy)
    pool = workers(4, 2, 7)
    assert policy.select(pool, RouteRequest(None)).url == "http://w1"
    tied = workers(1, 5, 1, 1)
    assert [policy.select(tied, RouteRequest(None)).url for _ in range(6)] == [
        "http://w0",
        "http://w2",
        "http://w3",
        "http://w0",
        "http://w2",
        "http://w3",
    ]
    assert policy.explain()["active_requests"]["http://w1"] == 5


def test_round_robin_rotates_in_order_and_adapts_to_membership() -> None:
    policy = build_policy("round_robin", kv_index=KvIndex())
    assert isinstance(policy, RoundRobinPolicy)
    pool = workers(9, 0, 3)  # load does not matter
    assert [policy.select(pool, RouteRequest(ids(8))).url for _ in range(6)] == [
        "http://w0",
        "http://w1",
        "http://w2",
        "http://w0",
        "http://w1",
        "http://w2",
    ]
    newcomer = WorkerLoad("http://new")
    assert policy.select([*pool, newcomer], RouteRequest(None)).url == newcomer.url
    assert policy.select(pool[1:], RouteRequest(None)).url == "http://w1"


# --- the registry -----------------------------------------------------------------------------------------


def test_registry_and_unknown_name() -> None:
    assert sorted(POLICIES) == ["kv_cache_aware", "load_balancing", "predicted_ttft", "round_robin"]
    for name, policy_class in POLICIES.items():
        assert policy_class.name == name
        assert build_policy(name, kv_index=KvIndex()).name == name
    with pytest.raises(
        ValueError, match="kv_cache_aware, load_balancing, predicted_ttft, round_robin"
    ) as error:
        build_policy("cache_aware", kv_index=KvIndex())
    assert "'cache_aware'" in str(error.value)


def test_hooks_have_safe_defaults() -> None:
    policy = build_policy("round_robin", kv_index=KvIndex())
    worker = WorkerLoad("http://w0")
    policy.on_routed(worker, RouteRequest(None))
    policy.on_complete(worker, RouteRequest(None), ok=False)
    assert build_policy("kv_cache_aware", kv_index=KvIndex()).explain() == {}
    # A policy that does not look at caches predicts nothing of them, and its load is the requests in flight.
    routing = policy.route([WorkerLoad("http://w0", active_requests=3)], RouteRequest([1, 2, 3]))
    assert routing.worker.url == "http://w0" and routing.predicted_cached_tokens is None
    assert policy.predicted_load(routing.worker) == {"active_requests": 3.0}


def test_kv_cache_aware_spreads_new_conversations_that_share_only_the_opening() -> None:
    """A shared template opening (a block of a 40-token prompt) is no reason to pile every new
    conversation onto one worker: below the cache threshold, load and fair turns decide, even when idle."""
    index = KvIndex()
    policy = build_policy("kv_cache_aware", kv_index=index)
    pool = workers(0, 0, 0)
    opening = ids(4, start=9000)
    chosen = []
    for conversation in range(6):
        prompt = opening + ids(36, start=100 * conversation)
        worker = policy.select(pool, RouteRequest(prompt))
        policy.on_routed(worker, RouteRequest(prompt))
        chosen.append(worker.url)
        assert policy.explain()["affinity"] is False
    assert Counter(chosen) == {"http://w0": 2, "http://w1": 2, "http://w2": 2}


def test_kv_cache_aware_keeps_a_growing_conversation_above_the_threshold() -> None:
    index = KvIndex()
    policy = build_policy("kv_cache_aware", kv_index=index, cache_threshold=0.5)
    pool = workers(0, 0, 0)
    turn = ids(24)
    first = policy.select(pool, RouteRequest(turn))
    policy.on_routed(first, RouteRequest(turn))
    for more in (8, 16, 24):  # each turn keeps the earlier prompt as its prefix
        turn = turn + ids(more, start=1000 + len(turn))
        worker = policy.select(pool, RouteRequest(turn))
        assert worker.url == first.url and policy.explain()["affinity"] is True
        policy.on_routed(worker, RouteRequest(turn))


def test_cache_threshold_is_validated() -> None:
    with pytest.raises(ValueError, match="cache_threshold"):
        build_policy("kv_cache_aware", kv_index=KvIndex(), cache_threshold=1.5)


@pytest.mark.parametrize("name", ["kv_cache_aware", "predicted_ttft"])
def test_kv_policies_follow_the_candidates_as_they_change_between_decisions(name: str) -> None:
    """The candidates' urls are reused while the router hands the same loads: a changed list is read anew."""
    index = KvIndex()
    policy = build_policy(name, kv_index=index)
    first, second = workers(0, 0), [WorkerLoad("http://x0", 0, TPB), WorkerLoad("http://x1", 0, TPB)]
    prompt = ids(40)
    holds(index, first[1], prompt)
    holds(index, second[0], prompt)
    assert policy.select(first, RouteRequest(prompt)).url == "http://w1"
    assert policy.select(list(first), RouteRequest(prompt)).url == "http://w1"  # a new list, the same loads
    assert policy.select(second, RouteRequest(prompt)).url == "http://x0"
    assert list(policy.explain()["workers"]) == ["http://x0", "http://x1"]
    # Equal loads of other objects (a worker removed and added back) have the same urls.
    again = workers(0, 0)
    assert policy.select(again, RouteRequest(prompt)).url == "http://w1"
    assert policy.select([*again, second[0]], RouteRequest(prompt)).url in {"http://w1", "http://x0"}
    assert list(policy.explain()["workers"]) == ["http://w0", "http://w1", "http://x0"]

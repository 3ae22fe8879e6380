"""The predicted_ttft policy: a cost model in seconds over a real KvIndex and the router's WorkerLoad views."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from test_policies import TPB, holds, ids, workers

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies import (
    PredictedTtftConfig,
    PredictedTtftPolicy,
    RouteRequest,
    WorkerLoad,
    build_policy,
)

RATE = 1000.0  # prefill tokens a second: costs in binary fractions, so the exact ones compare with ==
IDLE = {"pending_prefill_tokens": 0.0, "predicted_queue_seconds": 0.0, "tracked_requests": 0.0}


def policy_with(index: KvIndex, **settings: float | int | None) -> PredictedTtftPolicy:
    """The policy at RATE, each term alone: no occupancy, no affinity threshold, cached tokens at their
    prefill's worth, unless a test sets them."""
    defaults = {
        "prefill_tokens_per_second": RATE,
        "occupancy_weight": 0.0,
        "affinity_threshold": 0.0,
        "overlap_credit": 1.0,
        "occupancy_linger_seconds": 0.0,
    }
    config = PredictedTtftConfig(**{**defaults, **settings})  # type: ignore[arg-type]
    return PredictedTtftPolicy(index, config)


def costs(policy: PredictedTtftPolicy) -> dict[str, float]:
    return {url: row["predicted_ttft_seconds"] for url, row in policy.explain()["workers"].items()}


def test_an_idle_worker_with_the_cached_prefix_wins_by_the_prefill_it_saves() -> None:
    index = KvIndex()
    policy = policy_with(index)
    pool = workers(0, 0, 0)
    prompt = ids(40)
    holds(index, pool[1], prompt[:20])
    holds(index, pool[2], prompt[:8])
    routing = policy.route(pool, RouteRequest(prompt))
    assert routing.worker.url == "http://w1"
    assert routing.predicted_cached_tokens == 20
    assert costs(policy) == {"http://w0": 40 / RATE, "http://w1": 20 / RATE, "http://w2": 32 / RATE}


def test_pending_prefill_outweighs_the_saving_until_it_completes() -> None:
    index = KvIndex()
    policy = policy_with(index)
    pool = workers(0, 0)
    prompt = ids(40)
    holds(index, pool[1], prompt[:20])
    long_prompt = RouteRequest(ids(1000, start=5000))  # nothing cached anywhere: 1 s of prefill on w1
    policy.on_routed(pool[1], long_prompt)
    assert policy.predicted_load(pool[1]) == {
        "pending_prefill_tokens": 1000.0,
        "predicted_queue_seconds": 1.0,
        "tracked_requests": 1.0,
    }
    assert policy.select(pool, RouteRequest(prompt)).url == "http://w0"
    assert costs(policy) == {"http://w0": 40 / RATE, "http://w1": (1000 + 20) / RATE}
    policy.on_complete(pool[1], long_prompt, ok=True)  # done: w1 has only its cache to show
    assert policy.select(pool, RouteRequest(prompt)).url == "http://w1"
    assert costs(policy) == {"http://w0": 40 / RATE, "http://w1": 20 / RATE}


def test_occupancy_counts_the_prompts_in_flight_whatever_they_still_had_to_prefill() -> None:
    index = KvIndex()
    policy = policy_with(index, occupancy_weight=0.25)
    pool = workers(0, 0)
    conversation = ids(4000)
    holds(index, pool[1], conversation)  # w1 runs a long conversation, all of it cached: no prefill pending
    running = RouteRequest(conversation)
    policy.on_routed(pool[1], running)
    assert policy.predicted_load(pool[1]) == {
        "pending_prefill_tokens": 0.0,
        "predicted_queue_seconds": 0.25 * 4000 / RATE,
        "tracked_requests": 1.0,
    }
    prompt = ids(400)  # w1 holds its first 400 tokens too: a saving of 0.4 s against 1 s of occupancy
    assert policy.select(pool, RouteRequest(prompt)).url == "http://w0"
    assert costs(policy) == {"http://w0": 400 / RATE, "http://w1": (0.25 * 4000 + 0) / RATE}
    policy.on_complete(pool[1], running, ok=True)
    assert policy.select(pool, RouteRequest(prompt)).url == "http://w1"
    assert costs(policy) == {"http://w0": 400 / RATE, "http://w1": 0.0}


def test_an_answered_prompt_lingers_in_the_occupancy_for_its_next_turn() -> None:
    now = [100.0]
    index = KvIndex(clock=lambda: now[0])
    policy = policy_with(index, occupancy_weight=0.25, occupancy_linger_seconds=5.0)
    pool = workers(0, 0)
    turn = RouteRequest(ids(4000))
    policy.on_routed(pool[1], turn)
    policy.on_complete(pool[1], turn, ok=True)  # answered: its agent thinks, its next turn comes back here
    lingering = {"pending_prefill_tokens": 0.0, "predicted_queue_seconds": 1.0, "tracked_requests": 0.0}
    assert policy.predicted_load(pool[1]) == lingering
    prompt = RouteRequest(ids(400, start=50_000))  # a new conversation: the idle worker is cheaper
    assert policy.select(pool, prompt).url == "http://w0"
    assert costs(policy) == {"http://w0": 400 / RATE, "http://w1": (1000 + 400) / RATE}
    now[0] = 104.9
    policy.select(pool, prompt)
    assert costs(policy)["http://w1"] == (1000 + 400) / RATE
    now[0] = 105.0  # the linger is over: w1 is idle again, and forgotten
    policy.select(pool, prompt)
    assert costs(policy) == {"http://w0": 400 / RATE, "http://w1": 400 / RATE}
    assert policy.predicted_load(pool[1]) == IDLE
    # Without a linger an answered prompt leaves the occupancy at once.
    plain = policy_with(KvIndex(), occupancy_weight=0.25, occupancy_linger_seconds=0.0)
    plain.on_routed(pool[1], turn)
    plain.on_complete(pool[1], turn, ok=True)
    assert plain.predicted_load(pool[1])["predicted_queue_seconds"] == 0.0


def test_the_first_token_ends_the_pending_prefill_and_the_prompt_stays_in_the_occupancy() -> None:
    policy = policy_with(KvIndex(), occupancy_weight=0.25)
    pool = workers(0, 0)
    request = RouteRequest(ids(1000, start=5000))  # nothing cached: 1000 tokens to prefill on w1
    policy.on_routed(pool[1], request)
    assert policy.predicted_load(pool[1]) == {
        "pending_prefill_tokens": 1000.0,
        "predicted_queue_seconds": (1000 + 0.25 * 1000) / RATE,
        "tracked_requests": 1.0,
    }
    policy.on_first_token(pool[1], request)  # prefilled: it decodes now, holding its prompt's KV
    decoding = {"pending_prefill_tokens": 0.0, "predicted_queue_seconds": 0.25, "tracked_requests": 1.0}
    assert policy.predicted_load(pool[1]) == decoding
    policy.on_first_token(pool[1], request)  # a second first token, or one from elsewhere, changes nothing
    policy.on_first_token(pool[0], request)
    assert policy.predicted_load(pool[1]) == decoding
    assert policy.predicted_load(pool[0]) == IDLE
    prompt = RouteRequest(ids(400))
    policy.select(pool, prompt)
    assert costs(policy) == {"http://w0": 400 / RATE, "http://w1": (250 + 400) / RATE}
    policy.on_complete(pool[1], request, ok=True)
    assert policy.predicted_load(pool[1]) == IDLE


def test_a_next_turn_is_not_queued_behind_its_own_lingering_turn() -> None:
    """The linger stands for an agent coming back; when its next turn comes, its previous prompt's linger
    does not count against the worker holding it, and ends wherever the turn goes."""
    now = [100.0]
    index = KvIndex(clock=lambda: now[0])
    policy = policy_with(index, occupancy_weight=0.25, occupancy_linger_seconds=60.0)
    pool = workers(0, 0, 0)
    first, other = ids(4000), ids(4000, start=100_000)
    for worker, prompt in ((pool[1], first), (pool[2], other)):  # two agents, one a worker, both answered
        turn = RouteRequest(prompt)
        policy.on_routed(worker, turn)
        policy.on_complete(worker, turn, ok=True)
    assert policy.predicted_load(pool[1])["predicted_queue_seconds"] == 1.0
    new = RouteRequest(ids(400, start=50_000))  # a new conversation sees both lingering prompts
    policy.select(pool, new)
    assert costs(policy) == {"http://w0": 0.4, "http://w1": 1.4, "http://w2": 1.4}
    follow_up = RouteRequest(first + ids(400, start=9000))  # w1's agent is back: its 4000 tokens cached there
    assert policy.select(pool, follow_up).url == "http://w1"
    assert costs(policy) == {"http://w0": 4.4, "http://w1": 0.4, "http://w2": 1.0 + 4.4}
    policy.on_routed(pool[1], follow_up)  # its previous turn's linger ends; the new prompt is in flight
    assert policy.predicted_load(pool[1]) == {
        "pending_prefill_tokens": 400.0,
        "predicted_queue_seconds": (400 + 0.25 * 4400) / RATE,
        "tracked_requests": 1.0,
    }
    away = RouteRequest(other + ids(400, start=70_000))  # w2's agent is back, and sent elsewhere:
    pool[2].active_requests = 25_000  # w2 is decoding so much (5 s) that recomputing the prompt is cheaper
    assert policy.select(pool, away).url == "http://w0"
    policy.on_routed(pool[0], away)
    assert policy.predicted_load(pool[2]) == IDLE  # its linger on w2 ended all the same
    now[0] = 1000.0  # every linger is over: the one that ended early is not taken out twice
    policy.on_complete(pool[1], follow_up, ok=True)
    policy.on_complete(pool[0], away, ok=True)
    policy.select(pool, new)
    assert [policy.predicted_load(worker)["predicted_queue_seconds"] for worker in pool] == [1.1, 1.1, 0.0]


def test_below_the_affinity_threshold_only_what_one_worker_alone_holds_is_credited() -> None:
    index = KvIndex()
    policy = policy_with(index, affinity_threshold=0.8)
    pool = workers(0, 0, 0)
    prompt = ids(400)
    holds(index, pool[1], prompt[:240])  # 60 % of the prompt, held by two workers: a shared opening
    holds(index, pool[2], prompt[:240])
    routing = policy.route(pool, RouteRequest(prompt))
    assert routing.predicted_cached_tokens in (0, 240)  # what the chosen worker holds, credited or not
    assert costs(policy) == {"http://w0": 400 / RATE, "http://w1": 400 / RATE, "http://w2": 400 / RATE}
    holds(index, pool[2], prompt[:304])  # 76 %: w2 holds 64 tokens past the opening, this conversation's own
    assert policy.select(pool, RouteRequest(prompt)).url == "http://w2"
    assert costs(policy) == {"http://w0": 400 / RATE, "http://w1": 400 / RATE, "http://w2": 336 / RATE}
    holds(index, pool[2], prompt[:320])  # 80 %: now all of every worker's match counts
    assert policy.select(pool, RouteRequest(prompt)).url == "http://w2"
    assert costs(policy) == {"http://w0": 400 / RATE, "http://w1": 160 / RATE, "http://w2": 80 / RATE}


def test_on_routed_adds_the_uncached_tokens_and_on_complete_frees_them() -> None:
    index = KvIndex()
    policy = policy_with(index)
    pool = workers(0, 0)
    shared = ids(400)
    holds(index, pool[0], shared[:200])
    first, second = RouteRequest(shared + ids(100, start=9000)), RouteRequest(ids(1000, start=20_000))
    routing = policy.route(pool, first)  # w0: 300 uncached tokens against w1's 500
    assert routing.worker.url == "http://w0" and routing.predicted_cached_tokens == 200
    policy.on_routed(pool[0], first)
    policy.on_routed(pool[0], second)  # routed without its own select: matched on w0 alone, nothing cached
    assert policy.predicted_load(pool[0]) == {
        "pending_prefill_tokens": 1300.0,
        "predicted_queue_seconds": 1300 / RATE,
        "tracked_requests": 2.0,
    }
    # The same request routed here again counts once, with what is predicted now: its blocks, recorded as
    # routed here by the first on_routed, are all cached now (1000 tokens: whole blocks of 4).
    policy.on_routed(pool[0], second)
    assert policy.predicted_load(pool[0])["pending_prefill_tokens"] == 300.0
    assert policy.predicted_load(pool[0])["tracked_requests"] == 2.0
    policy.on_complete(pool[0], first, ok=False)  # a failed request needs no more prefill either
    assert policy.predicted_load(pool[0])["pending_prefill_tokens"] == 0.0
    policy.on_complete(pool[0], second, ok=True)
    assert policy.predicted_load(pool[0]) == IDLE  # nothing in flight
    policy.on_complete(pool[0], second, ok=True)  # a second completion changes nothing
    policy.on_complete(pool[1], second, ok=True)  # nor one from a worker it was never sent to
    assert policy.predicted_load(pool[0])["tracked_requests"] == 0.0
    assert policy.predicted_load(pool[1])["tracked_requests"] == 0.0


def test_equal_costs_take_turns() -> None:
    policy = policy_with(KvIndex())
    pool = workers(0, 0, 0)
    chosen = []
    for turn in range(6):
        request = RouteRequest(ids(16, start=100 * turn))
        worker = policy.select(pool, request)
        policy.on_routed(worker, request)
        policy.on_complete(worker, request, ok=True)
        chosen.append(worker.url)
    assert chosen == ["http://w0", "http://w1", "http://w2"] * 2


def test_requests_in_flight_cost_decode_time() -> None:
    policy = policy_with(KvIndex(), decode_seconds_per_request=0.25)
    pool = workers(3, 1)
    assert policy.select(pool, RouteRequest(ids(8))).url == "http://w1"
    assert costs(policy) == {"http://w0": 0.75 + 8 / RATE, "http://w1": 0.25 + 8 / RATE}


def test_overlap_credit_weighs_cached_tokens() -> None:
    index = KvIndex()
    pool = workers(0, 0)
    prompt = ids(40)
    holds(index, pool[1], prompt[:20])
    ignoring = policy_with(index, overlap_credit=0.0)
    ignoring.select(pool, RouteRequest(prompt))
    assert costs(ignoring) == {"http://w0": 40 / RATE, "http://w1": 40 / RATE}
    doubled = policy_with(index, overlap_credit=2.0)
    assert doubled.select(pool, RouteRequest(prompt)).url == "http://w1"
    assert costs(doubled)["http://w1"] == 0.0


def test_a_temperature_draws_reproducibly_with_a_seed_and_favours_the_cheaper() -> None:
    index = KvIndex()
    pool = workers(0, 0, 0)
    prompt = ids(40)
    holds(index, pool[1], prompt[:40])  # w1: 0.0 s (all cached), the others 0.04 s

    def draws(seed: int) -> list[str]:
        policy = policy_with(index, temperature=0.02, seed=seed)
        return [policy.select(pool, RouteRequest(prompt)).url for _ in range(300)]

    first, again, other = draws(7), draws(7), draws(8)
    assert first == again
    assert first != other
    counts = Counter(first)
    assert sum(counts.values()) == 300
    # p(w1) = 1 / (1 + 2 e^-2) = 0.787: far more than either other, and the others are drawn too.
    assert counts["http://w1"] > 180 and counts["http://w0"] > 10 and counts["http://w2"] > 10


def test_tracking_is_bounded_per_worker() -> None:
    policy = policy_with(KvIndex(), max_in_flight_per_worker=2)
    worker = WorkerLoad("http://w0", tokens_per_block=4)
    requests = [RouteRequest(ids(500, start=1000 * i)) for i in range(3)]
    for request in requests:
        policy.on_routed(worker, request)
    assert policy.predicted_load(worker)["tracked_requests"] == 2.0
    assert policy.predicted_load(worker)["predicted_queue_seconds"] == 1.0  # the oldest's 0.5 s dropped


def test_a_request_without_ids_costs_its_queue_and_load_only() -> None:
    """Nothing to match and nothing known to prefill: the pending prefill decides, and it adds none."""
    policy = policy_with(KvIndex())
    pool = workers(0, 0)
    policy.on_routed(pool[0], RouteRequest(ids(500)))
    routing = policy.route(pool, RouteRequest(None))
    assert routing.worker.url == "http://w1" and routing.predicted_cached_tokens == 0
    assert costs(policy) == {"http://w0": 0.5, "http://w1": 0.0}
    policy.on_routed(routing.worker, RouteRequest(None))
    assert policy.predicted_load(routing.worker) == {
        "pending_prefill_tokens": 0.0,
        "predicted_queue_seconds": 0.0,
        "tracked_requests": 1.0,
    }


def test_the_factory_takes_the_policy_s_own_config() -> None:
    config = PredictedTtftConfig(prefill_tokens_per_second=5000.0, temperature=0.5, seed=3)
    policy = build_policy("predicted_ttft", kv_index=KvIndex(), options=(config,))
    assert isinstance(policy, PredictedTtftPolicy) and policy.config is config
    default = build_policy("predicted_ttft", kv_index=KvIndex())
    assert isinstance(default, PredictedTtftPolicy) and default.config == PredictedTtftConfig()
    assert default.config.prefill_tokens_per_second == 20_000.0


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("prefill_tokens_per_second", 0.0),
        ("prefill_tokens_per_second", float("inf")),
        ("decode_seconds_per_request", -1.0),
        ("overlap_credit", float("nan")),
        ("affinity_threshold", 1.5),
        ("temperature", -0.1),
        ("max_in_flight_per_worker", 0),
    ],
)
def test_settings_are_validated(setting: str, value: float) -> None:
    with pytest.raises(ValueError, match=setting):
        PredictedTtftConfig(**{setting: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--prefill-tokens-per-second", "inf"],
            "error: --prefill-tokens-per-second must be a positive number",
        ),
        (
            ["--routing-temperature", "-1"],
            "error: argument --routing-temperature: must be at least 0 (see `tokenfront route --help`)",
        ),
    ],
)
def test_route_refuses_bad_settings_in_one_line(flags: list[str], message: str) -> None:
    command = [sys.executable, "-m", "tokenfront.cli", "route", "--worker", "http://127.0.0.1:9"]
    result = subprocess.run(
        [*command, "--policy", "predicted_ttft", *flags, "--host", "127.0.0.1", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in result.stderr


def test_a_peer_replicas_requests_count_as_this_routers_own() -> None:
    """What one replica's ``shared_load`` says, another's ``on_peer_*`` hooks track: the same pending prefill,
    the same occupancy and linger, the linger ended by the peer's next turn."""
    now = [100.0]
    index, peer_index = KvIndex(clock=lambda: now[0]), KvIndex(clock=lambda: now[0])
    policy = policy_with(index, occupancy_weight=0.25, occupancy_linger_seconds=5.0)
    peer = policy_with(peer_index, occupancy_weight=0.25, occupancy_linger_seconds=5.0)
    pool = workers(0, 0)
    turn = RouteRequest(ids(1000, start=5000))
    peer.on_routed(pool[1], turn)
    shared = peer.shared_load(pool[1], turn)
    assert shared is not None and (shared.uncached_tokens, shared.prompt_tokens) == (1000, 1000)
    assert shared.end == (1000 // TPB - 1, int(block_hashes(turn.token_ids or [], TPB)[-1]))
    policy.on_peer_routed(pool[1], ("peer", 1), shared)
    assert (
        policy.predicted_load(pool[1])
        == peer.predicted_load(pool[1])
        == {
            "pending_prefill_tokens": 1000.0,
            "predicted_queue_seconds": (1000 + 0.25 * 1000) / RATE,
            "tracked_requests": 1.0,
        }
    )
    assert policy.select(pool, RouteRequest(ids(40))).url == "http://w0"  # w1 is busy with the peer's prompt
    policy.on_peer_first_token(pool[1], ("peer", 1))
    assert policy.predicted_load(pool[1])["pending_prefill_tokens"] == 0.0
    policy.on_peer_complete(pool[1], ("peer", 1))  # answered: it lingers here as it would on the peer
    lingering = {"pending_prefill_tokens": 0.0, "predicted_queue_seconds": 0.25, "tracked_requests": 0.0}
    assert policy.predicted_load(pool[1]) == lingering
    # The peer routes the conversation's next turn: its message names the turn it continues, ending the linger.
    peer.on_complete(pool[1], turn, ok=True)
    holds(peer_index, pool[1], turn.token_ids or [])
    next_turn = RouteRequest([*(turn.token_ids or []), *ids(200, start=90_000)])
    assert peer.select(pool, next_turn).url == "http://w1"
    peer.on_routed(pool[1], next_turn)
    follow = peer.shared_load(pool[1], next_turn)
    assert follow is not None and follow.continued == (shared.end,)
    assert (follow.uncached_tokens, follow.prompt_tokens) == (200, 1200)  # the first turn's 1,000 cached
    policy.on_peer_routed(pool[1], ("peer", 2), follow)
    assert policy.predicted_load(pool[1]) == {
        "pending_prefill_tokens": 200.0,
        "predicted_queue_seconds": (200 + 0.25 * 1200) / RATE,  # the old turn's linger is over
        "tracked_requests": 1.0,
    }
    policy.on_peer_complete(pool[1], ("peer", 2))
    policy.on_peer_complete(pool[1], ("peer", 2))  # twice (a lost DONE mended by a beat) counts once
    now[0] += 5.0
    policy.select(pool, RouteRequest(ids(40)))
    assert policy.predicted_load(pool[1]) == IDLE

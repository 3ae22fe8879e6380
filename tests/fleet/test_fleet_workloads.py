"""The fleet workloads (benchmarks/fleet/workloads.py): their shape, counts and reuse, reproducible by seed."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict

import pytest
from benchmarks.fleet.oracle import achievable_hit_rate
from benchmarks.fleet.workloads import AgenticSessions, SharedDocuments, summarize

AGENTIC = AgenticSessions(sessions=20, session_rate=0.5, seed=3)


def test_agentic_sessions_reuse_about_94_percent_of_each_prompt() -> None:
    summary = summarize(AGENTIC.requests())
    assert 0.90 <= summary.seen_before_share <= 0.97, summary
    assert summary.sessions == 20
    assert 20 * 20 * 0.8 <= summary.requests <= 20 * 40  # 20-40 turns, a few sessions cut by the context
    assert 20_000 <= summary.mean_prompt_tokens <= 70_000


def test_agentic_turns_grow_their_session_and_arrive_in_time_order() -> None:
    requests = list(AGENTIC.requests())
    assert [r.at for r in requests] == sorted(r.at for r in requests)
    assert all(r.prompt_tokens + r.max_tokens <= AGENTIC.max_prompt_tokens for r in requests)
    by_session = defaultdict(list)
    for request in requests:
        by_session[request.session].append(request)
    compared = 0
    for turns in by_session.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        # All its turns, or cut short: one more turn (up to 200 + 3072 + 200 tokens) would not have fit.
        assert 20 <= len(turns) <= 40 or turns[-1].prompt_tokens > AGENTIC.max_prompt_tokens - 3472
        assert 4096 + 200 <= turns[0].prompt_tokens <= 8192 + 800 and turns[0].think_seconds is None
        for previous, turn in itertools.pairwise(turns):
            ids, before = turn.prompt_token_ids(), previous.prompt_token_ids()
            assert ids[: len(before)] == before  # the previous prompt, then its answer and the tool's output
            assert previous.max_tokens + 1024 <= len(ids) - len(before) <= previous.max_tokens + 3072
            assert 30 <= previous.max_tokens <= 200 and turn.at >= previous.at
            compared += 1
    assert compared == len(requests) - 20
    # Every session shares the one agent's system prompt.
    firsts = [turns[0].prompt_token_ids() for turns in by_session.values()]
    system = len(AGENTIC.requests().__next__().segments[0])
    assert len({tuple(f[:system]) for f in firsts}) == 1


def test_agentic_sessions_arrive_as_a_poisson_process() -> None:
    workload = AgenticSessions(sessions=400, session_rate=2.0, turns=(1, 1), system_tokens=(16, 16), seed=1)
    starts = [r.at for r in workload.requests()]
    gaps = [b - a for a, b in zip([0.0, *starts], starts, strict=False)]
    assert len(gaps) == 400
    assert statistics.mean(gaps) == pytest.approx(0.5, rel=0.15)  # 1 / rate
    assert statistics.stdev(gaps) == pytest.approx(0.5, rel=0.2)  # exponential: the sd is the mean


def test_a_seed_reproduces_a_workload_and_another_does_not() -> None:
    first = [(r.at, r.prompt_token_ids()) for r in AgenticSessions(sessions=3, seed=9).requests()]
    again = [(r.at, r.prompt_token_ids()) for r in AgenticSessions(sessions=3, seed=9).requests()]
    other = [(r.at, r.prompt_token_ids()) for r in AgenticSessions(sessions=3, seed=10).requests()]
    assert first == again != other


def test_groups_of_users_share_their_document() -> None:
    workload = SharedDocuments(groups=4, users=60, seed=2)
    requests = list(workload.requests())
    summary = summarize(iter(requests))
    assert summary.sessions == 60 and 60 <= summary.requests <= 240  # 1-4 questions each
    documents = {tuple(r.segments[1]) for r in requests}
    assert len(documents) == 4 and all(8192 <= len(d) <= 32768 for d in documents)
    assert len({r.segments[0] for r in requests}) == 1  # one system prompt for everyone
    # 60 users over 4 documents: all but the first user of each group finds its document sent before.
    assert summary.seen_before_share > 0.85
    # A fleet holding less than one document loses nearly all of it.
    small = achievable_hit_rate(iter(requests), 100, tokens_per_block=16)
    assert small.hit_rate < 0.2 and small.prompt_tokens == summary.prompt_tokens


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"sessions": 0}, "sessions"),
        ({"session_rate": 0.0}, "session_rate"),
        ({"turns": (5, 2)}, "turns"),
        ({"id_range": (10, 10)}, "id_range"),
        ({"think_seconds": -1.0}, "think_seconds"),
    ],
)
def test_settings_that_make_no_workload_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AgenticSessions(**settings)

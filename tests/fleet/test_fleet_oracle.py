"""The fleet oracle (benchmarks/fleet/oracle.py) on sequences small enough to count by hand."""

from __future__ import annotations

import pytest
from benchmarks.fleet.oracle import HitOracle, achievable_hit_rate, fleet_cache_blocks

BLOCK = 4


def _ids(*blocks: str, tail: int = 0) -> list[int]:
    """A prompt of whole 4-token blocks named by letters (the same letter, the same ids), plus `tail` ids."""
    ids = [ord(name) * 10 + i for name in blocks for i in range(BLOCK)]
    return ids + [900 + i for i in range(tail)]


def test_unbounded_the_hit_is_every_full_block_sent_before() -> None:
    # By hand, with 4-token blocks (the hit counts full blocks of the prompt without its last token):
    #   1. A B C + 2    : nothing was sent before                              -> 0 of 14
    #   2. A B C D + 1  : A B C were sent by 1; D is new                       -> 12 of 17
    #   3. A B X        : A B sent; X new. Its last block is whole, so the
    #                     lookup stops before it (the last token is computed) -> 8 of 12
    #   4. B A          : B was sent, but never as a first block              -> 0 of 8
    #   5. A B C D      : A B C D sent by 2; D is its last block              -> 12 of 16
    prompts = [_ids("A", "B", "C", tail=2), _ids("A", "B", "C", "D", tail=1), _ids("A", "B", "X")]
    prompts += [_ids("B", "A"), _ids("A", "B", "C", "D")]
    result = achievable_hit_rate(prompts, None, tokens_per_block=BLOCK)
    assert (result.requests, result.prompt_tokens, result.hit_tokens) == (5, 67, 32)
    assert result.hit_rate == pytest.approx(32 / 67)


def test_a_fleet_holds_its_capacity_and_evicts_the_least_recently_used() -> None:
    # Capacity 3 blocks. By hand:
    #   1. A B + 1  : miss                          -> 0; holds A B
    #   2. C + 1    : miss                          -> 0; holds A B C
    #   3. A B + 1  : hit A B                       -> 8; A B most recent
    #   4. D + 1    : miss; evicts C (oldest leaf)  -> 0; holds A B D
    #   5. C + 1    : miss (evicted); evicts B      -> 0; holds A D C
    #   6. A B + 1  : A only (B evicted)            -> 4
    prompts = [_ids("A", "B", tail=1), _ids("C", tail=1), _ids("A", "B", tail=1), _ids("D", tail=1)]
    prompts += [_ids("C", tail=1), _ids("A", "B", tail=1)]
    oracle = HitOracle(3, tokens_per_block=BLOCK)
    assert [oracle.add(prompt) for prompt in prompts] == [0, 0, 8, 0, 0, 4]
    assert oracle.result().hit_tokens == 12 and oracle.prompt_tokens == 9 + 5 + 9 + 5 + 5 + 9
    # Without the bound, the same sequence hits more: 3 (A B), 5 (C), 6 (A B).
    assert achievable_hit_rate(prompts, None, tokens_per_block=BLOCK).hit_tokens == 8 + 4 + 8


def test_fleet_capacity_is_workers_times_whole_blocks() -> None:
    assert fleet_cache_blocks(64, 262_144, 16) == 64 * 16_384
    assert fleet_cache_blocks(3, 100, 16) == 3 * 6  # a partial block holds nothing
    assert achievable_hit_rate([_ids("A", tail=1)] * 3, 0, tokens_per_block=BLOCK).hit_tokens == 0

"""The KV-free prefix index (worker/prefix_index.py): the blocks a cache holds and the events it publishes are
those of the worker's real prefix KV cache (worker/kv_cache.py) under the same stores and lookups."""

from __future__ import annotations

import random

import pytest
import torch

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.worker.kv_cache import PrefixKvCache
from tokenfront.worker.kv_events import KvEventLog
from tokenfront.worker.prefix_index import PrefixBlockIndex

BLOCK = 4


def _kv(tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """KV of one layer, one head, one dimension: the real cache needs tensors, their values do not matter."""
    return [(torch.zeros(1, 1, tokens, 1), torch.zeros(1, 1, tokens, 1))]


def _events(log: KvEventLog) -> list[dict]:
    return log.read(0, 100_000)["events"]


@pytest.mark.parametrize("seed", range(6))
def test_the_index_publishes_what_the_real_cache_publishes(seed: int) -> None:
    """Random stores and lookups over prompts that share prefixes, in a cache small enough to evict often:
    every lookup finds as many blocks, and the two event logs are equal, event for event."""
    rng = random.Random(seed)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(4, 24))] for _ in range(6)]
    real_log, index_log = KvEventLog(), KvEventLog()
    real = PrefixKvCache(BLOCK, 40, real_log)  # 10 blocks
    index = PrefixBlockIndex(BLOCK, 40, index_log)
    matches = 0
    for _ in range(300):
        stem = rng.choice(stems)
        prompt = stem[: rng.randrange(1, len(stem) + 1)] + [
            rng.randrange(50) for _ in range(rng.randrange(0, 9))
        ]
        hashes = block_hashes(prompt, BLOCK)
        if rng.random() < 0.5:
            real_hit, _ = real.match(prompt)
            assert index.match(hashes) * BLOCK == real_hit
            matches += 1
        else:
            assert index.store(hashes, prompt) == real.store(prompt, None, _kv(len(prompt)))
        assert index.num_blocks == real.num_blocks
    events = _events(real_log)
    assert matches > 100
    assert sum(event["type"] == "removed" for event in events) > 10  # eviction was exercised
    assert _events(index_log) == events


def test_eviction_takes_the_least_recently_used_leaf_first() -> None:
    """A chain never loses a middle block: with the budget full, the oldest leaf goes, then its parent."""
    log = KvEventLog()
    index = PrefixBlockIndex(BLOCK, 3 * BLOCK, log)  # 3 blocks
    chain = list(range(3 * BLOCK))  # blocks a -> b -> c
    a, b, c = block_hashes(chain, BLOCK)
    assert index.store([a, b, c], chain) == 3
    other = [99] * BLOCK
    (d,) = block_hashes(other, BLOCK)
    assert index.match([a]) == 1  # a is now the most recent, yet it has a child: c goes first
    assert index.store([d], other) == 1
    assert index.store(block_hashes([98] * BLOCK, BLOCK), [98] * BLOCK) == 1
    removed = [event["block_hashes"] for event in _events(log) if event["type"] == "removed"]
    assert removed == [[c], [b]]
    assert index.match([a, b]) == 1 and a in index and d in index


def test_a_held_block_after_another_parent_is_no_hit() -> None:
    """The parent check: a block counts only after the block it was stored after."""
    index = PrefixBlockIndex(BLOCK, 100)
    index.store([11, 12], [0] * 2 * BLOCK)
    assert index.match([11, 12]) == 2
    assert index.match([12]) == 0  # held, but as the child of 11, not as a first block
    assert index.match([13, 12]) == 0


def test_an_empty_budget_holds_nothing_and_logs_nothing() -> None:
    log = KvEventLog()
    index = PrefixBlockIndex(BLOCK, BLOCK - 1, log)  # less than one block
    assert index.store([1, 2], [0] * 2 * BLOCK) == 0
    assert index.match([1]) == 0
    assert log.last_seq == 0

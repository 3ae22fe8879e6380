"""The prefix KV cache and its event log, on KV tensors whose values name their layer and position."""

from __future__ import annotations

import threading

import pytest
import torch

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.worker.kv_cache import KvLayers, PrefixKvCache
from tokenfront.worker.kv_events import KvEventLog

BLOCK = 4
LAYERS = 2


def kv_for(token_ids: list[int]) -> KvLayers:
    """KV whose every key / value entry encodes (layer, token id at that position): checkable after slicing."""
    ids = torch.tensor(token_ids, dtype=torch.float32)
    pairs = []
    for layer in range(LAYERS):
        keys = (ids + 1000 * layer).view(1, 1, -1, 1).expand(1, 2, -1, 3).clone()
        pairs.append((keys, -keys))
    return pairs


def store(cache: PrefixKvCache, ids: list[int], salt: str | None = None) -> int:
    return cache.store(ids, salt, kv_for(ids))


def removed_hashes(log: KvEventLog, after: int = 0) -> list[list[int]]:
    return [e["block_hashes"] for e in log.read(after)["events"] if e["type"] == "removed"]


# ---------------------------------------------------------------------------- match and store


def test_match_returns_the_stored_kv_of_the_longest_cached_prefix() -> None:
    cache = PrefixKvCache(BLOCK, 64)
    prompt = list(range(10, 21))  # 11 ids: two full blocks, 3 ids left over
    assert store(cache, prompt) == 2
    n, kv = cache.match([*prompt[:8], 99, 98, 97, 96])
    assert n == 8 and kv is not None
    expected = kv_for(prompt[:8])
    for (keys, values), (want_keys, want_values) in zip(kv, expected, strict=True):
        assert keys.shape == (1, 2, 8, 3)
        assert torch.equal(keys, want_keys) and torch.equal(values, want_values)


def test_match_stops_at_the_first_block_not_held() -> None:
    cache = PrefixKvCache(BLOCK, 64)
    store(cache, [1, 2, 3, 4, 5, 6, 7, 8])
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 0])[0] == 4  # second block differs
    assert cache.match([0, 2, 3, 4, 5, 6, 7, 8]) == (0, None)  # first block differs: no hit at all
    assert cache.match([1, 2, 3])[0] == 0  # not a full block


def test_blocks_are_copies_not_views_of_the_request_kv() -> None:
    cache = PrefixKvCache(BLOCK, 64)
    ids = [1, 2, 3, 4]
    kv = kv_for(ids)
    cache.store(ids, None, kv)
    kv[0][0].zero_()
    _, matched = cache.match(ids)
    assert matched is not None and torch.equal(matched[0][0], kv_for(ids)[0][0])


def test_cache_salt_separates_caches() -> None:
    cache = PrefixKvCache(BLOCK, 64)
    ids = list(range(8))
    store(cache, ids, salt="tenant-a")
    assert cache.match(ids, "tenant-a")[0] == 8
    assert cache.match(ids, "tenant-b")[0] == 0
    assert cache.match(ids)[0] == 0


def test_store_of_a_known_prefix_adds_nothing_and_logs_nothing() -> None:
    log = KvEventLog()
    cache = PrefixKvCache(BLOCK, 64, log)
    store(cache, list(range(8)))
    seq = log.last_seq
    assert store(cache, list(range(8))) == 0
    assert log.last_seq == seq


# ---------------------------------------------------------------------------- events


def test_stored_events_carry_hashes_parent_links_and_token_ids() -> None:
    log = KvEventLog()
    cache = PrefixKvCache(BLOCK, 64, log)
    first = list(range(8))
    longer = [*first, 50, 51, 52, 53, 60]
    store(cache, first)
    store(cache, longer)
    events = log.read(0)["events"]
    hashes = block_hashes(longer, BLOCK)
    assert [e["seq"] for e in events] == [1, 2]
    assert events[0] == {
        "seq": 1,
        "type": "stored",
        "block_hashes": hashes[:2],
        "parent_block_hash": None,
        "token_ids": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "tokens_per_block": BLOCK,
    }
    assert events[1]["block_hashes"] == [hashes[2]]
    assert events[1]["parent_block_hash"] == hashes[1]
    assert events[1]["token_ids"] == [[50, 51, 52, 53]]


def test_clear_drops_everything_and_logs_it() -> None:
    log = KvEventLog()
    cache = PrefixKvCache(BLOCK, 64, log)
    store(cache, list(range(8)))
    cache.clear()
    assert cache.num_blocks == 0
    assert cache.match(list(range(8))) == (0, None)
    assert log.read(1)["events"] == [{"seq": 2, "type": "cleared"}]


# ---------------------------------------------------------------------------- eviction


def test_eviction_takes_least_recently_used_leaves_first() -> None:
    log = KvEventLog()
    cache = PrefixKvCache(BLOCK, 5 * BLOCK, log)  # room for 5 blocks
    shared = [1, 1, 1, 1]
    a = [*shared, 2, 2, 2, 2, 3, 3, 3, 3]  # blocks: shared, a2, a3
    b = [*shared, 7, 7, 7, 7]  # blocks: shared, b2
    store(cache, a)
    store(cache, b)
    assert cache.num_blocks == 4
    cache.match(a)  # a is now more recent than b
    seq = log.last_seq
    store(cache, [9, 9, 9, 9, 8, 8, 8, 8])  # 2 new blocks: one must go
    b_hashes = block_hashes(b, BLOCK)
    # b2 is the least recently used leaf; the shared block has a child left (a2), so it stays.
    assert removed_hashes(log, seq) == [[b_hashes[1]]]
    assert cache.num_blocks == 5
    assert cache.match(a)[0] == 12
    assert cache.match(b)[0] == 4


def test_eviction_never_removes_a_middle_block() -> None:
    log = KvEventLog()
    cache = PrefixKvCache(BLOCK, 3 * BLOCK, log)
    chain = list(range(12))  # 3 blocks, root first
    store(cache, chain)
    seq = log.last_seq
    store(cache, [100, 101, 102, 103, 104, 105, 106, 107])  # 2 new blocks
    chain_hashes = block_hashes(chain, BLOCK)
    # Leaves go first: the chain loses its tail, last block first, and keeps a usable prefix.
    assert removed_hashes(log, seq) == [[chain_hashes[2], chain_hashes[1]]]
    assert cache.match(chain)[0] == 4
    assert cache.num_tokens == 3 * BLOCK


def test_a_chain_longer_than_the_budget_is_stored_up_to_the_budget() -> None:
    log = KvEventLog()
    cache = PrefixKvCache(BLOCK, 2 * BLOCK, log)
    ids = list(range(5 * BLOCK))
    assert store(cache, ids) == 2
    assert cache.match(ids)[0] == 2 * BLOCK
    assert removed_hashes(log) == []


def test_a_zero_budget_stores_nothing() -> None:
    log = KvEventLog()
    cache = PrefixKvCache(BLOCK, 0, log)
    assert store(cache, list(range(8))) == 0
    assert cache.match(list(range(8))) == (0, None)
    assert log.last_seq == 0


def test_heavy_churn_keeps_the_budget_and_a_consistent_tree() -> None:
    log = KvEventLog(max_events=100_000)
    cache = PrefixKvCache(BLOCK, 16 * BLOCK, log)
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        # Prompts over a tiny alphabet share many prefixes of different depths.
        ids = torch.randint(
            0, 2, (int(torch.randint(4, 40, (1,), generator=generator)),), generator=generator
        )
        store(cache, ids.tolist())
        assert cache.num_blocks <= 16
    # Replay the log: every stored block's parent is present when stored, no removed block has a child left.
    present: dict[int, int | None] = {}
    for event in log.read(0, limit=100_000)["events"]:
        if event["type"] == "stored":
            parent = event["parent_block_hash"]
            assert parent is None or parent in present
            for block_hash in event["block_hashes"]:
                present[block_hash] = parent
                parent = block_hash
        elif event["type"] == "removed":
            for block_hash in event["block_hashes"]:
                assert block_hash not in present.values()
                del present[block_hash]
    assert len(present) == cache.num_blocks
    assert all(block_hash in cache for block_hash in present)


# ---------------------------------------------------------------------------- the event log


def test_readers_are_independent_and_reading_never_consumes() -> None:
    log = KvEventLog()
    for i in range(5):
        log.removed([i])
    first = log.read(0, limit=2)
    assert [e["seq"] for e in first["events"]] == [1, 2]
    assert first["last_seq"] == 5 and first["oldest_seq"] == 1 and not first["truncated"]
    second = log.read(2)
    assert [e["seq"] for e in second["events"]] == [3, 4, 5]
    assert [e["seq"] for e in log.read(0)["events"]] == [1, 2, 3, 4, 5]
    assert log.read(5)["events"] == []


def test_a_reader_behind_the_bounded_history_is_told_it_is_truncated() -> None:
    log = KvEventLog(max_events=3)
    for i in range(5):
        log.removed([i])
    behind = log.read(1)
    assert behind["truncated"] and behind["oldest_seq"] == 3
    assert [e["seq"] for e in behind["events"]] == [3, 4, 5]
    at_edge = log.read(2)  # it saw seq 2, and 3 is still held: nothing missed
    assert not at_edge["truncated"] and [e["seq"] for e in at_edge["events"]] == [3, 4, 5]


def test_a_reader_from_a_previous_life_of_the_worker_is_told_it_is_truncated() -> None:
    log = KvEventLog()
    log.cleared()
    reply = log.read(40)
    assert reply["truncated"] and reply["last_seq"] == 1
    assert [e["seq"] for e in reply["events"]] == [1]
    assert reply["log_id"] != KvEventLog().log_id


def test_an_empty_log_reads_cleanly() -> None:
    reply = KvEventLog().read(0)
    assert reply["events"] == [] and reply["last_seq"] == 0 and reply["oldest_seq"] == 1
    assert not reply["truncated"]
    with pytest.raises(ValueError):
        KvEventLog().read(-1)


def test_the_log_is_thread_safe() -> None:
    log = KvEventLog(max_events=100_000)

    def write() -> None:
        for i in range(1000):
            log.removed([i])

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seqs = [e["seq"] for e in log.read(0, limit=10_000)["events"]]
    assert seqs == list(range(1, 4001))

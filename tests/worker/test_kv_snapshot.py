"""A reader behind the KV event log's history gets the prefix cache's snapshot: the simulated engine's
PrefixBlockIndex and the real worker's PrefixKvCache, read through their KvEventLog as the route reads them,
and the router's index fed from that answer (worker/kv_snapshot.py, router/tokenfront_feed.py)."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.router.kv_index import KvIndex
from tokenfront.worker.kv_cache import KvLayers, PrefixKvCache
from tokenfront.worker.kv_events import KvEventLog
from tokenfront.worker.kv_snapshot import take_snapshot
from tokenfront.worker.prefix_index import PrefixBlockIndex

BLOCK = 16
FULL_CACHE_TOKENS = 262_144  # the simulated GPU's default prefix cache: 16,384 blocks


def conversations(rng: random.Random, index: PrefixBlockIndex, stored_blocks: int) -> None:
    """Store agentic-looking prompts (one shared system prompt, conversations that grow turn by turn and
    branch) until ``stored_blocks`` blocks were stored: past the budget, so the cache has evicted."""
    system = [rng.randrange(100_000) for _ in range(2048)]
    talks: list[list[int]] = []
    while index.stored_blocks < stored_blocks:
        if not talks or rng.random() < 0.2:
            talks.append(list(system))
        elif rng.random() < 0.1:  # a branch: the same conversation, answered otherwise from here on
            talks.append(list(rng.choice(talks)))
        talk = rng.choice(talks)
        talk.extend(rng.randrange(100_000) for _ in range(rng.randrange(100, 3000)))
        index.store(block_hashes(talk, BLOCK), talk)


def held_blocks(snapshot: list[list[object]]) -> dict[int, int | None]:
    """block -> parent, as the snapshot's chains say, checking that every chain's parent came before it."""
    parents: dict[int, int | None] = {}
    for parent, chain in snapshot:
        assert parent is None or parent in parents, "a chain's parent is in an earlier chain"
        assert isinstance(chain, list) and chain
        for block in chain:
            assert block not in parents, "each block once"
            parents[block] = parent  # type: ignore[assignment]
            parent = block
    return parents


def test_a_truncated_reader_of_a_full_simulated_cache_gets_every_block_as_chains() -> None:
    log = KvEventLog(max_events=64)
    index = PrefixBlockIndex(BLOCK, FULL_CACHE_TOKENS, log)
    conversations(random.Random(0), index, stored_blocks=24_000)
    assert index.num_blocks == 16_384 and index.evicted_blocks > 0 and log.last_seq > 64

    answer = log.read(0, 1000, snapshot=index.snapshot)
    assert answer["truncated"] and answer["events"] == [] and answer["last_seq"] == log.last_seq
    assert answer["snapshot_blocks"] == 16_384
    held = held_blocks(answer["snapshot"])
    assert held == index.parents()  # every block, each with its own parent
    # One chain per branch: far fewer chains than blocks (the JSON is about one number a block).
    assert len(answer["snapshot"]) < 200

    at_edge = log.read(log.last_seq - 1, snapshot=index.snapshot)  # nothing missed: events, no snapshot
    assert not at_edge["truncated"] and "snapshot" not in at_edge and len(at_edge["events"]) == 1


def test_a_reader_of_another_life_of_the_log_gets_the_snapshot() -> None:
    log = KvEventLog()
    index = PrefixBlockIndex(BLOCK, 4096, log)
    ids = list(range(100, 164))
    index.store(block_hashes(ids, BLOCK), ids)
    same = log.read(0, log_id=log.log_id, snapshot=index.snapshot)
    assert not same["truncated"] and len(same["events"]) == 1
    other = log.read(0, log_id="a-previous-life", snapshot=index.snapshot)
    assert other["truncated"] and other["snapshot"] == [[None, block_hashes(ids, BLOCK)]]
    assert other["snapshot_blocks"] == 4
    without = log.read(0, log_id="a-previous-life")  # the log alone (no cache to ask): its history, as before
    assert without["truncated"] and len(without["events"]) == 1 and "snapshot" not in without


def test_chains_follow_branches_parents_first() -> None:
    # a - b - c, b - d, e (a root of its own), f whose parent g is not held.
    blocks = [(1, None), (2, 1), (3, 2), (4, 2), (5, None), (6, 7)]
    snapshot = take_snapshot(blocks, seq=9)
    assert (snapshot.seq, snapshot.blocks) == (9, 6)
    assert snapshot.chains == [[None, [1, 2, 3]], [2, [4]], [None, [5]], [7, [6]]]


def kv_for(token_ids: list[int]) -> KvLayers:
    """Small KV for each position (the snapshot never looks at it)."""
    keys = torch.tensor(token_ids, dtype=torch.float32).view(1, 1, -1, 1).expand(1, 1, -1, 2).clone()
    return [(keys, -keys)]


def test_the_real_workers_cache_snapshot_is_consistent_with_last_seq_while_it_changes() -> None:
    # The engine thread stores and evicts while the route reads: each snapshot, followed by the events after
    # its seq, must rebuild exactly the cache as it ends up.
    log = KvEventLog(max_events=1_000_000)  # every event kept, to replay after each snapshot
    cache = PrefixKvCache(4, 4 * 200, log)
    stop = threading.Event()

    def engine_thread() -> None:
        rng = random.Random(1)
        talks: list[list[int]] = [[]]
        while not stop.is_set():
            talk = rng.choice(talks) if rng.random() < 0.7 else []
            if not talk:
                talks.append(talk)
            talk.extend(rng.randrange(1000) for _ in range(rng.randrange(4, 60)))
            cache.store(talk, None, kv_for(talk))

    thread = threading.Thread(target=engine_thread, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while log.last_seq < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert log.last_seq >= 200
        # Another life's log_id makes the reader truncated, so it gets a snapshot with the history still kept.
        answers = []
        for _ in range(20):
            answers.append(log.read(0, log_id="another-life", snapshot=cache.snapshot))
            while log.last_seq == answers[-1]["last_seq"] and time.monotonic() < deadline:
                time.sleep(0.001)  # the next snapshot after the cache changed again
    finally:
        stop.set()
        thread.join(10)
    final = cache.parents()
    assert len({answer["last_seq"] for answer in answers}) == 20  # each taken after the cache changed
    for answer in answers:
        assert answer["truncated"] and answer["events"] == []
        blocks = held_blocks(answer["snapshot"])
        assert len(blocks) == answer["snapshot_blocks"]
        later = log.read(answer["last_seq"], limit=1_000_000)
        assert not later["truncated"]
        for event in later["events"]:
            if event["type"] == "stored":
                parent = event["parent_block_hash"]
                for block in event["block_hashes"]:
                    blocks[block], parent = parent, block
            elif event["type"] == "removed":
                for block in event["block_hashes"]:
                    del blocks[block]  # KeyError: the snapshot missed a block an event after it removes
        assert blocks == final


def test_the_last_snapshot_rebuilds_the_cache_after_the_engine_stopped() -> None:
    log = KvEventLog(max_events=4)
    cache = PrefixKvCache(4, 4 * 50, log)
    rng = random.Random(2)
    for _ in range(40):
        ids = [rng.randrange(1000) for _ in range(rng.randrange(8, 40))]
        cache.store(ids, None, kv_for(ids))
    answer = log.read(0, snapshot=cache.snapshot)
    assert answer["snapshot_blocks"] == cache.num_blocks == 50
    assert held_blocks(answer["snapshot"]) == cache.parents()


# ---------------------------------------------------------------------------- the router's index


def test_the_router_index_takes_a_snapshot_as_the_workers_blocks_and_carries_on_from_last_seq() -> None:
    worker = "http://w"
    log = KvEventLog(max_events=8)
    cache = PrefixBlockIndex(BLOCK, FULL_CACHE_TOKENS, log)
    conversations(random.Random(3), cache, stored_blocks=20_000)
    index = KvIndex()
    index.record_routed_hashes(worker, [12345, 67890])  # a guess from before: forgotten with the rest
    index.apply_tokenfront_events(worker, log.read(0, snapshot=cache.snapshot))
    stats = index.stats()["workers"][worker]
    assert stats["blocks"] == stats["confirmed_blocks"] == cache.num_blocks == 16_384
    assert index.tokenfront_cursor(worker) == log.last_seq
    assert index.tokenfront_log_id(worker) == log.log_id
    assert index.holds_many(worker, list(cache.parents())) == [True] * cache.num_blocks

    # The next read starts at the snapshot's seq: events, applied on top of it.
    ids = list(range(5000, 5064))
    cache.store(block_hashes(ids, BLOCK), ids)
    index.apply_tokenfront_events(worker, log.read(index.tokenfront_cursor(worker), snapshot=cache.snapshot))
    assert index.blocks_held(worker) == cache.num_blocks
    assert index.match(worker, ids, BLOCK, None) == 4


def test_a_malformed_snapshot_is_refused_and_the_next_read_starts_afresh() -> None:
    worker = "http://w"
    index = KvIndex()
    bad = {"events": [], "truncated": True, "last_seq": 7, "log_id": "x", "snapshot": [[None, ["no"]]]}
    with pytest.raises(ValueError, match="snapshot"):
        index.apply_tokenfront_events(worker, bad)
    assert index.tokenfront_cursor(worker) == 0 and index.tokenfront_log_id(worker) is None
    with pytest.raises(ValueError, match="last_seq"):
        index.apply_tokenfront_events(worker, {**bad, "snapshot": [], "last_seq": None})

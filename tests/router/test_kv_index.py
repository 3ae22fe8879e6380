"""The router's KV index: tokenfront event logs, vLLM event batches and routed history, per worker."""

from __future__ import annotations

import hashlib
import random

import msgpack
import pytest

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.vllm_events import VllmBlockStored, decode_vllm_batch
from tokenfront.worker.kv_events import KvEventLog

TPB = 4
W = "http://w1:8000"
OTHER = "http://w2:8000"


class Clock:
    """A hand-moved monotonic clock for TTL rules."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def prompt(start: int, n_tokens: int) -> list[int]:
    return list(range(start, start + n_tokens))


def blocks_of(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + TPB] for i in range(0, len(ids) - TPB + 1, TPB)]


def log_store(log: KvEventLog, ids: list[int], salt: str | None = None, skip: int = 0) -> list[int]:
    """What a tokenfront worker logs when it stores the blocks of ``ids`` after the first ``skip`` it had."""
    hashes = block_hashes(ids, TPB, salt)
    parent = hashes[skip - 1] if skip else None
    log.stored(hashes[skip:], parent, blocks_of(ids)[skip:], TPB)
    return hashes


# --- tokenfront events ------------------------------------------------------------------------------------


def test_stored_events_give_whole_prefix_matches_for_that_worker_only() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(100, 14)  # 3 full blocks and 2 spare ids
    log_store(log, ids)
    index.apply_tokenfront_events(W, log.read(0))

    assert index.has_events(W) and not index.has_events(OTHER)
    assert index.match(W, ids, TPB, None) == 3
    assert index.match(W, ids[:11], TPB, None) == 2
    assert index.match(W, [*ids[:8], 7, 7, 7, 7], TPB, None) == 2  # diverges in block 3
    assert index.match(W, [1, *ids[1:]], TPB, None) == 0  # diverges in block 1: nothing after counts
    assert index.match(OTHER, ids, TPB, None) == 0
    assert index.match(W, ids, 2, None) == 0  # another block size names other blocks
    assert index.tokenfront_cursor(W) == 1
    assert index.tokens_per_block(W) == TPB


def test_stored_continuation_chains_onto_its_parent() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(0, 20)
    log_store(log, ids[:8])
    log_store(log, ids, skip=2)  # the worker hit 2 blocks and stored 3 new ones
    index.apply_tokenfront_events(W, log.read(0))
    assert index.match(W, ids, TPB, None) == 5
    assert index.tokenfront_cursor(W) == 2


def test_removed_block_breaks_the_chain_from_there() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(0, 16)
    hashes = log_store(log, ids)
    index.apply_tokenfront_events(W, log.read(0))
    assert index.match(W, ids, TPB, None) == 4

    log.removed([hashes[3]])
    index.apply_tokenfront_events(W, log.read(index.tokenfront_cursor(W)))
    assert index.match(W, ids, TPB, None) == 3

    log.removed([hashes[1]])  # a middle block: blocks 3 stays recorded but no match can reach it
    index.apply_tokenfront_events(W, log.read(index.tokenfront_cursor(W)))
    assert index.match(W, ids, TPB, None) == 1


def test_cleared_event_forgets_everything() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(0, 8)
    log_store(log, ids)
    log.cleared()
    index.apply_tokenfront_events(W, log.read(0))
    assert index.match(W, ids, TPB, None) == 0
    assert index.has_events(W)
    assert index.tokenfront_cursor(W) == 2


def test_truncated_read_forgets_what_was_known_and_applies_what_came() -> None:
    index, log = KvIndex(), KvEventLog(max_events=2)
    first, later, last = prompt(0, 8), prompt(1000, 8), prompt(2000, 8)
    log_store(log, first)
    index.apply_tokenfront_events(W, log.read(0))
    assert index.match(W, first, TPB, None) == 2

    hashes = log_store(log, later)
    log.removed(hashes)  # event 3: lost together with event 2 once the log holds only two events
    log_store(log, last)
    log_store(log, first)  # the worker re-stored `first`: event 5, still in the log
    payload = log.read(index.tokenfront_cursor(W))
    assert payload["truncated"]

    index.apply_tokenfront_events(W, payload)
    assert index.match(W, first, TPB, None) == 2
    assert index.match(W, last, TPB, None) == 2
    assert index.match(W, later, TPB, None) == 0
    assert index.tokenfront_cursor(W) == 5
    assert index.stats()["workers"][W]["resets"] == 1


def test_new_log_id_means_the_worker_restarted() -> None:
    index = KvIndex()
    before, after = KvEventLog(), KvEventLog()
    old = prompt(0, 8)
    log_store(before, old)
    log_store(before, prompt(50, 8))
    index.apply_tokenfront_events(W, before.read(0))
    assert index.tokenfront_cursor(W) == 2

    missed, seen = prompt(500, 8), prompt(600, 8)
    log_store(after, missed)
    log_store(after, seen)
    log_store(after, prompt(700, 8))
    payload = after.read(index.tokenfront_cursor(W))  # the new life has passed our cursor: not truncated
    assert not payload["truncated"] and payload["log_id"] != before.log_id

    index.apply_tokenfront_events(W, payload)
    assert index.match(W, old, TPB, None) == 0  # the restarted worker's cache is empty
    assert index.match(W, missed, TPB, None) == 0  # event 2 of the new life came before our cursor
    assert index.match(W, prompt(700, 8), TPB, None) == 2
    assert index.tokenfront_cursor(W) == 3


def test_repeated_read_is_harmless_and_a_gap_resets() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(0, 8)
    hashes = log_store(log, ids)
    log.removed(hashes[1:])
    payload = log.read(0)
    index.apply_tokenfront_events(W, payload)
    index.apply_tokenfront_events(W, payload)  # a retry of the same read: nothing applied twice
    assert index.match(W, ids, TPB, None) == 1
    assert index.stats()["workers"][W]["events_applied"] == 2

    log_store(log, prompt(100, 8))  # event 3: never read
    log_store(log, prompt(200, 8))
    index.apply_tokenfront_events(W, log.read(3))  # a reader that skipped event 3
    assert index.match(W, ids, TPB, None) == 0
    assert index.match(W, prompt(200, 8), TPB, None) == 2


def test_malformed_payload_is_refused() -> None:
    with pytest.raises(ValueError, match="events"):
        KvIndex().apply_tokenfront_events(W, {"last_seq": 3})


def test_cache_salt_separates_blocks() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(0, 8)
    log_store(log, ids, salt="tenant-a")
    index.apply_tokenfront_events(W, log.read(0))
    assert index.match(W, ids, TPB, "tenant-a") == 2
    assert index.match(W, ids, TPB, "tenant-b") == 0
    assert index.match(W, ids, TPB, None) == 0

    index.record_routed(OTHER, ids, TPB, None)
    assert index.match(OTHER, ids, TPB, None) == 2
    assert index.match(OTHER, ids, TPB, "tenant-a") == 0


def test_matches_what_a_real_worker_cache_holds_under_eviction() -> None:
    """A real PrefixKvCache (leaves-first eviction) and the router's view of it stay in step."""
    torch = pytest.importorskip("torch")
    from tokenfront.worker.kv_cache import PrefixKvCache

    cache = PrefixKvCache(TPB, max_tokens=12 * TPB)
    index = KvIndex()
    rng = random.Random(7)
    prefixes = [prompt(1000 * i, 8) for i in range(4)]
    for _ in range(60):
        ids = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.choice([4, 8, 12]))]
        kv = [(torch.zeros(1, 1, len(ids), 2), torch.zeros(1, 1, len(ids), 2))]
        cache.store(ids, None, kv)
        index.apply_tokenfront_events(W, cache.events.read(index.tokenfront_cursor(W)))
        for probe in [*prefixes, ids]:
            held_tokens, _ = cache.match(probe)
            assert index.match(W, probe, TPB, None) == held_tokens // TPB
    assert cache.evicted_blocks > 0


# --- routed history ---------------------------------------------------------------------------------------


def test_routed_history_counts_until_events_then_only_for_a_ttl() -> None:
    clock = Clock()
    index = KvIndex(routed_ttl_s=10.0, clock=clock)
    ids = prompt(0, 12)
    index.record_routed(W, ids, TPB, None)
    assert index.match(W, ids, TPB, None) == 3
    clock.now += 3600  # no events yet: the guess is all there is, and it does not age
    assert index.match(W, ids, TPB, None) == 3

    # Events start: a guess older than the TTL stops counting, a fresh one counts for the TTL.
    index.apply_tokenfront_events(W, KvEventLog().read(0))
    assert index.has_events(W)
    assert index.match(W, ids, TPB, None) == 0

    index.record_routed(W, ids, TPB, None)
    clock.now += 5
    assert index.match(W, ids, TPB, None) == 3
    clock.now += 6
    assert index.match(W, ids, TPB, None) == 0
    assert index.stats()["workers"][W]["blocks"] == 2  # the expired first block was dropped on sight


def test_events_confirm_a_routed_guess_beyond_its_ttl() -> None:
    clock = Clock()
    index, log = KvIndex(routed_ttl_s=10.0, clock=clock), KvEventLog()
    ids = prompt(0, 12)
    index.apply_tokenfront_events(W, log.read(0))
    index.record_routed(W, ids, TPB, None)
    log_store(log, ids[:8])  # the worker kept only two of the three blocks
    index.apply_tokenfront_events(W, log.read(index.tokenfront_cursor(W)))
    stats = index.stats()["workers"][W]
    assert (stats["confirmed_blocks"], stats["routed_only_blocks"]) == (2, 1)
    assert index.match(W, ids, TPB, None) == 3
    clock.now += 60
    assert index.match(W, ids, TPB, None) == 2
    stats = index.stats()["workers"][W]
    assert (stats["confirmed_blocks"], stats["routed_only_blocks"]) == (2, 0)  # the stale guess went


def test_removed_event_overrides_a_routed_guess() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(0, 8)
    index.record_routed(W, ids, TPB, None)
    log.removed(block_hashes(ids, TPB)[1:])
    index.apply_tokenfront_events(W, log.read(0))
    assert index.match(W, ids, TPB, None) == 1


def test_forget_drops_the_worker() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(0, 8)
    log_store(log, ids)
    index.apply_tokenfront_events(W, log.read(0))
    index.forget(W)
    assert index.match(W, ids, TPB, None) == 0
    assert not index.has_events(W)
    assert index.tokenfront_cursor(W) == 0
    assert W not in index.stats()["workers"]


# --- memory cap -------------------------------------------------------------------------------------------


def test_blocks_per_worker_are_capped_least_recently_used_first() -> None:
    index = KvIndex(max_blocks_per_worker=8)
    prompts = [prompt(100 * i, 8) for i in range(10)]  # 20 blocks in all
    for ids in prompts:
        index.record_routed(W, ids, TPB, None)
    stats = index.stats()["workers"][W]
    assert stats["blocks"] == 8
    assert stats["evicted_blocks"] == 12
    assert [index.match(W, ids, TPB, None) for ids in prompts] == [0] * 6 + [2] * 4

    index.record_routed(W, prompts[6], TPB, None)  # used again: now the most recent
    index.record_routed(W, prompt(5000, 4), TPB, None)
    assert index.match(W, prompts[6], TPB, None) == 2
    assert index.match(W, prompts[7], TPB, None) == 1  # lost its leaf, kept its first block


def test_cap_evicts_children_before_the_prefix_they_share() -> None:
    """A system prompt stored once and continued by every later event outlives its continuations."""
    index, log = KvIndex(max_blocks_per_worker=4), KvEventLog()
    system = prompt(0, 4)
    questions = [system + prompt(100 * (i + 1), 4) for i in range(10)]
    log_store(log, questions[0])
    for ids in questions[1:]:
        log_store(log, ids, skip=1)  # the worker hit the system block, stored the question block
    index.apply_tokenfront_events(W, log.read(0))
    assert index.stats()["workers"][W]["blocks"] == 4
    assert index.match(W, questions[-1], TPB, None) == 2
    assert index.match(W, questions[0], TPB, None) == 1  # its own block is gone, the shared one is not


# --- vLLM events ------------------------------------------------------------------------------------------


def vllm_hash(parent: bytes | None, ids: list[int]) -> bytes:
    """A stand-in for vLLM's own block hash: another chained scheme, with another root, than ours."""
    return hashlib.sha256(b"vllm" + (parent or b"NONE") + repr(ids).encode()).digest()


def vllm_chain(ids: list[int], parent: bytes | None = None) -> list[bytes]:
    hashes = []
    for block in blocks_of(ids):
        parent = vllm_hash(parent, block)
        hashes.append(parent)
    return hashes


def stored_array(hashes: list, parent: object, ids: list[int], *extra: object) -> list:
    # msgspec array_like tagged struct: tag, then fields in declaration order (lora_id, medium always present).
    return ["BlockStored", hashes, parent, ids, TPB, None, "GPU", *extra]


def batch(*events: object, rank: int | None = 0) -> bytes:
    return msgpack.packb([1_700_000_000.5, list(events), rank] if rank is not None else [1.0, list(events)])


def test_vllm_foreign_hashes_chain_onto_our_names() -> None:
    index = KvIndex()
    ids = prompt(300, 16)
    foreign = vllm_chain(ids)
    index.apply_vllm_batch(W, batch(stored_array(foreign[:2], None, ids[:8])))
    assert index.match(W, ids, TPB, None) == 2
    assert index.tokens_per_block(W) == TPB and index.has_events(W)

    # Newer vLLM: events as tagged maps, and fields we do not know about.
    continuation = {
        "type": "BlockStored",
        "block_hashes": foreign[2:],
        "parent_block_hash": foreign[1],
        "token_ids": ids[8:],
        "block_size": TPB,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "kv_cache_spec_kind": "full_attention",
    }
    index.apply_vllm_batch(W, decode_vllm_batch(batch(continuation)))
    assert index.match(W, ids, TPB, None) == 4

    index.apply_vllm_batch(W, batch(["BlockRemoved", [foreign[1]], "GPU"]))
    assert index.match(W, ids, TPB, None) == 1

    index.apply_vllm_batch(W, batch(["AllBlocksCleared"]))
    assert index.match(W, ids, TPB, None) == 0
    assert index.stats()["workers"][W]["blocks"] == 0


def test_vllm_int_hashes_and_a_parent_we_never_saw() -> None:
    index = KvIndex()
    ids = prompt(0, 12)
    ints = [int.from_bytes(h[:8], "big") for h in vllm_chain(ids)]
    # Stored before we subscribed: a child of it cannot be named, and must not be guessed.
    index.apply_vllm_batch(W, batch(stored_array(ints[2:], ints[1], ids[8:])))
    assert index.stats()["workers"][W]["blocks"] == 0
    index.apply_vllm_batch(W, batch(stored_array(ints[:2], None, ids[:8]), rank=None))
    index.apply_vllm_batch(W, batch(stored_array(ints[2:], ints[1], ids[8:])))
    assert index.match(W, ids, TPB, None) == 3


def test_vllm_block_held_in_two_media_is_gone_when_both_lose_it() -> None:
    index = KvIndex()
    ids = prompt(0, 8)
    foreign = vllm_chain(ids)
    cpu_copy = ["BlockStored", foreign, None, ids, TPB, None, "CPU"]
    index.apply_vllm_batch(W, batch(stored_array(foreign, None, ids), cpu_copy))
    index.apply_vllm_batch(W, batch(["BlockRemoved", foreign, "GPU"]))
    assert index.match(W, ids, TPB, None) == 2
    index.apply_vllm_batch(W, batch(["BlockRemoved", [foreign[0]], "CPU"]))
    assert index.match(W, ids, TPB, None) == 0


def test_vllm_blocks_named_by_more_than_their_ids_are_not_indexed() -> None:
    index = KvIndex()
    ids = prompt(0, 12)
    foreign = vllm_chain(ids)
    lora = ["BlockStored", foreign, None, ids, TPB, 3, "GPU"]
    index.apply_vllm_batch(W, batch(lora))
    assert index.stats()["workers"][W]["blocks"] == 0
    # extra_keys (field 9) on block 2, e.g. an image: blocks 1 is plain, 2 and 3 cannot be named by ids.
    image = stored_array(foreign, None, ids, None, [None, ["mm-hash"], None])
    index.apply_vllm_batch(W, batch(image))
    assert index.match(W, ids, TPB, None) == 1


def test_vllm_batch_decoding_tolerates_extras_and_refuses_garbage() -> None:
    ids = prompt(0, 4)
    (foreign,) = vllm_chain(ids)
    payload = batch(
        stored_array([foreign], None, ids, None, None, 0, "full_attention", None, "future-field"),
        ["KVCacheMetrics", 1, 2],  # an event kind from a newer vLLM
    )
    decoded = decode_vllm_batch(payload)
    assert decoded.data_parallel_rank == 0 and decoded.unknown_events == 1
    assert decoded.events == (VllmBlockStored((foreign,), None, tuple(ids), TPB, None, "GPU", None, None, 0),)
    map_batch = msgpack.packb({"ts": 2.0, "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 1})
    assert decode_vllm_batch(map_batch).data_parallel_rank == 1
    with pytest.raises(ValueError):
        decode_vllm_batch(b"\xc1 not msgpack")
    with pytest.raises(ValueError):
        decode_vllm_batch(msgpack.packb({"hello": "world"}))
    with pytest.raises(ValueError, match="block_size"):
        decode_vllm_batch(msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2]]]]))


# --- one structure for the whole fleet --------------------------------------------------------------------


class ReferenceIndex:
    """The index's rules the plain way, one dict per worker and no cap: what the fleet structure must say.

    A block held by a worker has the locations events confirmed it at and when it was last routed there."""

    def __init__(self, ttl: float, clock: Clock) -> None:
        self.ttl, self.clock = ttl, clock
        self.views: dict[str, dict[int, tuple[frozenset, float | None]]] = {}
        self.with_events: set[str] = set()

    def record(self, worker: str, hashes: list[int]) -> None:
        view = self.views.setdefault(worker, {})
        for block in hashes:
            view[block] = (view.get(block, (frozenset(), None))[0], self.clock.now)

    def store(self, worker: str, hashes: list[int], location: tuple) -> None:
        view = self.views.setdefault(worker, {})
        for block in hashes:
            locations, routed = view.get(block, (frozenset(), None))
            view[block] = (locations | {location}, routed)

    def remove(self, worker: str, hashes: list[int], location: tuple) -> None:
        view = self.views.get(worker, {})
        for block in hashes:
            if block in view:
                locations = view[block][0] - {location}
                if locations:
                    view[block] = (locations, view[block][1])
                else:
                    del view[block]

    def clear(self, worker: str, rank: int) -> None:
        view = self.views.get(worker, {})
        for block, (locations, routed) in list(view.items()):
            kept = frozenset(location for location in locations if location[0] != rank)
            if kept:
                view[block] = (kept, routed)
            else:
                del view[block]

    def match(self, worker: str, hashes: list[int]) -> int:
        view = self.views.get(worker, {})
        matched = 0
        for block in hashes:
            locations, routed = view.get(block, (frozenset(), None))
            fresh = routed is not None and (
                worker not in self.with_events or self.clock.now - routed < self.ttl
            )
            if not locations and not fresh:
                break
            matched += 1
        return matched


def fleet_prompts(rng: random.Random) -> list[list[int]]:
    """Prompts that share openings (two system prompts) and then branch, so blocks have several holders."""
    systems = [prompt(10_000, 8), prompt(20_000, 12)]
    branches = [prompt(1000 * (i + 1), 4 * rng.randrange(1, 5)) for i in range(12)]
    return [rng.choice(systems) + branch + rng.choice(branches)[:4] for branch in branches]


@pytest.mark.parametrize(("ttl", "incremental_moves"), [(5.0, False), (1e9, False), (5.0, True)])
def test_the_fleet_structure_agrees_with_one_dict_per_worker(
    ttl: float, incremental_moves: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random routed guesses, stored and removed events at several locations, clears, resets, forgets and
    time passing, for 6 workers: every worker's match of every prompt is the reference's, after every step
    (also while the table's slots move to larger arrays a few at a time, as a large table's do)."""
    from tokenfront.router import block_table
    from tokenfront.router.block_changes import Removed, Stored

    if incremental_moves:
        monkeypatch.setattr(block_table, "MOVE_AT_ONCE", 0)
        monkeypatch.setattr(block_table, "MOVE_STEP", 4)

    rng = random.Random(f"fleet-{ttl}")
    clock = Clock()
    index, reference = KvIndex(routed_ttl_s=ttl, clock=clock), ReferenceIndex(ttl, clock)
    workers = [f"http://w{i}:8000" for i in range(6)]
    prompts = [block_hashes(ids, TPB) for ids in fleet_prompts(rng)]
    locations = [(0, "GPU", 0), (0, "CPU", 0), (1, "GPU", 0)]
    compared = nonzero = 0
    for _ in range(1000):
        worker, hashes = rng.choice(workers), rng.choice(prompts)
        cut = rng.randrange(1, len(hashes) + 1)
        action = rng.random()
        if action < 0.3:
            index.record_routed_hashes(worker, hashes[:cut])
            reference.record(worker, hashes[:cut])
        elif action < 0.55:
            start, location = rng.randrange(cut), rng.choice(locations)
            parent = hashes[start - 1] if start else None
            index.mark_has_events(worker)
            reference.with_events.add(worker)
            index.apply(worker, [Stored(hashes[start:cut], parent, location)])
            reference.store(worker, hashes[start:cut], location)
        elif action < 0.75:
            gone, location = rng.sample(hashes, rng.randrange(1, 4)), rng.choice(locations)
            index.apply(worker, [Removed(gone, location)])
            reference.remove(worker, gone, location)
        elif action < 0.8:
            rank = rng.randrange(2)
            index.clear(worker, rank=rank)
            reference.clear(worker, rank)
        elif action < 0.83:
            index.reset(worker)
            reference.views.pop(worker, None)
        elif action < 0.85:
            index.forget(worker)
            reference.views.pop(worker, None)
            reference.with_events.discard(worker)
        else:
            clock.now += rng.choice([1.0, 3.0, 6.0])
        probe = rng.choice(prompts)
        matched = index.matched_blocks(workers, probe).tolist()
        expected = [reference.match(w, probe) for w in workers]
        assert matched == expected
        assert [index.match_hashes(w, probe) for w in workers] == expected
        compared += len(workers)
        nonzero += sum(1 for m in expected if m)
        stats = index.stats()["workers"]
        for w in workers:
            view = reference.views.get(w, {})
            confirmed = sum(1 for locations, _ in view.values() if locations)
            assert stats.get(w, {"confirmed_blocks": 0})["confirmed_blocks"] == confirmed
            if ttl > 1e6:  # nothing expires: every guess the reference holds is held
                assert stats.get(w, {"blocks": 0})["blocks"] == len(view)
    assert compared == 6000 and nonzero > 800
    assert index.stats()["shared_blocks"] > 0  # some blocks had several holders along the way


def test_one_walk_answers_for_a_thousand_workers() -> None:
    index = KvIndex()
    system = prompt(50_000, 32)
    workers = [f"http://w{i}:8000" for i in range(1000)]
    for i, worker in enumerate(workers):
        index.record_routed(worker, system + prompt(100 * i, 4 * (i % 5)), TPB, None)
    query = system + prompt(100 * 7, 20)
    matched = index.matched_blocks([*workers, "http://unknown:8000"], block_hashes(query, TPB)).tolist()
    expected = [8] * 1000 + [0]  # the system prompt's 8 blocks everywhere, nothing for an unknown worker
    expected[7] = 10  # and worker 7 holds the first 2 blocks of the question too
    assert matched == expected
    stats = index.stats()
    assert (stats["shared_blocks"], stats["distinct_blocks"]) == (8, 8 + sum(i % 5 for i in range(1000)))


def test_a_block_held_again_by_one_worker_goes_back_to_one_holder() -> None:
    index, log_a, log_b = KvIndex(), KvEventLog(), KvEventLog()
    ids = prompt(0, 8)
    log_store(log_a, ids)
    log_store(log_b, ids)
    index.apply_tokenfront_events(W, log_a.read(0))
    index.apply_tokenfront_events(OTHER, log_b.read(0))
    assert index.stats()["shared_blocks"] == 2
    index.forget(OTHER)
    assert index.stats()["shared_blocks"] == 0 and index.stats()["distinct_blocks"] == 2
    assert index.match(W, ids, TPB, None) == 2 and index.stats()["workers"][W]["confirmed_blocks"] == 2
    index.forget(W)
    assert index.stats()["distinct_blocks"] == 0


def test_a_vllm_worker_and_a_tokenfront_worker_share_one_row_per_block() -> None:
    index, log = KvIndex(), KvEventLog()
    ids = prompt(300, 12)
    index.apply_vllm_batch(W, batch(stored_array(vllm_chain(ids), None, ids)))
    log_store(log, ids)
    index.apply_tokenfront_events(OTHER, log.read(0))
    stats = index.stats()
    assert (stats["distinct_blocks"], stats["shared_blocks"]) == (3, 3)
    assert index.matched_blocks([W, OTHER], block_hashes(ids, TPB)).tolist() == [3, 3]


def test_a_page_of_events_is_applied_in_order() -> None:
    """A page is applied as one change; for each block the last event about it decides."""
    index, log = KvIndex(), KvEventLog()
    first, second = prompt(0, 8), prompt(100, 8)
    hashes = log_store(log, first)
    log.removed(hashes[1:])
    log_store(log, second)
    log.removed(block_hashes(second, TPB))
    log_store(log, second)  # stored, removed, stored again: held
    log_store(log, first, skip=1)  # the removed block is back on top of the one kept
    index.apply_tokenfront_events(W, log.read(0))
    assert index.match(W, first, TPB, None) == 2 and index.match(W, second, TPB, None) == 2
    assert index.stats()["workers"][W]["events_applied"] == 6
    assert index.tokenfront_cursor(W) == 6


def test_eviction_keeps_a_shared_root_for_every_worker_that_uses_it() -> None:
    index = KvIndex(max_blocks_per_worker=6)
    system = prompt(0, 8)
    for turn in range(10):
        for worker in (W, OTHER):
            index.record_routed(worker, system + prompt(1000 * turn + (worker == W) * 500, 8), TPB, None)
    for worker in (W, OTHER):
        assert index.stats()["workers"][worker]["blocks"] <= 6
        assert index.match(worker, system, TPB, None) == 2  # the shared root outlived 18 evicted blocks
    assert index.match(W, system + prompt(9500, 8), TPB, None) == 4  # the latest turn is whole


def test_concurrent_readers_and_writers_keep_the_index_consistent() -> None:
    import threading

    index = KvIndex(max_blocks_per_worker=64)
    prompts = [prompt(10_000, 16) + prompt(100 * i, 16) for i in range(20)]
    errors: list[BaseException] = []

    def route(worker: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(150):
                ids = rng.choice(prompts)
                index.matched_blocks([W, OTHER], block_hashes(ids, TPB))
                index.record_routed(worker, ids, TPB, None)
                if rng.random() < 0.1:
                    index.reset(worker)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=route, args=(w, n)) for n, w in enumerate([W, OTHER, W, OTHER])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and not any(thread.is_alive() for thread in threads)
    every_block = sorted({block for ids in prompts for block in block_hashes(ids, TPB)})
    for worker in (W, OTHER):
        blocks = index.stats()["workers"][worker]["blocks"]
        # The count kept along the way is the number of blocks the worker is found to hold, one by one.
        assert 0 < blocks <= 64 and index.holds_many(worker, every_block).count(True) == blocks


def test_a_vllm_batch_is_applied_in_order_within_itself() -> None:
    """Parents named earlier in the same batch resolve; a parent removed or cleared earlier does not."""
    index = KvIndex()
    ids, other = prompt(0, 12), prompt(500, 12)
    foreign, foreign_other = vllm_chain(ids), vllm_chain(other)
    index.apply_vllm_batch(
        W,
        batch(
            stored_array(foreign[:1], None, ids[:4]),
            stored_array(foreign[1:], foreign[0], ids[4:]),  # its parent came just before, in this batch
            stored_array(foreign_other[:2], None, other[:8]),
            ["BlockRemoved", [foreign_other[1]], "GPU"],
            stored_array(foreign_other[2:], foreign_other[1], other[8:]),  # its parent is gone: not named
        ),
    )
    assert index.match(W, ids, TPB, None) == 3
    assert index.match(W, other, TPB, None) == 1
    assert index.stats()["workers"][W]["blocks"] == 4
    index.apply_vllm_batch(
        W, batch(["AllBlocksCleared"], stored_array(foreign_other[1:2], foreign_other[0], other[4:8]))
    )
    assert (
        index.stats()["workers"][W]["blocks"] == 0
    )  # the parent went with the clear: the child is not named
    assert index.stats()["workers"][W]["events_applied"] == 7

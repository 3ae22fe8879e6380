"""The routing decision's fast paths in the KV index's storage: small batches placed one key after the other
and large ones vectorized give the same table, a chain's new rows are handed out in its order, and the
router hands the policy one `WorkerLoad` per worker, updated in place."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokenfront.router import block_table
from tokenfront.router.block_table import BlockTable, distinct
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.worker import Worker


@pytest.mark.parametrize("batch", [(1, 64), (65, 400)], ids=["placed-in-python", "placed-vectorized"])
def test_small_and_large_batches_follow_a_dict_through_growth_and_deletes(
    batch: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(block_table, "MOVE_AT_ONCE", 0)  # grown slots move a few at a time: both paths
    monkeypatch.setattr(block_table, "MOVE_STEP", 64)
    rng = random.Random(batch[0])
    table = BlockTable({"value": np.int64}, capacity=16)
    reference: dict[int, int] = {}  # key -> row
    compared = 0
    for _ in range(120):
        if rng.random() < 0.7 or not reference:
            new = [rng.getrandbits(64) for _ in range(rng.randint(*batch))]
            rows, created = table.insert(np.array(new, np.uint64))
            assert created.all() and len(set(rows.tolist())) == len(new)
            reference.update(zip(new, rows.tolist(), strict=True))
        else:
            gone = rng.sample(sorted(reference), min(len(reference), rng.randint(*batch)))
            table.delete(np.array([reference.pop(key) for key in gone], np.int64))
        probe = [*reference, *(rng.getrandbits(64) for _ in range(10))]
        found = table.lookup(np.array(probe, np.uint64)).tolist()
        assert found == [reference.get(key, -1) for key in probe]
        compared += len(probe)
    assert len(table) == len(reference) > 1000
    assert compared > 100_000


def test_distinct_keeps_the_order_given_when_asked_and_there_are_no_repeats() -> None:
    rng = np.random.default_rng(3)
    for size in (2, 64, 65, 3000):  # the set check below 64 values, the sort above
        values = rng.integers(0, 2**63, size, dtype=np.int64)
        unique, inverse = distinct(values, keep_order=True)
        assert unique.tolist() == values.tolist() and inverse.tolist() == list(range(size))
        assert distinct(values)[0].tolist() == sorted(values.tolist())
    repeated = np.array([5, 3, 5, 9, 3], np.int64)
    unique, inverse = distinct(repeated, keep_order=True)
    assert unique.tolist() == [3, 5, 9] and unique[inverse].tolist() == repeated.tolist()


@pytest.mark.parametrize("blocks", [40, 2048], ids=["few-blocks", "32k-tokens"])
def test_a_chains_new_rows_are_consecutive_so_a_walk_reads_them_in_sequence(blocks: int) -> None:
    index = KvIndex()
    rng = np.random.default_rng(blocks)
    shared = rng.integers(0, 2**64, 8, dtype=np.uint64)
    index.record_routed_hashes("http://a:8000", shared)
    chain = np.concatenate([shared, rng.integers(0, 2**64, blocks, dtype=np.uint64)])
    index.record_routed_hashes("http://b:8000", chain)
    rows = index.table.lookup(chain[8:])
    assert np.diff(rows).tolist() == [1] * (blocks - 1)
    assert index.matched_blocks(["http://a:8000", "http://b:8000"], chain).tolist() == [8, blocks + 8]


def test_a_worker_hands_the_policy_one_load_brought_up_to_date() -> None:
    worker = Worker("http://a:8000", client=None, connections=None)  # type: ignore[arg-type]
    first = worker.load()
    assert (first.url, first.active_requests, first.tokens_per_block) == ("http://a:8000", 0, None)
    worker.active_requests = 3
    second = worker.load()
    assert second is first and second.active_requests == 3

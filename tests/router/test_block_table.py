"""The KV index's storage: rows keyed by 64-bit block hashes, checked against a plain dict."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

from tokenfront.router import block_table
from tokenfront.router.block_table import BlockTable, as_keys, distinct


def keys(*values: int) -> np.ndarray:
    return np.array(values, np.uint64)


@pytest.mark.parametrize("moved_at_once", [True, False], ids=["small-moves-at-once", "moves-incrementally"])
def test_rows_follow_a_dict_through_inserts_deletes_and_growth(
    moved_at_once: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not moved_at_once:  # as a large table grows: old slots move a few at a time, lookups try both arrays
        monkeypatch.setattr(block_table, "MOVE_AT_ONCE", 0)
        monkeypatch.setattr(block_table, "MOVE_STEP", 8)
    rng = random.Random(11)
    table = BlockTable({"value": np.int64}, capacity=16)
    moving_seen = 0
    reference: dict[int, tuple[int, int]] = {}  # key -> (row, value)
    compared = 0
    for _ in range(700):
        if rng.random() < 0.6 or not reference:
            # New keys, keys already held, and a key given twice in one call.
            batch = [rng.getrandbits(64) for _ in range(rng.randrange(1, 40))]
            batch += rng.sample(sorted(reference), min(len(reference), rng.randrange(0, 5)))
            batch.append(batch[0])
            rows, created = table.insert(keys(*batch))
            values = table.columns["value"]
            held_before = set(reference)
            for key, row, new in zip(batch, rows.tolist(), created.tolist(), strict=True):
                if key in reference:
                    # A key given twice gets one row, new for both when the call created it.
                    assert (row, new) == (reference[key][0], key not in held_before)
                else:
                    assert new and values[row] == 0  # a new row holds 0
                    values[row] = key % 1000 + 1
                    reference[key] = (row, key % 1000 + 1)
        else:
            gone = rng.sample(sorted(reference), min(len(reference), rng.randrange(1, 30)))
            table.delete(np.array([reference.pop(key)[0] for key in gone], np.int64))
        probe = rng.sample(sorted(reference), min(len(reference), 50)) + [
            rng.getrandbits(64) for _ in range(5)
        ]
        rows = table.lookup(keys(*probe))
        for key, row in zip(probe, rows.tolist(), strict=True):
            if key in reference:
                assert (row, int(table.columns["value"][row])) == reference[key]
                assert int(table.keys_of(np.array([row]))[0]) == key
            else:
                assert row == -1
            compared += 1
        assert len(table) == len(reference)
        moving_seen += table.growing  # whether the growth path under test ran
    assert compared > 25_000
    assert (moving_seen > 0) is not moved_at_once
    assert sorted(table.live_rows().tolist()) == sorted(row for row, _ in reference.values())


def test_deleted_rows_are_reused_with_fresh_fills() -> None:
    table = BlockTable({"value": np.int32})
    rows, _ = table.insert(keys(1, 2, 3))
    table.columns["value"][rows] = 9
    table.delete(rows[:2])
    assert table.lookup(keys(1, 2, 3)).tolist() == [-1, -1, int(rows[2])]
    again, created = table.insert(keys(4, 5))
    assert created.tolist() == [True, True]
    assert sorted(again.tolist()) == sorted(rows[:2].tolist())  # the freed rows, not new ones
    assert table.columns["value"][again].tolist() == [0, 0]


def test_a_table_emptied_over_and_over_stays_small_and_correct() -> None:
    """Deleting leaves markers probes go past; the table must not fill up with them."""
    rng = random.Random(3)
    table = BlockTable({}, capacity=64)
    for _ in range(300):
        batch = keys(*(rng.getrandbits(64) for _ in range(50)))
        rows, created = table.insert(batch)
        assert created.all()
        assert (table.lookup(batch) == rows).all()
        table.delete(rows)
        assert (table.lookup(batch) == -1).all()
    assert len(table) == 0
    assert table.nbytes() < 64 * 1024  # 15,000 keys went through it; it never held more than 50


def test_keys_are_validated_and_read_without_copies() -> None:
    hashes = array("Q", [1, 2**64 - 1])
    viewed = as_keys(hashes)
    assert viewed.tolist() == [1, 2**64 - 1] and not viewed.flags.owndata
    assert as_keys([0, 2**63]).dtype == np.uint64
    for bad in ([-1], [2**64], ["a"], [[1, 2]]):
        with pytest.raises(ValueError, match="unsigned 64-bit"):
            as_keys(bad)


def test_distinct_matches_numpy_unique() -> None:
    rng = np.random.default_rng(5)
    for values in (np.array([], np.int64), np.array([7]), rng.integers(0, 50, 40), rng.permutation(40)):
        unique, inverse = distinct(values)
        expected_unique, expected_inverse = np.unique(values, return_inverse=True)
        assert unique.tolist() == expected_unique.tolist()
        assert (
            unique[inverse].tolist()
            == values.tolist()
            == expected_unique[expected_inverse.reshape(-1)].tolist()
        )

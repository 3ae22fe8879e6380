"""Who holds a block in the fleet's KV index (``router/fleet_blocks.py``): one worker's record, the holders of
a block several workers hold, and worker slots as bitsets.

A worker has a slot number (from 1) and a ``WorkerBlocks`` record: the rows it was given (a ``RowList``; stale
entries dropped when compacted), how many blocks it holds and how many of them its events confirmed, and the
locations its events named (bit i of a location mask is its i-th location). A block one worker holds keeps that
worker's slot and state in the index's numpy columns; a block several hold has a ``SharedHolders``: their slots
as a bitset (a Python int, one bit per slot), the confirmed ones, each one's locations or routed time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from tokenfront.router.block_changes import Location

__all__ = ["RowList", "SharedHolders", "WorkerBlocks", "iter_slots", "slot_array"]


@dataclass(eq=False)
class WorkerBlocks:
    """One worker in the index: its slot (its bit in holder sets), the rows it was given, its counters and the
    locations its events named."""

    url: str
    slot: int
    members: RowList
    blocks: int = 0  # (block, this worker) pairs held
    confirmed: int = 0  # of which confirmed by events
    has_events: bool = False
    tokens_per_block: int | None = None  # learned from its events
    locations: list[Location] = field(default_factory=list)  # bit i of a location mask is locations[i]
    events_applied: int = 0
    resets: int = 0
    evicted: int = 0


class SharedHolders:
    """The holders of a block several workers hold, and their state."""

    __slots__ = ("confirmed", "holders", "locations", "oldest", "routed")

    def __init__(self) -> None:
        self.holders = 0  # bitset of worker slots
        self.confirmed = 0  # the holders whose events confirmed it
        self.locations: dict[int, int] = {}  # slot -> location mask, for confirmed holders
        self.routed: dict[int, float] = {}  # slot -> when routed there, for holders not confirmed
        # No guess of a worker with events is older than this (a lower bound): until the TTL has passed since,
        # a walk need not look for expired guesses here.
        self.oldest = math.inf


class RowList:
    """The rows a worker was given, in a growable int32 array; stale entries are dropped when compacted."""

    __slots__ = ("rows", "size")

    def __init__(self) -> None:
        self.rows = np.empty(16, np.int32)
        self.size = 0

    def view(self) -> np.ndarray:
        """The rows, stale ones included (a view: valid until the next change)."""
        return self.rows[: self.size]

    def extend(self, rows: np.ndarray) -> None:
        """Append ``rows``, the array grown by half (or to fit) when full."""
        end = self.size + len(rows)
        if end > len(self.rows):
            grown = np.empty(max(end, len(self.rows) + len(self.rows) // 2), np.int32)
            grown[: self.size] = self.rows[: self.size]
            self.rows = grown
        self.rows[self.size : end] = rows
        self.size = end

    def replace(self, rows: np.ndarray) -> None:
        """The list is ``rows`` now (compacted)."""
        self.rows = rows.astype(np.int32)
        self.size = len(rows)


def iter_slots(bitset: int) -> Iterator[int]:
    """The slots in a bitset, lowest first."""
    while bitset:
        low = bitset & -bitset
        yield low.bit_length() - 1
        bitset ^= low


def slot_array(bitset: int) -> np.ndarray:
    """The slots in a bitset, as an array."""
    if bitset & (bitset - 1) == 0:  # one slot (or none)
        return np.array([bitset.bit_length() - 1] if bitset else [], np.int64)
    packed = np.frombuffer(bitset.to_bytes((bitset.bit_length() + 7) // 8, "little"), np.uint8)
    return np.flatnonzero(np.unpackbits(packed, bitorder="little"))

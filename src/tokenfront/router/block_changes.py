"""What a feed tells the fleet's KV index, in the index's own words, and a page of it as arrays.

- ``Stored``: a worker holds a chain of blocks, confirmed by its events, at a ``Location`` (data-parallel rank,
  medium, KV cache group; ``DEVICE`` is the one a tokenfront worker has);
- ``Removed``: blocks left one location of a worker.

The feeds translate into these (``router/tokenfront_feed.py``, ``router/vllm_feed.py``) and the index applies
a page of them as one change (``FleetBlocks.apply``): ``flatten`` turns the page into one array per column, in
which, for each block and location, the last change about it decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tokenfront.router.block_table import as_keys

__all__ = ["DEVICE", "FlatChanges", "Location", "Removed", "Stored", "chain_parents", "flatten"]

# A place a block is held: (data-parallel rank, medium, KV cache group).
Location = tuple[int, str, int]
DEVICE: Location = (0, "GPU", 0)


@dataclass(frozen=True)
class Stored:
    """The worker holds consecutive blocks of one chain at ``location`` (first block first; ``parent`` is the
    block before the first one, None when the first one starts a prompt), confirmed by its events."""

    hashes: object  # unsigned 64-bit block hashes: a list, an array('Q') or a uint64 numpy array
    parent: int | None = None
    location: Location = DEVICE


@dataclass(frozen=True)
class Removed:
    """Blocks left ``location`` of the worker: a block held nowhere else there (or only guessed) goes."""

    hashes: object
    location: Location = DEVICE


class FlatChanges(NamedTuple):
    """A page of changes as one array per column, a block a row: its hash, its parent (where ``has_parent``),
    its location's bit, whether it was stored (else removed), and its recency (larger: more recent)."""

    keys: np.ndarray
    parents: np.ndarray
    has_parent: np.ndarray
    bits: np.ndarray
    stored: np.ndarray
    recency: np.ndarray


def flatten(
    changes: Sequence[Stored | Removed], location_bit: Callable[[Stored | Removed], int]
) -> FlatChanges:
    """The non-empty ``changes`` of a page as arrays (``location_bit``: a change's location bit for its worker,
    asked once per change, in order), in which, for each block and location, only the last change about it is
    left.

    A block's parent is the one before it in its change; a change's first block has the change's. Recency: each
    change more recent than the ones before it, and in a change each block more recent than the ones after it.
    ValueError when a parent is not an unsigned 64-bit integer.
    """
    keys = _concatenated_keys([change.hashes for change in changes])
    sizes = np.array([len(change.hashes) for change in changes])  # type: ignore[arg-type]
    starts = np.cumsum(sizes) - sizes
    is_stored = [isinstance(change, Stored) for change in changes]
    bits = np.repeat(np.array([location_bit(change) for change in changes], np.uint8), sizes)
    stored = np.repeat(np.array(is_stored), sizes)
    first_parents = [change.parent if isinstance(change, Stored) else None for change in changes]
    if any(parent is not None and not 0 <= parent < 1 << 64 for parent in first_parents):
        raise ValueError("a parent block hash is an unsigned 64-bit integer")
    parents = np.empty(len(keys), np.uint64)
    parents[1:] = keys[:-1]
    parents[starts] = [parent or 0 for parent in first_parents]
    has_parent = stored.copy()
    has_parent[starts] = [parent is not None for parent in first_parents]
    change_starts = np.repeat(starts, sizes)
    recency = 2 * change_starts + np.repeat(sizes, sizes) - np.arange(len(keys))
    if len(changes) > 1:  # later changes supersede earlier ones about the same block and location
        last = _last_of_each(keys, bits)
        keys, parents, has_parent, bits, stored, recency = (
            column[last] for column in (keys, parents, has_parent, bits, stored, recency)
        )
    return FlatChanges(keys, parents, has_parent, bits, stored, recency)


def chain_parents(keys: np.ndarray, first_parent: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The parent of each block of a chain: the one before it, and ``first_parent`` for the first one."""
    if first_parent is not None and not 0 <= first_parent < 1 << 64:
        raise ValueError(f"a parent block hash is an unsigned 64-bit integer, got {first_parent!r}")
    parents = np.empty(len(keys), np.uint64)
    parents[1:] = keys[:-1]
    has_parent = np.ones(len(keys), bool)
    if first_parent is None:
        has_parent[:1] = False
        parents[:1] = 0
    else:
        parents[:1] = first_parent
    return parents, has_parent


def _concatenated_keys(parts: list[object]) -> np.ndarray:
    """Several lists or arrays of block hashes as one uint64 array."""
    if all(isinstance(part, list) for part in parts):
        return as_keys([key for part in parts for key in part])  # type: ignore[attr-defined]
    return np.concatenate([as_keys(part) for part in parts])


def _last_of_each(keys: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """The positions of the last occurrence of each (key, bit) pair, in their original order."""
    if bits.min() == bits.max():  # one location (every tokenfront worker): group by key alone
        order = np.argsort(keys[::-1], kind="stable")  # reversed: the latest position of a key comes first
        ordered = keys[::-1][order]
        first = np.ones(len(order), bool)
        first[1:] = ordered[1:] != ordered[:-1]
        return np.sort(len(keys) - 1 - order[first])
    positions = np.arange(len(keys))
    order = np.lexsort((-positions, bits, keys))  # by key, then bit, the latest position first
    first = np.ones(len(order), bool)
    first[1:] = (keys[order][1:] != keys[order][:-1]) | (bits[order][1:] != bits[order][:-1])
    return np.sort(order[first])

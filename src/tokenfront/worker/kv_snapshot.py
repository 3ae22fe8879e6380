"""A prefix cache's blocks at one point of its event log: what a reader that missed events gets instead of them.

The event log (``worker/kv_events.py``) keeps a bounded history. A reader whose cursor fell behind it (a router
started after the worker had run a while, one that was down, one reading another life of the worker) cannot
rebuild the cache from the events it can still get, so the worker hands it the cache itself: every block it
holds, at the log's sequence number ``seq`` (every event up to ``seq`` is in it, none after), as *chains*.

A chain is ``[parent, [hash, ...]]``: consecutive blocks of one prompt, first block first, ``parent`` the block
before the first one (``None``: the first block starts a prompt) — a "stored" event's ``parent_block_hash`` and
``block_hashes``, without the token ids. Chains come parents first: a chain's parent is in an earlier chain (or
is ``None``). The cache is a tree of blocks (a block's hash names its whole prefix); it is cut into one chain
per branch, so a snapshot costs one hash per block plus one parent per branch: 16,384 blocks of long
conversations are ~335 KB of JSON (measured in docs/api.md). It is bounded by the cache's own size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["KvSnapshot", "take_snapshot"]

# A chain on the wire: [parent hash or None, [block hash, ...]].
Chain = list[object]


@dataclass(frozen=True)
class KvSnapshot:
    """A prefix cache's blocks as chains (parents first) after every event up to ``seq`` and none after."""

    seq: int
    chains: list[Chain]
    blocks: int  # how many blocks the chains hold


def take_snapshot(blocks: Iterable[tuple[int, int | None]], seq: int) -> KvSnapshot:
    """The cache's ``blocks`` — (block hash, its parent's hash or None for a prompt's first block), every parent
    before its children — as chains, parents first, at the log's sequence number ``seq`` (the caller holds
    whatever keeps the two consistent).

    One pass: a block whose parent ends a chain so far continues that chain, any other starts one (naming its
    parent, even one not held: a cache never has such a block, it evicts leaves first). ~0.5 us a block."""
    chains: list[Chain] = []
    tails: dict[int, list[int]] = {}  # the last block of each chain -> that chain's blocks
    count = 0
    for block, parent in blocks:
        chain = tails.pop(parent, None) if parent is not None else None
        if chain is None:
            chain = []
            chains.append([parent, chain])
        chain.append(block)
        tails[block] = chain
        count += 1
    return KvSnapshot(seq, chains, count)

"""A prefix cache's bookkeeping without the KV: which blocks it holds, least recently used out, leaves first.

The simulated engine (``worker/engines/simulated.py``) keeps no keys and values, only which prefix blocks a GPU
would hold; the fleet oracle (``benchmarks/fleet/oracle.py``) uses the same index as one cache the size of a
whole fleet. Blocks are named by ``core.kv_blocks.block_hashes`` (chained: a block's hash names the prefix up to
it), as the worker's ``kv_cache.py`` names them, and every store, eviction and clear is written to a
``KvEventLog`` in the same events, so a router cannot tell this index from a real worker's cache.

Order and eviction. The index is one ``OrderedDict`` of hash -> parent hash, least recently used first. A
lookup or store touches a chain *deepest block first*, so every block is more recent than each of its
children; the least recently used block therefore never has a child, and evicting from the front evicts the
least recently used leaf — the order ``kv_cache.py`` keeps with its leaf heap — without counting children.
A chain never loses a middle block, so a router's view of chains stays whole.

The parent check on lookup (a held hash must follow the block before it) stands in for ``kv_cache.py``'s
comparison of block ids: without KV to serve, a 64-bit collision would only miscount one hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tokenfront.worker.kv_events import KvEventLog
from tokenfront.worker.kv_snapshot import KvSnapshot, take_snapshot

__all__ = ["PrefixBlockIndex"]

_ABSENT = object()  # what `OrderedDict.get` gives for a hash not held (None is a root block's parent)


class PrefixBlockIndex:
    """The blocks a prefix cache of ``max_tokens`` holds, by chained hash; LRU-evicted, leaves first.

    ``events`` None keeps no event log (the oracle); otherwise every change is logged as the worker logs it.
    Not thread-safe: the simulated engine uses it from its event loop only.
    """

    def __init__(self, tokens_per_block: int, max_tokens: int, events: KvEventLog | None = None) -> None:
        if tokens_per_block < 1:
            raise ValueError("tokens_per_block must be at least 1")
        if max_tokens < 0:
            raise ValueError("max_tokens must not be negative")
        self.tokens_per_block = tokens_per_block
        self.max_tokens = max_tokens
        self.max_blocks = max_tokens // tokens_per_block
        self.events = events
        self._blocks: OrderedDict[int, int | None] = OrderedDict()
        self.stored_blocks = 0
        self.evicted_blocks = 0

    @property
    def num_blocks(self) -> int:
        """How many blocks are held."""
        return len(self._blocks)

    @property
    def num_tokens(self) -> int:
        """How many token positions the held blocks cover."""
        return len(self._blocks) * self.tokens_per_block

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def parents(self) -> dict[int, int | None]:
        """Every block held, as block hash -> its parent's hash (None for a first block), least recently used
        first: what a snapshot must describe."""
        return dict(self._blocks)

    def stats(self) -> dict[str, float]:
        """The counters a worker's /metrics shows of its prefix cache (`tokenfront_engine_kv_cache_*`, and the
        event log's last sequence number when there is a log), by the names the real worker's engine uses."""
        counters = {
            "kv_cache_blocks": self.num_blocks,
            "kv_cache_tokens": self.num_tokens,
            "kv_cache_max_tokens": self.max_tokens,
            "kv_cache_stored_blocks": self.stored_blocks,
            "kv_cache_evicted_blocks": self.evicted_blocks,
        }
        if self.events is not None:
            counters["kv_events_last_seq"] = self.events.last_seq
        return {name: float(value) for name, value in counters.items()}

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt (its chained ``hashes``, first block first) are held.

        The matched blocks count as used.
        """
        held = self._held_prefix(hashes)
        self._touch(hashes[:held])
        return held

    def store(self, hashes: Sequence[int], token_ids: Sequence[int]) -> int:
        """Hold the blocks ``hashes`` name (a prompt's chain, first block first); return how many were new.

        ``token_ids`` are the ids the hashes were computed from (at least ``len(hashes)`` full blocks of
        them): the "stored" event carries each new block's ids, as the worker's does. Blocks already held are
        only marked used. When the budget is short the least recently used leaves go first (one "removed"
        event), then the new blocks are added (one "stored" event). A chain longer than the whole budget is
        held up to the budget.
        """
        hashes = hashes[: self.max_blocks]
        known = self._held_prefix(hashes)
        self._touch(hashes[:known])  # first: the prefix the new blocks hang from must not be evicted
        new_hashes = hashes[known:]
        if not new_hashes:
            return 0
        self._evict(len(self._blocks) + len(new_hashes) - self.max_blocks)
        first_parent = hashes[known - 1] if known else None
        parents = [first_parent, *new_hashes[:-1]]
        for block_hash, parent in zip(reversed(new_hashes), reversed(parents), strict=True):
            self._blocks[block_hash] = parent  # deepest first: each parent ends up more recent
        self._touch(hashes[:known])
        self.stored_blocks += len(new_hashes)
        if self.events is not None:
            size = self.tokens_per_block
            # One tuple of the new blocks' ids, cut into a tuple a block: the log keeps them as they are, and
            # tuples of ints leave the garbage collector's lists (a fleet's logs hold millions of blocks).
            ids = tuple(token_ids[known * size : len(hashes) * size])
            blocks = [ids[offset : offset + size] for offset in range(0, len(ids), size)]
            self.events.stored(new_hashes, first_parent, blocks, size)
        return len(new_hashes)

    def snapshot(self) -> KvSnapshot:
        """Every block held, as chains, at the event log's last sequence number (0 without a log): what a reader
        that missed events gets (`KvEventLog.read`). Consistent because the index changes only on the caller's
        thread (the simulated engine's event loop). Most recent first: every parent is more recent than its
        children (see the module docstring), so parents come first as the snapshot wants."""
        seq = self.events.last_seq if self.events is not None else 0
        return take_snapshot(reversed(self._blocks.items()), seq)

    def clear(self) -> None:
        """Drop every block (one "cleared" event)."""
        self._blocks.clear()
        if self.events is not None:
            self.events.cleared()

    def _held_prefix(self, hashes: Sequence[int]) -> int:
        blocks = self._blocks
        parent: int | None = None
        for count, block_hash in enumerate(hashes):
            if blocks.get(block_hash, _ABSENT) != parent:  # not held, or held after another block
                return count
            parent = block_hash
        return len(hashes)

    def _touch(self, chain: Sequence[int]) -> None:
        move_to_end = self._blocks.move_to_end
        for block_hash in reversed(chain):  # deepest first, the root last: parents stay more recent
            move_to_end(block_hash)

    def _evict(self, count: int) -> None:
        """Evict ``count`` least recently used blocks: each is a leaf when it goes (see the module docstring)."""
        if count <= 0:
            return
        removed = [self._blocks.popitem(last=False)[0] for _ in range(min(count, len(self._blocks)))]
        self.evicted_blocks += len(removed)
        if self.events is not None:
            self.events.removed(removed)

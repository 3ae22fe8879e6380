"""The worker's prefix KV cache: attention keys and values of prompt prefixes, kept in blocks, reused across
requests so a shared prefix is computed once.

A prompt is cut into full blocks of ``tokens_per_block`` ids named by ``core.kv_blocks.block_hashes`` (chained:
a block's hash names the whole prefix up to it; ``cache_salt`` is mixed into the root). Each block holds the
keys and values of its positions for every layer, its parent's hash and its ids. Lookups walk the chain from
the first block and stop at the first block not held, so a hit is always a whole prefix.

The cache is bounded by a token budget (``max_tokens``, a whole number of blocks). When a store would exceed
it, the least recently used *leaf* blocks (no cached child) are evicted first, so a chain never loses a
middle block and the router's view of chains stays consistent. Every store, eviction and clear is appended
to a ``KvEventLog`` (see ``worker/kv_events.py``).

KV is exchanged as ``KvLayers``: one ``(keys, values)`` pair per layer, each ``[1, kv_heads, tokens, head_dim]``
(the layout of transformers' ``DynamicCache``). Blocks store copies, never views, so a cached block does not
keep a request's whole KV tensor alive.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.worker.kv_events import KvEventLog
from tokenfront.worker.kv_snapshot import KvSnapshot, take_snapshot

KvLayers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class _Block:
    block_hash: int
    parent: int | None
    token_ids: tuple[int, ...]
    # Every layer's keys / values for this block's positions: [layers, kv_heads, tokens_per_block, head_dim].
    keys: torch.Tensor
    values: torch.Tensor
    children: int = 0
    last_used: int = 0


class PrefixKvCache:
    """Blocks of prefix KV keyed by chained block hash, LRU-evicted leaves-first under a token budget.

    Thread-safe; in the worker only the engine thread writes and looks up, the event log is read elsewhere.
    """

    def __init__(self, tokens_per_block: int, max_tokens: int, events: KvEventLog | None = None) -> None:
        if tokens_per_block < 1:
            raise ValueError("tokens_per_block must be at least 1")
        if max_tokens < 0:
            raise ValueError("max_tokens must not be negative")
        self.tokens_per_block = tokens_per_block
        self.max_tokens = max_tokens
        self.events = events if events is not None else KvEventLog()
        self._max_blocks = max_tokens // tokens_per_block
        self._blocks: dict[int, _Block] = {}
        # Candidate leaves by last use, (last_used, hash); stale entries are skipped when popped.
        self._leaf_heap: list[tuple[int, int]] = []
        self._clock = 0
        self._lock = threading.RLock()
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
        """Every block held, as block hash -> its parent's hash (None for a first block): what a snapshot must
        describe."""
        with self._lock:
            return {block_hash: block.parent for block_hash, block in self._blocks.items()}

    def match(self, token_ids: Sequence[int], cache_salt: str | None = None) -> tuple[int, KvLayers | None]:
        """The longest cached prefix of ``token_ids`` in whole blocks: ``(n_tokens, kv)``; ``(0, None)`` on a miss.

        The matched blocks count as used (they move to the recent end of the LRU order).
        """
        with self._lock:
            chain: list[_Block] = []
            parent: int | None = None
            for index, block_hash in enumerate(block_hashes(token_ids, self.tokens_per_block, cache_salt)):
                block = self._blocks.get(block_hash)
                start = index * self.tokens_per_block
                # The ids and parent check guards against a 64-bit hash collision serving the wrong KV.
                if (
                    block is None
                    or block.parent != parent
                    or block.token_ids != tuple(token_ids[start : start + self.tokens_per_block])
                ):
                    break
                chain.append(block)
                parent = block_hash
            if not chain:
                return 0, None
            for block in chain:
                self._touch(block)
            keys = torch.cat([block.keys for block in chain], dim=2)
            values = torch.cat([block.values for block in chain], dim=2)
        kv = [(keys[layer : layer + 1], values[layer : layer + 1]) for layer in range(keys.shape[0])]
        return len(chain) * self.tokens_per_block, kv

    def store(self, token_ids: Sequence[int], cache_salt: str | None, kv: KvLayers) -> int:
        """Keep every full block of ``token_ids`` whose KV ``kv`` holds; return how many blocks were new.

        ``kv`` covers at least the full blocks' positions (extra positions are ignored). Blocks already held
        are only marked used. When the budget is short, least recently used leaves are evicted first (one
        "removed" event), then the new blocks are added (one "stored" event). A chain longer than the whole
        budget is stored up to the budget.
        """
        kv_tokens = kv[0][0].shape[2] if kv else 0
        n_blocks = min(len(token_ids), kv_tokens) // self.tokens_per_block
        hashes = block_hashes(
            token_ids[: n_blocks * self.tokens_per_block], self.tokens_per_block, cache_salt
        )
        with self._lock:
            hashes = hashes[: self._max_blocks]
            known = 0
            while known < len(hashes) and hashes[known] in self._blocks:
                self._touch(self._blocks[hashes[known]])
                known += 1
            new_hashes = hashes[known:]
            if not new_hashes:
                return 0
            self._evict(len(self._blocks) + len(new_hashes) - self._max_blocks)
            parent = hashes[known - 1] if known else None
            first_parent = parent
            new_ids = []
            for index, block_hash in enumerate(new_hashes, start=known):
                start = index * self.tokens_per_block
                ids = tuple(token_ids[start : start + self.tokens_per_block])
                self._add(block_hash, parent, ids, kv, start)
                new_ids.append(ids)
                parent = block_hash
            self.stored_blocks += len(new_hashes)
            self.events.stored(new_hashes, first_parent, new_ids, self.tokens_per_block)
            return len(new_hashes)

    def snapshot(self) -> KvSnapshot:
        """Every block held, as chains, at the event log's last sequence number: what a reader that missed events
        gets (`KvEventLog.read`). Taken under the cache's lock, under which every change and its event are
        written, so the blocks are exactly those after event `seq` (the engine thread waits meanwhile: a few
        milliseconds for a full cache). In insertion order, which puts every parent before its children: a
        block is added after its parent and a parent is never evicted before its children."""
        with self._lock:
            pairs = ((block_hash, block.parent) for block_hash, block in self._blocks.items())
            return take_snapshot(pairs, self.events.last_seq)

    def clear(self) -> None:
        """Drop every block (one "cleared" event)."""
        with self._lock:
            self._blocks.clear()
            self._leaf_heap.clear()
            self.events.cleared()

    def _add(
        self, block_hash: int, parent: int | None, ids: tuple[int, ...], kv: KvLayers, start: int
    ) -> None:
        end = start + self.tokens_per_block
        # torch.stack copies: the block owns its memory instead of viewing the request's KV.
        keys = torch.stack([layer_keys[0, :, start:end] for layer_keys, _ in kv])
        values = torch.stack([layer_values[0, :, start:end] for _, layer_values in kv])
        block = _Block(block_hash, parent, ids, keys, values)
        self._blocks[block_hash] = block
        if parent is not None:
            self._blocks[parent].children += 1
        self._touch(block)

    def _touch(self, block: _Block) -> None:
        self._clock += 1
        block.last_used = self._clock
        if block.children == 0:
            heapq.heappush(self._leaf_heap, (block.last_used, block.block_hash))
        if len(self._leaf_heap) > 4 * len(self._blocks) + 64:
            self._rebuild_leaf_heap()

    def _evict(self, count: int) -> None:
        """Evict ``count`` least recently used leaves (a parent left childless becomes a candidate)."""
        removed: list[int] = []
        while len(removed) < count and self._leaf_heap:
            last_used, block_hash = heapq.heappop(self._leaf_heap)
            block = self._blocks.get(block_hash)
            if block is None or block.children or block.last_used != last_used:
                continue  # a stale entry: evicted, has children again, or used since
            del self._blocks[block_hash]
            removed.append(block_hash)
            parent = self._blocks.get(block.parent) if block.parent is not None else None
            if parent is not None:
                parent.children -= 1
                if parent.children == 0:
                    heapq.heappush(self._leaf_heap, (parent.last_used, parent.block_hash))
        if removed:
            self.evicted_blocks += len(removed)
            self.events.removed(removed)

    def _rebuild_leaf_heap(self) -> None:
        self._leaf_heap = [(b.last_used, b.block_hash) for b in self._blocks.values() if b.children == 0]
        heapq.heapify(self._leaf_heap)

"""vLLM workers' KV events applied to the fleet's blocks, vLLM's block names mapped onto tokenfront's.

vLLM names a block with its own hash (an int or bytes, from another scheme, salted per process), and every
``BlockStored`` event carries the blocks' token ids. The feed names each block again from its parent's
tokenfront name and its ids (``core.kv_blocks.next_block_hash``), so a vLLM block lands on the same row as
the same prefix held or routed anywhere else in the fleet, and keeps per worker a map from vLLM's name to
ours, so later children and removals, which name vLLM hashes only, land on the right block. The map is a
``BlockTable`` keyed by 64 bits of vLLM's name (an int name as it is, a bytes name by its XXH3-64); an entry
whose block the worker no longer holds is ignored when read and swept once the map outgrows what the worker
holds.

Blocks vLLM names by more than their ids cannot be named by ours and are skipped, with their descendants: a
LoRA adapter's KV, and blocks with ``extra_keys`` (multimodal inputs, ``cache_salt``, prompt embeddings).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import xxhash

from tokenfront.core.kv_blocks import next_block_hash, root_hash
from tokenfront.router.block_changes import Location, Removed, Stored
from tokenfront.router.block_table import BlockTable
from tokenfront.router.fleet_blocks import FleetBlocks
from tokenfront.router.vllm_events import (
    ForeignHash,
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    parse_vllm_batch,
)

__all__ = ["VllmFeed"]

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    """A batch's changes not applied yet, and the names they give (vLLM's -> ours)."""

    changes: list[Stored | Removed] = field(default_factory=list)
    names: dict[ForeignHash, int] = field(default_factory=dict)
    removed: set[ForeignHash] = field(default_factory=set)  # removed (at some location) in this batch


class VllmFeed:
    """Applies vLLM ``KVEventBatch``es to a ``FleetBlocks``, keeping each worker's vLLM-to-tokenfront names."""

    def __init__(self, blocks: FleetBlocks) -> None:
        self._blocks = blocks
        self._names: dict[str, BlockTable] = {}

    def forget(self, worker: str) -> None:
        """Drop the worker's name map (it restarted, or left)."""
        with self._blocks.lock:
            self._names.pop(worker, None)

    def apply(self, worker: str, batch: object) -> None:
        """Apply one batch (a ``VllmEventBatch``, its msgpack bytes or its decoded form) as one change."""
        parsed = parse_vllm_batch(batch)
        rank = parsed.data_parallel_rank or 0
        blocks = self._blocks
        with blocks.lock:
            blocks.mark_has_events(worker)
            pending = _Pending()
            for event in parsed.events:
                if isinstance(event, VllmBlockStored):
                    self._stored(worker, event, rank, pending)
                elif isinstance(event, VllmBlockRemoved):
                    self._removed(worker, event, rank, pending)
                elif isinstance(event, VllmAllBlocksCleared):
                    self._flush(worker, pending)
                    blocks.clear(worker, rank=rank)
            self._flush(worker, pending)
            blocks.count_events(worker, len(parsed.events))

    def _stored(self, worker: str, event: VllmBlockStored, rank: int, pending: _Pending) -> None:
        if event.lora_id is not None or event.lora_name:
            return  # an adapter's KV: vLLM names it with the adapter, our names cannot express that
        size = event.block_size
        if size < 1 or len(event.token_ids) != size * len(event.block_hashes):
            logger.debug("ignoring a BlockStored whose token_ids do not fill its blocks")
            return
        if event.parent_block_hash is None:
            parent, name = None, root_hash(None)
        else:
            parent = self._parent(worker, event.parent_block_hash, pending)
            if parent is None:
                return  # its parent was stored before we listened (or was not plain tokens): cannot name it
            name = parent
        self._blocks.set_tokens_per_block(worker, size)
        names: list[int] = []
        for index in range(len(event.block_hashes)):
            extra = event.extra_keys
            if extra is not None and index < len(extra) and extra[index]:
                # More than its ids names the block, so our name would be wrong; its descendants then have
                # no known parent and are skipped too.
                break
            try:
                name = next_block_hash(name, event.token_ids[index * size : (index + 1) * size])
            except ValueError:
                logger.debug("ignoring a BlockStored with token ids outside 0..2**32-1")
                break
            names.append(name)
        if not names:
            return
        location: Location = (rank, event.medium or "GPU", event.group_idx or 0)
        pending.changes.append(Stored(names, parent, location))
        for foreign, ours in zip(event.block_hashes[: len(names)], names, strict=True):
            pending.names[foreign] = ours
            pending.removed.discard(foreign)

    def _removed(self, worker: str, event: VllmBlockRemoved, rank: int, pending: _Pending) -> None:
        ours = [pending.names[foreign] for foreign in event.block_hashes if foreign in pending.names]
        earlier = [foreign for foreign in event.block_hashes if foreign not in pending.names]
        table = self._names.get(worker)
        if earlier and table is not None:
            rows = table.lookup(_keys(earlier))
            ours.extend(table.columns["ours"][rows[rows >= 0]].tolist())
        pending.removed.update(event.block_hashes)
        if ours:
            location: Location = (rank, event.medium or "GPU", event.group_idx or 0)
            pending.changes.append(Removed(ours, location))

    def _parent(self, worker: str, foreign: ForeignHash, pending: _Pending) -> int | None:
        """Our name for the parent block vLLM calls ``foreign``, if the worker holds it."""
        if foreign in pending.names and foreign not in pending.removed:
            return pending.names[foreign]  # stored earlier in this batch
        if foreign in pending.removed:
            self._flush(worker, pending)  # stored and removed (somewhere) in this batch: ask the index
        return self._resolve(worker, foreign)

    def _flush(self, worker: str, pending: _Pending) -> None:
        """Apply the batch's changes so far, then remember the names they gave."""
        if pending.changes:
            self._blocks.apply(worker, pending.changes)
        if pending.names:
            self._bind(worker, list(pending.names), list(pending.names.values()))
        pending.changes, pending.names, pending.removed = [], {}, set()

    def _resolve(self, worker: str, foreign: ForeignHash) -> int | None:
        """Our name for a block the worker holds under vLLM's name ``foreign``; None when it holds none."""
        table = self._names.get(worker)
        if table is None:
            return None
        row = int(table.lookup(_keys([foreign]))[0])
        if row < 0:
            return None
        ours = int(table.columns["ours"][row])
        return ours if self._blocks.holds(worker, ours) else None

    def _bind(self, worker: str, foreign: list[ForeignHash], ours: list[int]) -> None:
        table = self._names.get(worker)
        if table is None:
            table = self._names[worker] = BlockTable({"ours": np.uint64}, capacity=64)
        rows, _ = table.insert(_keys(foreign))
        table.columns["ours"][rows] = np.array(ours, np.uint64)
        if len(table) > 2 * self._blocks.blocks_held(worker) + 1024:
            # Sweep the names of blocks the worker no longer holds (dropped, evicted, cleared).
            live = table.live_rows()
            held = np.array(self._blocks.holds_many(worker, table.columns["ours"][live]), bool)
            table.delete(live[~held])


def _keys(names: list[ForeignHash] | tuple[ForeignHash, ...]) -> np.ndarray:
    """64-bit keys for vLLM's block names: an int in range as it is, anything else by its XXH3-64."""
    return np.array([_key(name) for name in names], np.uint64)


def _key(name: ForeignHash) -> int:
    if isinstance(name, int) and 0 <= name < 1 << 64:
        return name
    data = name if isinstance(name, bytes) else str(name).encode()
    return xxhash.xxh3_64_intdigest(data)

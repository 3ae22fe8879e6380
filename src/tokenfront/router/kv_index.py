"""What the router knows of each worker's prefix KV cache: the blocks it holds, named by content.

Every block is named by tokenfront's own chained hash (``core.kv_blocks``: the parent's hash and the block's
token ids, ``cache_salt`` in the root), whatever the worker is, so one lookup serves every kind of worker:

- tokenfront workers publish those very hashes on ``GET /kv_cache_events`` (``apply_tokenfront_events``);
- vLLM workers publish their own hashes with each block's token ids (``apply_vllm_batch``): the index
  re-hashes the ids from the parent's name and keeps a per-worker map from vLLM's hash to ours, so later
  children and removals (which name vLLM hashes only) land on the right block;
- any worker, before it has published anything (or if it never does), is credited with what the router sent
  it (``record_routed``).

``match`` walks a prompt's block names from the first and stops at the first one the worker is not known to
hold, so a match is always a whole prefix: a removed block breaks the chain from there on.

Routed history versus events. A routed block is a guess: the worker will probably cache it, but may evict it
at once. Until a worker's first event arrives, guesses are all the router has and they never expire (only the
LRU cap drops them). Once a worker has events (``has_events``), a guess counts only for ``routed_ttl_s``
seconds after the request was routed: long enough for the worker's own "stored" event to arrive and
confirm it (a confirmed block no longer depends on the guess), short enough that a block the worker never
kept soon stops attracting requests. Guesses older than that at the moment events start are ignored.
Events always win: "removed" and "cleared" drop a block whether it was guessed or confirmed.

Memory is bounded: each worker keeps at most ``max_blocks_per_worker`` blocks, least recently used first out.
Touching a chain refreshes its ancestors last, so a shared system prompt (the root of many chains) is evicted
after its children, never before them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# block_digest is the one step of core.kv_blocks' chain: a vLLM block must be named from its parent's full
# digest (block_hashes only starts from the root), and re-implementing it here would let the names drift.
from tokenfront.core.kv_blocks import as_int, block_digest, block_hashes, root_hash
from tokenfront.router.vllm_events import (
    ForeignHash,
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    parse_vllm_batch,
)

logger = logging.getLogger(__name__)

# A place a block is held: (data-parallel rank, medium, KV cache group). A vLLM block can be held in several
# (a CPU copy, the groups of a hybrid model); it is gone only when every one of them lost it.
Location = tuple[int, str, int]
_DEVICE: Location = (0, "GPU", 0)

DEFAULT_MAX_BLOCKS_PER_WORKER = 65_536
DEFAULT_ROUTED_TTL_S = 10.0


@dataclass(eq=False)
class _Block:
    parent: int | None  # our hash of the block before it; None for a first block (or unknown)
    locations: set[Location] | None = None  # where events say it is held; None/empty: not confirmed
    routed_at: float | None = None  # when the router last sent this prefix here (the guess)
    foreign: list[ForeignHash] | None = None  # vLLM's names for it, forgotten with the block


class _WorkerView:
    """The index's knowledge of one worker."""

    def __init__(self) -> None:
        self.blocks: OrderedDict[int, _Block] = OrderedDict()  # LRU order: least recently used first
        self.foreign: dict[ForeignHash, tuple[int, bytes]] = {}  # vLLM hash -> (our hash, our full digest)
        self.has_events = False
        self.tokens_per_block: int | None = None  # learned from the events
        self.log_id: str | None = None  # the tokenfront event log's life
        self.cursor = 0  # the last tokenfront event applied
        self.events_applied = 0
        self.resets = 0
        self.evicted = 0


class KvIndex:
    """Per worker url, the prefix blocks the worker is known (or, from routing, assumed) to hold. Thread-safe."""

    def __init__(
        self,
        *,
        max_blocks_per_worker: int = DEFAULT_MAX_BLOCKS_PER_WORKER,
        routed_ttl_s: float = DEFAULT_ROUTED_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_blocks_per_worker < 1:
            raise ValueError("max_blocks_per_worker must be at least 1")
        if routed_ttl_s < 0:
            raise ValueError("routed_ttl_s must not be negative")
        self.max_blocks_per_worker = max_blocks_per_worker
        self.routed_ttl_s = routed_ttl_s
        self._clock = clock
        self._views: dict[str, _WorkerView] = {}
        self._lock = threading.Lock()

    # --- lookups -------------------------------------------------------------------------------------------

    def match(
        self, worker: str, token_ids: Sequence[int], tokens_per_block: int, cache_salt: str | None
    ) -> int:
        """The number of leading full blocks of ``token_ids`` the worker is known to hold."""
        return self.match_hashes(worker, block_hashes(token_ids, tokens_per_block, cache_salt))

    def match_hashes(self, worker: str, hashes: Sequence[int]) -> int:
        """``match`` on block names already computed (so a policy hashes a prompt once for all workers)."""
        with self._lock:
            view = self._views.get(worker)
            if view is None:
                return 0
            now = self._clock()
            matched = 0
            for block_hash in hashes:
                block = view.blocks.get(block_hash)
                if block is None:
                    break
                if not self._held(view, block, now):
                    self._drop(view, block_hash, block)  # an expired guess: nothing else vouches for it
                    break
                matched += 1
            return matched

    def has_events(self, worker: str) -> bool:
        """Whether events have arrived for this worker (from then on, routed guesses expire)."""
        with self._lock:
            view = self._views.get(worker)
            return view is not None and view.has_events

    def tokens_per_block(self, worker: str) -> int | None:
        """The block size the worker's events use (vLLM's ``block_size``), None before any stored event."""
        with self._lock:
            view = self._views.get(worker)
            return view.tokens_per_block if view is not None else None

    def tokenfront_cursor(self, worker: str) -> int:
        """The ``after`` for the next ``GET /kv_cache_events`` read of this worker (0 to start)."""
        with self._lock:
            view = self._views.get(worker)
            return view.cursor if view is not None else 0

    # --- routed history ------------------------------------------------------------------------------------

    def record_routed(
        self, worker: str, token_ids: Sequence[int], tokens_per_block: int, cache_salt: str | None
    ) -> None:
        """Assume the worker now holds every full block of ``token_ids`` (until events say otherwise)."""
        self.record_routed_hashes(worker, block_hashes(token_ids, tokens_per_block, cache_salt))

    def record_routed_hashes(self, worker: str, hashes: Sequence[int]) -> None:
        """``record_routed`` on block names already computed, first block first."""
        if not hashes:
            return
        with self._lock:
            view = self._view(worker)
            now = self._clock()
            parent: int | None = None
            for block_hash in hashes:
                self._ensure(view, block_hash, parent).routed_at = now
                parent = block_hash
            self._touch(view, hashes, None)
            self._evict(view)

    # --- tokenfront workers --------------------------------------------------------------------------------

    def apply_tokenfront_events(self, worker: str, payload: Mapping[str, Any]) -> None:
        """Apply one ``GET /kv_cache_events`` answer (``{events, last_seq, oldest_seq, truncated, log_id}``).

        A new ``log_id`` (the worker restarted) or ``truncated`` (the router missed events) drops everything
        known of the worker before the returned events are applied. Events at or below the cursor (a repeated
        read) are skipped; a gap in sequence numbers is treated like ``truncated``. Read again with
        ``after=tokenfront_cursor(worker)``.
        """
        events = payload.get("events")
        if not isinstance(events, list):
            raise ValueError("a /kv_cache_events answer has an `events` list")
        log_id = payload.get("log_id")
        with self._lock:
            view = self._view(worker)
            view.has_events = True
            restarted = view.log_id is not None and log_id != view.log_id
            fresh = restarted or bool(payload.get("truncated"))
            if fresh:
                self._reset(view)
            view.log_id = log_id if isinstance(log_id, str) else view.log_id
            # After a restart the old cursor counts another life's events: take the new log from its start.
            cursor = 0 if restarted else view.cursor
            try:
                for event in events:
                    seq = event.get("seq") if isinstance(event, Mapping) else None
                    if not isinstance(seq, int) or not isinstance(event, Mapping):
                        raise ValueError(f"a KV event has a `seq` number, got {event!r:.80}")
                    if seq <= cursor:
                        continue
                    if seq > cursor + 1 and not fresh:
                        logger.warning(
                            "KV events %d..%d of %s missing: forgetting its blocks",
                            cursor + 1,
                            seq - 1,
                            worker,
                        )
                        self._reset(view)
                    fresh = False
                    self._apply_tokenfront_event(view, event)
                    cursor = seq
                if not events and fresh:
                    last_seq = payload.get("last_seq")
                    cursor = last_seq if isinstance(last_seq, int) else cursor
            finally:
                view.cursor = cursor

    def _apply_tokenfront_event(self, view: _WorkerView, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "stored":
            hashes = _int_list(event.get("block_hashes"), "block_hashes")
            parent = event.get("parent_block_hash")
            if parent is not None and not isinstance(parent, int):
                raise ValueError(f"parent_block_hash is an integer or null, got {parent!r}")
            tokens_per_block = event.get("tokens_per_block")
            if isinstance(tokens_per_block, int) and tokens_per_block > 0:
                view.tokens_per_block = tokens_per_block
            previous = parent
            for block_hash in hashes:
                self._confirm(self._ensure(view, block_hash, previous), _DEVICE)
                previous = block_hash
            self._touch(view, hashes, parent)
            self._evict(view)
        elif kind == "removed":
            for block_hash in _int_list(event.get("block_hashes"), "block_hashes"):
                block = view.blocks.get(block_hash)
                if block is not None:
                    self._drop(view, block_hash, block)
        elif kind == "cleared":
            self._reset(view)
        # Unknown kinds come from a newer worker: skipping them only loses knowledge, never invents it.
        view.events_applied += 1

    # --- vLLM workers --------------------------------------------------------------------------------------

    def apply_vllm_batch(self, worker: str, batch: object) -> None:
        """Apply one vLLM ``KVEventBatch`` (a ``VllmEventBatch``, its msgpack bytes or its decoded form)."""
        parsed = parse_vllm_batch(batch)
        rank = parsed.data_parallel_rank or 0
        with self._lock:
            view = self._view(worker)
            view.has_events = True
            for event in parsed.events:
                if isinstance(event, VllmBlockStored):
                    self._apply_vllm_stored(view, event, rank)
                elif isinstance(event, VllmBlockRemoved):
                    self._apply_vllm_removed(view, event, rank)
                elif isinstance(event, VllmAllBlocksCleared):
                    self._apply_vllm_cleared(view, rank)
                view.events_applied += 1

    def _apply_vllm_stored(self, view: _WorkerView, event: VllmBlockStored, rank: int) -> None:
        if event.lora_id is not None or event.lora_name:
            return  # an adapter's KV: vLLM names it with the adapter, our names cannot express that
        size = event.block_size
        if size < 1 or len(event.token_ids) != size * len(event.block_hashes):
            logger.debug("ignoring a BlockStored whose token_ids do not fill its blocks")
            return
        if event.parent_block_hash is None:
            parent, digest = None, root_hash(None)
        else:
            known = view.foreign.get(event.parent_block_hash)
            if known is None:
                return  # its parent was stored before we listened (or was not plain tokens): cannot name it
            parent, digest = known
        view.tokens_per_block = size
        location: Location = (rank, event.medium or "GPU", event.group_idx or 0)
        first_parent = parent
        chain: list[int] = []
        for index, foreign in enumerate(event.block_hashes):
            extra = event.extra_keys
            if extra is not None and index < len(extra) and extra[index]:
                # Multimodal inputs, cache_salt, prompt embeddings...: more than its ids names the block,
                # so our name would be wrong. Its descendants then have no known parent and are skipped too.
                break
            digest = block_digest(digest, event.token_ids[index * size : (index + 1) * size])
            block_hash = as_int(digest)
            block = self._ensure(view, block_hash, parent)
            self._confirm(block, location)
            if block.foreign is None:
                block.foreign = []
            if foreign not in block.foreign:
                block.foreign.append(foreign)
            view.foreign[foreign] = (block_hash, digest)
            chain.append(block_hash)
            parent = block_hash
        self._touch(view, chain, first_parent)
        self._evict(view)

    def _apply_vllm_removed(self, view: _WorkerView, event: VllmBlockRemoved, rank: int) -> None:
        location: Location = (rank, event.medium or "GPU", event.group_idx or 0)
        for foreign in event.block_hashes:
            known = view.foreign.get(foreign)
            if known is None:
                continue
            block = view.blocks.get(known[0])
            if block is None:
                view.foreign.pop(foreign, None)
                continue
            if block.locations:
                block.locations.discard(location)
            if not block.locations:
                self._drop(view, known[0], block)

    def _apply_vllm_cleared(self, view: _WorkerView, rank: int) -> None:
        # That rank's cache is empty; blocks other ranks still hold stay, guesses made before go.
        for block_hash, block in list(view.blocks.items()):
            if block.locations:
                block.locations = {loc for loc in block.locations if loc[0] != rank}
            if not block.locations:
                self._drop(view, block_hash, block)

    # --- membership ----------------------------------------------------------------------------------------

    def reset(self, worker: str) -> None:
        """Drop every block known of the worker (it restarted, or events were lost); keep its event state."""
        with self._lock:
            view = self._views.get(worker)
            if view is not None:
                self._reset(view)

    def forget(self, worker: str) -> None:
        """Drop everything about the worker (it left): blocks, event cursor, ``has_events``."""
        with self._lock:
            self._views.pop(worker, None)

    def stats(self) -> dict[str, Any]:
        """Per worker: blocks (confirmed by events / routed guesses only), event state, resets, evictions."""
        with self._lock:
            workers = {}
            for url, view in self._views.items():
                confirmed = sum(1 for block in view.blocks.values() if block.locations)
                workers[url] = {
                    "blocks": len(view.blocks),
                    "confirmed_blocks": confirmed,
                    "routed_only_blocks": len(view.blocks) - confirmed,
                    "has_events": view.has_events,
                    "tokens_per_block": view.tokens_per_block,
                    "events_applied": view.events_applied,
                    "event_cursor": view.cursor,
                    "log_id": view.log_id,
                    "resets": view.resets,
                    "evicted_blocks": view.evicted,
                }
            return {
                "max_blocks_per_worker": self.max_blocks_per_worker,
                "routed_ttl_s": self.routed_ttl_s,
                "workers": workers,
            }

    # --- internals (lock held) -----------------------------------------------------------------------------

    def _view(self, worker: str) -> _WorkerView:
        view = self._views.get(worker)
        if view is None:
            view = self._views[worker] = _WorkerView()
        return view

    def _held(self, view: _WorkerView, block: _Block, now: float) -> bool:
        if block.locations:
            return True
        if block.routed_at is None:
            return False
        return not view.has_events or now - block.routed_at < self.routed_ttl_s

    @staticmethod
    def _ensure(view: _WorkerView, block_hash: int, parent: int | None) -> _Block:
        block = view.blocks.get(block_hash)
        if block is None:
            block = view.blocks[block_hash] = _Block(parent)
        elif block.parent is None and parent is not None:
            block.parent = parent
        return block

    @staticmethod
    def _confirm(block: _Block, location: Location) -> None:
        if block.locations is None:
            block.locations = set()
        block.locations.add(location)

    @staticmethod
    def _touch(view: _WorkerView, chain: Sequence[int], parent: int | None) -> None:
        """Mark a chain used: leaf first, then towards the root, so ancestors are the last to be evicted."""
        for block_hash in reversed(chain):
            view.blocks.move_to_end(block_hash)
        # A stored chain continues a prefix stored earlier: refresh that prefix too (bounded: no cycles).
        steps = 0
        while parent is not None and steps < len(view.blocks):
            block = view.blocks.get(parent)
            if block is None:
                break
            view.blocks.move_to_end(parent)
            parent = block.parent
            steps += 1

    def _evict(self, view: _WorkerView) -> None:
        while len(view.blocks) > self.max_blocks_per_worker:
            _, block = view.blocks.popitem(last=False)
            self._forget_foreign(view, block)
            view.evicted += 1

    def _drop(self, view: _WorkerView, block_hash: int, block: _Block) -> None:
        del view.blocks[block_hash]
        self._forget_foreign(view, block)

    @staticmethod
    def _forget_foreign(view: _WorkerView, block: _Block) -> None:
        for foreign in block.foreign or ():
            view.foreign.pop(foreign, None)

    @staticmethod
    def _reset(view: _WorkerView) -> None:
        view.blocks.clear()
        view.foreign.clear()
        view.resets += 1


def _int_list(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(item, int) for item in value):
        raise ValueError(f"`{name}` is a list of integers, got {value!r:.80}")
    return value

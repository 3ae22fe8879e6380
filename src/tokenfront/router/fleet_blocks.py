"""Which worker holds which prefix block, for the whole fleet in one structure.

Every block is named by tokenfront's chained hash (``core.kv_blocks``), whatever the worker is, so one row per
block serves every worker: the row says who holds it. Most blocks are held by one worker (a conversation lives
where it was routed), and such a row carries that worker's slot number and its state in numpy columns
(``block_table``); a block held by several workers (a shared system prompt) has its holders as a bitset (a
Python int, one bit per worker slot) with their state beside it. So one walk of a prompt's blocks answers for
every worker at once: the running AND of the holder sets, noting where each worker drops out, costs a numpy
pass over the prompt plus Python work only for the blocks several workers hold (``matched_blocks``). A match
is always a whole prefix: a block a worker does not hold ends its match there.

The vocabulary (what feeds the index say, in the index's own words: ``router/block_changes.py``):

- ``apply(worker, changes)``: ``Stored`` (a worker holds a chain of blocks, confirmed by its events, at a
  ``Location``: data-parallel rank, medium, KV cache group; a block held in several is gone only when every one
  of them lost it) and ``Removed`` (blocks left one location), a page of them applied as one change in which,
  for each block and location, the last one decides; ``clear``: everything of one data-parallel rank went;
- ``record_routed``: the router sent a prompt to a worker, which probably caches it (a guess);
- ``reset`` / ``forget``: a worker's blocks are unknown again / the worker left.

Routed guesses versus events. Until a worker's first event arrives (``mark_has_events``), guesses are all
the router has and they never expire (only the cap drops them). Once a worker has events, a guess counts
only for ``routed_ttl_s`` seconds after the request was routed: long enough for the worker's own "stored"
event to confirm it (a confirmed block no longer depends on the guess), short enough that a block the worker
never kept soon stops attracting requests; guesses already older than that when events start are ignored. An
expired guess a walk meets is dropped. Events always win: a removal drops a block whether it was guessed or
confirmed.

Memory is bounded: each worker keeps at most ``max_blocks_per_worker`` blocks. Past it, the least recently
used go, a sixteenth of the cap at once so the work is amortized. A block's recency for eviction is the most
recent use in its subtree (a descendant's use counts for every ancestor, a little newer the higher up), so a
shared system prompt, the root of many chains, is evicted after its children, never before them. Recency is
one clock per block, not per worker and block: a block held by several workers is as recent as its latest use
by any of them. A held block costs about 65 bytes (its row: the table's key and slot, the parent's hash, the
holder, the last use, the routed time, the flags; and its place in its worker's list), measured by
``benchmarks/kv_decision.py``; a block several workers hold costs a dict entry or two per extra holder.

Thread-safe: every public method holds the index's re-entrant ``lock``; a feed holds it across a batch so the
batch is applied as one change.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat

import numpy as np

from tokenfront.core.kv_blocks import block_hash_array
from tokenfront.router.block_changes import Location, Removed, Stored, chain_parents, flatten
from tokenfront.router.block_holders import RowList, SharedHolders, WorkerBlocks, iter_slots, slot_array
from tokenfront.router.block_table import BlockTable, as_keys, distinct

__all__ = ["DEFAULT_MAX_BLOCKS_PER_WORKER", "DEFAULT_ROUTED_TTL_S", "FleetBlocks"]

DEFAULT_MAX_BLOCKS_PER_WORKER = 65_536
DEFAULT_ROUTED_TTL_S = 10.0

# Worker slots count from 1: a new row's columns are 0, which says "nobody".
_NOBODY = 0  # the holder of a free row
_SHARED = -1  # the holder of a row several workers hold: see FleetBlocks._shared
# Rows reserved up front (address space: memory is committed as rows are first used), so that the columns
# are never copied for a fleet of up to 1,024 workers at the default cap.
_RESERVED_ROWS = 1 << 26
# flags: bit 0 says the parent column is set; bits 1-7 are the locations where events confirmed the block
# (one bit per location of the holding worker; none: a routed guess).
_HAS_PARENT = np.uint8(1)
_MAX_LOCATIONS = 7


class FleetBlocks:
    """Per worker url, the prefix blocks the worker is known (or, from routing, assumed) to hold."""

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
        columns = {
            "parent": np.uint64,  # the hash of the block before it (when _HAS_PARENT)
            "holder": np.int32,  # the one worker slot holding it, _SHARED, or _NOBODY
            "tick": np.int64,  # when last used, in the index's own clock
            "routed_at": np.float64,  # when the router last sent it to its one holder
            "flags": np.uint8,
        }
        try:
            self._table = BlockTable(columns, reserve=_RESERVED_ROWS)
        except MemoryError:  # a system that refuses that much address space: columns grow by copying
            self._table = BlockTable(columns)
        self._shared: dict[int, SharedHolders] = {}  # row -> holders, for rows held by several workers
        self._workers: dict[str, WorkerBlocks] = {}
        self._slot_by_url: dict[str, int] = {}
        self._by_slot: list[WorkerBlocks | None] = [None]  # slot 0 is nobody's
        self._free_slots: list[int] = []
        self._has_events = np.zeros(64, bool)  # by slot
        self._events_mask = 0  # the same, as a bitset
        self._tick = 0
        self._version = 0  # changes whenever a row is added or deleted: cached row numbers are stale then
        self._last_rows: tuple[np.ndarray, int, np.ndarray] | None = None  # (keys, version, rows)
        self._slots_changed = 0  # counts workers given or losing a slot
        self._last_slots: tuple[list[str], int, np.ndarray] | None = None  # (workers, _slots_changed, slots)
        self._lock = threading.RLock()

    @property
    def lock(self) -> threading.RLock:
        """The index's re-entrant lock: held by every method; a feed holds it across a batch."""
        return self._lock

    @property
    def table(self) -> BlockTable:
        """The rows of every block the index knows (read-only use: the index changes it under its lock)."""
        return self._table

    def now(self) -> float:
        """The index's clock (seconds): what its routed guesses expire by; a policy's own timing follows it."""
        return self._clock()

    # --- lookups -------------------------------------------------------------------------------------------

    def match(
        self, worker: str, token_ids: Sequence[int], tokens_per_block: int, cache_salt: str | None
    ) -> int:
        """The number of leading full blocks of ``token_ids`` the worker is known to hold."""
        return self.match_hashes(worker, block_hash_array(token_ids, tokens_per_block, cache_salt))

    def match_hashes(self, worker: str, hashes: object) -> int:
        """``match`` on block names already computed (first block first)."""
        return int(self.matched_blocks([worker], hashes)[0])

    def matched_blocks(self, workers: Sequence[str], hashes: object) -> np.ndarray:
        """For each of ``workers``, how many leading blocks of ``hashes`` it holds: one walk for all of them."""
        keys = as_keys(hashes)
        with self._lock:
            levels = self._walk(keys, self._clock())
            matched = np.zeros(len(workers), np.int64)
            if not levels:
                return matched
            # Index -1 (a worker the index does not know) reads the extra last entry, which stays 0.
            by_slot = np.zeros(len(self._by_slot) + 1, np.int64)
            for depth, holders in levels:
                by_slot[slot_array(holders)] = depth
            return by_slot[self._slots_of_workers(workers)]

    def has_events(self, worker: str) -> bool:
        """Whether events have arrived for this worker (from then on, routed guesses expire)."""
        with self._lock:
            state = self._workers.get(worker)
            return state is not None and state.has_events

    def tokens_per_block(self, worker: str) -> int | None:
        """The block size the worker's events use (vLLM's ``block_size``), None before any stored event."""
        with self._lock:
            state = self._workers.get(worker)
            return state.tokens_per_block if state is not None else None

    def blocks_held(self, worker: str) -> int:
        """How many blocks the worker holds (confirmed or guessed)."""
        with self._lock:
            state = self._workers.get(worker)
            return state.blocks if state is not None else 0

    def holds(self, worker: str, block_hash: int) -> bool:
        """Whether the worker holds the block (confirmed, or a guess that has not expired)."""
        return self.holds_many(worker, [block_hash])[0]

    def holds_many(self, worker: str, hashes: object) -> list[bool]:
        """``holds`` for each of ``hashes``."""
        keys = as_keys(hashes)
        with self._lock:
            state = self._workers.get(worker)
            if state is None or not len(keys):
                return [False] * len(keys)
            rows = self._table.lookup(keys)
            return [row >= 0 and self._held_live(int(row), state, self._clock()) for row in rows.tolist()]

    # --- routed history ------------------------------------------------------------------------------------

    def record_routed(
        self, worker: str, token_ids: Sequence[int], tokens_per_block: int, cache_salt: str | None
    ) -> None:
        """Assume the worker now holds every full block of ``token_ids`` (until events say otherwise)."""
        self.record_routed_hashes(worker, block_hash_array(token_ids, tokens_per_block, cache_salt))

    def record_routed_hashes(self, worker: str, hashes: object) -> None:
        """``record_routed`` on block names already computed, first block first."""
        keys = as_keys(hashes)
        if not len(keys):
            return
        with self._lock:
            parents, has_parent = chain_parents(keys, None)
            self._hold(self._worker(worker), keys, parents, has_parent, np.arange(len(keys), 0, -1), None)

    # --- what events say -----------------------------------------------------------------------------------

    def mark_has_events(self, worker: str) -> None:
        """Events arrived for the worker: from now on its routed guesses expire after ``routed_ttl_s``."""
        with self._lock:
            state = self._worker(worker)
            if state.has_events:
                return
            state.has_events = True
            self._has_events[state.slot] = True
            self._events_mask |= 1 << state.slot
            # Its guesses on shared blocks start to age now: make those rows look for expired ones.
            for row in self._shared_members(state):
                shared = self._shared[row]
                routed_at = shared.routed.get(state.slot)
                if routed_at is not None and routed_at < shared.oldest:
                    shared.oldest = routed_at

    def count_events(self, worker: str, count: int = 1) -> None:
        """Count events applied for the worker (``events_applied`` in ``stats``)."""
        with self._lock:
            self._worker(worker).events_applied += count

    def set_tokens_per_block(self, worker: str, tokens_per_block: int) -> None:
        """The block size the worker's events use."""
        with self._lock:
            self._worker(worker).tokens_per_block = tokens_per_block

    def apply(self, worker: str, changes: Sequence[Stored | Removed]) -> None:
        """Apply what the worker's events say, in order, as one change: for each block and location the
        last change about it decides, so a page of events costs a few numpy passes, not a few per event."""
        changes = [change for change in changes if len(change.hashes)]  # type: ignore[arg-type]
        if not changes:
            return
        with self._lock:
            state = self._worker(worker)
            page = flatten(changes, functools.partial(self._change_bit, state))
            keys, bits, stored = page.keys, page.bits, page.stored
            removed = ~stored
            if removed.any():
                for bit in np.unique(bits[removed]).tolist():
                    rows = self._table.lookup(keys[removed & (bits == bit)])
                    self._drop_locations(state, rows[rows >= 0], bit)
            if stored.any():
                self._hold(
                    state,
                    keys[stored],
                    page.parents[stored],
                    page.has_parent[stored],
                    page.recency[stored],
                    bits[stored],
                )

    def clear(self, worker: str, *, rank: int) -> None:
        """Data-parallel rank ``rank`` of the worker dropped its whole cache: blocks only it held go, and so
        do the worker's routed guesses; blocks other ranks hold stay."""
        with self._lock:
            state = self._workers.get(worker)
            if state is None:
                return
            mask = sum(1 << i for i, location in enumerate(state.locations) if location[0] == rank)
            self._drop_locations(state, self._valid_members(state), mask)

    # --- membership ----------------------------------------------------------------------------------------

    def reset(self, worker: str) -> None:
        """Drop every block known of the worker (it restarted, or events were lost); keep its event state."""
        with self._lock:
            state = self._workers.get(worker)
            if state is not None:
                self._release(state, self._valid_members(state))
                state.members = RowList()
                state.resets += 1

    def forget(self, worker: str) -> None:
        """Drop everything about the worker (it left): blocks, ``has_events``, counters."""
        with self._lock:
            state = self._workers.pop(worker, None)
            if state is None:
                return
            self._release(state, self._valid_members(state))
            del self._slot_by_url[worker]
            self._slots_changed += 1
            self._by_slot[state.slot] = None
            self._free_slots.append(state.slot)
            self._has_events[state.slot] = False
            self._events_mask &= ~(1 << state.slot)

    def stats(self) -> dict[str, object]:
        """Per worker: blocks (confirmed by events / routed guesses only), event state, resets, evictions;
        for the fleet: distinct blocks, how many several workers hold, and the bytes its arrays use."""
        with self._lock:
            workers = {
                url: {
                    "blocks": state.blocks,
                    "confirmed_blocks": state.confirmed,
                    "routed_only_blocks": state.blocks - state.confirmed,
                    "has_events": state.has_events,
                    "tokens_per_block": state.tokens_per_block,
                    "events_applied": state.events_applied,
                    "resets": state.resets,
                    "evicted_blocks": state.evicted,
                }
                for url, state in self._workers.items()
            }
            return {
                "max_blocks_per_worker": self.max_blocks_per_worker,
                "routed_ttl_s": self.routed_ttl_s,
                "distinct_blocks": len(self._table),
                "shared_blocks": len(self._shared),
                "array_bytes": self._table.nbytes()
                + sum(s.members.rows.nbytes for s in self._workers.values()),
                "workers": workers,
            }

    # --- internals (lock held) -----------------------------------------------------------------------------

    def _worker(self, url: str) -> WorkerBlocks:
        state = self._workers.get(url)
        if state is None:
            slot = self._free_slots.pop() if self._free_slots else len(self._by_slot)
            state = WorkerBlocks(url, slot, RowList())
            if slot == len(self._by_slot):
                self._by_slot.append(state)
            else:
                self._by_slot[slot] = state
            if slot >= len(self._has_events):
                self._has_events = np.concatenate([self._has_events, np.zeros(len(self._has_events), bool)])
            self._workers[url] = state
            self._slot_by_url[url] = slot
            self._slots_changed += 1
        return state

    def _change_bit(self, state: WorkerBlocks, change: Stored | Removed) -> int:
        """The bit of the change's location for the worker: a stored one's is learned, a removed one's looked up."""
        if isinstance(change, Stored):
            return self._location_bit(state, change.location)
        return self._known_location_bit(state, change.location)

    def _location_bit(self, state: WorkerBlocks, location: Location) -> int:
        if location not in state.locations:
            if len(state.locations) == _MAX_LOCATIONS:
                # Past seven locations (ranks x media x groups) the last bit stands for all the others: such a
                # block counts as gone as soon as one of them loses it.
                return 1 << (_MAX_LOCATIONS - 1)
            state.locations.append(location)
        return 1 << state.locations.index(location)

    def _known_location_bit(self, state: WorkerBlocks, location: Location) -> int:
        if location in state.locations:
            return 1 << state.locations.index(location)
        return 1 << (_MAX_LOCATIONS - 1) if len(state.locations) == _MAX_LOCATIONS else 0

    def _slots_of_workers(self, workers: Sequence[str]) -> np.ndarray:
        """The slot of each worker (-1: unknown), reusing the last answer for the same list of workers."""
        cached = self._last_slots
        if cached is not None and cached[1] == self._slots_changed and cached[0] == workers:
            return cached[2]  # comparing the lists is cheap: the same url objects, compared by identity first
        slots = np.fromiter(map(self._slot_by_url.get, workers, repeat(-1)), np.int64, len(workers))
        self._last_slots = (list(workers), self._slots_changed, slots)
        return slots

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        """The rows of ``keys`` (-1: not held by anyone), reusing the last walk's when nothing changed since:
        the same array, not to be written to."""
        last = self._last_rows
        if last is not None and last[0] is keys and last[1] == self._version:
            return last[2]
        rows = self._table.lookup(keys)
        self._last_rows = (keys, self._version, rows)
        return rows

    def _walk(self, keys: np.ndarray, now: float) -> list[tuple[int, int]]:
        """Walk a prompt's blocks once for every worker: ``(depth, holders)`` pairs, each saying that the
        workers in bitset ``holders`` hold exactly the first ``depth`` blocks (workers in none hold none)."""
        rows = self._rows(keys)
        present = rows >= 0
        end = len(rows) if present.all() else int(present.argmin())
        if not end:
            return []
        rows = rows[:end]
        holders = self._table.columns["holder"][rows]
        singles = np.flatnonzero(holders > 0)
        first_single = int(singles[0]) if len(singles) else end
        levels: list[tuple[int, int]] = []
        running = -1  # the workers holding every block so far; -1 before the first block
        shared_rows, events_mask, ttl = self._shared, self._events_mask, self.routed_ttl_s
        # Blocks several workers hold: intersect their holder sets (in Python: one bitset AND a block).
        for depth, row in enumerate(rows[:first_single].tolist()):
            shared = shared_rows[row]
            live = shared.holders
            # `oldest` first: a float compare, where the bitsets are ints of a bit per worker.
            if now - shared.oldest >= ttl and live & ~shared.confirmed & events_mask:
                live = self._live_holders(row, now)  # a guess may have expired
            if running == -1:
                running = live
                if not running:
                    return levels
                continue
            still = running & live
            if still != running:
                levels.append((depth, running ^ still))
                running = still
                if not running:
                    return levels
        if first_single == end:
            levels.append((end, running))
            return levels
        # From the first block one worker holds alone, only that worker can go on.
        slot = int(holders[first_single])
        bit = 1 << slot
        if running != -1:
            if not running & bit:
                levels.append((first_single, running))
                return levels
            if running != bit:
                levels.append((first_single, running & ~bit))
        stop = self._run_end(slot, rows, holders, first_single, now)
        if stop:
            levels.append((stop, bit))
        return levels

    def _run_end(self, slot: int, rows: np.ndarray, holders: np.ndarray, start: int, now: float) -> int:
        """The first position from ``start`` on whose block worker ``slot`` does not hold (live)."""
        columns = self._table.columns
        segment = rows[start:]
        held = holders[start:] == slot
        if self._has_events[slot]:
            # Confirmed blocks (a location bit: flags of 2 or more) always count; guesses until their TTL.
            guessed = np.flatnonzero(held & (columns["flags"][segment] < 2))
            if len(guessed):
                held[guessed] = now - columns["routed_at"][segment[guessed]] < self.routed_ttl_s
        if held.all():
            return len(rows)
        for offset in np.flatnonzero(~held).tolist():
            position = start + offset
            holder = int(holders[position])
            row = int(rows[position])
            if holder == _SHARED and self._live_holders(row, now) >> slot & 1:
                continue
            if holder == slot:  # an expired guess: nothing vouches for it any more
                state = self._by_slot[slot]
                assert state is not None
                self._release(state, rows[position : position + 1])
            return position
        return len(rows)

    def _live_holders(self, row: int, now: float) -> int:
        """The holders of a shared row whose copy counts now; expired guesses found on the way are dropped."""
        shared = self._shared[row]
        guesses = shared.holders & ~shared.confirmed & self._events_mask
        if not guesses or now - shared.oldest < self.routed_ttl_s:
            return shared.holders
        expired, oldest = 0, math.inf
        for slot in iter_slots(guesses):
            routed_at = shared.routed[slot]
            if now - routed_at >= self.routed_ttl_s:
                expired |= 1 << slot
            elif routed_at < oldest:
                oldest = routed_at
        shared.oldest = oldest
        holders = shared.holders
        if expired:
            self._release_shared(row, expired)
        return holders & ~expired

    def _held_live(self, row: int, state: WorkerBlocks, now: float) -> bool:
        columns = self._table.columns
        holder = int(columns["holder"][row])
        if holder == _SHARED:
            return bool(self._live_holders(row, now) >> state.slot & 1)
        if holder != state.slot:
            return False
        return (
            int(columns["flags"][row]) >> 1 != 0
            or not state.has_events
            or now - float(columns["routed_at"][row]) < self.routed_ttl_s
        )

    def _hold(
        self,
        state: WorkerBlocks,
        keys: np.ndarray,
        parents: np.ndarray,
        has_parent: np.ndarray,
        recency: np.ndarray,
        location_bits: np.ndarray | None,
    ) -> None:
        """``state`` holds the blocks ``keys`` (``parents[i]`` the block before ``keys[i]`` where
        ``has_parent[i]``): confirmed at the locations of ``location_bits``, or routed guesses when None.
        ``recency`` orders their use (larger: more recent)."""
        now = self._clock()
        rows = self._rows(keys)
        created = rows < 0
        new_rows = rows[:0]
        if created.any():
            new_keys, inverse = distinct(keys[created], keep_order=True)  # a hash given twice gets one row
            new_rows = self._table.add(new_keys)
            rows = rows.copy()  # the walk's, cached
            rows[created] = new_rows[inverse]
            self._version += 1
        columns = self._table.columns
        holder_column, flags_column = columns["holder"], columns["flags"]
        # Blocks learning their parent now (`has_parent` and no parent yet: a > on booleans and 0 / 1).
        gets_parent = (has_parent > (flags_column[rows] & _HAS_PARENT)).nonzero()[0]
        if len(gets_parent):
            parent_rows = rows[gets_parent]
            columns["parent"][parent_rows] = parents[gets_parent]
            flags_column[parent_rows] |= _HAS_PARENT
        holder_column[new_rows] = state.slot
        holders = holder_column[rows]
        own = holders == state.slot  # the new rows among them
        own_rows = rows[own]
        if location_bits is None:
            columns["routed_at"][own_rows] = now
        else:
            state.confirmed += len(distinct(own_rows[(flags_column[own_rows] >> 1) == 0])[0])
            np.bitwise_or.at(flags_column, own_rows, location_bits[own] << 1)
            # Unused for a confirmed block, but written now: a column's memory is committed as it is first
            # written (see block_table), and better here than in a routing decision's first guess there.
            columns["routed_at"][new_rows] = now
        state.blocks += len(new_rows)
        # Rows other workers hold too: a routed prompt's new tail has none (one check, not a few numpy passes).
        joined = [] if own.all() else self._hold_with_others(state, rows, holders, location_bits, now)
        columns["tick"][rows] = self._tick + recency
        self._tick += len(keys)
        state.members.extend(new_rows)
        if joined:
            state.members.extend(np.array(joined, np.int32))
        if state.blocks > self.max_blocks_per_worker:
            self._evict(state)
        elif state.members.size > 2 * state.blocks + 1024:
            self._valid_members(state)

    def _hold_with_others(
        self,
        state: WorkerBlocks,
        rows: np.ndarray,
        holders: np.ndarray,
        location_bits: np.ndarray | None,
        now: float,
    ) -> list[int]:
        """``_hold``'s part for the ``rows`` other workers hold (shared ones, and ones another worker held
        alone until now, which become shared): the rows ``state`` joins."""
        joined = []
        bit, shared_rows = 1 << state.slot, self._shared
        shared_positions = np.flatnonzero(holders == _SHARED)
        shared_list = rows[shared_positions].tolist()
        if location_bits is None:
            # A guess changes nothing where this worker is confirmed (the usual case: a shared system prompt).
            shared_list = [row for row in shared_list if not shared_rows[row].confirmed & bit]
        shared_bits = (
            [0] * len(shared_list) if location_bits is None else location_bits[shared_positions].tolist()
        )
        for row, location_bit in zip(shared_list, shared_bits, strict=True):
            shared = shared_rows.get(row)
            # The usual case, a shared system prompt this worker holds confirmed already: nothing to add.
            if (
                shared is not None
                and shared.confirmed & bit
                and (not location_bit or shared.locations[state.slot] & location_bit)
            ):
                continue
            if self._hold_shared(row, state, now, location_bit):
                joined.append(row)
        # Rows another worker held alone become shared.
        for position in np.flatnonzero((holders > 0) & (holders != state.slot)).tolist():
            location_bit = 0 if location_bits is None else int(location_bits[position])
            if self._hold_shared(int(rows[position]), state, now, location_bit):
                joined.append(int(rows[position]))
        return joined

    def _hold_shared(self, row: int, state: WorkerBlocks, now: float, location_bit: int) -> bool:
        """``state`` holds a row another worker holds too; True when it did not hold it before."""
        columns = self._table.columns
        holder = int(columns["holder"][row])
        if holder > 0:  # held by one other worker until now: the row becomes shared
            shared = SharedHolders()
            shared.holders = 1 << holder
            mask = int(columns["flags"][row]) >> 1
            if mask:
                shared.confirmed = 1 << holder
                shared.locations[holder] = mask
            else:
                shared.routed[holder] = float(columns["routed_at"][row])
                if self._has_events[holder]:
                    shared.oldest = shared.routed[holder]
            columns["holder"][row] = _SHARED
            columns["flags"][row] &= _HAS_PARENT
            self._shared[row] = shared
        else:
            shared = self._shared[row]
        slot, bit = state.slot, 1 << state.slot
        joined = not shared.holders & bit
        if joined:
            shared.holders |= bit
            state.blocks += 1
        if location_bit:
            if not shared.confirmed & bit:
                shared.confirmed |= bit
                state.confirmed += 1
                shared.routed.pop(slot, None)
            shared.locations[slot] = shared.locations.get(slot, 0) | location_bit
        elif not shared.confirmed & bit:
            shared.routed[slot] = now
            if state.has_events and now < shared.oldest:
                shared.oldest = now
        return joined

    def _drop_locations(self, state: WorkerBlocks, rows: np.ndarray, location_mask: int) -> None:
        """Take ``location_mask`` off the worker's copies of ``rows``; copies left with no location go."""
        if not len(rows):
            return
        columns = self._table.columns
        holders = columns["holder"][rows]
        single = rows[holders == state.slot]
        if len(single):
            flags = columns["flags"][single]
            left = (flags >> 1) & np.uint8(~location_mask & 0x7F)
            kept = left != 0
            columns["flags"][single[kept]] = (flags[kept] & _HAS_PARENT) | (left[kept] << 1)
            self._release(state, single[~kept])
        slot, bit = state.slot, 1 << state.slot
        for row in rows[holders == _SHARED].tolist():
            shared = self._shared.get(row)
            if shared is None or not shared.holders & bit:
                continue  # a row given twice, settled already
            left_mask = shared.locations.get(slot, 0) & ~location_mask
            if left_mask:
                shared.locations[slot] = left_mask
            else:
                self._release_shared(row, bit)

    def _release(self, state: WorkerBlocks, rows: np.ndarray) -> None:
        """The worker no longer holds ``rows`` (rows it does not hold are ignored)."""
        if not len(rows):
            return
        columns = self._table.columns
        holders = columns["holder"][rows]
        single = distinct(rows[holders == state.slot])[0]
        if len(single):
            state.confirmed -= int(np.count_nonzero(columns["flags"][single] >> 1))
            state.blocks -= len(single)
            self._table.delete(single)
            self._version += 1
        bit = 1 << state.slot
        for row in rows[holders == _SHARED].tolist():
            if row in self._shared:
                self._release_shared(row, bit)

    def _release_shared(self, row: int, slots: int) -> None:
        """The workers in bitset ``slots`` no longer hold the shared ``row``."""
        shared = self._shared[row]
        slots &= shared.holders
        for slot in iter_slots(slots):
            state = self._by_slot[slot]
            assert state is not None
            state.blocks -= 1
            if shared.confirmed >> slot & 1:
                state.confirmed -= 1
            shared.locations.pop(slot, None)
            shared.routed.pop(slot, None)
        shared.holders &= ~slots
        shared.confirmed &= ~slots
        if shared.holders & (shared.holders - 1):
            return  # still several holders
        del self._shared[row]
        columns = self._table.columns
        if not shared.holders:
            self._table.delete(np.array([row], np.int64))
            self._version += 1
            return
        # One holder is left: the row goes back to the single-holder columns.
        slot = shared.holders.bit_length() - 1
        columns["holder"][row] = slot
        columns["flags"][row] = (columns["flags"][row] & _HAS_PARENT) | np.uint8(
            shared.locations.get(slot, 0) << 1
        )
        columns["routed_at"][row] = shared.routed.get(slot, 0.0)

    def _valid_members(self, state: WorkerBlocks) -> np.ndarray:
        """The rows the worker holds, sorted; its list is compacted to them."""
        rows = state.members.view()
        if not len(rows):
            return rows.astype(np.int64)
        holders = self._table.columns["holder"][rows]
        held = holders == state.slot
        bit = 1 << state.slot
        for index in np.flatnonzero(holders == _SHARED).tolist():
            held[index] = bool(self._shared[int(rows[index])].holders & bit)
        valid = np.unique(rows[held]).astype(np.int64)
        state.members.replace(valid)
        return valid

    def _shared_members(self, state: WorkerBlocks) -> Iterator[int]:
        rows = state.members.view()
        bit = 1 << state.slot
        for row in rows[self._table.columns["holder"][rows] == _SHARED].tolist():
            if self._shared[row].holders & bit:
                yield row

    def _evict(self, state: WorkerBlocks) -> None:
        """Bring the worker under the cap: its least recently used blocks go, leaves before their parents."""
        rows = self._valid_members(state)
        count = min(len(rows), state.blocks - self.max_blocks_per_worker + self.max_blocks_per_worker // 16)
        if count <= 0:
            return
        recency = self._subtree_recency(rows)
        victims = rows if count >= len(rows) else rows[np.argpartition(recency, count - 1)[:count]]
        self._release(state, victims)
        state.evicted += count

    def _subtree_recency(self, rows: np.ndarray) -> np.ndarray:
        """For sorted distinct ``rows`` of one worker: the latest use in each one's subtree among them, plus
        its distance from that use, so that a block always counts as more recent than its children."""
        columns = self._table.columns
        recency = columns["tick"][rows].astype(np.int64)
        up = np.full(len(rows), -1, np.int64)  # the position in `rows` of each one's parent
        has_parent = np.flatnonzero(columns["flags"][rows] & _HAS_PARENT)
        if len(has_parent):
            parent_rows = self._table.lookup(columns["parent"][rows[has_parent]])
            positions = np.minimum(np.searchsorted(rows, parent_rows), len(rows) - 1)
            known = (parent_rows >= 0) & (rows[positions] == parent_rows)
            up[has_parent[known]] = positions[known]
        # Pointer doubling: in round k every block passes what it knows to its 2**k-th ancestor, so after
        # log2(depth) rounds each use has reached every ancestor (a cycle, from a confused peer, just stops).
        distance = 1
        for _ in range(len(rows).bit_length() + 1):
            going = np.flatnonzero(up >= 0)
            if not len(going):
                break
            np.maximum.at(recency, up[going], recency[going] + distance)
            up[going] = up[up[going]]
            distance *= 2
        return recency

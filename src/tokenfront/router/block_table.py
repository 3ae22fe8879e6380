"""Rows keyed by 64-bit block hashes, held in numpy arrays: the storage under the router's KV index.

A key maps to a dense row number (reused once its key is deleted); what a row holds lives in named columns,
numpy arrays the table keeps together (reserved up front, or grown by half when full). Keys are found by open
addressing with
linear probing over a power-of-two array of slots, each slot holding a row number, kept at most half full.
Every operation takes a whole array of keys and probes one slot per key per round, the keys still unresolved
going on to the next round, so the 2,048 block hashes of a 32k-token prompt cost a few dozen numpy calls
rather than 2,048 Python steps; the last few keys of a batch (the longest probe runs) are probed in Python.
New keys get rows in the order they come in, so a chain stored at once (a worker's "stored" event, a routed
prompt's new blocks) sits in consecutive rows, and a lookup first reads runs of keys off the rows after their
first key's: a probe and a sequential compare a run, where the slots cost a random memory access a key (the
slot array of a large fleet is far larger than the CPU's caches). Small batches (a prompt's new tail) are
placed and looked up in Python, one key after the other.
A key costs about 24 bytes (4 a slot at the table's load, its own 8, and 4 for the slot its row sits in) plus
its columns, where a Python dict entry with its int costs about 100. A deleted key leaves a marker probes
go past, cleared when the slot after it is empty, and left behind when the keys move to a larger array.

Home slots come from the key mixed with a random per-table seed, so keys chosen by a peer (a worker's event
stream is input) cannot be aimed at one run of slots.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import numpy as np

__all__ = ["MOVE_AT_ONCE", "MOVE_STEP", "BlockTable", "as_keys", "distinct"]

# A slot holds its row's number plus one; 0 and -1 are these (0, so that a new array is lazily zeroed memory):
_EMPTY = 0  # a slot never used in this array: a probe stops here
_DELETED = -1  # a slot whose key was deleted: a probe goes on past it, an insert may reuse it
_MAX_LOAD = 0.5  # used slots (live and deleted) over capacity before a rebuild
_SCALAR_TAIL = 16  # this few keys left, probing goes on in Python: cheaper than numpy calls on tiny arrays
_SCALAR_BATCH = 64  # this few keys are placed in Python, one after the other (a routed prompt's new blocks)
MOVE_STEP = 4096  # old slots moved into new ones per change while the table grows (a quarter per lookup)
MOVE_AT_ONCE = 1 << 18  # old slots this few are moved at once (a few milliseconds)
_MAX_SLOTS = 1 << 31  # slot and row numbers are int32
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_UINT64_MAX = (1 << 64) - 1
_MAX_RUNS = 8  # runs of keys in consecutive rows a lookup reads off before it probes the slots for the rest
_MIN_RUN = 16  # a run shorter than this: the keys are not a chain stored in order, the slots are cheaper


def as_keys(values: object) -> np.ndarray:
    """Block hashes as a uint64 array (no copy for a uint64 array or an ``array('Q')``); ``ValueError`` when
    a value is not an unsigned 64-bit integer."""
    if isinstance(values, np.ndarray) and values.dtype == np.uint64:
        return values
    try:
        if getattr(values, "typecode", None) in ("L", "Q") and getattr(values, "itemsize", 0) == 8:
            return np.frombuffer(values, dtype=np.uint64)  # type: ignore[call-overload]
        keys = np.array(values, dtype=np.uint64)
    except (OverflowError, TypeError, ValueError) as exc:
        raise ValueError(f"block hashes are unsigned 64-bit integers ({exc})") from exc
    if keys.ndim != 1:
        raise ValueError("block hashes are a flat list of unsigned 64-bit integers")
    return keys


def distinct(values: np.ndarray, *, keep_order: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(unique, inverse)`` as ``np.unique`` gives them, cheaper in the usual case of no repeats.

    With ``keep_order``, values without repeats come back as given (new rows are then handed out in a chain's
    order, so its rows sit together in every column and a walk reads them in sequence); a few are checked in
    a Python set, cheaper than a sort for a routed prompt's new blocks."""
    if len(values) < 2:
        return values, np.zeros(len(values), np.int64)
    if keep_order and len(values) <= _SCALAR_BATCH and len(set(values.tolist())) == len(values):
        return values, np.arange(len(values))
    order = np.argsort(values)
    in_order = values[order]
    if (in_order[1:] != in_order[:-1]).all():
        if keep_order:
            return values, np.arange(len(values))
        inverse = np.empty(len(values), np.int64)
        inverse[order] = np.arange(len(values))
        return in_order, inverse
    unique, inverse = np.unique(values, return_inverse=True)
    return unique, inverse.reshape(-1)


class _Slots:
    """One open-addressing array of slots: each holds a row number, ``_EMPTY`` or ``_DELETED``."""

    def __init__(self, capacity: int, seed: np.uint64) -> None:
        if capacity > _MAX_SLOTS:
            raise MemoryError("a block table holds at most about a billion keys")
        self.rows = np.zeros(capacity, np.int32)  # row + 1, or _EMPTY / _DELETED
        self.mask = capacity - 1
        self.used = 0  # slots not empty: live keys and deleted ones
        self._shift = np.uint64(64 - (capacity.bit_length() - 1))
        self._seed = seed
        self._home_ints = (int(seed), int(_GOLDEN), int(self._shift))  # `home` in Python ints, for `find_one`

    @property
    def capacity(self) -> int:
        return self.mask + 1

    def home(self, keys: np.ndarray) -> np.ndarray:
        return (((keys ^ self._seed) * _GOLDEN) >> self._shift).astype(np.int64)

    def find_one(self, key: int, row_keys: np.ndarray) -> int:
        """``find`` for one key, in Python (``home``'s arithmetic on an int: cheaper than numpy on one key)."""
        seed, golden, shift = self._home_ints
        slot = (((key ^ seed) * golden) & _UINT64_MAX) >> shift
        rows, mask = self.rows, self.mask
        while (value := rows.item(slot)) != _EMPTY:
            if value > 0 and row_keys.item(value - 1) == key:
                return int(value) - 1
            slot = (slot + 1) & mask
        return -1

    def find(self, keys: np.ndarray, row_keys: np.ndarray) -> np.ndarray:
        """The row of each key here (int64), -1 for a key not here."""
        slots = self.home(keys)
        # The first probe, for every key (most sit in their home slot), fills the answer in one pass.
        slot_rows = self.rows[slots] - 1
        # An empty or deleted slot (-1, -2) reads a row key from the end of the array: not a hit.
        hit = row_keys[slot_rows] == keys
        hit &= slot_rows >= 0
        rows = np.where(hit, slot_rows, np.int64(-1))
        # A key is never stored past an empty slot of its probe sequence: an empty slot ends its search
        # (`going on` is "not empty and not hit": a > on booleans).
        pending = np.flatnonzero((slot_rows != _EMPTY - 1) > hit)
        keys, slots = keys[pending], (slots[pending] + 1) & self.mask
        while len(pending) > _SCALAR_TAIL:
            slot_rows = self.rows[slots] - 1
            hit = row_keys[slot_rows] == keys
            hit &= slot_rows >= 0
            rows[pending[hit]] = slot_rows[hit]
            going_on = (slot_rows != _EMPTY - 1) > hit
            pending, keys, slots = pending[going_on], keys[going_on], (slots[going_on] + 1) & self.mask
        slot_rows, mask = self.rows, self.mask
        for position, key, slot in zip(pending.tolist(), keys.tolist(), slots.tolist(), strict=True):
            while (value := slot_rows.item(slot)) != _EMPTY:
                if value > 0 and row_keys.item(value - 1) == key:
                    rows[position] = value - 1
                    break
                slot = (slot + 1) & mask
        return rows

    def place(self, rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Put rows (keys not here yet) into the first free slot of each key's probe run: their slots."""
        slot_rows, mask = self.rows, self.mask
        targets = self.home(keys)
        if len(keys) <= _SCALAR_BATCH:  # a few keys: one after the other, each taking its first free slot
            placed, emptied = [], 0
            for slot, row in zip(targets.tolist(), rows.tolist(), strict=True):
                while (value := slot_rows.item(slot)) > 0:
                    slot = (slot + 1) & mask
                emptied += value == _EMPTY
                slot_rows[slot] = row + 1
                placed.append(slot)
            self.used += emptied
            return np.array(placed, np.int64)
        # Each key's first free slot as if it were alone...
        pending = np.arange(len(keys))
        while len(pending) > _SCALAR_TAIL:
            taken = slot_rows[targets[pending]] > 0
            pending = pending[taken]
            targets[pending] = (targets[pending] + 1) & mask
        for position in pending.tolist():
            slot = targets.item(position)
            while slot_rows.item(slot) > 0:
                slot = (slot + 1) & mask
            targets[position] = slot
        # ...then two keys that found the same one: one takes it, the others probe on from there.
        order = np.argsort(targets)  # which of two keys wins a slot does not matter
        repeated = np.zeros(len(keys), bool)
        repeated[order[1:]] = targets[order[1:]] == targets[order[:-1]]
        alone = ~repeated
        self.used += int(np.count_nonzero(slot_rows[targets[alone]] == _EMPTY))
        slot_rows[targets[alone]] = rows[alone] + 1
        for position in np.flatnonzero(repeated).tolist():
            slot = targets.item(position)
            while slot_rows.item(slot) > 0:
                slot = (slot + 1) & mask
            self.used += slot_rows.item(slot) == _EMPTY
            slot_rows[slot] = rows[position] + 1
            targets[position] = slot
        return targets

    def remove(self, slots: np.ndarray) -> None:
        """Mark slots deleted."""
        self.rows[slots] = _DELETED
        # A deleted slot just before an empty one is on no probe run that goes further: it can be empty
        # again, and so, in turn, can the deleted slots before it. Runs then do not fill up with deleted slots.
        ends = slots[self.rows[(slots + 1) & self.mask] == _EMPTY]
        while len(ends):
            self.rows[ends] = _EMPTY
            self.used -= len(ends)
            before = (ends - 1) & self.mask
            ends = before[self.rows[before] == _DELETED]


class BlockTable:
    """Rows keyed by uint64 keys, with numpy columns; vectorized lookup, insert and delete. Not thread-safe.

    ``columns`` names each column's dtype; a new (or deleted) row holds 0 in every column. The arrays in
    ``self.columns`` are replaced when the rows outgrow them: read them again after an ``insert``. ``reserve``
    rows are allocated up front as lazily committed zeroed memory, so a table that stays under it never
    copies its columns.

    Growing never stops the world: when the slots fill up, a larger array takes the new keys and every later
    change moves a few thousand old slots over, while lookups try the new array, then the old one. Past
    ``reserve`` the columns grow by copying (half again each time).
    """

    def __init__(
        self, columns: Mapping[str, type | np.dtype], *, capacity: int = 1024, reserve: int = 0
    ) -> None:
        self._dtypes = {name: np.dtype(dtype) for name, dtype in columns.items()}
        self._seed = np.uint64(secrets.randbits(64))
        self._slots = _Slots(1 << max(4, int(capacity / _MAX_LOAD)).bit_length(), self._seed)
        self._old: _Slots | None = None  # the slots being moved into self._slots, from self._moved on
        self._moved = 0
        self._row_capacity = 0
        self.columns: dict[str, np.ndarray] = {}
        self._row_keys = self._row_slot = np.zeros(0)
        self._grow_rows(max(16, capacity, reserve))
        self._free = np.zeros(16, np.int32)  # deleted rows, reused first
        self._n_free = 0
        self._next_row = 0  # rows below it were handed out at some point
        self._live = 0

    def __len__(self) -> int:
        return self._live

    @property
    def growing(self) -> bool:
        """Whether a growth is under way: old slots still being moved into the larger array."""
        return self._old is not None

    def nbytes(self) -> int:
        """The bytes the table's arrays use: its slots, and its columns up to the last row handed out (rows
        reserved beyond it are address space the system has not committed)."""
        slots = self._slots.rows.nbytes + (self._old.rows.nbytes if self._old is not None else 0)
        per_row = sum(array.itemsize for array in (self._row_keys, self._row_slot, *self.columns.values()))
        return slots + self._free.nbytes + per_row * self._next_row

    def keys_of(self, rows: np.ndarray) -> np.ndarray:
        """The key of each live row."""
        return self._row_keys[rows]

    def live_rows(self) -> np.ndarray:
        """Every live row (int64), in no particular order."""
        live = [self._slots.rows[self._slots.rows > 0]]
        if self._old is not None:
            live.append(self._old.rows[self._old.rows > 0])
        return np.concatenate(live).astype(np.int64) - 1

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The row of each key (int64), -1 for a key the table does not hold.

        New keys get rows in the order they come in (``add``), so a chain stored at once sits in consecutive
        rows: runs of keys are read off the rows after their first key's (one probe, then a sequential
        compare with the rows' keys), where probing the slots costs a random memory access a key. The keys
        after the runs are probed in the slots."""
        rows = np.full(len(keys), -1, np.int64)
        start = self._read_runs(keys, rows)
        rest = keys[start:]
        if len(rest) > _SCALAR_BATCH:
            found = self._slots.find(rest, self._row_keys)
            if self._old is not None:
                missing = np.flatnonzero(found < 0)
                if len(missing):
                    found[missing] = self._old.find(rest[missing], self._row_keys)
            rows[start:] = found
        else:  # a few left (a prompt's new blocks): one at a time, in Python
            for position, key in enumerate(rest.tolist(), start):
                rows[position] = self._find_one(key)
        if self._old is not None:
            self._move_some(0)  # lookups move old slots too, so a table that stops changing still finishes
        return rows

    def insert(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The row of each key, adding the keys not held yet: ``(rows, created)``, ``created[i]`` true when
        ``keys[i]`` got a new row in this call (every column of a new row holds 0)."""
        rows = self.lookup(keys)
        created = rows < 0
        if created.any():
            new_keys, inverse = distinct(keys[created], keep_order=True)  # a key may be given twice
            rows[created] = self.add(new_keys)[inverse]
        return rows, created

    def add(self, keys: np.ndarray) -> np.ndarray:
        """New rows for distinct keys the table does not hold (the caller looked them up): their row numbers."""
        self._reserve_slots(len(keys))
        rows = self._take_rows(len(keys))
        self._row_keys[rows] = keys
        self._row_slot[rows] = self._slots.place(rows, keys)
        self._live += len(keys)
        self._move_some(len(keys))
        return rows

    def delete(self, rows: np.ndarray) -> None:
        """Delete distinct live rows: their keys go, their column values are reset to 0."""
        if not len(rows):
            return
        slots = self._row_slot[rows].astype(np.int64)
        old = self._old
        if old is None:
            self._slots.remove(slots)
        else:  # a row still in the old slots is found there (a moved one left a deleted mark)
            in_old = (slots < old.capacity) & (old.rows[np.minimum(slots, old.mask)] == rows + 1)
            old.remove(slots[in_old])
            self._slots.remove(slots[~in_old])
        self._row_slot[rows] = -1  # a free row: its stale key is no match for `_read_runs`
        for column in self.columns.values():
            column[rows] = 0
        if self._n_free + len(rows) > len(self._free):
            self._free = _grown(self._free, 2 * (self._n_free + len(rows)))
        self._free[self._n_free : self._n_free + len(rows)] = rows
        self._n_free += len(rows)
        self._live -= len(rows)
        self._move_some(len(rows))

    # --- internals -----------------------------------------------------------------------------------------

    def _find_one(self, key: int) -> int:
        row = self._slots.find_one(key, self._row_keys)
        if row < 0 and self._old is not None:
            row = self._old.find_one(key, self._row_keys)
        return row

    def _read_runs(self, keys: np.ndarray, rows: np.ndarray) -> int:
        """Fill ``rows`` for the leading runs of ``keys`` held in consecutive rows; where the runs end (past
        the key that ended them when it is not held at all: a prompt's new block, probed once)."""
        start, row_keys, row_slot = 0, self._row_keys, self._row_slot
        for _ in range(_MAX_RUNS):
            if start == len(keys):
                break
            first = self._find_one(int(keys[start]))
            if first < 0:
                return start + 1  # that key is not held: its row stays -1
            end = first + min(len(keys) - start, self._next_row - first)
            # The rows after `first` holding the next keys, live (a free row's slot is -1): a run of the chain.
            same = row_keys[first:end] == keys[start : start + end - first]
            same &= row_slot[first:end] >= 0
            run = len(same) if same.all() else int(same.argmin())
            rows[start : start + run] = np.arange(first, first + run)
            start += run
            if run < _MIN_RUN:
                break
        return start

    def _reserve_slots(self, count: int) -> None:
        slots = self._slots
        if slots.used + count <= _MAX_LOAD * slots.capacity:
            return
        if self._old is not None:
            self._move_some(self._old.capacity)  # the move fell behind: finish it first
        # New slots without the deleted ones, twice as large when the live keys alone would fill half of them.
        capacity = slots.capacity
        while self._live + count > _MAX_LOAD * capacity / 2:
            capacity *= 2
        self._old, self._moved = slots, 0
        self._slots = _Slots(capacity, self._seed)
        if slots.capacity <= MOVE_AT_ONCE:
            self._move_some(slots.capacity)  # a small table moves at once: a short pause, no double lookups

    def _move_some(self, changed: int) -> None:
        """Move old slots into the new ones: enough for every change that the old are gone before the new fill."""
        old = self._old
        if old is None:
            return
        end = min(old.capacity, self._moved + (max(MOVE_STEP, 8 * changed) if changed else MOVE_STEP // 4))
        chunk = old.rows[self._moved : end]
        live = np.flatnonzero(chunk > 0)
        rows = chunk[live].astype(np.int64) - 1
        # Deleted (not emptied) in the old slots: the keys still there stay reachable past them.
        chunk[live] = _DELETED
        self._row_slot[rows] = self._slots.place(rows, self._row_keys[rows])
        self._moved = end
        if end == old.capacity:
            self._old = None

    def _take_rows(self, count: int) -> np.ndarray:
        reused = min(count, self._n_free)
        taken = self._free[self._n_free - reused : self._n_free].astype(np.int64)
        self._n_free -= reused
        fresh = count - reused
        if self._next_row + fresh > self._row_capacity:
            self._grow_rows(self._next_row + fresh)
        if fresh:
            rows = np.arange(self._next_row, self._next_row + fresh, dtype=np.int64)
            rows = np.concatenate([taken, rows]) if reused else rows
        else:
            rows = taken
        self._next_row += fresh
        return rows

    def _grow_rows(self, needed: int) -> None:
        capacity = max(needed, self._row_capacity + self._row_capacity // 2)
        for name, dtype in self._dtypes.items():
            self.columns[name] = _grown(self.columns.get(name, np.zeros(0, dtype)), capacity)
        self._row_keys = _grown(self._row_keys.astype(np.uint64), capacity)
        self._row_slot = _grown(self._row_slot.astype(np.int32), capacity)
        self._row_capacity = capacity


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    """``array`` with room for ``capacity`` items, the new ones 0: zeroed memory the system commits only as
    it is first written, so a large ``reserve`` costs address space, not memory."""
    grown = np.zeros(max(capacity, len(array)), array.dtype)
    grown[: len(array)] = array
    return grown

"""The KV cache event log: what the prefix cache stored and removed, in order, for routers to mirror.

Every change to the prefix cache appends one event with a sequence number (1, 2, 3, ...):

- ``{"seq", "type": "stored", "block_hashes": [...], "parent_block_hash": int | None,
  "token_ids": [[...], ...], "tokens_per_block"}`` — consecutive blocks of one chain, first block first;
  ``parent_block_hash`` is the block before the first one (None: the first block starts the prompt).
  ``token_ids[i]`` are the ids of ``block_hashes[i]``. Hashes are ``core.kv_blocks`` hashes, so a router
  that hashes a prompt the same way (``kv_cache_hash`` on /server_info) finds them.
- ``{"seq", "type": "removed", "block_hashes": [...]}`` — evicted blocks (always leaves first, so a chain
  never loses a middle block).
- ``{"seq", "type": "cleared"}`` — the whole cache was dropped.

Several routers read the same log independently, each from its own cursor: reading never consumes. The log
keeps a bounded history; a reader whose cursor fell behind it (or comes from another life of the worker: see
``log_id``) is told ``truncated`` and should forget what it knew of this worker and continue from
``last_seq``. When the log is read with its cache's ``snapshot`` (the worker's ``GET /kv_cache_events`` always
is), such a reader also gets the cache as it is at ``last_seq`` (``worker/kv_snapshot.py``), so it knows
every block the worker holds without the events it missed.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from tokenfront.worker.kv_snapshot import KvSnapshot

DEFAULT_MAX_EVENTS = 10_000


class KvEventLog:
    """A bounded, thread-safe, sequence-numbered log of prefix cache events."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self._events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._last_seq = 0
        self._lock = threading.Lock()
        # Names this log's life: a reader that sees another log_id knows the worker restarted and its
        # sequence numbers started over.
        self.log_id = uuid.uuid4().hex
        self._taps: list[Callable[[dict[str, Any]], object]] = []

    def tap(self, receive: Callable[[dict[str, Any]], object]) -> None:
        """Hand every event written from now on to `receive` as well, in order (`worker.zmq_events`): called
        under the log's lock, so it must only hand the event on (a queue's put)."""
        with self._lock:
            self._taps.append(receive)

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest event (0 before the first)."""
        with self._lock:
            return self._last_seq

    def stored(
        self,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[Sequence[int]],
        tokens_per_block: int,
    ) -> int:
        """Record consecutive blocks of one chain as stored; return the event's sequence number."""
        return self._append(
            {
                "type": "stored",
                "block_hashes": tuple(block_hashes),
                "parent_block_hash": parent_block_hash,
                "token_ids": tuple(map(tuple, token_ids)),  # tuples given are kept, not copied (`_answered`)
                "tokens_per_block": tokens_per_block,
            }
        )

    def removed(self, block_hashes: Sequence[int]) -> int:
        """Record blocks as removed (evicted); return the event's sequence number."""
        return self._append({"type": "removed", "block_hashes": tuple(block_hashes)})

    def cleared(self) -> int:
        """Record that every block was dropped; return the event's sequence number."""
        return self._append({"type": "cleared"})

    def read(
        self,
        after: int = 0,
        limit: int = 1000,
        *,
        log_id: str | None = None,
        snapshot: Callable[[], KvSnapshot] | None = None,
    ) -> dict[str, Any]:
        """The events with ``seq > after``, oldest first, at most ``limit`` of them.

        Returns ``{"events", "last_seq", "oldest_seq", "truncated", "log_id"}``. ``oldest_seq`` is the oldest
        event still held (``last_seq + 1`` when none is). ``truncated`` is true when the reader missed events
        — its cursor is older than the history (``after < oldest_seq - 1``) or newer than anything this log
        wrote (``after > last_seq``: it read a previous life of the worker), or it names another ``log_id``
        than this log's (a reader that read another life of the worker). A truncated reader should drop its
        view of this worker's cache and carry on from the events returned.

        ``snapshot`` (the cache's ``snapshot``: its blocks and the last sequence number they include, taken
        consistently) is asked only for a truncated reader: the answer then carries ``"snapshot"`` (chains,
        ``worker/kv_snapshot.py``) and ``"snapshot_blocks"``, no events, and ``last_seq`` is the snapshot's,
        the reader's next ``after``.
        """
        if after < 0 or limit < 0:
            raise ValueError("after and limit must not be negative")
        with self._lock:
            last_seq = self._last_seq
            oldest_seq = self._events[0]["seq"] if self._events else last_seq + 1
            truncated = (
                after < oldest_seq - 1 or after > last_seq or (log_id is not None and log_id != self.log_id)
            )
            events: list[dict[str, Any]] = []
            if not (truncated and snapshot is not None):
                start = oldest_seq - 1 if truncated else after
                # Sequence numbers are contiguous in the deque, so the first wanted event is at a known index.
                first = start - (oldest_seq - 1)
                events = [_answered(event) for event in itertools.islice(self._events, first, first + limit)]
        answer: dict[str, Any] = {
            "events": events,
            "last_seq": last_seq,
            "oldest_seq": oldest_seq,
            "truncated": truncated,
            "log_id": self.log_id,
        }
        if truncated and snapshot is not None:
            # Taken outside the log's lock: a cache writes its events while holding its own lock, so taking
            # that one under this one could deadlock. The snapshot's own seq says where it stands.
            taken = snapshot()
            answer.update(last_seq=taken.seq, snapshot=taken.chains, snapshot_blocks=taken.blocks)
        return answer

    def _append(self, event: dict[str, Any]) -> int:
        with self._lock:
            self._last_seq += 1
            entry = {"seq": self._last_seq, **event}
            self._events.append(entry)
            for receive in self._taps:
                receive(entry)
            return self._last_seq


def _answered(event: dict[str, Any]) -> dict[str, Any]:
    """A held event as `read` hands it out: a copy in the shape the module docstring gives (lists, as a reader
    of the JSON gets them). The log holds tuples, which the garbage collector stops scanning once they survive
    a collection: a fleet of simulated workers holds millions of blocks' ids in its logs."""
    answer = dict(event)
    if "block_hashes" in answer:
        answer["block_hashes"] = list(answer["block_hashes"])
    if "token_ids" in answer:
        answer["token_ids"] = [list(ids) for ids in answer["token_ids"]]
    return answer

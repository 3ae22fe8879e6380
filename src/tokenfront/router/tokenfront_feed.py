"""Tokenfront workers' KV events (``GET /kv_cache_events``, ``worker/kv_events.py``) applied to the fleet's
blocks.

A tokenfront worker names blocks with the very hashes the router computes (the same ``kv_cache_hash`` on
/server_info), so its "stored", "removed" and "cleared" events apply as they are. What this feed adds is the
reading position: per worker, the last sequence number applied (``cursor``: the ``after`` of the next read)
and which life of the worker's log it reads (``log_id``). A new ``log_id`` (the worker restarted) or
``truncated`` (the router missed events) drops everything known of the worker before the returned events are
applied; events at or below the cursor (a repeated read) are skipped; a gap in sequence numbers is treated like
``truncated``.

A truncated answer from a worker that sends its cache's ``snapshot`` (``worker/kv_snapshot.py``: chains of
block hashes, parents first, as of ``last_seq``) replaces what was known of the worker with those blocks,
confirmed as "stored" events would, and the cursor moves to ``last_seq``: a router that starts after the
worker's history was cut knows its cache at once. The reads send the ``log_id`` they follow, so a worker that
restarted answers with a snapshot too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenfront.router.block_changes import Removed, Stored
from tokenfront.router.fleet_blocks import FleetBlocks

__all__ = ["TokenfrontFeed"]

logger = logging.getLogger(__name__)


@dataclass
class _LogPosition:
    log_id: str | None = None  # the worker's event log's life
    cursor: int = 0  # the last event applied


class TokenfrontFeed:
    """Applies ``GET /kv_cache_events`` answers to a ``FleetBlocks``, keeping each worker's read position."""

    def __init__(self, blocks: FleetBlocks) -> None:
        self._blocks = blocks
        self._positions: dict[str, _LogPosition] = {}

    def cursor(self, worker: str) -> int:
        """The ``after`` for the next ``GET /kv_cache_events`` read of this worker (0 to start)."""
        with self._blocks.lock:
            position = self._positions.get(worker)
            return position.cursor if position is not None else 0

    def log_id(self, worker: str) -> str | None:
        """The ``log_id`` of the worker's log as last read (None before the first read)."""
        with self._blocks.lock:
            position = self._positions.get(worker)
            return position.log_id if position is not None else None

    def forget(self, worker: str) -> None:
        """The worker left: read its log from the start if it comes back."""
        with self._blocks.lock:
            self._positions.pop(worker, None)

    def apply(self, worker: str, payload: Mapping[str, Any]) -> None:
        """Apply one answer (``{events, last_seq, oldest_seq, truncated, log_id}``, and ``snapshot`` when
        truncated); ``ValueError`` for a malformed one (the events before the bad one stay applied, and the
        cursor says so; a malformed snapshot leaves the worker's blocks forgotten and the cursor where it was).

        The answer's events are applied as one change (``FleetBlocks.apply``), split only where the worker's
        blocks are forgotten (a gap, a "cleared" event)."""
        events = payload.get("events")
        if not isinstance(events, list):
            raise ValueError("a /kv_cache_events answer has an `events` list")
        log_id = payload.get("log_id")
        blocks = self._blocks
        with blocks.lock:
            blocks.mark_has_events(worker)
            position = self._positions.setdefault(worker, _LogPosition())
            restarted = position.log_id is not None and log_id != position.log_id
            fresh = restarted or bool(payload.get("truncated"))
            if fresh:
                blocks.reset(worker)
            if isinstance(log_id, str):
                position.log_id = log_id
            # After a restart the old cursor counts another life's events: take the new log from its start.
            cursor = 0 if restarted else position.cursor
            changes: list[Stored | Removed] = []
            applied = 0
            snapshot = payload.get("snapshot")
            if snapshot is not None and fresh:
                try:
                    changes = _snapshot_changes(snapshot, payload.get("last_seq"))
                except ValueError:
                    position.log_id, position.cursor = None, 0  # nothing known: the next read starts afresh
                    raise
                cursor, fresh = payload["last_seq"], False
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
                        changes.clear()  # what came before is forgotten with the rest
                        blocks.reset(worker)
                    fresh = False
                    if self._read_event(worker, event, changes):  # "cleared": what came before goes too
                        changes.clear()
                        blocks.reset(worker)
                    applied += 1
                    cursor = seq
                if not events and fresh:
                    last_seq = payload.get("last_seq")
                    cursor = last_seq if isinstance(last_seq, int) else cursor
            finally:
                blocks.apply(worker, changes)
                blocks.count_events(worker, applied)
                position.cursor = cursor

    def _read_event(self, worker: str, event: Mapping[str, Any], changes: list[Stored | Removed]) -> bool:
        """Add one event's change to ``changes``; True for a "cleared" event."""
        kind = event.get("type")
        if kind == "stored":
            hashes = _hash_list(event.get("block_hashes"), "block_hashes")
            parent = event.get("parent_block_hash")
            if parent is not None and (type(parent) is not int or not 0 <= parent < 1 << 64):
                raise ValueError(
                    f"parent_block_hash is an unsigned 64-bit integer or null, got {parent!r:.80}"
                )
            tokens_per_block = event.get("tokens_per_block")
            if type(tokens_per_block) is int and tokens_per_block > 0:
                self._blocks.set_tokens_per_block(worker, tokens_per_block)
            changes.append(Stored(hashes, parent))
        elif kind == "removed":
            changes.append(Removed(_hash_list(event.get("block_hashes"), "block_hashes")))
        # Unknown kinds come from a newer worker: skipping them only loses knowledge, never invents it.
        return kind == "cleared"


def _snapshot_changes(snapshot: object, last_seq: object) -> list[Stored | Removed]:
    """A snapshot's chains (``[[parent or null, [hash, ...]], ...]``) as "stored" changes, or ``ValueError``
    (also when the answer's ``last_seq``, the snapshot's place in the log, is not a sequence number)."""
    if type(last_seq) is not int or last_seq < 0:
        raise ValueError(f"a snapshot comes with its `last_seq`, got {last_seq!r:.80}")
    if not isinstance(snapshot, list):
        raise ValueError(f"a snapshot is a list of [parent, [block hashes]] chains, got {snapshot!r:.80}")
    changes: list[Stored | Removed] = []
    for chain in snapshot:
        if not (isinstance(chain, list) and len(chain) == 2):
            raise ValueError(f"a snapshot chain is [parent, [block hashes]], got {chain!r:.80}")
        parent, hashes = chain
        if parent is not None and (type(parent) is not int or not 0 <= parent < 1 << 64):
            raise ValueError(f"a chain's parent is an unsigned 64-bit integer or null, got {parent!r:.80}")
        changes.append(Stored(_hash_list(hashes, "snapshot"), parent))
    return changes


def _hash_list(value: object, name: str) -> list[int]:
    """A list of block hashes (unsigned 64-bit integers), or ``ValueError``."""
    if (
        isinstance(value, list)
        and set(map(type, value)) <= {int}
        and (not value or 0 <= min(value) <= max(value) < 1 << 64)
    ):
        return value
    raise ValueError(f"`{name}` is a list of unsigned 64-bit integers, got {value!r:.80}")

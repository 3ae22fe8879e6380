"""Tokenfront workers' KV events (``GET /kv_cache_events``, ``worker/kv_events.py``) applied to the fleet's
blocks.

A tokenfront worker names blocks with the very hashes the router computes (the same ``kv_cache_hash`` on
/server_info), so its "stored", "removed" and "cleared" events apply as they are. What this feed adds is the
reading position: per worker, the last sequence number applied (``cursor``: the ``after`` of the next read)
and which life of the worker's log it reads (``log_id``). A new ``log_id`` (the worker restarted) or
``truncated`` (the router missed events) drops everything known of the worker before the returned events are
applied; events at or below the cursor (a repeated read) are skipped; a gap in sequence numbers is treated like
``truncated``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenfront.router.fleet_blocks import FleetBlocks, Removed, Stored

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
        """Apply one answer (``{events, last_seq, oldest_seq, truncated, log_id}``); ``ValueError`` for a
        malformed one (the events before the bad one stay applied, and the cursor says so).

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


def _hash_list(value: object, name: str) -> list[int]:
    """A list of block hashes (unsigned 64-bit integers), or ``ValueError``."""
    if (
        isinstance(value, list)
        and set(map(type, value)) <= {int}
        and (not value or 0 <= min(value) <= max(value) < 1 << 64)
    ):
        return value
    raise ValueError(f"`{name}` is a list of unsigned 64-bit integers, got {value!r:.80}")

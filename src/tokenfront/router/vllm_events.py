"""vLLM's KV cache events: decoding its msgpack batches and subscribing to its ZMQ publisher.

A vLLM worker started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`` publishes what its prefix cache stores and
evicts. On the wire (``vllm/distributed/kv_events.py``, msgspec):

- every message is a ZMQ multipart ``[topic, seq, payload]``: ``seq`` an 8-byte big-endian counter that
  starts at 0 with the publisher, ``payload`` one msgpack ``KVEventBatch``;
- a batch is ``[ts, [event, ...], data_parallel_rank]`` (``array_like``; the rank may be missing), or the same
  fields as a map in builds that encode it as one;
- an event is a tagged struct, either a tagged array (``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...]``) or, in newer vLLM, a
  tagged map (``{"type": "BlockStored", "block_hashes": ..., ...}``). ``BlockRemoved`` carries
  ``block_hashes, medium, group_idx``; ``AllBlocksCleared`` nothing. Block hashes are vLLM's own (``int`` or
  ``bytes``), ``token_ids`` is flat (``len(block_hashes) * block_size`` ids), fields with default values may
  be omitted at the end and newer fields may follow: both are tolerated;
- the optional replay endpoint (a ROUTER socket) answers ``[b"", start_seq]`` with ``[b"", seq, payload]``
  for every buffered batch from ``start_seq`` on, then ``[b"", -1, b""]``.

``decode_vllm_batch`` turns a payload into plain frozen dataclasses; ``VllmEventSubscriber`` runs the SUB
socket on a background thread and hands each batch to a ``VllmEventSink`` (the router's ``KvIndex``, whose
``router/vllm_feed.py`` maps vLLM's hashes onto tokenfront's own block names). This module knows the wire, not
what is done with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
import zmq

__all__ = [
    "ForeignHash",
    "VllmAllBlocksCleared",
    "VllmBlockRemoved",
    "VllmBlockStored",
    "VllmEvent",
    "VllmEventBatch",
    "VllmEventSink",
    "VllmEventSubscriber",
    "decode_vllm_batch",
    "parse_vllm_batch",
]

logger = logging.getLogger(__name__)

# vLLM's ExternalBlockHash: a 64-bit int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) or the raw hash bytes.
ForeignHash = int | bytes

# Field order of the tagged-array encodings (msgspec array_like: declaration order, tag first). Only the
# fields the router uses are named; later fields are ignored.
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")

# The replay endpoint ends its answer with this sequence number (-1 as a signed 8-byte integer).
_END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class VllmBlockStored:
    """Consecutive blocks of one chain entered vLLM's prefix cache, first block first."""

    block_hashes: tuple[ForeignHash, ...]
    parent_block_hash: ForeignHash | None
    token_ids: tuple[int, ...]  # flat: block i holds token_ids[i * block_size : (i + 1) * block_size]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    # One entry per block (None: plain tokens), else what else vLLM hashed: multimodal inputs, cache_salt, ...
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class VllmBlockRemoved:
    """Blocks left vLLM's prefix cache (of ``medium`` / KV cache group ``group_idx`` when given)."""

    block_hashes: tuple[ForeignHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class VllmAllBlocksCleared:
    """vLLM dropped its whole prefix cache (e.g. ``/reset_prefix_cache``)."""


VllmEvent = VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared


@dataclass(frozen=True)
class VllmEventBatch:
    """One published ``KVEventBatch``: events in the order they happened, from one data-parallel rank."""

    ts: float
    events: tuple[VllmEvent, ...]
    data_parallel_rank: int | None = None
    # Events of a kind this decoder does not know (a newer vLLM): skipped, counted for the logs.
    unknown_events: int = 0


class VllmEventSink(Protocol):
    """Where a subscriber puts what it reads: each batch, and "forget this worker" when it lost track."""

    def apply_vllm_batch(self, worker: str, batch: VllmEventBatch) -> None:
        """Apply one decoded batch of the worker's events."""

    def reset(self, worker: str) -> None:
        """Drop everything known of the worker's cache (events were missed, or it restarted)."""


def decode_vllm_batch(payload: bytes) -> VllmEventBatch:
    """Decode one msgpack ``KVEventBatch`` payload; ``ValueError`` when it is not one."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"not a msgpack vLLM KV event batch: {exc}") from exc
    return parse_vllm_batch(raw)


def parse_vllm_batch(raw: object) -> VllmEventBatch:
    """Build a batch from its decoded msgpack form (array or map); ``ValueError`` when it is not one."""
    if isinstance(raw, VllmEventBatch):
        return raw
    if isinstance(raw, bytes | bytearray):
        return decode_vllm_batch(bytes(raw))
    if isinstance(raw, Mapping):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise ValueError(f"a vLLM KV event batch is [ts, events, dp_rank?], got {_preview(raw)}")
    if not isinstance(ts, int | float) or not isinstance(events, list | tuple):
        raise ValueError(f"a vLLM KV event batch is [ts, events, dp_rank?], got {_preview(raw)}")
    if rank is not None and not isinstance(rank, int):
        raise ValueError(f"data_parallel_rank must be an integer, got {rank!r}")
    decoded: list[VllmEvent] = []
    unknown = 0
    for raw_event in events:
        event = _parse_event(raw_event)
        if event is None:
            unknown += 1
        else:
            decoded.append(event)
    return VllmEventBatch(float(ts), tuple(decoded), rank, unknown)


def _parse_event(raw: object) -> VllmEvent | None:
    """One tagged event (array or map); None for a tag this decoder does not know."""
    if isinstance(raw, Mapping):
        tag = raw.get("type")
        fields: Mapping[str, Any] = raw
    elif isinstance(raw, list | tuple) and raw:
        tag = raw[0]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS
        # Shorter (omitted trailing defaults) or longer (newer fields) than the names: both fine.
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise ValueError(f"a vLLM KV event is a tagged array or map, got {_preview(raw)}")
    if tag == "BlockStored":
        block_size = fields.get("block_size")
        if not isinstance(block_size, int) or isinstance(block_size, bool):
            raise ValueError(f"BlockStored needs an integer block_size, got {block_size!r}")
        extra_keys = fields.get("extra_keys")
        return VllmBlockStored(
            block_hashes=_hashes(fields.get("block_hashes")),
            parent_block_hash=_optional_hash(fields.get("parent_block_hash")),
            token_ids=_token_ids(fields.get("token_ids")),
            block_size=block_size,
            lora_id=fields.get("lora_id"),
            medium=fields.get("medium"),
            lora_name=fields.get("lora_name"),
            extra_keys=tuple(extra_keys) if isinstance(extra_keys, list | tuple) else None,
            group_idx=fields.get("group_idx"),
        )
    if tag == "BlockRemoved":
        return VllmBlockRemoved(
            block_hashes=_hashes(fields.get("block_hashes")),
            medium=fields.get("medium"),
            group_idx=fields.get("group_idx"),
        )
    if tag == "AllBlocksCleared":
        return VllmAllBlocksCleared()
    return None


def _hashes(value: object) -> tuple[ForeignHash, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"block_hashes must be a list, got {_preview(value)}")
    return tuple(_hash(item) for item in value)


def _optional_hash(value: object) -> ForeignHash | None:
    return None if value is None else _hash(value)


def _hash(value: object) -> ForeignHash:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"a vLLM block hash is an integer or bytes, got {_preview(value)}")


def _token_ids(value: object) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"token_ids must be a list, got {_preview(value)}")
    # Tolerate a per-block nesting ([[...], [...]]) as well as vLLM's flat list.
    flat = [tid for ids in value for tid in ids] if value and isinstance(value[0], list | tuple) else value
    if not all(isinstance(tid, int) and not isinstance(tid, bool) for tid in flat):
        raise ValueError("token_ids must be integers")
    return tuple(flat)


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class VllmEventSubscriber:
    """Mirror one vLLM worker's KV events into a sink (a ``KvIndex``): a ZMQ SUB socket read by a background
    thread.

    ``endpoint`` is where the worker's publisher listens (``tcp://host:5557``; with data parallelism each rank
    publishes on its own port: run one subscriber per rank, all naming the same ``worker``). Sequence numbers
    are checked: a gap is filled from ``replay_endpoint`` when one is given; a gap that cannot be filled, a
    batch that cannot be decoded, or a counter that went backwards (the worker restarted) resets what the index
    knows of the worker, because the router may have missed removals and must not trust stale blocks.
    """

    def __init__(
        self,
        endpoint: str,
        worker: str,
        kv_index: VllmEventSink,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_s: float = 1.0,
        context: zmq.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.worker = worker
        self.replay_endpoint = replay_endpoint
        self._kv_index = kv_index
        self._topic = topic.encode("utf-8")
        self._replay_timeout_ms = max(1, int(replay_timeout_s * 1000))
        self._context = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_seq: int | None = None
        self._counts = {"batches": 0, "gaps": 0, "replayed": 0, "restarts": 0, "decode_errors": 0}

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Connect and start reading on a daemon thread (idempotent)."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"vllm-kv-events {self.endpoint}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop reading and close the sockets; waits up to ``timeout`` seconds for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def stats(self) -> dict[str, Any]:
        """Counters for logs and /metrics: batches applied, gaps, replayed batches, restarts, decode errors."""
        return {
            "endpoint": self.endpoint,
            "worker": self.worker,
            "running": self.running,
            "last_seq": self._last_seq,
            **self._counts,
        }

    def _run(self) -> None:
        # ZMQ sockets are not thread-safe: this thread creates, uses and closes its own.
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        try:
            sub.connect(self.endpoint)
            while not self._stop.is_set():
                # A short poll keeps stop() responsive without a busy loop.
                if sub.poll(100):
                    self._on_message(sub.recv_multipart())
        except Exception:
            logger.exception("vLLM KV event subscriber for %s (%s) stopped", self.worker, self.endpoint)
        finally:
            sub.close(linger=0)

    def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) == 3:
            _topic, seq_bytes, payload = frames
        elif len(frames) == 2:  # a publisher without a topic frame
            seq_bytes, payload = frames
        else:
            logger.warning("ignoring a %d-frame message from %s", len(frames), self.endpoint)
            return
        seq = int.from_bytes(seq_bytes, "big")
        last = self._last_seq
        if last is not None and seq <= last:
            # The publisher's counter starts at 0 with the process: the worker restarted, its cache is new.
            logger.info(
                "vLLM worker %s restarted (seq %d after %d): forgetting its blocks", self.worker, seq, last
            )
            self._counts["restarts"] += 1
            self._kv_index.reset(self.worker)
        elif last is not None and seq > last + 1:
            self._counts["gaps"] += 1
            if not self._replay(last + 1, seq):
                logger.warning(
                    "missed KV event batches %d..%d from %s: forgetting its blocks",
                    last + 1,
                    seq - 1,
                    self.worker,
                )
                self._kv_index.reset(self.worker)
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> bool:
        self._last_seq = seq
        try:
            batch = decode_vllm_batch(payload)
        except ValueError as exc:
            # Forget first, count after: a reader of stats() that sees the error sees the reset too.
            self._kv_index.reset(self.worker)
            self._counts["decode_errors"] += 1
            # Warn once; after that the counter in stats() tells the story without flooding the log.
            log = logger.warning if self._counts["decode_errors"] == 1 else logger.debug
            log("undecodable KV event batch %d from %s (%s): forgetting its blocks", seq, self.worker, exc)
            return False
        self._kv_index.apply_vllm_batch(self.worker, batch)
        self._counts["batches"] += 1
        return True

    def _replay(self, start: int, until: int) -> bool:
        """Fetch and apply batches ``start .. until - 1`` from the replay endpoint; True when all arrived."""
        if self.replay_endpoint is None:
            return False
        # DEALER rather than REQ: one request gets many replies, which a REQ socket refuses to read.
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        expected = start
        try:
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while expected < until and dealer.poll(self._replay_timeout_ms):
                frames = dealer.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]  # the REQ-style empty delimiter
                if len(frames) != 2 or frames[0] == _END_SEQ or not frames[1]:
                    break
                seq = int.from_bytes(frames[0], "big")
                if seq < expected:
                    continue
                if seq > expected:
                    break  # the replay buffer no longer holds what we missed
                self._apply(seq, frames[1])
                self._counts["replayed"] += 1
                expected = seq + 1
        except zmq.ZMQError as exc:
            logger.warning("KV event replay from %s failed: %s", self.replay_endpoint, exc)
        finally:
            dealer.close(linger=0)
        return expected >= until

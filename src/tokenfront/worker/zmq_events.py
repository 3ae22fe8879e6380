"""The worker's KV cache events on ZMQ, in vLLM's own wire format, for any consumer that reads vLLM's.

`tokenfront serve --kv-events-endpoint tcp://*:5557 [--kv-events-replay-endpoint tcp://*:5558]` publishes what
the prefix cache stores and evicts exactly as a vLLM worker started with `--kv-events-config '{"publisher":
"zmq", ...}'` does (`vllm/distributed/kv_events.py`), so the router reads a tokenfront worker and a vLLM one with
one reader (`router.vllm_events`, a worker given as `URL,kv-events=tcp://HOST:5557,kv-replay=tcp://HOST:5558`),
and so do llm-d's and Dynamo's indexers:

- a PUB socket sends every batch as the multipart `[topic, seq, payload]`: `seq` an 8-byte big-endian counter
  from 0, `payload` one msgpack `KVEventBatch` `[ts, [event, ...]]` (msgspec's `array_like` batch, its
  default `data_parallel_rank` left out);
- an event is msgspec's tagged map: `{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids"
  (flat: block after block), "block_size", "lora_id": None, "medium": "GPU", "lora_name": None}`,
  `{"type": "BlockRemoved", "block_hashes", "medium": "GPU"}`, `{"type": "AllBlocksCleared"}`. Block hashes
  are tokenfront's own (`core.kv_blocks`, 64-bit ints, which vLLM's `ExternalBlockHash` admits);
- the optional ROUTER socket answers a request `[b"", start_seq]` with `[b"", topic, seq, payload]` for every
  buffered batch from `start_seq` on, then the end marker `[b"", b"", -1, b""]`.

The event log (`worker.kv_events`) hands each event to a queue as it is written; one thread owns both sockets
(ZMQ sockets are not thread-safe), drains the queue into a batch at a time, publishes it, keeps the last
`buffer_steps` batches for replay, and serves replay requests between batches. The HTTP event log is kept
beside it: the same events, read by cursor.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from typing import Any

import msgpack
import zmq

from tokenfront.core.errors import TokenfrontError
from tokenfront.worker.kv_events import KvEventLog

__all__ = ["END_SEQ", "ZmqEventPublisher", "encode_batch"]

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM = "GPU"  # vLLM's MEDIUM_GPU: the engine's own cache
# Events put in one batch at most; more wait for the next (vLLM sends each engine step's events as one batch).
_MAX_BATCH_EVENTS = 1024
_POLL_SECONDS = 0.05


def _event(entry: dict[str, Any]) -> dict[str, Any]:
    """One event log entry as vLLM's tagged event map (fields in vLLM's declaration order)."""
    kind = entry["type"]
    if kind == "stored":
        return {
            "type": "BlockStored",
            "block_hashes": entry["block_hashes"],
            "parent_block_hash": entry["parent_block_hash"],
            "token_ids": [token for ids in entry["token_ids"] for token in ids],
            "block_size": entry["tokens_per_block"],
            "lora_id": None,
            "medium": MEDIUM,
            "lora_name": None,
        }
    if kind == "removed":
        return {"type": "BlockRemoved", "block_hashes": entry["block_hashes"], "medium": MEDIUM}
    return {"type": "AllBlocksCleared"}


def encode_batch(entries: list[dict[str, Any]], ts: float) -> bytes:
    """Event log entries as one msgpack `KVEventBatch` payload."""
    return bytes(msgpack.packb([ts, [_event(entry) for entry in entries]]))


class ZmqEventPublisher:
    """Publishes an event log's events on a PUB socket, with an optional replay ROUTER socket: both bound when
    made (a start-up step: an address taken is a TokenfrontError), the log attached with `publish_from`."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        topic: str = "",
    ) -> None:
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._topic = topic.encode("utf-8")
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub = self._context.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        self._pub.setsockopt(zmq.LINGER, 0)
        try:
            self._bind(self._pub, endpoint, "--kv-events-endpoint")
            if replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._bind(self._replay, replay_endpoint, "--kv-events-replay-endpoint")
        except TokenfrontError:
            self._close_sockets()
            raise
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.published = 0  # batches sent
        self.published_events = 0
        self._running = True  # False once the thread ended: the log's events are no longer queued
        self._thread = threading.Thread(target=self._run, name="tokenfront-kv-events", daemon=True)
        self._thread.start()

    def publish_from(self, events: KvEventLog) -> None:
        """Publish every event `events` writes from now on."""
        events.tap(self._receive)

    def _receive(self, entry: dict[str, Any]) -> None:
        if self._running:  # a stopped publisher must not queue the log's events for ever
            self._queue.put(entry)

    @staticmethod
    def _bind(sock: zmq.Socket[bytes], endpoint: str, flag: str) -> None:
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise TokenfrontError(f"{flag} {endpoint}: cannot bind ({exc})") from exc

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is queued, then stop the thread and close the sockets."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except Exception:  # never silently: a publisher that died would leave routers with a stale view
            log.exception("the KV event publisher stopped")
        finally:
            self._running = False
            self._close_sockets()

    def _step(self) -> bool:
        """Serve waiting replay requests, then publish one batch of what is queued; False once told to stop."""
        while self._replay is not None and self._replay.poll(0):
            self._serve_replay()
        try:
            item = self._queue.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            return True
        entries: list[dict[str, Any]] = []
        while item is not None:
            entries.append(item)
            if len(entries) >= _MAX_BATCH_EVENTS:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        if entries:
            self._publish(entries)
        return item is not None  # None: the stop sentinel, after everything queued before it

    def _publish(self, entries: list[dict[str, Any]]) -> None:
        seq = self.published
        payload = encode_batch(entries, time.time())
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.published_events += len(entries)
        self.published += 1

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning(
                "a KV event replay request of %d frames was ignored (expected [b'', start_seq])", len(frames)
            )
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.close(linger=0)

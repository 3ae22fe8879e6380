"""vLLM KV events over real ZMQ sockets on loopback: a publisher framed like vLLM's ZmqEventPublisher
(``[topic, seq, payload]`` on PUB, a ROUTER replay endpoint) and the router's subscriber feeding a KvIndex."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator

import msgpack
import pytest
import zmq

from tokenfront.router.kv_index import KvIndex
from tokenfront.router.vllm_events import VllmEventSubscriber

TPB = 4
WORKER = "http://vllm-0:8000"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class VllmPublisher:
    """The wire side of vLLM's ZmqEventPublisher: a PUB socket, sequence numbers from 0, a replay buffer."""

    def __init__(self, context: zmq.Context, topic: bytes = b"") -> None:
        self.pub = context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.topic = topic
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self._replay: threading.Thread | None = None
        self._stop = threading.Event()
        self.replay_endpoint: str | None = None
        self._context = context

    def publish(self, payload: bytes, *, drop: bool = False) -> int:
        """Send one batch (or, with ``drop``, only buffer it: a message the subscriber never sees)."""
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if not drop:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def serve_replay(self) -> None:
        """Answer replay requests on a ROUTER socket, as vLLM's publisher thread does."""
        ready = threading.Event()

        def run() -> None:
            router = self._context.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            port = router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{port}"
            ready.set()
            try:
                while not self._stop.is_set():
                    if not router.poll(50):
                        continue
                    client, empty, start = router.recv_multipart()
                    first = int.from_bytes(start, "big")
                    for seq, payload in list(self.buffer):
                        if seq >= first:
                            router.send_multipart([client, empty, seq.to_bytes(8, "big"), payload])
                    router.send_multipart([client, empty, END_SEQ, b""])
            finally:
                router.close(linger=0)

        self._replay = threading.Thread(target=run, daemon=True)
        self._replay.start()
        ready.wait(5)

    def restart(self) -> None:
        """A new vLLM process on the same endpoint: its counter and buffer start over."""
        self.seq = 0
        self.buffer.clear()

    def close(self) -> None:
        self._stop.set()
        if self._replay is not None:
            self._replay.join(5)
        self.pub.close(linger=0)


def vllm_chain(ids: list[int]) -> list[bytes]:
    """vLLM-style chained block hashes (bytes), a different scheme from tokenfront's."""
    hashes, parent = [], b"NONE"
    for start in range(0, len(ids) - TPB + 1, TPB):
        parent = hashlib.sha256(parent + repr(ids[start : start + TPB]).encode()).digest()
        hashes.append(parent)
    return hashes


def stored(hashes: list[bytes], parent: bytes | None, ids: list[int]) -> list:
    return ["BlockStored", hashes, parent, ids, TPB, None, "GPU"]


def batch(*events: list) -> bytes:
    """A KVEventBatch as vLLM's msgspec encoder writes it: [ts, events, data_parallel_rank]."""
    return msgpack.packb([time.time(), list(events), 0])


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the subscriber")
        time.sleep(0.01)


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.term()


@pytest.fixture
def publisher(context: zmq.Context) -> Iterator[VllmPublisher]:
    pub = VllmPublisher(context, topic=b"kv-events")
    yield pub
    pub.close()


def connect(
    publisher: VllmPublisher, index: KvIndex, context: zmq.Context, *, replay: bool = False
) -> VllmEventSubscriber:
    """Start a subscriber and wait out ZMQ's slow joiner with empty batches until one arrives."""
    subscriber = VllmEventSubscriber(
        publisher.endpoint,
        WORKER,
        index,
        topic="kv-events",
        replay_endpoint=publisher.replay_endpoint if replay else None,
        replay_timeout_s=2.0,
        context=context,
    )
    subscriber.start()
    deadline = time.monotonic() + 5
    while subscriber.stats()["batches"] == 0:
        assert time.monotonic() < deadline, "the subscriber never received a batch"
        publisher.publish(batch())
        time.sleep(0.02)
    return subscriber


def test_subscriber_mirrors_stored_removed_and_cleared(
    publisher: VllmPublisher, context: zmq.Context
) -> None:
    index = KvIndex()
    subscriber = connect(publisher, index, context)
    try:
        ids = list(range(500, 516))
        foreign = vllm_chain(ids)
        publisher.publish(batch(stored(foreign[:2], None, ids[:8])))
        publisher.publish(batch(stored(foreign[2:], foreign[1], ids[8:])))
        wait_for(lambda: index.match(WORKER, ids, TPB, None) == 4)
        assert index.has_events(WORKER)

        publisher.publish(batch(["BlockRemoved", [foreign[2]], "GPU"]))
        wait_for(lambda: index.match(WORKER, ids, TPB, None) == 2)
        publisher.publish(batch(["AllBlocksCleared"]))
        wait_for(lambda: index.match(WORKER, ids, TPB, None) == 0)
        stats = subscriber.stats()
        assert stats["running"] and stats["gaps"] == 0 and stats["last_seq"] == publisher.seq - 1
    finally:
        subscriber.stop()
    assert not subscriber.running


def test_other_topics_are_not_read(publisher: VllmPublisher, context: zmq.Context) -> None:
    index = KvIndex()
    subscriber = connect(publisher, index, context)
    try:
        ids = list(range(8))
        publisher.pub.send_multipart(
            [b"other", (99).to_bytes(8, "big"), batch(stored(vllm_chain(ids), None, ids))]
        )
        publisher.publish(batch())
        wait_for(lambda: subscriber.stats()["last_seq"] == publisher.seq - 1)
        assert index.match(WORKER, ids, TPB, None) == 0
    finally:
        subscriber.stop()


def test_a_gap_is_filled_from_the_replay_endpoint(publisher: VllmPublisher, context: zmq.Context) -> None:
    publisher.serve_replay()
    index = KvIndex()
    subscriber = connect(publisher, index, context, replay=True)
    try:
        first, missed = list(range(8)), list(range(100, 108))
        publisher.publish(batch(stored(vllm_chain(first), None, first)))
        publisher.publish(batch(stored(vllm_chain(missed), None, missed)), drop=True)
        publisher.publish(batch())
        wait_for(lambda: subscriber.stats()["last_seq"] == publisher.seq - 1)
        assert index.match(WORKER, missed, TPB, None) == 2
        assert index.match(WORKER, first, TPB, None) == 2
        stats = subscriber.stats()
        assert (stats["gaps"], stats["replayed"]) == (1, 1)
    finally:
        subscriber.stop()


def test_a_gap_without_replay_forgets_the_worker(publisher: VllmPublisher, context: zmq.Context) -> None:
    index = KvIndex()
    subscriber = connect(publisher, index, context)
    try:
        before, after = list(range(8)), list(range(200, 208))
        publisher.publish(batch(stored(vllm_chain(before), None, before)))
        wait_for(lambda: index.match(WORKER, before, TPB, None) == 2)
        hashes = vllm_chain(before)
        publisher.publish(batch(["BlockRemoved", hashes, "GPU"]), drop=True)  # lost: `before` is stale
        publisher.publish(batch(stored(vllm_chain(after), None, after)))
        wait_for(lambda: index.match(WORKER, after, TPB, None) == 2)
        assert index.match(WORKER, before, TPB, None) == 0
        assert subscriber.stats()["gaps"] == 1
    finally:
        subscriber.stop()


def test_a_restarted_publisher_resets_the_worker(publisher: VllmPublisher, context: zmq.Context) -> None:
    index = KvIndex()
    subscriber = connect(publisher, index, context)
    try:
        old, new = list(range(8)), list(range(300, 308))
        for _ in range(3):
            publisher.publish(batch())
        publisher.publish(batch(stored(vllm_chain(old), None, old)))
        wait_for(lambda: index.match(WORKER, old, TPB, None) == 2)
        publisher.restart()
        publisher.publish(batch(stored(vllm_chain(new), None, new)))  # seq 0 again
        wait_for(lambda: index.match(WORKER, new, TPB, None) == 2)
        assert index.match(WORKER, old, TPB, None) == 0
        assert subscriber.stats()["restarts"] == 1
    finally:
        subscriber.stop()


def test_an_undecodable_batch_resets_and_reading_goes_on(
    publisher: VllmPublisher, context: zmq.Context
) -> None:
    index = KvIndex()
    subscriber = connect(publisher, index, context)
    try:
        ids = list(range(8))
        publisher.publish(batch(stored(vllm_chain(ids), None, ids)))
        wait_for(lambda: index.match(WORKER, ids, TPB, None) == 2)
        publisher.publish(b"\xc1 garbage")
        wait_for(lambda: subscriber.stats()["decode_errors"] == 1)
        assert index.match(WORKER, ids, TPB, None) == 0
        publisher.publish(batch(stored(vllm_chain(ids), None, ids)))
        wait_for(lambda: index.match(WORKER, ids, TPB, None) == 2)
        assert subscriber.running
    finally:
        subscriber.stop()

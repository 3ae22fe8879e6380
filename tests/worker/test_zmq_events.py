"""A worker's KV events on ZMQ in vLLM's wire format (`worker.zmq_events`): read by the router's own vLLM event
reader from a real worker process, the same events as its HTTP log; the replay socket answered as vLLM's is;
the flags' mistakes one line before anything loads. (vLLM's own decoder reads them too:
`benchmarks/compare_vllm_kv_events.py`, with the vllm wheel.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.vllm_events import (
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEventSubscriber,
    decode_vllm_batch,
)
from tokenfront.worker.kv_events import KvEventLog
from tokenfront.worker.zmq_events import END_SEQ, ZmqEventPublisher

TPB = 16
COMPLETIONS = "/v1/completions"


def _ids(start: int, count: int) -> list[int]:
    """Ordinary Qwen3 token ids (below its special tokens at 151643)."""
    return [1000 + (start + i) % 100_000 for i in range(count)]


def _wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.term()


def test_events_are_vllm_batches_and_the_replay_socket_answers_from_a_seq(
    pick_port: Callable[[], int], context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    events = KvEventLog()
    replay_endpoint = f"tcp://127.0.0.1:{pick_port()}"
    publisher = ZmqEventPublisher(f"tcp://127.0.0.1:{pick_port()}", replay_endpoint=replay_endpoint)
    publisher.publish_from(events)
    ids = _ids(0, 40)
    hashes = block_hashes(ids, TPB)
    events.stored(hashes[:1], None, [ids[:16]], TPB)
    events.stored(hashes[1:], hashes[0], [ids[16:32]], TPB)
    events.removed([hashes[1]])
    events.cleared()
    _wait_for(lambda: publisher.published_events == 4)
    asker = context.socket(zmq.DEALER)
    asker.setsockopt(zmq.LINGER, 0)
    asker.connect(replay_endpoint)
    try:
        asker.send_multipart([b"", (0).to_bytes(8, "big")])
        frames: list[list[bytes]] = []
        while not frames or frames[-1][2] != END_SEQ:
            assert asker.poll(5000), "the replay socket did not answer"
            frames.append(asker.recv_multipart())
    finally:
        asker.close()
        publisher.close()
    replies, end = frames[:-1], frames[-1]
    assert end == [b"", b"", END_SEQ, b""]
    assert [int.from_bytes(reply[2], "big") for reply in replies] == list(range(publisher.published))
    # The wire, byte for byte what msgspec encodes for vLLM's structs: the batch an array, each event a map
    # tagged "type", fields in vLLM's order.
    decoded = [event for reply in replies for event in msgpack.unpackb(reply[3])[1]]
    assert decoded == [
        {
            "type": "BlockStored",
            "block_hashes": hashes[:1],
            "parent_block_hash": None,
            "token_ids": ids[:16],
            "block_size": TPB,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        },
        {
            "type": "BlockStored",
            "block_hashes": hashes[1:],
            "parent_block_hash": hashes[0],
            "token_ids": ids[16:32],
            "block_size": TPB,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        },
        {"type": "BlockRemoved", "block_hashes": [hashes[1]], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ]
    assert [list(decoded[0])[:4], list(decoded[2])] == [
        ["type", "block_hashes", "parent_block_hash", "token_ids"],
        ["type", "block_hashes", "medium"],
    ]
    # The router's vLLM decoder reads the same batches.
    batches = [decode_vllm_batch(reply[3]) for reply in replies]
    kinds = [type(event) for batch in batches for event in batch.events]
    assert kinds == [VllmBlockStored, VllmBlockStored, VllmBlockRemoved, VllmAllBlocksCleared]


@pytest.mark.slow  # a real worker process
def test_the_routers_vllm_reader_mirrors_a_tokenfront_worker(
    module_servers: Callable[..., Any],
    connect: Callable[[Any], Any],
    pick_port: Callable[[], int],
    qwen3: Path,
) -> None:
    endpoint, replay = f"tcp://127.0.0.1:{pick_port()}", f"tcp://127.0.0.1:{pick_port()}"
    server = module_servers(
        "serve",
        "--engine",
        "simulated",
        "--model",
        str(qwen3),
        "--kv-events-endpoint",
        endpoint,
        "--kv-events-replay-endpoint",
        replay,
    )
    assert f"publishing KV events on {endpoint} (replay on {replay})" in server.log()
    worker = connect(server)
    index = KvIndex()
    subscriber = VllmEventSubscriber(
        endpoint, server.url, index, replay_endpoint=replay, replay_timeout_s=2.0
    )
    subscriber.start()
    try:
        first = _ids(5000, 100) + _ids(9000, 50)
        second = _ids(5000, 100) + _ids(7000, 60)
        for prompt in (first, second):
            answer = worker.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": 4, "temperature": 0})
            assert answer.status_code == 200, answer.text
        # The first request's events may go before the subscriber joined: the replay socket fills the gap.
        _wait_for(lambda: index.match(server.url, first, TPB, None) == 9)
        _wait_for(lambda: index.match(server.url, second, TPB, None) == 10)
        stats = subscriber.stats()
    finally:
        subscriber.stop()
    assert stats["running"] and stats["decode_errors"] == 0, stats
    # The same blocks as the worker's HTTP event log names.
    log = worker.get("/kv_cache_events", params={"after": 0}).json()["events"]
    stored = [h for event in log if event["type"] == "stored" for h in event["block_hashes"]]
    assert stored[:9] == block_hashes(first, TPB) and set(block_hashes(second, TPB)) <= set(stored)


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--kv-events-replay-endpoint", "tcp://127.0.0.1:5558"],
            "error: --kv-events-replay-endpoint needs --kv-events-endpoint (the PUB socket)",
        ),
        (
            ["--kv-events-endpoint", "tcp://127.0.0.1"],
            "error: --kv-events-endpoint tcp://127.0.0.1: give the address to bind as tcp://HOST:PORT",
        ),
        (
            ["--kv-events-endpoint", "tcp://127.0.0.1:{taken}"],
            "error: --kv-events-endpoint tcp://127.0.0.1:{taken}: cannot bind",
        ),
    ],
)
def test_zmq_event_mistakes_are_one_line(qwen3: Path, flags: list[str], line: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = ["serve", "--engine", "simulated", "--model", str(qwen3), "--port", "0"]
        args = [flag.format(taken=port) for flag in flags]
        result = subprocess.run(
            [sys.executable, "-m", "tokenfront.cli", *command, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line.format(taken=port)), result.stderr

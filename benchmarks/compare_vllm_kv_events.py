"""vLLM's own KV event decoder on a tokenfront worker's ZMQ events (docs/operations.md, worker/zmq_events.py).

Starts `tokenfront serve --engine simulated` on the Qwen3 fixture with `--kv-events-endpoint` and
`--kv-events-replay-endpoint`, and, in the vllm venv's interpreter, a subscriber that reads every batch from
sequence 0 (the replay socket, then the PUB socket) and decodes it with vLLM 0.33's
`msgspec.msgpack.Decoder(vllm.distributed.kv_events.KVEventBatch)` — the decoder vLLM's own consumers use.
Sends completions that store, share and evict blocks (a small `--kv-cache-max-tokens` cache), then compares what vLLM
decoded, event by event, with the worker's HTTP event log (`GET /kv_cache_events`): the same kinds, block
hashes, parents, token ids and block sizes, in the same order. Exit status 0 only when every event matched and
at least one of each kind was seen. Needs a venv holding vllm==0.33.0 (`make peer-vllm`); not run in CI.

    python -m benchmarks.compare_vllm_kv_events --vllm ~/.cache/tokenfront-peers/vllm [--requests 40]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import free_port, launch_tokenfront, stop_all, wait_healthy
from tokenfront.fixtures import ensure_checkpoint

# Run by the vllm venv's python: subscribe, replay from 0, decode each payload with vLLM's KVEventBatch, print
# one JSON line per event until told to stop (stdin closed) and the stream has been quiet for a moment.
_SUBSCRIBER = r"""
import json, sys, threading, time
import msgspec, zmq
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

endpoint, replay = sys.argv[1], sys.argv[2]
decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
context = zmq.Context()
sub = context.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(endpoint)
seen = {}

def emit(seq, payload):
    if seq in seen:
        return
    batch = decoder.decode(payload)
    seen[seq] = True
    for event in batch.events:
        if isinstance(event, BlockStored):
            line = {"type": "stored", "block_hashes": event.block_hashes, "parent_block_hash": event.parent_block_hash,
                    "token_ids": event.token_ids, "block_size": event.block_size, "medium": event.medium}
        elif isinstance(event, BlockRemoved):
            line = {"type": "removed", "block_hashes": event.block_hashes, "medium": event.medium}
        elif isinstance(event, AllBlocksCleared):
            line = {"type": "cleared"}
        else:
            line = {"type": "unknown:" + type(event).__name__}
        print(json.dumps({"seq": seq, **line}), flush=True)

done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
print(json.dumps({"ready": True}), flush=True)
quiet_since = time.monotonic()
replayed = False
while not (done.is_set() and time.monotonic() - quiet_since > 1.0):
    if sub.poll(100):
        _, seq_bytes, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        if not replayed:  # everything before the first live batch, from the replay socket
            asker = context.socket(zmq.DEALER)
            asker.connect(replay)
            asker.send_multipart([b"", (0).to_bytes(8, "big")])
            while True:
                frames = asker.recv_multipart()
                if frames[2] == (-1).to_bytes(8, "big", signed=True):
                    break
                emit(int.from_bytes(frames[2], "big"), frames[3])
            asker.close()
            replayed = True
        emit(seq, payload)
        quiet_since = time.monotonic()
"""


def _vllm_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"error: {python} does not exist: pass the venv holding vllm==0.33.0 (make peer-vllm)"
        )
    return python


def _ids(start: int, count: int) -> list[int]:
    return [1000 + (start + i) % 100_000 for i in range(count)]


def _requests(count: int) -> list[list[int]]:
    """Prompts that share a system prefix, grow conversations, and overflow the small cache (evictions)."""
    shared = _ids(0, 64)
    return [shared + _ids(1000 * (i % 7) + 200, 40 + 16 * (i // 7)) for i in range(count)]


def _log_events(client: httpx.Client) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = client.get("/kv_cache_events", params={"after": after, "limit": 1000}).json()
        events += page["events"]
        if not page["events"]:
            return events
        after = page["events"][-1]["seq"]


def _expected(event: dict[str, Any]) -> dict[str, Any]:
    """The worker's HTTP log entry as the vLLM decoder's line should read."""
    if event["type"] == "stored":
        return {
            "type": "stored",
            "block_hashes": event["block_hashes"],
            "parent_block_hash": event["parent_block_hash"],
            "token_ids": [token for ids in event["token_ids"] for token in ids],
            "block_size": event["tokens_per_block"],
            "medium": "GPU",
        }
    if event["type"] == "removed":
        return {"type": "removed", "block_hashes": event["block_hashes"], "medium": "GPU"}
    return {"type": "cleared"}


def run(args: argparse.Namespace) -> int:
    python = _vllm_python(args.vllm)
    checkpoint = ensure_checkpoint("qwen3")
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    log_dir = Path(tempfile.mkdtemp(prefix="compare-kv-events-"))
    worker = launch_tokenfront(
        [
            "serve",
            "--engine",
            "simulated",
            "--model",
            str(checkpoint),
            "--kv-cache-max-tokens",
            str(args.kv_cache_tokens),
            "--sim-speedup",
            "20",
            "--kv-events-endpoint",
            endpoint,
            "--kv-events-replay-endpoint",
            replay,
        ],
        log_dir=log_dir,
    )
    subscriber = subprocess.Popen(
        [str(python), "-c", _SUBSCRIBER, endpoint, replay],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_healthy([worker])
        assert subscriber.stdout is not None and subscriber.stdin is not None
        assert json.loads(subscriber.stdout.readline()) == {"ready": True}
        with httpx.Client(base_url=f"http://127.0.0.1:{worker.port}", timeout=60) as client:
            for prompt in _requests(args.requests):
                answer = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4})
                answer.raise_for_status()
            time.sleep(0.5)  # a comparison script, not a test: let the last batch go out before reading
            expected = [_expected(event) for event in _log_events(client)]
        subscriber.stdin.close()
        decoded = [json.loads(line) for line in subscriber.stdout]
        subscriber.wait(timeout=30)
    finally:
        if subscriber.poll() is None:
            subscriber.kill()
        stop_all([worker])
    lines = [{key: value for key, value in line.items() if key != "seq"} for line in decoded]
    kinds = {line["type"] for line in lines}
    mismatches = [i for i, (a, b) in enumerate(zip(expected, lines, strict=False)) if a != b]
    print(f"worker HTTP log: {len(expected)} events; vLLM 0.33's KVEventBatch decoder: {len(lines)} events")
    print(f"kinds decoded: {sorted(kinds)}; batches: {len({line['seq'] for line in decoded})}")
    if mismatches:
        first = mismatches[0]
        print(f"MISMATCH at event {first}: log {expected[first]} vs vLLM {lines[first]}")
    ok = not mismatches and len(expected) == len(lines) and {"stored", "removed"} <= kinds
    print("OK: every event decoded by vLLM equals the worker's log" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", type=Path, required=True, help="the venv holding vllm==0.33.0")
    parser.add_argument("--requests", type=int, default=40, help="completions sent (default: 40)")
    parser.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=256,
        help="the simulated cache's size in tokens: small, so blocks are evicted (default: 256)",
    )
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""The Mooncake trace format: read it, write it, replay it as timed requests, and generate traces of it.

Mooncake's published traces (kvcache-ai/Mooncake, `FAST25-release/traces`) are JSON lines, one request each:

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, ...]}

`timestamp` is when the request arrives, in milliseconds from the trace's start; `input_length` and
`output_length` are its prompt and answer lengths in tokens; `hash_ids` name its prompt's blocks of 512 tokens,
first block first (the last one may be partial), so that two requests whose first k ids are equal share their
first k blocks of content — the traces carry the reuse but not the text.

Replaying gives each hash id 512 token ids of its own (drawn from a `random.Random` seeded with the replay's
seed and the id): a prompt is its blocks' ids, cut at `input_length`. Generating goes the other way: a
workload's prompts (`workloads`) are cut into 512-token blocks and each distinct chain of blocks gets an id, so a
trace of our workloads can be read by any tool that reads Mooncake's. Reuse within a block that a trace cannot
say (two prompts that share part of a block) is lost on the way, so a replayed trace reuses a little less than
the workload it came from; the oracle is run on what is replayed.

    python -m benchmarks.fleet.mooncake generate --workload agentic --sessions 50 --out agentic.jsonl
    python -m benchmarks.fleet.mooncake describe agentic.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.fleet.requests import TimedRequest, random_ids
from benchmarks.fleet.workloads import AgenticSessions, SharedDocuments, summarize

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "MooncakeRecord",
    "read_trace",
    "replay",
    "trace_from_requests",
    "write_trace",
]

# The tokens behind one hash id in Mooncake's traces.
MOONCAKE_BLOCK_TOKENS = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True)
class MooncakeRecord:
    """One line of a Mooncake trace (see the module docstring for the fields)."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def as_json(self) -> str:
        """The record as a trace line (without the newline)."""
        return json.dumps(
            {
                "timestamp": self.timestamp,
                "input_length": self.input_length,
                "output_length": self.output_length,
                "hash_ids": list(self.hash_ids),
            }
        )


def read_trace(path: str | Path, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Iterator[MooncakeRecord]:
    """The records of a trace file, in file order. ValueError naming the line for a line that is not a record:
    not a JSON object, a field missing or not a whole number (`hash_ids` a list of them), lengths below 1
    (`output_length` below 0), or fewer hash ids than `input_length` needs blocks of `block_tokens`."""
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield _record(line, f"{path}:{number}", block_tokens)


def _record(line: str, where: str, block_tokens: int) -> MooncakeRecord:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error.msg})") from error
    if not isinstance(value, dict) or any(name not in value for name in _FIELDS):
        raise ValueError(f"{where}: a trace line is an object with {', '.join(_FIELDS)}")
    timestamp, input_length, output_length, hash_ids = (value[name] for name in _FIELDS)
    numbers = [timestamp, input_length, output_length, *(hash_ids if isinstance(hash_ids, list) else [None])]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        raise ValueError(
            f"{where}: timestamp, input_length, output_length and hash_ids must be whole numbers"
        )
    if input_length < 1 or output_length < 0 or timestamp < 0:
        raise ValueError(f"{where}: input_length must be at least 1, output_length and timestamp at least 0")
    blocks = -(-input_length // block_tokens)
    if len(hash_ids) < blocks:
        raise ValueError(
            f"{where}: {input_length} input tokens are {blocks} blocks of {block_tokens}, but there are "
            f"{len(hash_ids)} hash ids"
        )
    return MooncakeRecord(timestamp, input_length, output_length, tuple(hash_ids[:blocks]))


def write_trace(records: Iterable[MooncakeRecord], path: str | Path) -> int:
    """Write `records` as a trace file, one JSON line each; return how many."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as out:
        for record in records:
            out.write(record.as_json() + "\n")
            count += 1
    return count


def replay(
    records: Iterable[MooncakeRecord],
    *,
    seed: int = 0,
    id_range: tuple[int, int] = (256, 32_000),
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> Iterator[TimedRequest]:
    """The trace as timed requests (in the records' order): `at` the timestamp in seconds, the prompt the ids
    of its hash ids' blocks cut at `input_length`, `max_tokens` the output length (at least 1). Each record is
    a session of its own (`trace-<line>`): Mooncake's traces do not say who sent what."""

    @functools.lru_cache(maxsize=4096)  # hash ids repeat: the hot ones are drawn once
    def block(hash_id: int) -> tuple[int, ...]:
        return random_ids(random.Random(f"mooncake:{seed}:{hash_id}"), block_tokens, id_range)

    for index, record in enumerate(records):
        segments = [block(hash_id) for hash_id in record.hash_ids]
        tail = record.input_length - block_tokens * (len(segments) - 1)
        segments[-1] = segments[-1][:tail]
        yield TimedRequest(
            at=record.timestamp / 1000,
            session=f"trace-{index}",
            turn=0,
            segments=tuple(segments),
            max_tokens=max(1, record.output_length),
        )


def trace_from_requests(
    requests: Iterable[TimedRequest], *, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> Iterator[MooncakeRecord]:
    """A Mooncake trace of timed requests: each distinct chain of `block_tokens`-token blocks (the same ids
    after the same prefix) gets the next hash id, from 0, as the requests first send it."""
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    for request in requests:
        prompt = request.prompt_token_ids()
        parent = -1
        hash_ids = []
        for start in range(0, len(prompt), block_tokens):
            key = (parent, tuple(prompt[start : start + block_tokens]))
            parent = ids.setdefault(key, len(ids))
            hash_ids.append(parent)
        yield MooncakeRecord(round(request.at * 1000), len(prompt), request.max_tokens, tuple(hash_ids))


def main(argv: list[str] | None = None) -> int:
    """`generate` a trace of a workload, or `describe` a trace file (its counts and share seen before)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet.mooncake", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="write a Mooncake trace of a workload")
    generate.add_argument("--workload", choices=["agentic", "documents"], default="agentic")
    generate.add_argument(
        "--sessions", type=int, default=100, help="agentic sessions, or document users (default: 100)"
    )
    generate.add_argument("--seed", type=int, default=0, help="the workload's seed (default: 0)")
    generate.add_argument("--out", type=Path, required=True, help="the trace file to write")
    describe = commands.add_parser("describe", help="count a trace's requests and tokens as replayed")
    describe.add_argument("trace", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            if args.workload == "agentic":
                requests = AgenticSessions(sessions=args.sessions, seed=args.seed).requests()
            else:
                requests = SharedDocuments(users=args.sessions, seed=args.seed).requests()
            count = write_trace(trace_from_requests(requests), args.out)
            print(f"wrote {count} requests to {args.out}")
        else:
            summary = summarize(replay(read_trace(args.trace)))
            print(json.dumps({**vars(summary), "mean_prompt_tokens": summary.mean_prompt_tokens}, indent=2))
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

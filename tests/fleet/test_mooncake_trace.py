"""The Mooncake trace format (benchmarks/fleet/mooncake.py): read, write, replay, and traces of our workloads."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from benchmarks.fleet import mooncake
from benchmarks.fleet.mooncake import MooncakeRecord, read_trace, replay, trace_from_requests, write_trace
from benchmarks.fleet.oracle import achievable_hit_rate
from benchmarks.fleet.workloads import AgenticSessions

# Three lines in Mooncake's own format: the second shares the first's two first blocks, the third only one.
TRACE = [
    {"timestamp": 0, "input_length": 1500, "output_length": 20, "hash_ids": [0, 1, 2]},
    {"timestamp": 250, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 3]},
    {"timestamp": 1000, "input_length": 600, "output_length": 0, "hash_ids": [0, 4]},
]


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_trace_replays_with_its_lengths_and_shared_blocks(tmp_path: Path) -> None:
    records = list(read_trace(_write(tmp_path / "t.jsonl", TRACE)))
    assert records[1] == MooncakeRecord(250, 1100, 5, (0, 1, 3))
    requests = list(replay(records, seed=4))
    assert [(r.at, r.prompt_tokens, r.max_tokens) for r in requests] == [
        (0.0, 1500, 20),
        (0.25, 1100, 5),
        (1.0, 600, 1),
    ]
    first, second, third = (r.prompt_token_ids() for r in requests)
    assert first[:1024] == second[:1024] and first[1024] != second[1024]
    assert first[:512] == third[:512] and first[512] != third[512]
    # By hand, in 16-token blocks: request 2 finds blocks 0 and 1 (1024 tokens), request 3 block 0 (512).
    assert achievable_hit_rate(requests, None).hit_tokens == 1024 + 512


def test_a_workload_goes_through_the_format_and_back(tmp_path: Path) -> None:
    workload = list(AgenticSessions(sessions=4, seed=5).requests())
    path = tmp_path / "agentic.jsonl"
    assert write_trace(trace_from_requests(workload), path) == len(workload)
    records = list(read_trace(path))
    assert [r.input_length for r in records] == [r.prompt_tokens for r in workload]
    assert [r.output_length for r in records] == [r.max_tokens for r in workload]
    # Reuse survives at 512-token granularity: the replay reuses nearly what the workload did, never more.
    original = achievable_hit_rate(workload, None).hit_rate
    replayed = achievable_hit_rate(replay(records), None).hit_rate
    assert original - 0.03 <= replayed <= original
    # A session's turns extend each other: each trace line repeats the hash ids of the full blocks before.
    turns = [r for r, w in zip(records, workload, strict=True) if w.session == workload[0].session]
    for previous, turn in itertools.pairwise(turns):
        full = previous.input_length // 512
        assert turn.hash_ids[:full] == previous.hash_ids[:full]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('{"timestamp": 0, "input_length": 5}', "an object with"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "2 blocks of 512"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "at least 1"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}', "whole numbers"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(TRACE[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message) as error:
        list(read_trace(path))
    assert f"{path}:2" in str(error.value)


def test_the_generator_command_writes_and_describes_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "docs.jsonl"
    assert mooncake.main(["generate", "--workload", "documents", "--sessions", "5", "--out", str(path)]) == 0
    written = len(path.read_text().splitlines())
    assert f"wrote {written} requests" in capsys.readouterr().out
    assert mooncake.main(["describe", str(path)]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["requests"] == written and described["sessions"] == written  # a trace line is its own
    assert mooncake.main(["describe", str(tmp_path / "missing.jsonl")]) == 2

"""The render server's CPU per request from several source trees, side by side: one change's effect, measured.

A render server's CPU per request moves by a few percent from run to run on a shared VM, about as much as one
change to the hot path saves. This starts `tokenfront render` from each `--tree DIR` in turn (`DIR/src` first on
its PYTHONPATH: another checkout, or `git archive COMMIT src | tar -x -C DIR`), pinned to core 0, and sends it
`--requests` fresh requests of a workload from core 1 with `benchmarks.render_http`'s client (8 keep-alive
connections, every body distinct, after a warm-up of a tenth as many), `--rounds` times, the trees interleaved
round by round so that a change in the machine's weather falls on all of them. It reports each tree's server
CPU per request (its process tree's utime + stime from /proc) as the median and the least of its rounds.

A tree runs as its source unless it was compiled in place as the wheel compiles it (setup.py's mypyc modules):
`cp pyproject.toml setup.py README.md DIR && (cd DIR && python setup.py build_ext --inplace)`. Each tree's
line says how many of its modules are extension modules (`tokenfront.compiled.compiled_modules`).

    python -m benchmarks.render_trees --tree /tmp/before --tree /tmp/after [--workload one_line]
                                      [--rounds 5] [--requests 20000] [--checkpoint qwen3] [--json]

Needs 2 cores (`taskset`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.render_http import run_client, workload_requests
from benchmarks.servers import launch_tokenfront, stop_all, wait_healthy
from tokenfront import fixtures
from tokenfront.compiled import compiled_modules

SERVER_CORE, CLIENT_CORE = "0", 1


def _one_round(tree: Path, args: argparse.Namespace, folder: str, log_dir: Path, number: int) -> float:
    """Server CPU µs per request of one round on `tree`."""
    server = launch_tokenfront(
        ["render", "--model", folder, "--tool-call-parser", "hermes"],
        log_dir=log_dir,
        cpus=SERVER_CORE,
        env={"PYTHONPATH": str(tree / "src")},
        name=f"tokenfront-{tree.name}",
    )
    try:
        wait_healthy([server], timeout=120.0)
        server.wait_settled()
        warm = workload_requests(
            args.workload, max(1, args.requests // 10), f"trees-warm-{number}", server.port
        )
        run_client(server.port, warm, 8)
        requests = workload_requests(args.workload, args.requests, f"trees-{number}", server.port)
        sent = sum(len(turns) for turns in requests)
        before = server.cpu_seconds()
        run = run_client(server.port, requests, 8)
        used = server.cpu_seconds() - before
        if run.failures:
            raise RuntimeError(f"{tree}: {len(run.failures)} of {sent} requests not answered 200 with ids")
        return used / sent * 1e6
    finally:
        stop_all([server])


def run(args: argparse.Namespace) -> dict[str, Any]:
    trees = [Path(tree).resolve() for tree in args.tree]
    for tree in trees:
        if not (tree / "src" / "tokenfront").is_dir():
            raise SystemExit(f"--tree {tree}: no src/tokenfront in it")
    folder = str(fixtures.ensure_checkpoint(args.checkpoint))
    log_dir = Path(tempfile.mkdtemp(prefix="tokenfront-render-trees-"))
    os.sched_setaffinity(0, {CLIENT_CORE})
    rounds: dict[str, list[float]] = {str(tree): [] for tree in trees}
    for number in range(args.rounds):
        for tree in trees:
            rounds[str(tree)].append(_one_round(tree, args, folder, log_dir, number))
    return {
        "workload": args.workload,
        "requests": args.requests,
        "trees": [
            {
                "tree": tree,
                "compiled": compiled_modules(Path(tree) / "src" / "tokenfront"),
                "median_us": statistics.median(values),
                "least_us": min(values),
                "rounds_us": values,
            }
            for tree, values in rounds.items()
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.render_trees",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tree", action="append", required=True, help="a directory holding src/tokenfront")
    parser.add_argument("--workload", default="one_line")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--checkpoint", default="qwen3")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        print("render_trees needs 2 cores: the server on one, the client on the other", file=sys.stderr)
        return 2
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.workload}, {args.requests} requests a round, server CPU per request:")
    for row in report["trees"]:
        values = " ".join(f"{value:.1f}" for value in row["rounds_us"])
        compiled = f" ({len(row['compiled'])} modules compiled)" if row["compiled"] else ""
        print(
            f"  {row['tree']}{compiled}: median {row['median_us']:.1f} us, least {row['least_us']:.1f} us  ({values})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

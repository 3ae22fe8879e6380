"""Start-up: how soon `tokenfront render` answers /health after its launch, and the memory it holds idle.

Launches `tokenfront render` on a checkpoint as `make demo-render` starts it (`--served-model-name Qwen3-0.6B
--reasoning-parser qwen3` on the Qwen3 fixture; this interpreter, `python -m tokenfront.cli`) `--runs` times,
one process at a time, each on a free loopback port. Per run: the seconds from the launch to the first 200 on
/health (polled every 10 ms), then, `--idle-seconds` later and once the process is idle (under 0.05 cores for
0.5 s: the work a server does after it answers, such as building its fast tokenizer, is over), before any
request, VmRSS and VmHWM (the peak) from /proc, and when that was (settled after). With `--vllm-rs VENV|BINARY`, vLLM's Rust renderer (`vllm-rs render CKPT`) is launched the same
way, alternating with tokenfront run by run, so both see the same machine.

It reports the minimum and the median of each figure, the commit (with `+` when the tree has changes) and how
busy the machine was: its load average and the cores other processes kept busy while the runs went on (a
warning above 0.2 cores: the figures are then a floor). A busy 2-core machine stretches start-up: take the
minimum, and repeat on a quiet moment.

    python -m benchmarks.startup [--checkpoint qwen3] [--runs 5] [--idle-seconds 2]
                                 [--vllm-rs ~/.cache/tokenfront-peers/vllm] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.servers import (
    Server,
    launch_tokenfront,
    launch_vllm_rs,
    machine_cpu_seconds,
    stop_all,
    vllm_rs_option,
    wait_healthy,
)
from tokenfront import fixtures

MIB = 1024 * 1024
# What `make demo-render` gives the renderer beyond the model (the Qwen3 fixture's names and parser).
DEMO_ARGUMENTS = {"qwen3": ["--served-model-name", "Qwen3-0.6B", "--reasoning-parser", "qwen3"]}


def _commit() -> str:
    root = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True
    )
    return (head.stdout.strip() or "unknown") + ("+" if dirty.stdout.strip() else "")


def _memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of one process, in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    return {"rss_bytes": values["VmRSS"], "peak_bytes": values["VmHWM"]}


def _one_run(server: Server, idle_seconds: float) -> dict[str, Any]:
    try:
        wait_healthy([server], timeout=120, interval=0.01)
        time.sleep(idle_seconds)
        server.wait_settled()
        return {
            "healthy_after_s": round(server.healthy_after or 0.0, 3),
            "settled_after_s": round(server.settled_after or 0.0, 2),
            **_memory(server.pid),
        }
    finally:
        stop_all([server])


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    healthy = [run["healthy_after_s"] for run in runs]
    rss = [run["rss_bytes"] for run in runs]
    return {
        "runs": len(runs),
        "healthy_after_s": {"min": min(healthy), "median": statistics.median(healthy)},
        "settled_after_s": {"median": statistics.median(run["settled_after_s"] for run in runs)},
        "idle_rss_mib": {"min": round(min(rss) / MIB), "median": round(statistics.median(rss) / MIB)},
        "peak_rss_mib": round(max(run["peak_bytes"] for run in runs) / MIB),
        "each": runs,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = str(fixtures.ensure_checkpoint(args.checkpoint))
    binary = vllm_rs_option(args.vllm_rs) if args.vllm_rs else None
    log_dir = Path(tempfile.mkdtemp(prefix="tokenfront-startup-"))
    tokenfront_args = ["render", "--model", folder, *DEMO_ARGUMENTS.get(args.checkpoint, [])]
    runs: dict[str, list[dict[str, Any]]] = {"tokenfront": [], **({"vllm-rs": []} if binary else {})}
    load_before = os.getloadavg()
    busy_before, ours_before, started = machine_cpu_seconds(), _our_cpu(), time.monotonic()
    for _ in range(args.runs):
        for name in runs:
            if name == "tokenfront":
                server = launch_tokenfront(tokenfront_args, log_dir=log_dir)
            else:
                assert binary is not None
                server = launch_vllm_rs(binary, folder, log_dir=log_dir)
            runs[name].append(_one_run(server, args.idle_seconds))
    elapsed = time.monotonic() - started
    others = max(0.0, machine_cpu_seconds() - busy_before - (_our_cpu() - ours_before)) / elapsed
    return {
        "commit": _commit(),
        "checkpoint": args.checkpoint,
        "command": ["tokenfront", *tokenfront_args[:1], "--model", args.checkpoint, *tokenfront_args[3:]],
        "idle_seconds": args.idle_seconds,
        "load_average": {
            "before": [round(v, 2) for v in load_before],
            "after": [round(v, 2) for v in os.getloadavg()],
        },
        "other_busy_cores": round(others, 2),
        **{name: _summary(values) for name, values in runs.items()},
    }


def _our_cpu() -> float:
    """CPU seconds of this benchmark and of its reaped children (every server it ran, stopped)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _print(report: dict[str, Any]) -> None:
    print(
        f"start-up of `{' '.join(report['command'])}` on {report['commit']}, memory read {report['idle_seconds']:g} "
        f"s after /health and once idle; load average {report['load_average']['before']} -> "
        f"{report['load_average']['after']}, other processes kept {report['other_busy_cores']} cores busy"
    )
    if report["other_busy_cores"] > 0.2:
        print("warning: the machine was not quiet; these figures are a floor")
    for name in ("tokenfront", "vllm-rs"):
        if name not in report:
            continue
        summary = report[name]
        print(
            f"  {name + ':':<11} {summary['runs']} runs, healthy after {summary['healthy_after_s']['min']:.2f} s "
            f"(median {summary['healthy_after_s']['median']:.2f} s), settled after "
            f"{summary['settled_after_s']['median']:.2f} s (median); idle RSS {summary['idle_rss_mib']['min']} MB "
            f"(median {summary['idle_rss_mib']['median']} MB), peak {summary['peak_rss_mib']} MB"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default="qwen3", choices=sorted(fixtures.CHECKPOINTS))
    parser.add_argument("--runs", type=int, default=5, help="launches of each server (default: 5)")
    parser.add_argument("--idle-seconds", type=float, default=2.0, help="seconds after /health (default: 2)")
    parser.add_argument("--vllm-rs", help="vLLM's Rust renderer too: its binary, or a venv holding vllm")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

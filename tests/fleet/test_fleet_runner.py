"""The fleet benchmark runner (python -m benchmarks.fleet): the offline replay on the virtual clock, and one
live run through real `tokenfront simulate` and `tokenfront route` processes."""

from __future__ import annotations

import asyncio
import json

import pytest
from benchmarks.fleet.__main__ import main
from benchmarks.fleet.load import calibrate
from benchmarks.fleet.scenario import WorkloadSpec
from benchmarks.fleet.virtual_clock import run_virtual

from tokenfront.worker.engines.simulated import SimulatedGpu

# The fields every policy's entry has (the list; the runner adds more).
POLICY_FIELDS = {
    "requests",
    "errors",
    "hit_rate",
    "oracle_hit_rate",
    "ttft_mean_ms",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "max_worker_share",
}
GPU = SimulatedGpu(max_context_tokens=131_072)


def _report(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _workload_size(workers: int, duration: float) -> int:
    spec = WorkloadSpec.parse("agentic", seed=0, duration=duration)
    return len(calibrate(spec.requests, 0.7, workers, GPU).requests)


def test_the_virtual_clock_jumps_from_timer_to_timer() -> None:
    async def sleepers() -> tuple[float, list[float]]:
        loop = asyncio.get_running_loop()
        woke: list[float] = []

        async def sleeper(seconds: float) -> None:
            await asyncio.sleep(seconds)
            woke.append(loop.time())

        await asyncio.gather(*(sleeper(s) for s in (300.0, 0.5, 3600.0)))
        return loop.time(), woke

    # An hour of sleeps, in order, ending on the hour: on a real clock this test would take that hour.
    now, woke = run_virtual(sleepers())
    assert woke == [0.5, 300.0, 3600.0]
    assert now == 3600.0


def test_offline_replay_reports_every_policy_on_the_whole_workload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = _report(
        capsys,
        ["--offline", "--workers", "8", "--duration", "15", "--policies", "kv_cache_aware,round_robin,nope"],
    )
    assert report["workers"] == 8 and report["mode"] == "offline"
    assert abs(report["load"] - 0.7) < 0.1
    expected = _workload_size(8, 15)
    assert report["requests"] == expected > 100
    assert set(report["policies"]) == {"kv_cache_aware", "round_robin"}
    assert "nope" in report["skipped"]
    for entry in report["policies"].values():
        assert set(entry) >= POLICY_FIELDS
        assert (entry["requests"], entry["errors"]) == (expected, 0)
        assert 0 < entry["hit_rate"] <= entry["oracle_hit_rate"] <= 1
        assert 0 < entry["ttft_p50_ms"] <= entry["ttft_p99_ms"]
        assert entry["max_worker_share"] >= 1
        assert entry["kv_events_truncated"] == 0  # the index read every event the engines wrote
    aware, blind = report["policies"]["kv_cache_aware"], report["policies"]["round_robin"]
    assert aware["hit_rate"] > blind["hit_rate"]
    assert blind["max_worker_share"] < 1.1  # round-robin gives 8 workers the same count, within one request


def test_runner_refuses_bad_flags_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--offline", "--workload", "poisson"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown workload 'poisson': choose one of agentic")
    assert main(["--offline", "--load", "0"]) == 2
    assert capsys.readouterr().err == "error: --load must be more than 0, not 0.0\n"
    assert main(["--workers", "4", "--sim-processes", "5"]) == 2
    assert capsys.readouterr().err == "error: --sim-processes must be between 1 and --workers, not 5\n"


@pytest.mark.slow
def test_live_run_through_real_servers(capsys: pytest.CaptureFixture[str]) -> None:
    # 4 simulated workers in 2 processes and a router per policy, real processes on loopback, 3 modelled seconds
    # of arrivals.
    report = _report(
        capsys,
        [
            "--workers",
            "4",
            "--sim-processes",
            "2",
            "--duration",
            "3",
            "--sim-speedup",
            "1",
            "--policies",
            "kv_cache_aware,round_robin",
        ],
    )
    expected = _workload_size(4, 3)
    assert report["mode"] == "live" and report["sim_speedup"] == 1.0 and report["requests"] == expected > 10
    assert report["sim_processes"] == 2
    assert set(report["policies"]) == {"kv_cache_aware", "round_robin"}
    for entry in report["policies"].values():
        assert set(entry) >= POLICY_FIELDS
        assert (entry["requests"], entry["errors"]) == (expected, 0)
        assert 0 <= entry["hit_rate"] <= 1 and entry["ttft_p50_ms"] > 0
        assert entry["engine_lag_mean_ms"] is not None and entry["engine_lag_max_ms"] >= 0
        # Whether the fleet kept up, as the report says it: no worker taken out, and who used the CPU.
        assert (entry["router_workers_taken_out"], entry["router_take_out_reasons"]) == (0, {})
        assert entry["fleet_cores"] > 0 and entry["router_cores"] > 0 and entry["client_cores"] > 0
        assert entry["router_decision_ms"]["mean"] > 0 and entry["router_render_ms"]["mean"] > 0
        assert entry["router_renders"].get("ok", 0) > 0
    # Round-robin spreads the requests evenly, by the workers' own counts (their /metrics).
    assert report["policies"]["round_robin"]["max_worker_share"] == pytest.approx(1.0, abs=0.1)

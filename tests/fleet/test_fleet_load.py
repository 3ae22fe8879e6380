"""The fleet load (benchmarks/fleet/load.py) on request sequences small enough to count by hand."""

from __future__ import annotations

import pytest
from benchmarks.fleet.load import calibrate, round_robin_load
from benchmarks.fleet.requests import TimedRequest

from tokenfront.worker.engines.simulated import SimulatedGpu

# 100 prefill tokens a second, no attention term, no step overhead, 4-token blocks: a prompt's prefill is its
# uncached tokens / 100 seconds.
GPU = SimulatedGpu(
    prefill_tokens_per_second=100.0,
    attention_seconds_per_token_pair=0.0,
    prefill_overhead_seconds=0.0,
    tokens_per_block=4,
    kv_cache_tokens=1000,
)
A, B, C = (tuple(range(start, start + 4)) for start in (100, 200, 300))


def _request(at: float, *blocks: tuple[int, ...]) -> TimedRequest:
    return TimedRequest(at=at, session="s", turn=0, segments=blocks, max_tokens=1)


def test_the_load_counts_round_robin_prefill_with_each_workers_cache() -> None:
    # Two workers, requests given in turn:
    #   t=0  A B      -> worker 0: nothing cached, 8 tokens                               0.08 s
    #   t=1  A B C    -> worker 1: nothing cached, 12 tokens                              0.12 s
    #   t=2  A B C    -> worker 0: holds A B; 8 cached, 4 computed                        0.04 s
    #   t=4  A B      -> worker 1: holds A B C, but the last token is always computed, so
    #                    only A is cached: 4 cached, 4 computed                           0.04 s
    # 0.28 s of prefill over 2 workers x 4 s: load 0.035.
    requests = [_request(0, A, B), _request(1, A, B, C), _request(2, A, B, C), _request(4, A, B)]
    measured = round_robin_load(requests, 2, GPU)
    assert (measured.requests, measured.prompt_tokens, measured.cached_tokens) == (4, 40, 12)
    assert measured.prefill_seconds == pytest.approx(0.28)
    assert measured.span_seconds == 4
    assert measured.load == pytest.approx(0.035)
    # One worker gets everything: t=0 nothing cached (8 computed); t=1 A B cached (4 computed); t=2 A B cached,
    # not C, which holds the last token (4 computed); t=4 A cached (4 computed). 20 cached, 20 computed: 0.2 s
    # over 1 worker x 4 s.
    single = round_robin_load(requests, 1, GPU)
    assert single.cached_tokens == 20
    assert single.load == pytest.approx(0.05)


def test_calibration_scales_the_rate_to_the_target_load() -> None:
    # Eight distinct 8-token prompts (no reuse), one every 1/scale seconds: 0.64 s of prefill over 7/scale s of
    # span on 2 workers, so the load is 0.64 * scale / 14, exactly proportional: one step reaches 0.2.
    prompts = [(tuple(range(1000 + 8 * i, 1008 + 8 * i)),) for i in range(8)]

    def make(scale: float) -> list[TimedRequest]:
        return [_request(i / scale, *prompt) for i, prompt in enumerate(prompts)]

    found = calibrate(make, 0.2, 2, GPU)
    assert [scale for scale, _ in found.passes] == pytest.approx([1.0, 0.2 * 14 / 0.64])
    assert found.passes[0][1] == pytest.approx(0.64 / 14)
    assert found.load.load == pytest.approx(0.2)
    assert len(found.requests) == 8
    with pytest.raises(ValueError, match="more than 0"):
        calibrate(make, 0.0, 2, GPU)

"""What one policy's run of a fleet workload measured, and the summary both runners print.

A run (offline on the virtual clock, `replay`, or live through `tokenfront route`, `__main__`) records one
`Outcome` per request sent and, per worker, the requests it was given and the modelled seconds its GPU was
busy. `summary` turns that into the fields `python -m benchmarks.fleet --json` prints for the policy:

- `requests` (sent), `errors` (no answer, or an answer that failed), `error_kinds` (errors by how they failed);
- `hit_rate`: cached prompt tokens (`usage.prompt_tokens_details.cached_tokens`) over prompt tokens, of the
  requests answered; `oracle_hit_rate` (`oracle.achievable_hit_rate` of the same requests for the fleet's total
  cache) and `achieved_over_oracle`, their ratio;
- `ttft_mean_ms`, `ttft_p50_ms`, `ttft_p99_ms`: time to first token in modelled milliseconds, from the moment
  the request was due (its `at`) to its first token, of the requests answered;
- `throughput_requests_per_s`, `output_tokens_per_s`: answers and their tokens over the modelled seconds from
  the start to the last answer's end;
- `max_worker_share`: the busiest worker's request count over the mean (1.0: perfectly even);
  `max_worker_busy_share`: the same for the modelled seconds each GPU spent in steps.

Rates are fractions; percentiles are numpy's (linear interpolation).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Outcome", "PolicyRun", "summary"]


@dataclass(frozen=True)
class Outcome:
    """One request's result: `ttft` in modelled seconds (None: it failed, and `error` says how), its prompt and
    cached tokens, the tokens it got, and when (modelled seconds from the run's start) its answer ended."""

    ttft: float | None
    prompt_tokens: int
    cached_tokens: int = 0
    output_tokens: int = 0
    ended_at: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the request was answered."""
        return self.ttft is not None


@dataclass
class PolicyRun:
    """Everything one policy's run recorded (see the module docstring); `extra` goes into the summary as is."""

    policy: str
    outcomes: list[Outcome]
    requests_per_worker: Sequence[int]
    busy_seconds_per_worker: Sequence[float]
    extra: dict[str, Any] = field(default_factory=dict)


def summary(run: PolicyRun, oracle_hit_rate: float) -> dict[str, Any]:
    """The policy's line of the report (module docstring), rounded for reading."""
    answered = [outcome for outcome in run.outcomes if outcome.ok]
    prompt = sum(outcome.prompt_tokens for outcome in answered)
    cached = sum(outcome.cached_tokens for outcome in answered)
    hit_rate = cached / prompt if prompt else 0.0
    ttfts = np.array([outcome.ttft for outcome in answered], np.float64) * 1000
    makespan = max((outcome.ended_at for outcome in answered), default=0.0)
    output = sum(outcome.output_tokens for outcome in answered)
    return {
        "requests": len(run.outcomes),
        "errors": len(run.outcomes) - len(answered),
        "hit_rate": round(hit_rate, 4),
        "oracle_hit_rate": round(oracle_hit_rate, 4),
        "achieved_over_oracle": round(hit_rate / oracle_hit_rate, 4) if oracle_hit_rate else None,
        "ttft_mean_ms": _ms(float(ttfts.mean())) if len(ttfts) else None,
        "ttft_p50_ms": _ms(float(np.percentile(ttfts, 50))) if len(ttfts) else None,
        "ttft_p99_ms": _ms(float(np.percentile(ttfts, 99))) if len(ttfts) else None,
        "throughput_requests_per_s": round(len(answered) / makespan, 2) if makespan else None,
        "output_tokens_per_s": round(output / makespan, 1) if makespan else None,
        "max_worker_share": _max_over_mean(run.requests_per_worker),
        "max_worker_busy_share": _max_over_mean(run.busy_seconds_per_worker),
        "error_kinds": dict(
            Counter(outcome.error or "unknown" for outcome in run.outcomes if not outcome.ok)
        ),
        **run.extra,
    }


def _ms(value: float) -> float:
    return round(value, 1)


def _max_over_mean(values: Sequence[float]) -> float | None:
    mean = sum(values) / len(values) if values else 0.0
    return round(max(values) / mean, 3) if mean else None

"""What a fleet run replays: the workload named on the command line, cut at a duration, at a scaled arrival rate.

`--workload agentic|groups|mooncake:FILE` names it (`WorkloadSpec.parse`):

- `agentic`: `workloads.AgenticSessions` with its defaults (one agent's 4-8k-token system prompt, 20-40 turns of
  1-3k tokens of tool output, think 3 s), sessions arriving at `session_rate` x the scale;
- `groups`: `workloads.SharedDocuments` with its defaults (16 groups of users sharing 8-32k-token documents),
  users arriving at `user_rate` x the scale;
- `mooncake:FILE`: a Mooncake trace (`mooncake.read_trace`, replayed with `mooncake.replay`), its timestamps
  divided by the scale.

`duration` keeps the requests sent in [0, duration) seconds (None: the whole workload: 100 agentic sessions,
200 users, the whole trace). For the generated workloads there are always enough sessions for arrivals to
run past the duration, so a faster rate means more sessions, not a shorter run. Each session's prompts and
think times do not depend on the rate (they come from generators seeded by the session's number, and the
arrival gaps are the same exponential draws divided by the rate): scaling the rate only brings sessions
closer together. So does scaling a trace, except that it also compresses the gaps within what Mooncake calls
a session.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.fleet.mooncake import read_trace, replay
from benchmarks.fleet.requests import TimedRequest
from benchmarks.fleet.workloads import AgenticSessions, SharedDocuments

__all__ = ["WORKLOADS", "WorkloadSpec"]

WORKLOADS = ("agentic", "groups", "mooncake:FILE")


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload by name, its seed and its duration (see the module docstring)."""

    kind: str  # "agentic", "groups" or "mooncake"
    seed: int = 0
    duration: float | None = None
    trace: Path | None = None

    @classmethod
    def parse(cls, text: str, *, seed: int = 0, duration: float | None = None) -> WorkloadSpec:
        """`agentic`, `groups` or `mooncake:FILE`; ValueError naming the choices for anything else, a trace
        file that does not exist, or a duration that is not positive."""
        if duration is not None and not (duration > 0 and math.isfinite(duration)):
            raise ValueError(f"the duration must be a positive number of seconds, not {duration}")
        kind, _, trace = text.partition(":")
        if kind in ("agentic", "groups") and not trace:
            return cls(kind, seed, duration)
        if kind == "mooncake" and trace:
            path = Path(trace)
            if not path.is_file():
                raise ValueError(f"the Mooncake trace {trace} is not a file")
            return cls(kind, seed, duration, path)
        raise ValueError(f"unknown workload {text!r}: choose one of {', '.join(WORKLOADS)}")

    def requests(self, rate_scale: float = 1.0) -> list[TimedRequest]:
        """The workload's requests in the order of their `at`, arrivals `rate_scale` times as frequent as the
        workload's default, cut at the duration."""
        if not rate_scale > 0:
            raise ValueError(f"the rate scale must be more than 0, not {rate_scale}")
        if self.kind == "mooncake":
            assert self.trace is not None
            requests: Iterable[TimedRequest] = (
                dataclasses.replace(request, at=request.at / rate_scale)
                for request in replay(read_trace(self.trace), seed=self.seed)
            )
        elif self.kind == "agentic":
            base = AgenticSessions(seed=self.seed)
            rate = base.session_rate * rate_scale
            requests = dataclasses.replace(
                base, session_rate=rate, sessions=self._arrivals(base.sessions, rate)
            ).requests()
        else:
            documents = SharedDocuments(seed=self.seed)
            rate = documents.user_rate * rate_scale
            requests = dataclasses.replace(
                documents, user_rate=rate, users=self._arrivals(documents.users, rate)
            ).requests()
        if self.duration is None:
            return list(requests)
        duration = self.duration
        return list(itertools.takewhile(lambda request: request.at < duration, requests))

    def _arrivals(self, default: int, rate: float) -> int:
        """Sessions enough for Poisson arrivals at `rate` to pass the duration (the mean plus eight standard
        deviations: the last arrival falls short with odds far below one in a million), else `default`."""
        if self.duration is None:
            return default
        mean = rate * self.duration
        return math.ceil(mean + 8 * math.sqrt(mean) + 8)

"""load_balancing: the worker with the fewest requests in flight."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenfront.router.policies.base import FairChooser, Policy, RouteRequest, WorkerLoad


class LoadBalancingPolicy(Policy):
    """Pick the least loaded candidate (``active_requests``); equally loaded ones take turns."""

    name = "load_balancing"

    def __init__(self) -> None:
        self._chooser = FairChooser()
        self._last: dict[str, Any] = {}

    def select(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> WorkerLoad:
        fewest = min(worker.active_requests for worker in candidates)
        tied = [worker for worker in candidates if worker.active_requests == fewest]
        chosen = self._chooser.choose(tied, candidates)
        self._last = {
            "policy": self.name,
            "chosen": chosen.url,
            "active_requests": {worker.url: worker.active_requests for worker in candidates},
        }
        return chosen

    def explain(self) -> dict[str, Any]:
        return dict(self._last)

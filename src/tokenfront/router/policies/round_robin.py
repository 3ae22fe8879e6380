"""round_robin: every worker in turn, whatever it holds or how busy it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenfront.router.policies.base import FairChooser, Policy, RouteRequest, WorkerLoad


class RoundRobinPolicy(Policy):
    """Rotate over the candidates.

    The rotation is "least recently chosen", not an index into the list, so it stays fair while workers join
    and leave: a new worker is next, a returning one takes its old turn.
    """

    name = "round_robin"

    def __init__(self) -> None:
        self._chooser = FairChooser()
        self._last: dict[str, Any] = {}

    def select(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> WorkerLoad:
        chosen = self._chooser.choose(candidates, candidates)
        self._last = {"policy": self.name, "chosen": chosen.url, "candidates": [w.url for w in candidates]}
        return chosen

    def explain(self) -> dict[str, Any]:
        return dict(self._last)

"""The metrics of routing: how long decisions take, what the policy predicted, what the workers achieved.

- ``tokenfront_router_decision_seconds``: one routing decision — the policy's ``route`` and its ``on_routed``
  (hashing, the index walk, scoring, the bookkeeping), once per attempt (a retry is a decision too).
- ``tokenfront_router_prompt_matched_share``: per decision, the share of the prompt's tokens the chosen worker
  is predicted to hold in its prefix cache (decisions of a policy that predicts, on a prompt with ids).
- ``tokenfront_router_predicted_cached_tokens`` / ``_achieved_cached_tokens`` / ``_answered_prompt_tokens``:
  over the same answers — those whose usage carries ``prompt_tokens_details.cached_tokens``, of a policy that
  predicts — the tokens the policy predicted cached, the tokens the worker says it found cached, and the
  answers' prompt tokens. So achieved / predicted is the index's accuracy and achieved / prompt the hit rate,
  honestly: an answer without usage (a stream without ``include_usage``, vLLM without prompt token details)
  counts in none of the three.
- ``tokenfront_router_worker_predicted_load{worker,quantity}``: the policy's view of each worker's load, read
  at scrape time (``Policy.predicted_load``: pending prefill tokens and seconds for predicted_ttft, requests in
  flight for the others); GET /workers shows the same per worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenfront.router.policies.base import Policy, RouteRequest, Routing

if TYPE_CHECKING:
    from tokenfront.router.worker import Worker
    from tokenfront.router.worker_pool import WorkerPool

__all__ = ["RoutingMetrics", "answer_usage"]

# A decision at 1,000 workers is well under a millisecond (docs/benchmarks.md, "KV index"): fine buckets there.
_DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1)
_SHARE_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class RoutingMetrics:
    """The routing metrics (module docstring), in the app's registry; the load gauge shows ``pool``'s workers."""

    def __init__(
        self,
        registry: CollectorRegistry,
        policy: Policy,
        pool: WorkerPool,
        policy_of: Callable[[Worker], Policy | None] | None = None,
    ) -> None:
        """`policy_of`: the policy that routes to a worker, on a router of several models (each model has its
        own); None: `policy` routes to every worker."""
        self.decision_seconds = Histogram(
            "tokenfront_router_decision_seconds",
            "Time of one routing decision: the policy's choice and its on_routed bookkeeping",
            registry=registry,
            buckets=_DECISION_BUCKETS,
        )
        self.matched_share = Histogram(
            "tokenfront_router_prompt_matched_share",
            "Share of each prompt's tokens the chosen worker is predicted to hold cached",
            registry=registry,
            buckets=_SHARE_BUCKETS,
        )
        self.predicted_cached = Counter(
            "tokenfront_router_predicted_cached_tokens",
            "Prompt tokens the policy predicted cached on the chosen worker, over answers that report cached tokens",
            registry=registry,
        )
        self.achieved_cached = Counter(
            "tokenfront_router_achieved_cached_tokens",
            "Prompt tokens the workers' answers report cached (usage.prompt_tokens_details.cached_tokens)",
            registry=registry,
        )
        self.answered_prompt = Counter(
            "tokenfront_router_answered_prompt_tokens",
            "Prompt tokens of the answers counted in the predicted and achieved cached tokens",
            registry=registry,
        )
        registry.register(_PredictedLoad(policy_of or (lambda _: policy), pool))

    def decided(self, routing: Routing, request: RouteRequest, seconds: float) -> None:
        """Count one decision that took ``seconds``."""
        self.decision_seconds.observe(seconds)
        prompt_tokens = len(request.token_ids or ())
        if routing.predicted_cached_tokens is not None and prompt_tokens:
            self.matched_share.observe(min(routing.predicted_cached_tokens / prompt_tokens, 1.0))

    def answered(self, routing: Routing, request: RouteRequest, usage: Any) -> None:
        """Count one answer's cached tokens against the prediction (nothing without a prediction or without
        cached tokens in ``usage``, the answer's usage object)."""
        if routing.predicted_cached_tokens is None or not isinstance(usage, dict):
            return
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if not _count(cached):
            return
        prompt = usage.get("prompt_tokens")
        prompt_tokens = prompt if _count(prompt) else len(request.token_ids or ())
        assert isinstance(cached, int) and isinstance(prompt_tokens, int)
        self.predicted_cached.inc(routing.predicted_cached_tokens)
        self.achieved_cached.inc(cached)
        self.answered_prompt.inc(prompt_tokens)


def answer_usage(payload: Any) -> Any:
    """The usage object of a parsed answer or stream event (None when it has none)."""
    return payload.get("usage") if isinstance(payload, dict) else None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _PredictedLoad(Collector):
    """``tokenfront_router_worker_predicted_load``, read from the policy when scraped (never stale, and a
    worker that left is gone)."""

    def __init__(self, policy_of: Callable[[Worker], Policy | None], pool: WorkerPool) -> None:
        self._policy_of = policy_of
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "tokenfront_router_worker_predicted_load",
            "The routing policy's predicted load of each worker, by quantity",
            labels=["worker", "quantity"],
        )
        for worker in list(self._pool.workers.values()):
            policy = self._policy_of(worker)
            if policy is None:
                continue  # a worker of no model of the router's: no policy routes to it
            load = worker.load()
            for quantity, value in policy.predicted_load(load).items():
                family.add_metric([load.url, quantity], value)
        yield family

"""Routing policies (docs/contract.md §8): one module each behind ``Policy``, built by name with ``build_policy``.

Adding a policy: a new module with a ``Policy`` subclass, and one line in ``POLICIES``.
"""

from __future__ import annotations

from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies.base import (
    FairChooser,
    Policy,
    PolicyConfig,
    RouteRequest,
    Routing,
    WorkerLoad,
)
from tokenfront.router.policies.kv_cache_aware import KvCacheAwarePolicy
from tokenfront.router.policies.load_balancing import LoadBalancingPolicy
from tokenfront.router.policies.predicted_ttft import PredictedTtftConfig, PredictedTtftPolicy
from tokenfront.router.policies.round_robin import RoundRobinPolicy

POLICIES: dict[str, type[Policy]] = {
    KvCacheAwarePolicy.name: KvCacheAwarePolicy,
    LoadBalancingPolicy.name: LoadBalancingPolicy,
    PredictedTtftPolicy.name: PredictedTtftPolicy,
    RoundRobinPolicy.name: RoundRobinPolicy,
}

DEFAULT_POLICY = PredictedTtftPolicy.name


def build_policy(
    name: str,
    *,
    kv_index: KvIndex,
    load_weight: float = 1.0,
    default_tokens_per_block: int = 16,
    cache_threshold: float = 0.5,
    options: tuple[object, ...] = (),
) -> Policy:
    """Build the policy called ``name``; ``ValueError`` naming the known policies when there is none.

    ``options``: policies' own settings dataclasses (e.g. ``PredictedTtftConfig``); each takes its own.
    """
    policy_class = POLICIES.get(name)
    if policy_class is None:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown routing policy {name!r}: choose one of {known}")
    config = PolicyConfig(
        kv_index=kv_index,
        load_weight=load_weight,
        default_tokens_per_block=default_tokens_per_block,
        cache_threshold=cache_threshold,
        options=options,
    )
    return policy_class.from_config(config)


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "FairChooser",
    "KvCacheAwarePolicy",
    "LoadBalancingPolicy",
    "Policy",
    "PolicyConfig",
    "PredictedTtftConfig",
    "PredictedTtftPolicy",
    "RoundRobinPolicy",
    "RouteRequest",
    "Routing",
    "WorkerLoad",
    "build_policy",
]

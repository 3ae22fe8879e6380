"""kv_cache_aware: send a request where its prompt's prefix is already cached, unless busy.

For each candidate, ``prefix_match`` cuts the prompt's ids into blocks of that worker's ``tokens_per_block``
(from its /server_info, else from its KV events, else ``default_tokens_per_block``: vLLM's default block
size) named by ``core.kv_blocks`` hashes (``cache_salt`` in the root); ``KvIndex`` says how many leading
blocks the worker holds. Then

    score = matched_blocks - load_weight * active_requests

and the highest score wins; equal scores take turns (``FairChooser``). When workers use different block
sizes, matched blocks are counted in blocks of the smallest size, so a cached token weighs the same
everywhere. A request without ids (rendering failed) matches nothing: the choice is by load alone.

Why ``load_weight = 1.0`` by default: one in-flight request costs as much as one cached block saves. A
prefix advantage of k blocks then holds until the caching worker has k more requests in flight than the
next one: a long shared prefix (a system prompt of a few hundred tokens is tens of blocks) keeps its
worker under moderate imbalance, while a chance match of a block or two never piles requests onto a busy
worker. Raise it when answers are long compared with prompts (decode time dominates, balance matters
more); lower it for long prompts with short answers (prefill dominates, cache hits matter more).

Affinity needs a real share of the prompt: when the best worker holds less than ``cache_threshold`` of the
prompt's tokens (default 0.5, SGLang's rule), cached blocks are ignored and the choice is by load alone
(ties in turn). Otherwise every new conversation would follow the first worker that cached the template's
shared opening (a default system prompt is a block or two), and sequential traffic would never spread.

Once a request is sent, ``on_routed`` records its blocks as held by that worker, so the next request with
the same prefix follows it even before the worker's events confirm it.

Cost: the prompt is hashed once per block size in use, and the index answers every candidate of that size in
one walk (``prefix_match``); scores are numpy arrays, and ``explain`` builds its per-worker rows only
when asked. A decision at 1,000 workers costs little more than at 10 (docs/benchmarks.md, "KV index").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, TypeVar

import numpy as np

from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies.base import (
    FairChooser,
    Policy,
    PolicyConfig,
    RouteRequest,
    Routing,
    WorkerLoad,
    explain_rows,
)
from tokenfront.router.policies.prefix_match import (
    SCALAR_CANDIDATES,
    PrefixMatch,
    match_prefix,
    record_routed,
)

__all__ = ["KvCacheAwarePolicy"]

# Scores are sums of fractions and float weights: equal within this counts as a tie.
_TIE_EPSILON = 1e-9
_active_requests = attrgetter("active_requests")
# A per-candidate column: an array, or one candidate's number (``SCALAR_CANDIDATES``).
_Column = TypeVar("_Column", float, np.ndarray)


@dataclass(frozen=True)
class _Decision:
    """One select's inputs and scores, kept as arrays: ``explain`` turns them into rows only when asked."""

    chosen: str
    tied: list[str]
    prompt_tokens: int | None
    best_share: float
    affinity: bool
    urls: list[str]
    matched: np.ndarray
    sizes: np.ndarray
    active: list[int] | np.ndarray  # lists up to SCALAR_CANDIDATES candidates
    scores: list[float] | np.ndarray


class KvCacheAwarePolicy(Policy):
    """Longest cached prefix minus a load penalty; ties taken in turn."""

    name = "kv_cache_aware"

    def __init__(
        self,
        kv_index: KvIndex,
        *,
        load_weight: float = 1.0,
        default_tokens_per_block: int = 16,
        cache_threshold: float = 0.5,
    ) -> None:
        if load_weight < 0:
            raise ValueError("load_weight must not be negative")
        if not 0 <= cache_threshold <= 1:
            raise ValueError("cache_threshold must be between 0 and 1")
        self.cache_threshold = cache_threshold
        if default_tokens_per_block < 1:
            raise ValueError("default_tokens_per_block must be at least 1")
        self.kv_index = kv_index
        self.load_weight = load_weight
        self.default_tokens_per_block = default_tokens_per_block
        self._chooser = FairChooser()
        # The last select's match, with its request's block names per block size: on_routed reuses them.
        self._match: PrefixMatch | None = None
        self._last: _Decision | None = None

    @classmethod
    def from_config(cls, config: PolicyConfig) -> KvCacheAwarePolicy:
        return cls(
            config.kv_index,
            load_weight=config.load_weight,
            default_tokens_per_block=config.default_tokens_per_block,
            cache_threshold=config.cache_threshold,
        )

    def select(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> WorkerLoad:
        return self.route(candidates, request).worker

    def route(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> Routing:
        match = match_prefix(
            self.kv_index, candidates, request, self.default_tokens_per_block, previous=self._match
        )
        affinity = match.has_affinity(self.cache_threshold)
        # Matched blocks are counted in blocks of the smallest size, so a cached token weighs the same anywhere.
        unit = match.smallest_block
        active: list[int] | np.ndarray
        scores: list[float] | np.ndarray
        if len(candidates) <= SCALAR_CANDIDATES:  # the same scores on Python numbers (prefix_match docstring)
            active = list(map(_active_requests, candidates))
            cached = (
                [tokens / unit for tokens in match.cached_tokens.tolist()]
                if affinity
                else [0.0] * len(active)
            )
            scores = [self._score(blocks, requests) for blocks, requests in zip(cached, active, strict=True)]
            best = max(scores)
            tied_positions = [i for i, score in enumerate(scores) if score >= best - _TIE_EPSILON]
        else:
            active = np.fromiter(map(_active_requests, candidates), np.float64, len(candidates))
            scores = self._score(
                match.cached_tokens / unit if affinity else np.zeros(len(candidates)), active
            )
            tied_positions = (scores >= scores.max() - _TIE_EPSILON).nonzero()[0].tolist()
        tied = [candidates[i] for i in tied_positions]
        chosen = self._chooser.choose(tied, candidates)
        self._match = match
        self._last = _Decision(
            chosen=chosen.url,
            tied=[worker.url for worker in tied],
            prompt_tokens=len(request.token_ids) if request.token_ids is not None else None,
            best_share=match.best_share,
            affinity=affinity,
            urls=match.urls,
            matched=match.matched,
            sizes=match.sizes,
            active=active,
            scores=scores,
        )
        position = tied_positions[next(i for i, worker in enumerate(tied) if worker is chosen)]
        return Routing(chosen, match.cached_tokens.item(position))

    def _score(self, cached_blocks: _Column, active_requests: _Column) -> _Column:
        """The score of each candidate (arrays) or of one (numbers): one formula for both."""
        return cached_blocks - self.load_weight * active_requests  # type: ignore[operator, return-value]

    def on_routed(self, worker: WorkerLoad, request: RouteRequest) -> None:
        """Credit the worker with the request's blocks until its own events say otherwise."""
        record_routed(self.kv_index, self._match, worker, request, self.default_tokens_per_block)

    def explain(self) -> dict[str, Any]:
        last = self._last
        if last is None:
            return {}
        return {
            "policy": self.name,
            "chosen": last.chosen,
            "tied": list(last.tied),
            "prompt_tokens": last.prompt_tokens,
            "load_weight": self.load_weight,
            "cache_threshold": self.cache_threshold,
            "best_cached_share": last.best_share,
            "affinity": last.affinity,
            "workers": explain_rows(
                last.urls,
                matched_blocks=last.matched,
                tokens_per_block=last.sizes,
                active_requests=np.asarray(last.active).astype(np.int64),
                score=last.scores,
            ),
        }

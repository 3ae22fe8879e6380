"""kv_cache_aware (the default): send a request where its prompt's prefix is already cached, unless busy.

For each candidate, the prompt's ids are cut into blocks of that worker's ``tokens_per_block`` (from its
/server_info, else from its KV events, else ``default_tokens_per_block``: vLLM's default block size) and
named by ``core.kv_blocks`` hashes (``cache_salt`` in the root); ``KvIndex`` says how many leading blocks the
worker holds. Then

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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenfront.core.kv_blocks import block_hashes
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies.base import FairChooser, Policy, PolicyConfig, RouteRequest, WorkerLoad

# Scores are sums of fractions and float weights: equal within this counts as a tie.
_TIE_EPSILON = 1e-9


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
        # The last select's request and its block names per block size: on_routed reuses them.
        self._hashed: tuple[RouteRequest, dict[int, list[int]]] | None = None
        self._last: dict[str, Any] = {}

    @classmethod
    def from_config(cls, config: PolicyConfig) -> KvCacheAwarePolicy:
        return cls(
            config.kv_index,
            load_weight=config.load_weight,
            default_tokens_per_block=config.default_tokens_per_block,
            cache_threshold=config.cache_threshold,
        )

    def select(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> WorkerLoad:
        sizes = {worker.url: self._tokens_per_block(worker) for worker in candidates}
        unit = min(sizes.values())
        hashed = self._hash(request, set(sizes.values()))
        rows: dict[str, dict[str, Any]] = {}
        matches = {
            worker.url: self.kv_index.match_hashes(worker.url, hashed[sizes[worker.url]]) if hashed else 0
            for worker in candidates
        }
        prompt_tokens = len(request.token_ids or ())
        best_share = (
            max(matches[w.url] * sizes[w.url] for w in candidates) / prompt_tokens if prompt_tokens else 0.0
        )
        # Below the threshold a match is the template's common opening, not this conversation: load decides.
        affinity = best_share >= self.cache_threshold and best_share > 0
        scores: list[float] = []
        for worker in candidates:
            size = sizes[worker.url]
            matched = matches[worker.url]
            cached = matched * size / unit if affinity else 0.0
            score = cached - self.load_weight * worker.active_requests
            scores.append(score)
            rows[worker.url] = {
                "matched_blocks": matched,
                "tokens_per_block": size,
                "active_requests": worker.active_requests,
                "score": score,
            }
        best = max(scores)
        tied = [
            worker for worker, score in zip(candidates, scores, strict=True) if score >= best - _TIE_EPSILON
        ]
        chosen = self._chooser.choose(tied, candidates)
        self._hashed = (request, hashed)
        self._last = {
            "policy": self.name,
            "chosen": chosen.url,
            "tied": [worker.url for worker in tied],
            "prompt_tokens": len(request.token_ids) if request.token_ids is not None else None,
            "load_weight": self.load_weight,
            "cache_threshold": self.cache_threshold,
            "best_cached_share": best_share,
            "affinity": affinity,
            "workers": rows,
        }
        return chosen

    def on_routed(self, worker: WorkerLoad, request: RouteRequest) -> None:
        """Credit the worker with the request's blocks until its own events say otherwise."""
        if request.token_ids is None:
            return
        size = self._tokens_per_block(worker)
        last = self._hashed
        hashes = last[1].get(size) if last is not None and last[0] is request else None
        if hashes is None:
            hashes = block_hashes(request.token_ids, size, request.cache_salt)
        self.kv_index.record_routed_hashes(worker.url, hashes)

    def explain(self) -> dict[str, Any]:
        return dict(self._last)

    def _tokens_per_block(self, worker: WorkerLoad) -> int:
        return (
            worker.tokens_per_block
            or self.kv_index.tokens_per_block(worker.url)
            or self.default_tokens_per_block
        )

    @staticmethod
    def _hash(request: RouteRequest, sizes: set[int]) -> dict[int, list[int]]:
        """The prompt's block names for each block size in use (hashed once, shared by the workers)."""
        if request.token_ids is None:
            return {}
        return {size: block_hashes(request.token_ids, size, request.cache_salt) for size in sizes}

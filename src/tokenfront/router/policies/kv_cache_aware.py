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

Cost: the prompt is hashed once per block size in use, and the index answers every candidate of that size in
one walk (``KvIndex.matched_blocks``); scores are numpy arrays, and ``explain`` builds its per-worker rows only
when asked. A decision at 1,000 workers costs little more than at 10 (docs/benchmarks.md, "KV index").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from tokenfront.core.kv_blocks import block_hash_array
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies.base import FairChooser, Policy, PolicyConfig, RouteRequest, WorkerLoad

__all__ = ["KvCacheAwarePolicy"]

# Scores are sums of fractions and float weights: equal within this counts as a tie.
_TIE_EPSILON = 1e-9
_url = attrgetter("url")
_tokens_per_block = attrgetter("tokens_per_block")
_active_requests = attrgetter("active_requests")


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
    active: np.ndarray
    scores: np.ndarray


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
        self._hashed: tuple[RouteRequest, dict[int, np.ndarray]] | None = None
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
        # Per-candidate work in C (map, attrgetter): this runs for every candidate of every request.
        urls = list(map(_url, candidates))
        sizes = list(map(_tokens_per_block, candidates))
        distinct_sizes = set(sizes)
        if None in distinct_sizes:  # no size from /server_info: the one learned from events, or the default
            sizes = [
                size or self._tokens_per_block(worker) for size, worker in zip(sizes, candidates, strict=True)
            ]
            distinct_sizes = set(sizes)
        hashed = self._hash(request, distinct_sizes)
        block_sizes: np.ndarray | int
        if len(distinct_sizes) == 1:  # the usual fleet: one block size, one walk for every worker
            (size,) = distinct_sizes
            block_sizes = size
            matched = self.kv_index.matched_blocks(urls, hashed[size]) if hashed else np.zeros(len(urls), int)
        else:  # one walk per block size, each for the workers of that size
            block_sizes = np.array(sizes, np.int64)
            matched = np.zeros(len(candidates), np.int64)
            for size, hashes in hashed.items():
                of_size = np.flatnonzero(block_sizes == size)
                matched[of_size] = self.kv_index.matched_blocks([urls[i] for i in of_size.tolist()], hashes)
        cached_tokens = matched * block_sizes
        prompt_tokens = len(request.token_ids or ())
        best_share = float(cached_tokens.max()) / prompt_tokens if prompt_tokens else 0.0
        # Below the threshold a match is the template's common opening, not this conversation: load decides.
        affinity = best_share >= self.cache_threshold and best_share > 0
        # Matched blocks are counted in blocks of the smallest size, so a cached token weighs the same anywhere.
        cached = cached_tokens / min(distinct_sizes) if affinity else np.zeros(len(candidates))
        active = np.fromiter(map(_active_requests, candidates), np.float64, len(candidates))
        scores = cached - self.load_weight * active
        tied_positions = np.flatnonzero(scores >= scores.max() - _TIE_EPSILON).tolist()
        tied = [candidates[i] for i in tied_positions]
        chosen = self._chooser.choose(tied, candidates)
        self._hashed = (request, hashed)
        self._last = _Decision(
            chosen=chosen.url,
            tied=[worker.url for worker in tied],
            prompt_tokens=len(request.token_ids) if request.token_ids is not None else None,
            best_share=best_share,
            affinity=affinity,
            urls=urls,
            matched=matched,
            sizes=np.broadcast_to(block_sizes, len(urls)),
            active=active,
            scores=scores,
        )
        return chosen

    def on_routed(self, worker: WorkerLoad, request: RouteRequest) -> None:
        """Credit the worker with the request's blocks until its own events say otherwise."""
        if request.token_ids is None:
            return
        size = self._tokens_per_block(worker)
        last = self._hashed
        hashes = last[1].get(size) if last is not None and last[0] is request else None
        if hashes is None:
            hashes = _hash_array(request, size)
        self.kv_index.record_routed_hashes(worker.url, hashes)

    def explain(self) -> dict[str, Any]:
        last = self._last
        if last is None:
            return {}
        rows = zip(
            last.urls,
            last.matched.tolist(),
            last.sizes.tolist(),
            last.active.tolist(),
            last.scores.tolist(),
            strict=True,
        )
        return {
            "policy": self.name,
            "chosen": last.chosen,
            "tied": list(last.tied),
            "prompt_tokens": last.prompt_tokens,
            "load_weight": self.load_weight,
            "cache_threshold": self.cache_threshold,
            "best_cached_share": last.best_share,
            "affinity": last.affinity,
            "workers": {
                url: {
                    "matched_blocks": matched,
                    "tokens_per_block": size,
                    "active_requests": int(active),
                    "score": score,
                }
                for url, matched, size, active, score in rows
            },
        }

    def _tokens_per_block(self, worker: WorkerLoad) -> int:
        return (
            worker.tokens_per_block
            or self.kv_index.tokens_per_block(worker.url)
            or self.default_tokens_per_block
        )

    @staticmethod
    def _hash(request: RouteRequest, sizes: set[int]) -> dict[int, np.ndarray]:
        """The prompt's block names for each block size in use (hashed once, shared by the workers)."""
        if request.token_ids is None:
            return {}
        return {size: _hash_array(request, size) for size in sizes}


def _hash_array(request: RouteRequest, tokens_per_block: int) -> np.ndarray:
    assert request.token_ids is not None
    return np.frombuffer(block_hash_array(request.token_ids, tokens_per_block, request.cache_salt), np.uint64)

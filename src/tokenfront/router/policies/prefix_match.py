"""How much of a prompt each candidate worker holds: the prefix matching that KV-aware policies share.

Each candidate's prompt is cut into blocks of that worker's ``tokens_per_block`` (from its /server_info,
else from its KV events, else the policy's default: vLLM's 16) and named by ``core.kv_blocks`` hashes
(``cache_salt`` in the root). The prompt is hashed once per block size in use, and ``KvIndex`` answers every
candidate of a size in one walk (``KvIndex.matched_blocks``), so a decision at 1,000 workers costs little
more than at 10. The hashes are kept in the answer: ``on_routed`` records them without hashing again.

A policy's per-candidate arithmetic runs on numpy columns for a fleet, but each numpy call costs about a
microsecond whatever its length: with at most ``SCALAR_CANDIDATES`` candidates the policy applies the same
formula (one function, written for either) to each candidate's Python numbers instead, which gives the same
floats (IEEE doubles both ways, the same operations in the same order) and so the same choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from tokenfront.core.kv_blocks import block_hash_array
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies.base import RouteRequest, WorkerLoad

__all__ = [
    "SCALAR_CANDIDATES",
    "PrefixMatch",
    "block_names",
    "match_prefix",
    "record_routed",
    "tokens_per_block",
]

# Up to this many candidates a decision's per-candidate arithmetic is done on Python numbers, not numpy arrays
# (module docstring): measured (predicted_ttft, one-block prompts), the loop is cheaper up to about 16.
SCALAR_CANDIDATES = 16

_url = attrgetter("url")
_tokens_per_block = attrgetter("tokens_per_block")


@dataclass(frozen=True)
class PrefixMatch:
    """One prompt matched against every candidate, arrays in candidate order."""

    request: RouteRequest
    candidates: Sequence[WorkerLoad]  # as given: the next match reuses ``urls`` when they are the same
    urls: list[str]
    sizes: np.ndarray  # tokens per block of each candidate (a read-only broadcast when they are all equal)
    matched: np.ndarray  # leading blocks of the prompt each candidate holds
    cached_tokens: np.ndarray  # matched * sizes: prompt tokens each candidate is predicted to have cached
    smallest_block: int  # the smallest block size among the candidates
    hashes: Mapping[int, np.ndarray]  # the prompt's block names per block size ({} without ids)
    best_cached_tokens: int  # the largest of ``cached_tokens`` (0 without candidates)

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens (0 without ids)."""
        return len(self.request.token_ids or ())

    @property
    def best_share(self) -> float:
        """The largest share of the prompt's tokens any candidate holds (0 without ids)."""
        prompt_tokens = self.prompt_tokens
        return self.best_cached_tokens / prompt_tokens if prompt_tokens else 0.0

    def has_affinity(self, threshold: float) -> bool:
        """Whether some candidate holds at least ``threshold`` of the prompt (and any of it): below that a match
        is a shared opening (a template's, an agent's system prompt), not this conversation, and load decides."""
        best_share = self.best_share
        return best_share >= threshold and best_share > 0

    def private_tokens(self) -> np.ndarray:
        """Per candidate, the cached tokens of the prompt no other candidate holds: the longest match's lead
        over the second longest, for the one candidate holding it; 0 for every other (and for a tie)."""
        cached = self.cached_tokens
        private = np.zeros(len(cached), np.int64)
        lead = self.private_lead()
        if lead is not None:
            private[lead[0]] = lead[1]
        return private

    def private_lead(self) -> tuple[int, int] | None:
        """``private_tokens``' one non-zero entry, ``(position, tokens)``; None when there is none."""
        cached, best = self.cached_tokens, self.best_cached_tokens
        if not best:
            return None
        if len(cached) == 1:
            return 0, best
        if len(cached) <= SCALAR_CANDIDATES:
            values = cached.tolist()
            position = values.index(best)
            values[position] = -1
            second = max(values)
        else:
            position = int(cached.argmax())
            second = int(np.partition(cached, -2)[-2])
        return (position, best - second) if best > second else None

    def hashes_for(self, request: RouteRequest, size: int) -> np.ndarray:
        """The block names of ``request`` in blocks of ``size``: the kept ones when it is this match's request."""
        kept = self.hashes.get(size) if request is self.request else None
        return kept if kept is not None else block_names(request, size)


def tokens_per_block(kv_index: KvIndex, worker: WorkerLoad, default: int) -> int:
    """The worker's block size: from its /server_info, else learned from its KV events, else ``default``."""
    return worker.tokens_per_block or kv_index.tokens_per_block(worker.url) or default


def match_prefix(
    kv_index: KvIndex,
    candidates: Sequence[WorkerLoad],
    request: RouteRequest,
    default_tokens_per_block: int,
    previous: PrefixMatch | None = None,
) -> PrefixMatch:
    """Match ``request``'s prompt against every one of ``candidates`` (a request without ids matches nothing).

    ``previous``: the policy's last match, whose candidates' urls are reused when the candidates are the same.
    """
    # Per-candidate work in C (map, attrgetter): this runs for every candidate of every request. The urls are
    # the previous match's when the candidates compare equal: the router hands the same WorkerLoad objects
    # each time (compared by identity first, a pointer a candidate) and equal loads have equal urls, where
    # reading 1,000 objects' urls again costs ~25 us.
    if previous is not None and previous.candidates == candidates:
        urls = previous.urls
    else:
        urls = list(map(_url, candidates))
    sizes = list(map(_tokens_per_block, candidates))
    distinct_sizes = set(sizes)
    if None in distinct_sizes:  # no size from /server_info: the one learned from events, or the default
        sizes = [
            size or tokens_per_block(kv_index, worker, default_tokens_per_block)
            for size, worker in zip(sizes, candidates, strict=True)
        ]
        distinct_sizes = set(sizes)
    hashes = (
        {size: block_names(request, size) for size in distinct_sizes} if request.token_ids is not None else {}
    )
    block_sizes: np.ndarray | int
    if len(distinct_sizes) == 1:  # the usual fleet: one block size, one walk for every worker
        (size,) = distinct_sizes
        block_sizes = size
        matched = kv_index.matched_blocks(urls, hashes[size]) if hashes else np.zeros(len(urls), np.int64)
    else:  # one walk per block size, each for the workers of that size
        block_sizes = np.array(sizes, np.int64)
        matched = np.zeros(len(candidates), np.int64)
        for size, names in hashes.items():
            of_size = np.flatnonzero(block_sizes == size)
            matched[of_size] = kv_index.matched_blocks([urls[i] for i in of_size.tolist()], names)
    cached_tokens = matched * block_sizes
    return PrefixMatch(
        request=request,
        candidates=candidates,
        urls=urls,
        sizes=np.full(len(urls), block_sizes, np.int64) if isinstance(block_sizes, int) else block_sizes,
        matched=matched,
        cached_tokens=cached_tokens,
        smallest_block=min(distinct_sizes),
        hashes=hashes,
        best_cached_tokens=int(cached_tokens.max()) if len(cached_tokens) else 0,
    )


def record_routed(
    kv_index: KvIndex, match: PrefixMatch | None, worker: WorkerLoad, request: RouteRequest, default: int
) -> np.ndarray | None:
    """Credit ``worker`` with ``request``'s blocks until its own events say otherwise (``match``: the last
    select's, whose hashes are reused when it was this request's); the block names recorded (None without
    ids)."""
    if request.token_ids is None:
        return None
    size = tokens_per_block(kv_index, worker, default)
    hashes = match.hashes_for(request, size) if match is not None else block_names(request, size)
    kv_index.record_routed_hashes(worker.url, hashes)
    return hashes


def block_names(request: RouteRequest, size: int) -> np.ndarray:
    """The prompt's block hashes in blocks of ``size`` tokens, as uint64 (``request`` must have ids)."""
    assert request.token_ids is not None
    return np.frombuffer(block_hash_array(request.token_ids, size, request.cache_salt), np.uint64)

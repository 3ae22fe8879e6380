"""The oracle: the prefix-cache hit rate a request sequence allows, for a fleet that holds so many blocks.

What it counts, exactly. The requests are taken in the order given (a workload's order of `at`). A request's
prompt is cut into full blocks of `tokens_per_block` ids, named by tokenfront's chained block hashes
(`core.kv_blocks.block_hashes`, as the workers and the router name them). Its hit is its longest run of leading
full blocks, of the prompt without its last token, that are held when it arrives — the count a tokenfront
worker reports as `cached_tokens` (it always computes the last prompt token). Then every full block of the
prompt is held. The hit rate is the hit tokens over all prompt tokens.

What "held" means: the whole fleet as one cache of `capacity_blocks` blocks — for a fleet, the sum of its
workers' caches, `fleet_cache_blocks(workers, kv_cache_max_tokens, tokens_per_block)` = workers x
floor(kv_cache_max_tokens / tokens_per_block) — least recently used blocks out first, leaves before their
parents, exactly as a simulated worker's cache keeps blocks (the same `worker.prefix_index.PrefixBlockIndex`).
`capacity_blocks` None holds everything ever sent: the share of the prompts sent before.

So it is what a perfect router could reach with the fleet's memory pooled and no block held twice: an upper
bound for a real fleet, which keeps a hot prefix on several workers and cannot hold one conversation in two
places. It is not a proof of optimality — a cache that knew the future could evict better than LRU — and it
ignores time: a request counts as cached even when the request that sent its prefix is still prefilling.
Generated ids are not counted (a workload's next prompt carries its own answer ids, see `workloads`). It is a
pure function of the prompts and the capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from benchmarks.fleet.requests import TimedRequest
from tokenfront.core.kv_blocks import block_hashes
from tokenfront.worker.prefix_index import PrefixBlockIndex

__all__ = ["HitOracle", "OracleResult", "achievable_hit_rate", "fleet_cache_blocks"]

# `capacity_blocks` None: a cache no workload fills.
_UNBOUNDED_BLOCKS = 1 << 62


def fleet_cache_blocks(workers: int, kv_cache_max_tokens: int, tokens_per_block: int) -> int:
    """The prefix cache blocks of a fleet: `workers` x floor(`kv_cache_max_tokens` / `tokens_per_block`)."""
    if workers < 0 or kv_cache_max_tokens < 0 or tokens_per_block < 1:
        raise ValueError("workers and kv_cache_max_tokens must not be negative, tokens_per_block at least 1")
    return workers * (kv_cache_max_tokens // tokens_per_block)


@dataclass(frozen=True)
class OracleResult:
    """The oracle's count over a request sequence."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    capacity_blocks: int | None
    tokens_per_block: int

    @property
    def hit_rate(self) -> float:
        """Hit tokens over prompt tokens (0 for no prompt tokens)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class HitOracle:
    """The oracle fed one prompt at a time (see the module docstring for what it counts)."""

    def __init__(self, capacity_blocks: int | None = None, *, tokens_per_block: int = 16) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError("capacity_blocks must not be negative")
        blocks = _UNBOUNDED_BLOCKS if capacity_blocks is None else capacity_blocks
        self.capacity_blocks = capacity_blocks
        self.tokens_per_block = tokens_per_block
        self._cache = PrefixBlockIndex(tokens_per_block, blocks * tokens_per_block)
        self.requests = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0

    def add(self, prompt: Sequence[int]) -> int:
        """Count one prompt (its ids): return its hit in tokens, then hold its full blocks."""
        size = self.tokens_per_block
        hashes = block_hashes(prompt, size)
        hit = self._cache.match(hashes[: max(len(prompt) - 1, 0) // size]) * size
        self._cache.store(hashes, prompt)
        self.requests += 1
        self.prompt_tokens += len(prompt)
        self.hit_tokens += hit
        return hit

    @property
    def hit_rate(self) -> float:
        """Hit tokens over prompt tokens so far."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def result(self) -> OracleResult:
        """The count so far."""
        return OracleResult(
            self.requests, self.prompt_tokens, self.hit_tokens, self.capacity_blocks, self.tokens_per_block
        )


def achievable_hit_rate(
    requests: Iterable[TimedRequest | Sequence[int]],
    capacity_blocks: int | None,
    *,
    tokens_per_block: int = 16,
) -> OracleResult:
    """The oracle over a request sequence (`TimedRequest`s or prompts as id lists), for a fleet holding
    `capacity_blocks` blocks (`fleet_cache_blocks`; None: unbounded)."""
    oracle = HitOracle(capacity_blocks, tokens_per_block=tokens_per_block)
    for request in requests:
        oracle.add(request.prompt_token_ids() if isinstance(request, TimedRequest) else request)
    return oracle.result()

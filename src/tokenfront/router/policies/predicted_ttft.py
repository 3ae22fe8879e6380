"""predicted_ttft: the worker with the lowest predicted time to first token — a cost model, not a score.

A cached block saves prefill time and a busy worker costs queueing time: both are counted in seconds (the
insight of Dynamo's KV router, whose cost adds prefill and decode blocks; the model here is tokenfront's).
For each candidate, with its cached tokens of the prompt from ``prefix_match``:

    queue seconds   = (the worker's pending prefill tokens
                       + occupancy_weight x the prompt tokens of its requests in flight) / prefill_tokens_per_second
    prefill seconds = (prompt tokens - overlap_credit * credited cached tokens) / prefill_tokens_per_second
    decode seconds  = active_requests * decode_seconds_per_request
    cost            = queue seconds + prefill seconds + decode seconds

Cached tokens are credited only when some worker holds at least ``affinity_threshold`` of the prompt (0.8):
below it the match is a shared opening (an agent's system prompt and tools), not this conversation, and load
decides where the new conversation goes. ``overlap_credit`` (1.75) weighs a cached token against the prefill it
saves: above 1 a conversation stays where its KV is a little longer than the prefill alone would say (moving it
costs its next turns their cache too). The lowest cost wins; equal costs take turns (``FairChooser``). With
``temperature`` > 0 (seconds) the worker is drawn instead, with probabilities softmax(-cost / temperature):
spreading near-equal choices the way Dynamo's router temperature does.

Pending prefill and occupancy are tracked here, per worker, from what this router sent: ``on_routed`` adds the
request's predicted uncached tokens (prompt - cached there) and its prompt tokens, ``on_complete`` (answered or
failed) takes them out again. A request counts until it ends, not until its first token (Dynamo's moment): the
router sees only the end of an answer that is not streamed.

Why occupancy (Dynamo counts a worker's active decode blocks for the same reason): a GPU admits a prompt only
while its running sequences' KV leaves room, so a worker running a few long conversations queues the next
prompt for as long as they take to answer, however few tokens those conversations still had to prefill.
An answered request's prompt stays in the occupancy for ``occupancy_linger_seconds`` (6) more: an agent's next
turn comes back after its think time (the tool running), so a worker whose sessions are all between turns has
nothing in flight but is not free; without the linger new sessions piled onto such workers.

The defaults were chosen on the offline fleet replay (agentic workload, 64 simulated workers, load 0.7, seed 0,
2,539 requests, oracle hit rate 0.907: ``python -m benchmarks.fleet --offline --workers 64 --rate-scale
7.2394``; measured on the working tree committed as 4273633 plus these terms; round-robin 5,226 ms mean TTFT,
25.6 s p99). As (occupancy, threshold, credit) -> mean TTFT, p99, hit rate, busiest worker over the mean:

- (0, none, 1), pending prefill alone: 49 s, 303 s, 0.73, 10.3x (new sessions piled onto the workers that
  first cached the system prompt);
- (0.1 / 0.25 / 0.5 / 1.0, none, 1): 511 / 719 / 1,301 / 1,940 ms; 2.2 / 3.1 / 5.9 / 8.6 s; 0.76 / 0.69 /
  0.61 / 0.54; 1.87 / 1.61 / 1.46 / 1.44x;
- (0.05 / 0.1 / 0.25, 0.8, 1): 347 / 427 / 741 ms; 1.8 / 2.2 / 3.4 s; 0.84 / 0.80 / 0.71; 1.49 / 1.24 / 1.41x;
- (0.1, 0.8, 1.5), the defaults before the linger: 312 ms, 1.9 s, 0.859, 1.49x; (0.1, 0.7, 1.5): 546 ms, 4.0 s, 0.83, 2.24x;
- (0.1 / 0.15, 0.8, 2) and (0.1, 0.8, 1.75): 290-297 ms, 1.8-2.0 s, 0.87, 1.61-1.69x.

So more credit buys hit rate and costs balance. Then the linger (``--occupancy-linger`` in the fleet benchmark,
measured on the working tree over 17a4b57), as (linger, occupancy, credit) -> the same four:

- (0, 0.1, 1.5), the earlier defaults: 303 ms, 1.74 s, 0.861 (94.99 % of the oracle), 1.49x;
- (3 / 6 / 10, 0.1, 1.5): 295 / 294 / 309 ms; 1.73 / 1.71 / 1.73 s; 0.865 / 0.865 / 0.859; 1.29 / 1.26 / 1.26x;
- (3, 0.05, 1.5), (3, 0.1, 2): 288 / 292 ms; 1.77 / 2.01 s; 0.874 / 0.876; 1.51 / 1.44x;
- (6, 0.05 / 0.07, 1.5): 288 / 299 ms; 1.99 / 1.95 s; 0.877 / 0.871; 1.34 / 1.31x;
- (6, 0.1, 1.75), the defaults: 291 ms, 1.76 s, 0.870 (96.0 %), 1.36x.

On 1,000 workers (``--workers 1000 --duration 20 --rate-scale 824``) the defaults gave 285 ms, 1.29 s, 0.781
(91 % of the oracle's 0.855) and 1.39x, where the earlier ones gave 325 ms, 1.54 s, 0.764 (89 %) and 1.53x. On
the 64-worker run ``kv_cache_aware --load-weight 200 --cache-threshold 0.8`` had 304 ms, 1.9 s, 0.867 and
1.44x: docs/routing.md has the tables.

A worker with nothing in flight is forgotten, and at most ``max_in_flight_per_worker`` requests are
tracked per worker (the oldest go first): the state is bounded even when a completion is lost.

The rates' defaults are the simulated engine's (docs/simulation.md: Llama-3.1-8B on one H100): 20,000 prefill
tokens a second, and 0.0002 s of decode step a request in flight adds (5e-05 s per sequence plus ~2,700 tokens
of context read at 5.6e-08 s each). Fit them to your GPUs.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

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
from tokenfront.router.policies.prefix_match import PrefixMatch, match_prefix, record_routed

__all__ = ["PredictedTtftConfig", "PredictedTtftPolicy"]

# Costs are sums of float seconds: equal within this counts as a tie.
_TIE_EPSILON = 1e-12
_url = attrgetter("url")
_active_requests = attrgetter("active_requests")
_ZEROS = itertools.repeat(0)


@dataclass(frozen=True)
class PredictedTtftConfig:
    """The settings of ``predicted_ttft`` (module docstring); rates are per worker."""

    prefill_tokens_per_second: float = 20_000.0
    decode_seconds_per_request: float = 0.0002
    overlap_credit: float = 1.75
    occupancy_weight: float = 0.1
    affinity_threshold: float = 0.8
    occupancy_linger_seconds: float = 6.0
    temperature: float = 0.0  # seconds; 0: the lowest cost, ties in turn
    seed: int | None = None  # the draw's seed when temperature > 0 (None: fresh entropy)
    max_in_flight_per_worker: int = 4096

    def __post_init__(self) -> None:
        if not (math.isfinite(self.prefill_tokens_per_second) and self.prefill_tokens_per_second > 0):
            raise ValueError("prefill_tokens_per_second must be a positive number")
        for name in (
            "decode_seconds_per_request",
            "overlap_credit",
            "occupancy_weight",
            "occupancy_linger_seconds",
            "temperature",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative number")
        if not 0 <= self.affinity_threshold <= 1:
            raise ValueError("affinity_threshold must be between 0 and 1")
        if self.max_in_flight_per_worker < 1:
            raise ValueError("max_in_flight_per_worker must be at least 1")


@dataclass
class _Pending:
    """One worker's requests in flight from this router: their uncached tokens, in all and each."""

    tokens: int = 0
    kv_tokens: int = 0  # the prompts' tokens: the KV the worker holds for them while they run
    requests: dict[int, tuple[int, int]] = field(
        default_factory=dict
    )  # id(RouteRequest) -> (uncached, prompt)


@dataclass(frozen=True)
class _Decision:
    """One select's inputs and costs, kept as arrays: ``explain`` turns them into rows only when asked."""

    chosen: str
    tied: list[str]
    prompt_tokens: int
    urls: list[str]
    cached: np.ndarray
    queue: np.ndarray
    active: np.ndarray
    costs: np.ndarray


class PredictedTtftPolicy(Policy):
    """The lowest predicted time to first token: pending prefill + uncached prefill + decode load."""

    name = "predicted_ttft"

    def __init__(
        self,
        kv_index: KvIndex,
        config: PredictedTtftConfig | None = None,
        *,
        default_tokens_per_block: int = 16,
    ) -> None:
        if default_tokens_per_block < 1:
            raise ValueError("default_tokens_per_block must be at least 1")
        self.kv_index = kv_index
        self.config = config or PredictedTtftConfig()
        self.default_tokens_per_block = default_tokens_per_block
        self._chooser = FairChooser()
        self._rng = np.random.default_rng(self.config.seed)
        self._lock = threading.Lock()  # the pending tokens and the draw: select and the hooks may race
        self._pending: dict[str, _Pending] = {}
        # The sums of ``_pending`` by url, kept beside it so a decision reads 1,000 workers' in C.
        self._tokens_of: dict[str, int] = {}
        self._kv_tokens_of: dict[str, int] = {}  # in flight, and lingering after completion
        # Answered requests whose prompts still count in their worker's occupancy, oldest first:
        # (until, url, prompt tokens). One queue for every worker: expiring is amortized O(1) per request.
        self._lingering: deque[tuple[float, str, int]] = deque()
        self._lingering_of: dict[str, int] = {}
        # The last select's match and its chosen worker's uncached tokens: on_routed reuses them.
        self._match: PrefixMatch | None = None
        self._chosen: tuple[RouteRequest, str, int] | None = None
        self._last: _Decision | None = None

    @classmethod
    def from_config(cls, config: PolicyConfig) -> PredictedTtftPolicy:
        return cls(
            config.kv_index,
            config.option(PredictedTtftConfig, PredictedTtftConfig()),
            default_tokens_per_block=config.default_tokens_per_block,
        )

    def select(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> WorkerLoad:
        return self.route(candidates, request).worker

    def route(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> Routing:
        config = self.config
        match = match_prefix(self.kv_index, candidates, request, self.default_tokens_per_block)
        rate = config.prefill_tokens_per_second
        prompt_tokens = match.prompt_tokens
        active = np.fromiter(map(_active_requests, candidates), np.float64, len(candidates))
        with self._lock:
            if self._lingering:
                self._expire_lingering(self.kv_index.now())
            pending, occupied = self._pending_tokens(match.urls)
            queue = (pending + config.occupancy_weight * occupied) / rate
            affinity = match.has_affinity(config.affinity_threshold)
            credited = match.cached_tokens if affinity else np.zeros(len(candidates))
            prefill = (prompt_tokens - config.overlap_credit * credited) / rate
            costs = queue + prefill + config.decode_seconds_per_request * active
            if config.temperature > 0:
                logits = -(costs - costs.min()) / config.temperature
                weights = np.exp(logits)
                position = int(self._rng.choice(len(candidates), p=weights / weights.sum()))
                chosen, tied = candidates[position], [candidates[position]]
            else:
                tied_positions = np.flatnonzero(costs <= costs.min() + _TIE_EPSILON).tolist()
                tied = [candidates[i] for i in tied_positions]
                chosen = self._chooser.choose(tied, candidates)
                position = tied_positions[next(i for i, worker in enumerate(tied) if worker is chosen)]
            cached = int(match.cached_tokens[position])
            self._match = match
            self._chosen = (request, chosen.url, max(prompt_tokens - cached, 0))
            self._last = _Decision(
                chosen=chosen.url,
                tied=[worker.url for worker in tied],
                prompt_tokens=prompt_tokens,
                urls=match.urls,
                cached=match.cached_tokens,
                queue=queue,
                active=active,
                costs=costs,
            )
        return Routing(chosen, cached)

    def on_routed(self, worker: WorkerLoad, request: RouteRequest) -> None:
        """Queue the request's uncached tokens on the worker, and credit it with the request's blocks."""
        with self._lock:
            chosen, match = self._chosen, self._match
        if chosen is not None and chosen[0] is request and chosen[1] == worker.url:
            uncached = chosen[2]
        else:  # routed without this select (or another came between): match this worker alone
            match = match_prefix(self.kv_index, [worker], request, self.default_tokens_per_block)
            uncached = max(match.prompt_tokens - int(match.cached_tokens[0]), 0)
        record_routed(self.kv_index, match, worker, request, self.default_tokens_per_block)
        with self._lock:
            pending = self._pending.get(worker.url)
            if pending is None:
                pending = self._pending[worker.url] = _Pending()
            _take_out(pending, id(request))  # the same request routed here again counts once
            prompt_tokens = len(request.token_ids or ())
            pending.requests[id(request)] = (uncached, prompt_tokens)
            pending.tokens += uncached
            pending.kv_tokens += prompt_tokens
            if len(pending.requests) > self.config.max_in_flight_per_worker:  # a completion was lost
                _take_out(pending, next(iter(pending.requests)))
            self._account(worker.url, pending)

    def on_complete(self, worker: WorkerLoad, request: RouteRequest, ok: bool) -> None:
        """The request needs no more prefill: take its tokens out; forget a worker with nothing in flight."""
        url = worker.url
        with self._lock:
            pending = self._pending.get(url)
            if pending is None:
                return
            tracked = _take_out(pending, id(request))
            linger = self.config.occupancy_linger_seconds
            if tracked is not None and linger > 0 and tracked[1]:
                self._lingering.append((self.kv_index.now() + linger, url, tracked[1]))
                self._lingering_of[url] = self._lingering_of.get(url, 0) + tracked[1]
            if pending.requests or url in self._lingering_of:
                self._account(url, pending)
            else:
                del self._pending[url], self._tokens_of[url], self._kv_tokens_of[url]

    def _expire_lingering(self, now: float) -> None:
        """Take out of the occupancy the answered prompts whose linger is over (the lock is held)."""
        lingering, lingering_of = self._lingering, self._lingering_of
        while lingering and lingering[0][0] <= now:
            _, url, tokens = lingering.popleft()
            left = lingering_of[url] - tokens
            if left:
                lingering_of[url] = left
            else:
                del lingering_of[url]
            pending = self._pending.get(url)
            if pending is None:
                continue
            if pending.requests or left:
                self._account(url, pending)
            else:
                del self._pending[url], self._tokens_of[url], self._kv_tokens_of[url]

    def predicted_load(self, worker: WorkerLoad) -> dict[str, float]:
        """The worker's pending prefill tokens, its predicted queue (pending prefill and occupancy, in seconds)
        and its tracked requests."""
        with self._lock:
            pending = self._pending.get(worker.url)
            tokens, kv_tokens, tracked = (
                (pending.tokens, self._kv_tokens_of[worker.url], len(pending.requests))
                if pending is not None
                else (0, 0, 0)
            )
        config = self.config
        return {
            "pending_prefill_tokens": float(tokens),
            "predicted_queue_seconds": (tokens + config.occupancy_weight * kv_tokens)
            / config.prefill_tokens_per_second,
            "tracked_requests": float(tracked),
        }

    def explain(self) -> dict[str, Any]:
        last = self._last
        if last is None:
            return {}
        config = self.config
        return {
            "policy": self.name,
            "chosen": last.chosen,
            "tied": list(last.tied),
            "prompt_tokens": last.prompt_tokens,
            "prefill_tokens_per_second": config.prefill_tokens_per_second,
            "decode_seconds_per_request": config.decode_seconds_per_request,
            "overlap_credit": config.overlap_credit,
            "occupancy_weight": config.occupancy_weight,
            "affinity_threshold": config.affinity_threshold,
            "temperature": config.temperature,
            "workers": explain_rows(
                last.urls,
                cached_tokens=last.cached,
                queue_seconds=last.queue,
                active_requests=last.active.astype(np.int64),
                predicted_ttft_seconds=last.costs,
            ),
        }

    def _pending_tokens(self, urls: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each worker's pending prefill tokens and its prompts' tokens in flight (0 for an idle worker)."""
        if not self._pending:
            return np.zeros(len(urls)), np.zeros(len(urls))
        # map over dict.get with a default: the per-candidate loop stays in C.
        tokens = np.fromiter(map(self._tokens_of.get, urls, _ZEROS), np.float64, len(urls))
        kv_tokens = np.fromiter(map(self._kv_tokens_of.get, urls, _ZEROS), np.float64, len(urls))
        return tokens, kv_tokens

    def _account(self, url: str, pending: _Pending) -> None:
        """Copy ``pending``'s sums into the per-url lookups ``_pending_tokens`` reads."""
        self._tokens_of[url] = pending.tokens
        self._kv_tokens_of[url] = pending.kv_tokens + self._lingering_of.get(url, 0)


def _take_out(pending: _Pending, key: int) -> tuple[int, int] | None:
    """Remove one tracked request and its tokens (nothing when it is not tracked): its (uncached, prompt)."""
    tracked = pending.requests.pop(key, None)
    if tracked is not None:
        pending.tokens -= tracked[0]
        pending.kv_tokens -= tracked[1]
    return tracked

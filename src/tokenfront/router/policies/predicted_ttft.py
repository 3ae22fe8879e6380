"""predicted_ttft: the worker with the lowest predicted time to first token — a cost model, not a score.

A cached block saves prefill time and a busy worker costs queueing time: both are counted in seconds (the
insight of Dynamo's KV router, whose cost adds prefill and decode blocks; the model here is tokenfront's).
For each candidate, with its cached tokens of the prompt from ``prefix_match``:

    queue seconds   = (the worker's pending prefill tokens
                       + occupancy_weight x its occupancy: the prompt tokens of its requests in flight
                                            and of its lingering answered ones) / prefill_tokens_per_second
    prefill seconds = (prompt tokens - overlap_credit * credited cached tokens) / prefill_tokens_per_second
    decode seconds  = active_requests * decode_seconds_per_request
    cost            = queue seconds + prefill seconds + decode seconds

Every worker's cached tokens are credited when some worker holds at least ``affinity_threshold`` of the prompt
(0.8). Below it the match is mostly a shared opening (an agent's system prompt and tools), and load decides
where the conversation goes, except for what one worker alone holds past every other's match: that is this
conversation's own (its early turns, before they reach the threshold), credited to that worker, so a young
conversation is not moved for a small difference in load and recomputed elsewhere. ``overlap_credit`` (1.75) weighs a cached token against the prefill it
saves: above 1 a conversation stays where its KV is a little longer than the prefill alone would say (moving it
costs its next turns their cache too). The lowest cost wins; equal costs take turns (``FairChooser``). With
``temperature`` > 0 (seconds) the worker is drawn instead, with probabilities softmax(-cost / temperature):
spreading near-equal choices the way Dynamo's router temperature does.

Pending prefill and occupancy are tracked here, per worker, from what this router sent: ``on_routed`` adds the
request's predicted uncached tokens (prompt - cached there) to the pending prefill and its prompt tokens to the
occupancy; ``on_first_token`` (a stream's first event that carries output, Dynamo's moment) takes its uncached
tokens out of the pending prefill, and ``on_complete`` (answered or failed) takes out what is left. An answer
that is not streamed shows the router no first token: its prefill counts as pending until it ends.

Why occupancy (Dynamo counts a worker's active decode blocks for the same reason): a GPU admits a prompt only
while its running sequences' KV leaves room, so a worker running a few long conversations queues the next
prompt for as long as they take to answer, however few tokens those conversations still had to prefill.
An answered request's prompt stays in the occupancy for ``occupancy_linger_seconds`` (6) more: an agent's next
turn comes back after its think time (the tool running), so a worker whose sessions are all between turns has
nothing in flight but is not free; without the linger new sessions piled onto such workers. The linger stands
for a turn expected back, so it ends when that turn comes: a prompt that extends a lingering one (its last
full block is in the new prompt's, looked for on the workers holding most of the prompt) is not counted as
queued behind itself there, and once routed, wherever it goes, the old prompt's linger is over.

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
- (6, 0.1, 1.75), the defaults of 875f8fd: 291 ms, 1.76 s, 0.870 (96.0 %), 1.36x.

Then three changes of what is tracked, the settings unchanged (on 9fe2199, ``--policies
predicted_ttft,round_robin``): a stream's first token ends its pending prefill, and a next turn is not queued
behind its own lingering turn: 307 ms, 2.35 s, 0.886 (97.7 %), 1.36x; with the private lead credited below the
threshold too (today's code): 301 ms, 2.55 s, 0.892 (98.4 %), 1.36x — the hit rate gained is conversations no
longer moved at their second to fourth turns, which had been most of the gap to the oracle.

On 1,000 workers (``--workers 1000 --duration 20 --rate-scale 824``) today's code gives 244 ms, 1.48 s, 0.822
(96.2 % of the oracle's 0.855) and 1.45x; 875f8fd's gave 285 ms, 1.29 s, 0.781 (91 %) and 1.39x, and the
earlier settings 325 ms, 1.54 s, 0.764 (89 %) and 1.53x. On the 64-worker run ``kv_cache_aware --load-weight
200 --cache-threshold 0.8`` had 304 ms, 1.9 s, 0.867 and 1.44x: docs/routing.md has the tables.

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
from collections.abc import Hashable, Sequence
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
    SharedLoad,
    WorkerLoad,
    explain_rows,
)
from tokenfront.router.policies.prefix_match import (
    SCALAR_CANDIDATES,
    PrefixMatch,
    match_prefix,
    record_routed,
)
from tokenfront.router.policies.worker_columns import WorkerColumns

__all__ = ["PredictedTtftConfig", "PredictedTtftPolicy"]

# Costs are sums of float seconds: equal within this counts as a tie.
_TIE_EPSILON = 1e-12
_url = attrgetter("url")
_active_requests = attrgetter("active_requests")
# A per-candidate column: an array, or one candidate's number (``SCALAR_CANDIDATES``).
_Column = TypeVar("_Column", float, np.ndarray)
# The per-worker totals (``WorkerColumns``): tokens still to prefill, and the prompts' tokens in flight or
# lingering (the occupancy).
_PENDING, _OCCUPANCY = "pending", "occupancy"
# A next turn's previous prompt is looked for on at most this many of the workers holding most of it.
_MAX_CONTINUED_HOLDERS = 4


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
class _InFlight:
    """One request in flight from this router: its tokens still to prefill, its prompt's, and where its prompt
    ends (its last full block's index and name), which a next turn extending it finds."""

    uncached: int
    prompt: int
    end: tuple[int, int] | None
    shared: SharedLoad  # as it was routed: what peer replicas are told


@dataclass
class _Linger:
    """An answered prompt still counted in its worker's occupancy, until its linger is over or its next turn
    comes (its expiry is queued in ``_expiry``)."""

    url: str
    tokens: int
    end: tuple[int, int] | None


@dataclass(frozen=True)
class _Decision:
    """One select's inputs and costs, kept as arrays: ``explain`` turns them into rows only when asked."""

    chosen: str
    tied: list[str]
    prompt_tokens: int
    urls: list[str]
    cached: np.ndarray
    queue: list[float] | np.ndarray  # lists up to SCALAR_CANDIDATES candidates
    active: list[int] | np.ndarray
    costs: list[float] | np.ndarray


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
        # Per worker url, its requests in flight from this router, by id(RouteRequest). Their sums by url are
        # kept beside them in numpy columns, so a decision reads 1,000 workers' in one gather: the tokens still
        # to prefill, and the prompts' tokens in flight or lingering (the occupancy); 0 for an idle worker.
        # Peer replicas' requests are tracked beside them, by the peer's key (``on_peer_routed``).
        self._in_flight: dict[str, dict[Hashable, _InFlight]] = {}
        self._totals = WorkerColumns((_PENDING, _OCCUPANCY))
        # Answered prompts lingering in their worker's occupancy: by serial number, expiring oldest first from
        # one queue for every worker (amortized O(1) a request); per url, the serials by where the prompt ends.
        self._lingers: dict[int, _Linger] = {}
        self._expiry: deque[tuple[float, int]] = deque()  # (until, serial)
        self._lingering_ends: dict[str, dict[tuple[int, int], int]] = {}
        self._lingering_of: dict[str, int] = {}
        self._serials = itertools.count()
        # The last select's match, its chosen worker's uncached tokens and the lingering turns it continues:
        # on_routed reuses them.
        self._match: PrefixMatch | None = None
        self._chosen: tuple[RouteRequest, str, int, list[int]] | None = None
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
        match = match_prefix(
            self.kv_index, candidates, request, self.default_tokens_per_block, previous=self._match
        )
        prompt_tokens = match.prompt_tokens
        # Up to SCALAR_CANDIDATES, the same costs on Python numbers (prefix_match's docstring).
        scalar = len(candidates) <= SCALAR_CANDIDATES
        active: list[int] | np.ndarray
        queue: list[float] | np.ndarray
        costs: list[float] | np.ndarray
        with self._lock:
            if self._expiry:
                self._expire(self.kv_index.now())
            totals = self._totals.read(match.urls).T
            pending, occupied = totals.tolist() if scalar else totals
            continued = self._continued(match, occupied)
            affinity = match.has_affinity(config.affinity_threshold)
            # Below the threshold only what one worker alone holds is this conversation's own: that is credited.
            if scalar:
                active = list(map(_active_requests, candidates))
                if affinity:
                    credited = match.cached_tokens.tolist()
                else:
                    credited = [0] * len(candidates)
                    lead = match.private_lead()
                    if lead is not None:
                        credited[lead[0]] = lead[1]
                queue = [self._queue(*worker) for worker in zip(pending, occupied, strict=True)]
                costs = [
                    self._cost(*worker, prompt_tokens) for worker in zip(queue, credited, active, strict=True)
                ]
            else:
                active = np.fromiter(map(_active_requests, candidates), np.float64, len(candidates))
                queue_column = self._queue(pending, occupied)
                credited_tokens = match.cached_tokens if affinity else match.private_tokens()
                queue, costs = queue_column, self._cost(queue_column, credited_tokens, active, prompt_tokens)
            if config.temperature > 0:
                cost_array = np.asarray(costs)
                logits = -(cost_array - cost_array.min()) / config.temperature
                weights = np.exp(logits)
                position = int(self._rng.choice(len(candidates), p=weights / weights.sum()))
                chosen, tied = candidates[position], [candidates[position]]
            else:
                if scalar:
                    lowest = min(costs)
                    tied_positions = [i for i, cost in enumerate(costs) if cost <= lowest + _TIE_EPSILON]
                else:
                    assert isinstance(costs, np.ndarray)
                    tied_positions = (costs <= costs.min() + _TIE_EPSILON).nonzero()[0].tolist()
                tied = [candidates[i] for i in tied_positions]
                chosen = self._chooser.choose(tied, candidates)
                position = tied_positions[next(i for i, worker in enumerate(tied) if worker is chosen)]
            cached = match.cached_tokens.item(position)
            self._match = match
            self._chosen = (request, chosen.url, max(prompt_tokens - cached, 0), continued)
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

    def _queue(self, pending: _Column, occupied: _Column) -> _Column:
        """The predicted queue in seconds of each candidate (arrays) or of one (numbers): one formula for both."""
        config = self.config
        return (pending + config.occupancy_weight * occupied) / config.prefill_tokens_per_second  # type: ignore[operator, return-value]

    def _cost(self, queue: _Column, credited: _Column, active: _Column, prompt_tokens: int) -> _Column:
        """The predicted time to first token of each candidate (arrays) or of one (numbers), from its queue, its
        credited cached tokens and its requests in flight: one formula for both."""
        config = self.config
        prefill = (prompt_tokens - config.overlap_credit * credited) / config.prefill_tokens_per_second
        return queue + prefill + config.decode_seconds_per_request * active  # type: ignore[operator, return-value]

    def on_routed(self, worker: WorkerLoad, request: RouteRequest) -> None:
        """Queue the request's uncached tokens on the worker, credit it with the request's blocks, and end the
        linger of the turn it continues."""
        with self._lock:
            chosen, match = self._chosen, self._match
        continued: list[int] = []
        if chosen is not None and chosen[0] is request and chosen[1] == worker.url:
            uncached, continued = chosen[2], chosen[3]
        else:  # routed without this select (or another came between): match this worker alone
            match = match_prefix(self.kv_index, [worker], request, self.default_tokens_per_block)
            uncached = max(match.prompt_tokens - int(match.cached_tokens[0]), 0)
        names = record_routed(self.kv_index, match, worker, request, self.default_tokens_per_block)
        end = (len(names) - 1, int(names[-1])) if names is not None and len(names) else None
        with self._lock:
            ends = tuple(self._lingers[serial].end for serial in continued if serial in self._lingers)
            for serial in continued:  # its previous turn is back: no longer a prompt expected to return
                self._end_linger(serial)
            shared = SharedLoad(uncached, len(request.token_ids or ()), end, tuple(e for e in ends if e))
            self._track(worker.url, id(request), shared)

    def on_first_token(self, worker: WorkerLoad, request: RouteRequest) -> None:
        """The request's prefill is done: its uncached tokens leave the pending prefill (its prompt stays in
        the occupancy until it ends)."""
        with self._lock:
            self._prefilled(worker.url, id(request))

    def on_complete(self, worker: WorkerLoad, request: RouteRequest, ok: bool) -> None:
        """The request ended: its tokens come out, its prompt lingering in the occupancy for a while; a worker
        with nothing in flight or lingering is forgotten."""
        with self._lock:
            self._ended(worker.url, id(request))

    def shared_load(self, worker: WorkerLoad, request: RouteRequest) -> SharedLoad | None:
        """The request as ``on_routed`` tracked it, for the peer replicas to track the same."""
        with self._lock:
            tracked = self._in_flight.get(worker.url, {}).get(id(request))
            return tracked.shared if tracked is not None else None

    def on_peer_routed(self, worker: WorkerLoad, key: Hashable, load: SharedLoad) -> None:
        """A peer's request, tracked as this router's own: its pending prefill and occupancy on the worker, and
        the lingering turns it continues ended here too."""
        url = worker.url
        with self._lock:
            ends = self._lingering_ends.get(url)
            for end in load.continued:
                serial = ends.get(end) if ends else None
                if serial is not None:
                    self._end_linger(serial)
                    ends = self._lingering_ends.get(url)
            self._track(url, key, load)

    def on_peer_first_token(self, worker: WorkerLoad, key: Hashable) -> None:
        with self._lock:
            self._prefilled(worker.url, key)

    def on_peer_complete(self, worker: WorkerLoad, key: Hashable) -> None:
        with self._lock:
            self._ended(worker.url, key)

    def predicted_load(self, worker: WorkerLoad) -> dict[str, float]:
        """The worker's pending prefill tokens, its predicted queue (pending prefill and occupancy, in seconds)
        and its tracked requests."""
        url = worker.url
        with self._lock:
            tokens, kv_tokens = self._totals.get(url, _PENDING), self._totals.get(url, _OCCUPANCY)
            tracked = len(self._in_flight.get(url, ()))
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
                active_requests=np.asarray(last.active).astype(np.int64),
                predicted_ttft_seconds=last.costs,
            ),
        }

    # --- bookkeeping (the lock is held) --------------------------------------------------------------------

    def _continued(self, match: PrefixMatch, occupied: list[float] | np.ndarray) -> list[int]:
        """The lingering prompts this request continues (an agent's next turn extends its last prompt), found
        on the workers holding most of it: taken out of ``occupied`` there (a turn is not queued behind its
        own previous turn), their serials returned."""
        if not self._lingering_ends or not match.best_cached_tokens:
            return []
        best = int(match.matched.max())
        holders = (match.matched == best).nonzero()[0][:_MAX_CONTINUED_HOLDERS].tolist()
        continued = []
        for position in holders:
            ends = self._lingering_ends.get(match.urls[position])
            if not ends:
                continue
            names = match.hashes.get(int(match.sizes[position]))
            if names is None:
                continue
            for (block, name), serial in ends.items():
                if block < best and int(names[block]) == name:
                    occupied[position] -= self._lingers[serial].tokens
                    continued.append(serial)
        return continued

    def _expire(self, now: float) -> None:
        """End the lingers that are over."""
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            self._end_linger(expiry.popleft()[1])

    def _end_linger(self, serial: int) -> None:
        """Take one lingering prompt out of its worker's occupancy (nothing when it ended already)."""
        linger = self._lingers.pop(serial, None)
        if linger is None:
            return
        url = linger.url
        left = self._lingering_of[url] - linger.tokens
        if left:
            self._lingering_of[url] = left
        else:
            del self._lingering_of[url]
        ends = self._lingering_ends.get(url)
        if ends is not None and linger.end is not None and ends.get(linger.end) == serial:
            del ends[linger.end]
            if not ends:
                del self._lingering_ends[url]
        self._totals.add(url, _OCCUPANCY, -linger.tokens)
        if not left and not self._in_flight[url]:
            self._forget(url)

    def _track(self, url: str, key: Hashable, shared: SharedLoad) -> None:
        """Count one request in flight on the worker (this router's, by id(RouteRequest), or a peer's)."""
        requests = self._in_flight.get(url)
        if requests is None:
            requests = self._in_flight[url] = {}  # nothing lingers either: its totals are 0
        self._take_out(url, requests, key)  # the same request routed here again counts once
        tracked = requests[key] = _InFlight(shared.uncached_tokens, shared.prompt_tokens, shared.end, shared)
        self._totals.add(url, _PENDING, tracked.uncached)
        self._totals.add(url, _OCCUPANCY, tracked.prompt)
        if len(requests) > self.config.max_in_flight_per_worker:  # a completion was lost
            self._take_out(url, requests, next(iter(requests)))

    def _prefilled(self, url: str, key: Hashable) -> None:
        """The request's first token came: its uncached tokens leave the worker's pending prefill."""
        tracked = self._in_flight.get(url, {}).get(key)
        if tracked is not None:
            self._totals.add(url, _PENDING, -tracked.uncached)
            tracked.uncached = 0

    def _ended(self, url: str, key: Hashable) -> None:
        """The request ended: its tokens come out, its prompt lingering in the occupancy for a while."""
        requests = self._in_flight.get(url)
        if requests is None:
            return
        tracked = self._take_out(url, requests, key)
        linger = self.config.occupancy_linger_seconds
        if tracked is not None and linger > 0 and tracked.prompt:
            serial = next(self._serials)
            self._lingers[serial] = _Linger(url, tracked.prompt, tracked.end)
            self._expiry.append((self.kv_index.now() + linger, serial))
            self._lingering_of[url] = self._lingering_of.get(url, 0) + tracked.prompt
            self._totals.add(url, _OCCUPANCY, tracked.prompt)
            if tracked.end is not None:
                self._lingering_ends.setdefault(url, {})[tracked.end] = serial
        if not requests and url not in self._lingering_of:
            self._forget(url)

    def _take_out(self, url: str, requests: dict[Hashable, _InFlight], key: Hashable) -> _InFlight | None:
        """Remove one tracked request of the worker and its tokens (nothing when it is not tracked)."""
        tracked = requests.pop(key, None)
        if tracked is not None:
            self._totals.add(url, _PENDING, -tracked.uncached)
            self._totals.add(url, _OCCUPANCY, -tracked.prompt)
        return tracked

    def _forget(self, url: str) -> None:
        """The worker has nothing in flight or lingering: drop its entries (the state stays bounded)."""
        del self._in_flight[url]
        self._totals.clear(url)

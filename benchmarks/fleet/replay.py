"""The offline replay: a fleet of simulated GPUs, the router's KV index and policy, in one process on a
simulated clock.

Nothing is modelled twice. The workers are N real `SimulatedEngine`s (`worker/engines/simulated.py`: its
scheduler, prefix cache and KV event log, unchanged); the router is the real `KvIndex` and the real policy
from `build_policy(name, ...)`; what is left out is the HTTP between them. They run on a `VirtualClockLoop`
(`virtual_clock.py`): each engine's modelled step is an `asyncio.sleep` that costs no wall time, so 1,000 GPUs
replay minutes of traffic in minutes of one core.

Each request, at its `at` on the virtual clock: the policy's `route` (its `select`) over every worker (each a `WorkerLoad`
with its requests in flight, as the router's proxy counts them: from sending to the answer's end), then
`on_routed`, then the chosen engine's `submit`; its stream is read to the end, with `on_first_token` at its
first output and `on_complete` at its end. The index
is fed as the router feeds it: every `kv_events_interval` modelled seconds (0.5 s, `tokenfront route`'s
default `--kv-events-interval`), each engine's new events (`SimulatedEngine.kv_events`, the answer of
`GET /kv_cache_events`) are applied with `KvIndex.apply_tokenfront_events`, so the policy sees what a router
would, as late as a router would; between polls it has its own routed guesses (`on_routed`), whose TTL runs
on the virtual clock (`KvIndex(clock=loop.time)`).

What differs from a live run: routing, hashing and HTTP take no virtual time (a live router adds its own
latency, a millisecond or so a request), the engines' clock never lags, and output ids come from a fixed pool
rather than a tokenizer's word tokens (answers are never reused by the workloads, so the ids do not matter).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.fleet.requests import TimedRequest
from benchmarks.fleet.results import Outcome, PolicyRun
from benchmarks.fleet.virtual_clock import run_virtual
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.policies import Policy, PredictedTtftConfig, RouteRequest, WorkerLoad, build_policy
from tokenfront.router.policies.base import SharedLoad
from tokenfront.worker.engine import NO_TOKEN, GenerationRequest, SamplingParams
from tokenfront.worker.engines.simulated import SimulatedEngine, SimulatedGpu

__all__ = ["FLEET_CONTEXT_TOKENS", "FLEET_EVENT_HISTORY", "ReplaySettings", "replay_policy"]

# The modelled context of every fleet GPU (offline and live): the agentic workload's longest prompt + answer.
FLEET_CONTEXT_TOKENS = 131_072
# The modelled GPU of every fleet run: the simulated engine's defaults, with that context.
_FLEET_GPU = SimulatedGpu(max_context_tokens=FLEET_CONTEXT_TOKENS)
# The logits width and the output ids of the offline engines: Qwen3's vocabulary size (the live fleet's
# checkpoint), answers drawn from ids the workloads' prompts never use (they draw from 256-32,000).
_VOCAB_SIZE = 151_936
_OUTPUT_IDS = tuple(range(32_000, 64_000))
# Events read per engine per poll answer (the router's page size for /kv_cache_events).
_EVENTS_PER_READ = 1000
# Each engine's event history: a poll every 0.5 modelled seconds reads the ~100 events a busy engine writes
# meanwhile, so a tenth of the worker's default (10,000) is plenty, and 1,000 engines hold a tenth of the memory
# (stored events carry their blocks' ids). A reader that falls behind anyway is counted (`kv_events_truncated`).
# The live fleet keeps as many (`simulate --kv-events-history`).
FLEET_EVENT_HISTORY = 1000


@dataclass(frozen=True)
class ReplaySettings:
    """The fleet and router of an offline replay."""

    workers: int
    gpu: SimulatedGpu = _FLEET_GPU
    kv_events_interval: float = 0.5
    load_weight: float = 1.0
    cache_threshold: float = 0.5
    predicted_ttft: PredictedTtftConfig = field(default_factory=PredictedTtftConfig)
    # Router replicas, the requests dealt to them in turn, each with its own index and policy fed by every
    # engine's events; `share_load`: each tells the others of its requests at once (`router.replica_sync`'s
    # messages without their milliseconds), else each counts only its own.
    routers: int = 1
    share_load: bool = True

    def __post_init__(self) -> None:
        if self.routers < 1:
            raise ValueError(f"routers must be at least 1, not {self.routers}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")
        if not self.kv_events_interval > 0:
            raise ValueError(f"kv_events_interval must be more than 0, not {self.kv_events_interval}")


def replay_policy(policy: str, requests: Sequence[TimedRequest], settings: ReplaySettings) -> PolicyRun:
    """Replay `requests` (in the order of their `at`) through `policy` onto a fresh simulated fleet, on a new
    virtual clock; ValueError for a policy `build_policy` does not know. `extra` has the wall seconds and
    this process's CPU seconds the replay took (on a shared machine the CPU seconds are the cost)."""
    started, cpu = time.perf_counter(), time.process_time()
    run = run_virtual(_replay(policy, requests, settings))
    run.extra["wall_seconds"] = round(time.perf_counter() - started, 1)
    run.extra["cpu_seconds"] = round(time.process_time() - cpu, 1)
    return run


async def _replay(name: str, requests: Sequence[TimedRequest], settings: ReplaySettings) -> PolicyRun:
    loop = asyncio.get_running_loop()
    gpu = settings.gpu
    engines = [
        SimulatedEngine(
            gpu, vocab_size=_VOCAB_SIZE, output_token_ids=_OUTPUT_IDS, kv_event_history=FLEET_EVENT_HISTORY
        )
        for _ in range(settings.workers)
    ]
    routers = [_Router(name, settings, loop.time) for _ in range(settings.routers)]
    positions = {load.url: i for i, load in enumerate(routers[0].loads)}
    for engine in engines:
        await engine.start()
    truncated = [0]
    pollers = [
        loop.create_task(
            _feed_index(engines, router.loads, router.index, settings.kv_events_interval, truncated)
        )
        for router in routers
    ]
    given = [0] * settings.workers
    answers: list[asyncio.Task[Outcome]] = []
    try:
        for number, request in enumerate(requests):
            if request.at > loop.time():
                await asyncio.sleep(request.at - loop.time())
            router = routers[number % len(routers)]  # replicas behind one address: dealt in turn
            peers = [peer for peer in routers if peer is not router] if settings.share_load else []
            route = RouteRequest(request.prompt_token_ids())
            worker = router.policy.route(router.loads, route).worker  # as the proxy decides (`Proxy._choose`)
            position = positions[worker.url]
            given[position] += 1
            worker.active_requests += 1
            router.policy.on_routed(worker, route)
            shared = router.policy.shared_load(worker, route) or SharedLoad()
            for peer in peers:
                peer.loads[position].active_requests += 1
                peer.policy.on_peer_routed(peer.loads[position], number, shared)
            answers.append(
                loop.create_task(_answer(engines[position], position, router, peers, route, request, number))
            )
        outcomes = list(await asyncio.gather(*answers))
    finally:
        for poller in pollers:
            poller.cancel()
        for engine in engines:
            await engine.stop()
    busy = [engine.stats()["model_seconds"] for engine in engines]
    return PolicyRun(name, outcomes, given, busy, extra={"kv_events_truncated": truncated[0]})


class _Router:
    """One router replica: its index, policy and view of each worker."""

    def __init__(self, name: str, settings: ReplaySettings, clock: Callable[[], float]) -> None:
        self.index = KvIndex(clock=clock)
        self.policy = _policy(name, self.index, settings)
        tokens_per_block = settings.gpu.tokens_per_block
        self.loads = [
            WorkerLoad(f"sim-{i}", tokens_per_block=tokens_per_block) for i in range(settings.workers)
        ]


def _policy(name: str, index: KvIndex, settings: ReplaySettings) -> Policy:
    """The router's policy as `tokenfront route --policy NAME` builds it (with the flags' defaults)."""
    return build_policy(
        name,
        kv_index=index,
        load_weight=settings.load_weight,
        default_tokens_per_block=settings.gpu.tokens_per_block,
        cache_threshold=settings.cache_threshold,
        options=(settings.predicted_ttft,),
    )


async def _answer(
    engine: SimulatedEngine,
    position: int,
    router: _Router,
    peers: Sequence[_Router],
    route: RouteRequest,
    request: TimedRequest,
    number: int,
) -> Outcome:
    """Submit one request and read its stream to the end: its TTFT on the virtual clock, its cached tokens.
    The routing replica's policy hears of its first token and end, and so do its `peers` when load is shared."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    worker = router.loads[position]
    assert route.token_ids is not None
    ok = False
    try:
        stream = engine.submit(
            GenerationRequest(
                f"req-{number}", route.token_ids, SamplingParams(request.max_tokens, temperature=0.0)
            )
        )
        first: float | None = None
        tokens = 0
        finish = None
        async for output in stream:
            if output.token_id != NO_TOKEN:
                tokens += 1
                if first is None:  # the router sees a stream's first event (`Proxy._attempt`)
                    first = loop.time()
                    router.policy.on_first_token(worker, route)
                    for peer in peers:
                        peer.policy.on_peer_first_token(peer.loads[position], number)
            finish = output.finish_reason
        ok = first is not None and finish != "abort"
        if not ok or first is None:
            return Outcome(None, len(route.token_ids), error=f"finished {finish} without a token")
        return Outcome(first - due, len(route.token_ids), stream.cached_tokens or 0, tokens, loop.time())
    except ValueError as refused:  # a request the engine refuses (longer than the context), as a 400 would be
        return Outcome(None, len(route.token_ids), error=f"refused: {refused}")
    finally:
        worker.active_requests -= 1
        router.policy.on_complete(worker, route, ok)
        for peer in peers:
            peer.loads[position].active_requests -= 1
            peer.policy.on_peer_complete(peer.loads[position], number)


async def _feed_index(
    engines: Sequence[SimulatedEngine],
    loads: Sequence[WorkerLoad],
    index: KvIndex,
    interval: float,
    truncated: list[int],
) -> None:
    """The router's event poller: every `interval`, each engine's events after the index's cursor (reads that
    missed events are counted in `truncated[0]`)."""
    while True:
        await asyncio.sleep(interval)
        for engine, load in zip(engines, loads, strict=True):
            cursor = index.tokenfront_cursor(load.url)
            while engine.events.last_seq > cursor:
                answer = engine.kv_events(cursor, _EVENTS_PER_READ)
                truncated[0] += bool(answer["truncated"])
                index.apply_tokenfront_events(load.url, answer)
                cursor, before = index.tokenfront_cursor(load.url), cursor
                if cursor <= before:  # nothing applied (cannot happen with a well-formed log): never spin
                    break

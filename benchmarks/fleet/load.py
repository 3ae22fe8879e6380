"""The load a workload puts on a fleet: the share of the fleet's prefill capacity it uses under round-robin.

The definition. Take the requests in arrival order and give request *i* to worker *i* mod N (round-robin, as
`round_robin` routes a fleet whose workers are all healthy). Keep each worker's prefix cache as the simulated
engine keeps it — `worker.prefix_index.PrefixBlockIndex` of the GPU's `kv_cache_tokens` in blocks of its
`tokens_per_block`, least recently used leaves out first: a prompt's leading full blocks found there, always
leaving its last token to compute, are cached; then its full blocks are held. Each request costs
`SimulatedGpu.request_prefill_seconds(cached, prompt_tokens)`: its uncached tokens alone on the GPU, in chunks,
with each step's overhead. The load is the sum of those seconds over N x the workload's span (the last
request's `at`, the requests' clock starting at 0):

    load = sum of prefill seconds under round-robin / (workers x span)

So a load of 0.7 means round-robin would keep the fleet's GPUs prefilling 70 % of the time, before decoding,
queueing or batching: the scale at which a cache-blind router starts to hurt, and a cache-aware one has the
most to save. What it leaves out, on purpose: decode time, the answers' blocks a sequence stores when it ends
(the workloads' next prompts never repeat a worker's generated ids), and timing (a request counts its cache as
it stands when the previous requests are done). It is a property of the request sequence and the fleet's size
and GPU, not of a run.

Reaching a given load (`calibrate`). The load grows about in proportion to the arrival rate (twice the
sessions in the same duration, twice the prefill; the cache hits round-robin finds barely change), so the rate
scale is found by proportional steps: scale <- scale x target / load, the workload rebuilt with its fixed seed
each time, until the load is within `tolerance` of the target (3 % by default) or `max_passes` are spent, when
the closest pass is taken. A pass costs a hash and a cache walk of every prompt, so for a fleet larger than
`probe_workers` (64) the steps start from a guess found cheaply on that many workers first: the scale that
loads 64 workers, times workers / 64 (the same rate per worker). Round-robin's cache hits shrink a little as
the fleet grows (a session's turns meet a worker again less often), which the passes on the real fleet then
correct: from 64 workers on, the rate per worker barely changes (the agentic workload over 60 s at load 0.7:
0.116 and 0.118 x its default rate per worker at 64 and 256 workers, 0.133 at 16), so one pass or two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from benchmarks.fleet.requests import TimedRequest
from tokenfront.core.kv_blocks import block_hashes
from tokenfront.worker.engines.simulated import SimulatedGpu
from tokenfront.worker.prefix_index import PrefixBlockIndex

__all__ = ["Calibration", "RoundRobinLoad", "calibrate", "round_robin_load"]


@dataclass(frozen=True)
class RoundRobinLoad:
    """A request sequence's prefill under round-robin on `workers` GPUs, and the load it makes."""

    workers: int
    requests: int
    prompt_tokens: int
    cached_tokens: int
    prefill_seconds: float
    span_seconds: float

    @property
    def load(self) -> float:
        """Prefill seconds over workers x span (0 for an empty or instantaneous workload)."""
        capacity = self.workers * self.span_seconds
        return self.prefill_seconds / capacity if capacity > 0 else 0.0


def round_robin_load(requests: Iterable[TimedRequest], workers: int, gpu: SimulatedGpu) -> RoundRobinLoad:
    """The load `requests` (in arrival order) put on `workers` GPUs of the model `gpu` (module docstring)."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    size = gpu.tokens_per_block
    caches = [PrefixBlockIndex(size, gpu.kv_cache_tokens) for _ in range(workers)]
    count = prompt_tokens = cached_tokens = 0
    seconds = span = 0.0
    for request in requests:
        prompt = request.prompt_token_ids()
        cache = caches[count % workers]
        hashes = block_hashes(prompt, size)
        cached = cache.match(hashes[: (len(prompt) - 1) // size]) * size
        cache.store(hashes, prompt)
        seconds += gpu.request_prefill_seconds(cached, len(prompt))
        count += 1
        prompt_tokens += len(prompt)
        cached_tokens += cached
        span = max(span, request.at)
    return RoundRobinLoad(workers, count, prompt_tokens, cached_tokens, seconds, span)


@dataclass(frozen=True)
class Calibration:
    """The rate scale found for a target load, the load it makes, its requests and every pass tried."""

    scale: float
    load: RoundRobinLoad
    requests: Sequence[TimedRequest]
    passes: tuple[tuple[float, float], ...]  # (scale, load) of each pass, in order


def calibrate(
    make_requests: Callable[[float], Sequence[TimedRequest]],
    target: float,
    workers: int,
    gpu: SimulatedGpu,
    *,
    max_passes: int = 5,
    tolerance: float = 0.03,
    probe_workers: int = 64,
) -> Calibration:
    """The rate scale at which `make_requests(scale)` puts `target` load on `workers` GPUs (module docstring):
    proportional steps from scale 1, or from a probe on `probe_workers` for a larger fleet. ValueError for a
    target that is not positive, or a workload with no prefill at all (no scale reaches a load then)."""
    if not target > 0:
        raise ValueError(f"the load must be more than 0, not {target}")
    scale = 1.0
    passes: list[tuple[float, float]] = []
    if workers > probe_workers >= 1:
        probe = calibrate(
            make_requests, target, probe_workers, gpu, max_passes=max_passes, tolerance=tolerance
        )
        scale = probe.scale * workers / probe_workers
    best: Calibration | None = None
    for _ in range(max(1, max_passes)):
        requests = make_requests(scale)
        measured = round_robin_load(requests, workers, gpu)
        passes.append((scale, measured.load))
        if best is None or abs(measured.load - target) < abs(best.load.load - target):
            best = Calibration(scale, measured, requests, ())
        if measured.load <= 0:
            raise ValueError("the workload has no prefill to scale: no arrival rate reaches a load")
        if abs(measured.load / target - 1) <= tolerance:
            break
        scale *= target / measured.load
    assert best is not None
    return Calibration(best.scale, best.load, best.requests, tuple(passes))

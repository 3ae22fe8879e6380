"""The simulated engine: a GPU worker modelled instead of run, behind the real worker API.

`tokenfront serve --engine simulated` and `tokenfront simulate` (many of them in one process) put this engine
where `engines/transformers.py` runs a model. Everything around it is the real worker: the rendering pipeline,
the OpenAI routes, the output parsers, `/kv_cache_events`, `/metrics`. It needs the checkpoint's tokenizer
files only (no weights) and never imports torch. It computes nothing: each scheduler step *sleeps* (on the
event loop, costing no CPU) for the time the modelled GPU would take, then hands out that step's tokens.

The scheduler (one asyncio task per engine)
-------------------------------------------
Continuous batching with chunked prefill, first come first served, as vLLM schedules by default. Each step:

1. waiting requests are admitted in arrival order while the batch has room (`max_batch_size` sequences) and
   the running sequences' reserved KV (prompt + `max_tokens` each) stays within `max_running_tokens` (a
   request that needs more than all of it still runs, alone). On admission the prompt's leading full blocks
   are looked up in the prefix cache (always leaving its last token to compute, as the real worker does):
   those are `cached_tokens`, never computed;
2. up to `prefill_chunk_tokens` uncached prompt tokens are prefilled, the oldest admitted prompt first (a long
   prompt takes several steps); every sequence already generating decodes one token in the same step;
3. the step lasts `SimulatedGpu.prefill_step_seconds` + `decode_seconds` of modelled time (divided by
   `speedup` on the clock); then the prefilled blocks are stored in the prefix cache, a prompt whose prefill
   is complete gets its first token, and every decoding sequence its next.

The prefix cache (`worker/prefix_index.py`) holds `kv_cache_tokens` worth of blocks, named by
`core/kv_blocks.py` as the real worker names them, least recently used leaves out first, and publishes the
same stored / removed events on `/kv_cache_events`. As in the real worker it holds a prompt's full blocks once
they are computed, and when a sequence ends, the full blocks of prompt + generated ids whose KV was computed
(all but the last token). The running sequences' own KV is bounded apart (`max_running_tokens`).

Output tokens are drawn from `output_token_ids` (`output_token_pool`: the tokenizer's plain word tokens, so
the text reads as words) by a `random.Random` seeded with the request's `seed`, else — for greedy requests —
from the engine's `seed` and the prompt, so the same prompt gets the same answer on every worker; sampled
requests without a seed also count submissions, so their choices differ. Sampling parameters other than the
seed do not change the ids. A sequence ends at `max_tokens` or the context ("length"), on a drawn id in its
`stop_token_ids` ("stop"), or when aborted; stop strings are the service layer's, as with any engine.
Logprobs, when asked, are those of a uniform draw over the pool. Grammars (a named `tool_choice`) are not
run: a request with a constraint is refused.

Time is the event loop's: `asyncio.sleep` until each step's end. Steps run back to back from where the last
one ended, so sleep overshoot does not add up; when the process is too busy to keep up (many workers, a
loaded machine), the lateness is counted (`lag_seconds_total`, `lag_seconds_max` in `stats()`, on
`/metrics`), and a step that starts more than `_CATCH_UP_SECONDS` late starts from now instead of catching up
in a burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import re
import zlib
from array import array
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenfront.core.context_length import max_model_len
from tokenfront.core.kv_blocks import KV_CACHE_HASH, block_hashes
from tokenfront.worker.engine import (
    ENGINE_COUNTERS,
    NO_TOKEN,
    Engine,
    EngineInfo,
    GenerationRequest,
    GenerationStream,
    TokenOutput,
    check_runnable,
)
from tokenfront.worker.kv_events import DEFAULT_MAX_EVENTS, KvEventLog
from tokenfront.worker.prefix_index import PrefixBlockIndex

if TYPE_CHECKING:
    from tokenfront.core.render import RenderPipeline

__all__ = ["SimulatedEngine", "SimulatedGpu", "output_token_pool"]

log = logging.getLogger(__name__)

# Temperatures below this are greedy (as in the transformers engine and vLLM).
_GREEDY_EPS = 1e-5
# A step that would start later than this after the previous one ended starts from now: catching up on more
# would hand out a burst of tokens at once.
_CATCH_UP_SECONDS = 0.05
# A plain word token: letters, after the tokenizer's space marker if any (byte-level "Ġ", SentencePiece "▁").
_WORD_TOKEN = re.compile("^[\u0120\u2581]?[A-Za-z]+$")
# Fewer word tokens than this (an unusual vocabulary): draw from every non-special id instead.
_MIN_WORD_TOKENS = 100


@dataclass(frozen=True)
class SimulatedGpu:
    """The modelled GPU worker: its speed, its capacity and how it schedules.

    The defaults model Llama-3.1-8B in bf16 on one H100 SXM 80 GB served vLLM-style. They are assumptions
    worked out from the published hardware figures (989 TFLOPs dense bf16, 3.35 TB/s HBM3) and the model's
    shapes (8.0 B parameters, 32 layers, hidden 4096, 8 KV heads of 128: 128 KiB of KV per token) at
    efficiencies typical of a serving engine — not measurements:

    - prefill: 20,000 tokens/s through the weights (about 30 % of peak at 16 GFLOPs a token), plus causal
      attention at 1.05 ns per (query, key) pair (4 x 4096 x 32 FLOPs at ~500 TFLOPs), plus 5 ms a step of
      scheduling and launch overhead: a 4k-token prompt takes ~0.21 s cold, a 32k one ~2.2 s;
    - decode: 8 ms a step (reading 16 GB of weights at ~70 % of 3.35 TB/s is 6.9 ms, plus overhead), 50 us per
      sequence in the batch, and 56 ns per token of context read (128 KiB at ~2.35 TB/s): 32 sequences of 8k
      context step in ~24 ms;
    - capacity: of ~52 GB left for KV after weights and activations (vLLM's 0.9 memory utilization), 256 Ki
      tokens (32 GiB) of prefix cache and 128 Ki tokens (16 GiB) for the running sequences;
    - scheduling: up to 256 sequences (vLLM's `max_num_seqs`) and 8192 prefill tokens a step (vLLM's chunked
      prefill budget, `max_num_batched_tokens`), in blocks of 16 tokens.

    `speedup` runs the clock faster (2: every step takes half the wall time; the modelled durations and the
    stats stay in GPU seconds). `max_context_tokens` None takes the checkpoint's context (vLLM's
    `max_model_len`). `seed` picks the output ids (see the module docstring).
    """

    prefill_tokens_per_second: float = 20_000.0
    attention_seconds_per_token_pair: float = 1.05e-9
    prefill_overhead_seconds: float = 0.005
    decode_step_seconds: float = 0.008
    decode_seconds_per_sequence: float = 5e-5
    decode_seconds_per_kv_token: float = 5.6e-8
    prefill_chunk_tokens: int = 8192
    max_batch_size: int = 256
    max_running_tokens: int = 131_072
    kv_cache_tokens: int = 262_144
    tokens_per_block: int = 16
    max_context_tokens: int | None = None
    speedup: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prefill_tokens_per_second", "speedup"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number, not {value!r}")
        for name in (
            "attention_seconds_per_token_pair",
            "prefill_overhead_seconds",
            "decode_step_seconds",
            "decode_seconds_per_sequence",
            "decode_seconds_per_kv_token",
        ):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number of at least 0, not {value!r}")
        for name in ("prefill_chunk_tokens", "max_batch_size", "max_running_tokens", "tokens_per_block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)!r}")
        if self.kv_cache_tokens < 0:
            raise ValueError(f"kv_cache_tokens must not be negative, not {self.kv_cache_tokens}")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be at least 2, not {self.max_context_tokens}")

    def prefill_seconds(self, start: int, end: int) -> float:
        """Computing the KV of prompt positions [start, end) when the positions before `start` are cached or
        computed already: every token through the weights, and each attending to every position before it.
        The step's overhead is apart (`prefill_step_seconds`)."""
        pairs = (end * end - start * start) / 2
        return (end - start) / self.prefill_tokens_per_second + pairs * self.attention_seconds_per_token_pair

    def decode_seconds(self, batch: int, kv_tokens: int) -> float:
        """One decode step of `batch` sequences whose contexts hold `kv_tokens` tokens in all."""
        return (
            self.decode_step_seconds
            + batch * self.decode_seconds_per_sequence
            + kv_tokens * self.decode_seconds_per_kv_token
        )

    def prefill_step_seconds(self, chunks: Sequence[tuple[int, int]]) -> float:
        """The prefill part of one scheduler step: its `chunks` ((start, end) positions of each prompt's
        chunk) and the step's overhead; 0 for a step that prefills nothing."""
        if not chunks:
            return 0.0
        return self.prefill_overhead_seconds + sum(self.prefill_seconds(start, end) for start, end in chunks)

    def request_prefill_seconds(self, cached: int, prompt_tokens: int) -> float:
        """The modelled prefill time of one prompt with `cached` tokens from the prefix cache, alone on the GPU:
        its uncached tokens in chunks of `prefill_chunk_tokens`, each step with its overhead."""
        total, start = 0.0, cached
        while start < prompt_tokens:
            end = min(prompt_tokens, start + self.prefill_chunk_tokens)
            total += self.prefill_step_seconds([(start, end)])
            start = end
        return total


def output_token_pool(pipeline: RenderPipeline) -> tuple[int, ...]:
    """The ids a simulated engine on `pipeline`'s checkpoint draws its output from: the vocabulary's plain word
    tokens (letters, after the tokenizer's space marker or not), never a special, added or EOS id; every other
    id when the vocabulary has fewer than a hundred such tokens. Sorted, so the draw is the same for the same
    vocabulary; a tuple, so a fleet of engines shares one."""
    tokenizer = pipeline.tokenizer
    excluded = {*getattr(tokenizer, "all_special_ids", ()), *pipeline.checkpoint.eos_token_ids}
    excluded.update(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab: Mapping[str, int] = get_vocab() if callable(get_vocab) else {}
    limit = pipeline.vocab_size
    words = sorted(
        i for token, i in vocab.items() if _WORD_TOKEN.match(token) and i not in excluded and i < limit
    )
    if len(words) >= _MIN_WORD_TOKENS:
        return tuple(words)
    return tuple(i for i in range(limit) if i not in excluded)


@dataclass(eq=False)
class _Sequence:
    """One request as the simulated scheduler tracks it."""

    request: GenerationRequest
    stream: GenerationStream
    outputs: asyncio.Queue[TokenOutput | BaseException]
    rng: random.Random
    # The prompt and the prompt's full blocks as tuples, which the garbage collector stops scanning once they
    # survive a collection: a fleet holds hundreds of long prompts in flight (docs/simulation.md).
    prompt: tuple[int, ...]
    reserved_tokens: int  # its share of max_running_tokens while admitted: prompt + max_tokens
    output: list[int] = field(default_factory=list)  # the ids generated so far
    hashes: tuple[int, ...] = ()  # the prompt's full blocks, set on admission
    computed: int = 0  # leading prompt tokens whose KV exists (cached or prefilled)
    admitted: bool = False
    done: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    @property
    def generated(self) -> int:
        return len(self.output)

    @property
    def length(self) -> int:
        """Prompt and output tokens: its context."""
        return len(self.prompt) + len(self.output)


@dataclass
class _Step:
    """What one scheduler step does: prefill chunks (each sequence with the end of its chunk) and decoding."""

    chunks: list[tuple[_Sequence, int]]
    decoding: list[_Sequence]
    prefill_seconds: float
    decode_seconds: float


class SimulatedEngine(Engine):
    """A modelled GPU worker (see the module docstring): no model, no torch, real prefix cache bookkeeping and
    KV events, modelled durations slept on the event loop.

    `vocab_size` is the model's logits width (prompt ids must be below it); `output_token_ids` the ids output
    is drawn from (default: all of them); `max_context` the checkpoint's context, unless the GPU's
    `max_context_tokens` says otherwise.
    """

    def __init__(
        self,
        gpu: SimulatedGpu,
        *,
        vocab_size: int,
        output_token_ids: Sequence[int] | None = None,
        max_context: int | None = None,
        kv_event_history: int = DEFAULT_MAX_EVENTS,
    ) -> None:
        if vocab_size < 1:
            raise ValueError("vocab_size must be at least 1")
        self.gpu = gpu
        self.vocab_size = vocab_size
        self.max_context = gpu.max_context_tokens or max_context
        # A tuple is kept as given: a fleet of engines shares one pool.
        pool = tuple(range(vocab_size) if output_token_ids is None else output_token_ids)
        if not pool or min(pool) < 0 or max(pool) >= vocab_size:
            raise ValueError(f"output_token_ids must be a non-empty list of ids in [0, {vocab_size})")
        self._pool = pool
        self._uniform_logprob = -math.log(len(pool))
        self.events = KvEventLog(kv_event_history)
        self.prefix_cache = PrefixBlockIndex(gpu.tokens_per_block, gpu.kv_cache_tokens, self.events)
        self.info = EngineInfo(
            name="simulated",
            tokens_per_block=gpu.tokens_per_block,
            kv_cache_hash=KV_CACHE_HASH,
            max_batch_size=gpu.max_batch_size,
            kv_cache_max_tokens=gpu.kv_cache_tokens,
            device="simulated-gpu",
        )
        self._live: dict[str, _Sequence] = {}
        self._waiting: deque[_Sequence] = deque()
        self._prefilling: list[_Sequence] = []  # admitted, prompt not fully computed, oldest first
        self._running: list[_Sequence] = []  # generating
        self._reserved_tokens = 0
        self._aborts: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._unseeded_draws = 0
        # The counters every engine reports, then the simulation's own (docs/simulation.md).
        own = ("steps", "model_seconds", "lag_seconds_total", "lag_seconds_max")
        self._counters: dict[str, float] = dict.fromkeys((*ENGINE_COUNTERS, *own), 0.0)

    @classmethod
    def for_pipeline(
        cls,
        gpu: SimulatedGpu,
        pipeline: RenderPipeline,
        *,
        output_token_ids: Sequence[int] | None = None,
        kv_event_history: int = DEFAULT_MAX_EVENTS,
    ) -> SimulatedEngine:
        """A simulated engine for the checkpoint `pipeline` renders for: its logits width (the config's
        `vocab_size` or the tokenizer's size, whichever is larger), its context as vLLM derives it (unless the
        GPU sets one), and output drawn from `output_token_ids` (default: `output_token_pool(pipeline)`; a
        fleet computes it once); `kv_event_history`: events its log keeps."""
        config = pipeline.checkpoint.config
        vocab_size = max(int(config.get("vocab_size") or 0), pipeline.vocab_size)
        return cls(
            gpu,
            vocab_size=vocab_size,
            output_token_ids=output_token_pool(pipeline) if output_token_ids is None else output_token_ids,
            max_context=max_model_len(config),
            kv_event_history=kv_event_history,
        )

    # ------------------------------------------------------------------ the Engine interface

    async def start(self) -> None:
        """Start the scheduler task on the running event loop (again after `stop`, if need be)."""
        if self._task is not None and not self._task.done():
            return
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tokenfront-simulated-engine")

    async def stop(self) -> None:
        """Abort whatever is waiting or running (streams end with "abort") and stop the scheduler task."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for sequence in list(self._live.values()):
            self._finish_abort(sequence)
        self._waiting.clear()
        self._prefilling.clear()
        self._running.clear()

    def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queue a request (from the event loop the engine runs on); tokens arrive on the returned stream.

        Raises ValueError for a request the engine cannot run (empty prompt, ids outside the vocabulary, a
        prompt that fills the context, `max_tokens` < 1, a grammar constraint, a request id already running)
        and RuntimeError when the engine is not started.
        """
        self._validate(request)
        if self._task is None or self._wake is None:
            raise RuntimeError("the engine is not running: call start() first")
        if request.request_id in self._live:
            raise ValueError(f"request id {request.request_id!r} is already running")
        prompt = tuple(request.prompt_token_ids)
        outputs: asyncio.Queue[TokenOutput | BaseException] = asyncio.Queue()
        stream = GenerationStream(request.request_id, len(prompt))
        budget = request.params.max_tokens
        if self.max_context is not None:
            budget = min(budget, self.max_context - len(prompt))
        sequence = _Sequence(
            request=request,
            stream=stream,
            outputs=outputs,
            rng=self._rng(request),
            prompt=prompt,
            reserved_tokens=len(prompt) + budget,
        )
        stream._outputs = self._read(sequence)
        self._live[request.request_id] = sequence
        self._waiting.append(sequence)
        self._counters["requests_submitted"] += 1
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a waiting or running request at the end of the current step; unknown or finished ids are
        ignored."""
        sequence = self._live.get(request_id)
        if sequence is None or sequence.done:
            return
        self._aborts.add(request_id)
        if self._wake is not None:
            self._wake.set()

    def abort_all(self) -> int:
        """Abort every waiting or running request at the end of the current step (the shutdown deadline: their
        streams end with "abort"); returns how many there were."""
        self.cut_at_shutdown = True
        live = [request_id for request_id, sequence in self._live.items() if not sequence.done]
        for request_id in live:
            self.abort(request_id)
        return len(live)

    def kv_events(self, after: int, limit: int = 1000, log_id: str | None = None) -> dict[str, Any]:
        """The KV event log after `after` (see `worker/kv_events.py` for the events and the reply's fields);
        a reader that missed events gets the prefix cache's snapshot instead."""
        return self.events.read(after, limit, log_id=log_id, snapshot=self.prefix_cache.snapshot)

    def stats(self) -> dict[str, float]:
        """Counters: requests, prompt tokens (total / from cache / computed), modelled prefill and decode
        seconds, decode steps and batch sizes, the prefix cache, and how late the steps ran on the clock."""
        stats = dict(self._counters)
        steps = stats["decode_steps"]
        stats["decode_batch_size_mean"] = stats["decode_tokens"] / steps if steps else 0.0
        stats["running"] = float(len(self._running) + len(self._prefilling))
        stats["waiting"] = float(len(self._waiting))
        stats["running_reserved_tokens"] = float(self._reserved_tokens)
        stats.update(self.prefix_cache.stats())  # the kv_cache_* and kv_events_last_seq gauges
        return stats

    def clear_kv_cache(self) -> None:
        """Drop the prefix cache (a "cleared" event); running sequences keep their own KV."""
        self.prefix_cache.clear()

    # ------------------------------------------------------------------ requests

    def _validate(self, request: GenerationRequest) -> None:
        check_runnable(request, self.vocab_size, self.max_context)
        if request.constraint is not None:
            raise ValueError(
                "the simulated engine does not run grammars (a named tool_choice): use a worker with "
                "--engine transformers"
            )

    def _rng(self, request: GenerationRequest) -> random.Random:
        """The draw of a request's output ids: its seed's, else the prompt's (greedy) — the same answer to the
        same prompt — or, sampled without a seed, the prompt's and the submission's."""
        params = request.params
        if params.seed is not None:
            return random.Random(params.seed)
        prompt_key = zlib.crc32(array("I", request.prompt_token_ids))
        key = self.gpu.seed * (1 << 32) + prompt_key
        if params.temperature >= _GREEDY_EPS:
            self._unseeded_draws += 1
            key = key * (1 << 32) + self._unseeded_draws
        return random.Random(key)

    async def _read(self, sequence: _Sequence) -> AsyncIterator[TokenOutput]:
        try:
            while True:
                item = await sequence.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not sequence.done:  # the reader walked away: stop spending (modelled) compute on it
                self.abort(sequence.request_id)

    # ------------------------------------------------------------------ the scheduler

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        step_end = loop.time()
        while True:
            try:
                self._apply_aborts()
                if not (self._waiting or self._prefilling or self._running):
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                step = self._schedule()
                seconds = step.prefill_seconds + step.decode_seconds
                now = loop.time()
                # Back to back while busy (sleep overshoot must not add up), from now after idling or lagging.
                start = step_end if now - step_end <= _CATCH_UP_SECONDS else now
                step_end = start + seconds / self.gpu.speedup
                await asyncio.sleep(max(0.0, step_end - loop.time()))
                lag = max(0.0, loop.time() - step_end)
                self._counters["lag_seconds_total"] += lag
                self._counters["lag_seconds_max"] = max(self._counters["lag_seconds_max"], lag)
                self._count_step(step)
                self._complete(step)
            except Exception as error:  # a bug must not leave streams hanging: fail what runs, keep serving
                log.exception("simulated engine step failed; failing its requests")
                self._fail_everything(error)

    def _schedule(self) -> _Step:
        """Pick this step's prefill chunks (admitting waiting requests while there is room) and its decoders."""
        gpu = self.gpu
        budget = gpu.prefill_chunk_tokens
        chunks: list[tuple[_Sequence, int]] = []
        candidates = iter(list(self._prefilling))  # a copy: admitting appends to the list
        while budget > 0:
            sequence = next(candidates, None)
            if sequence is None:
                if not self._waiting or not self._can_admit(self._waiting[0]):
                    break
                sequence = self._waiting.popleft()
                self._admit(sequence)
            end = min(sequence.prompt_tokens, sequence.computed + budget)
            chunks.append((sequence, end))
            budget -= end - sequence.computed
        prefill = gpu.prefill_step_seconds([(sequence.computed, end) for sequence, end in chunks])
        decoding = list(self._running)
        kv_tokens = sum(sequence.length for sequence in decoding)
        decode = gpu.decode_seconds(len(decoding), kv_tokens) if decoding else 0.0
        return _Step(chunks, decoding, prefill, decode)

    def _can_admit(self, sequence: _Sequence) -> bool:
        admitted = len(self._prefilling) + len(self._running)
        if admitted >= self.gpu.max_batch_size:
            return False
        # A request larger than the whole running budget still runs, once it has the GPU to itself.
        return not admitted or self._reserved_tokens + sequence.reserved_tokens <= self.gpu.max_running_tokens

    def _admit(self, sequence: _Sequence) -> None:
        """Look the prompt up in the prefix cache (its last token is always computed) and join the batch."""
        size = self.gpu.tokens_per_block
        prompt = sequence.prompt
        sequence.hashes = tuple(block_hashes(prompt, size, sequence.request.cache_salt))
        held = self.prefix_cache.match(sequence.hashes[: (len(prompt) - 1) // size])
        cached = held * size
        sequence.computed = cached
        sequence.stream.cached_tokens = cached
        sequence.admitted = True
        self._reserved_tokens += sequence.reserved_tokens
        self._prefilling.append(sequence)
        self._counters["prompt_tokens"] += len(prompt)
        self._counters["prompt_tokens_cached"] += cached
        self._counters["prefill_tokens_computed"] += len(prompt) - cached

    def _count_step(self, step: _Step) -> None:
        counters = self._counters
        counters["steps"] += 1
        counters["model_seconds"] += step.prefill_seconds + step.decode_seconds
        counters["prefill_seconds"] += step.prefill_seconds
        if step.decoding:
            counters["decode_steps"] += 1
            counters["decode_tokens"] += len(step.decoding)
            counters["decode_seconds"] += step.decode_seconds
            counters["decode_batch_size_max"] = max(counters["decode_batch_size_max"], len(step.decoding))

    def _complete(self, step: _Step) -> None:
        """The step is over: store what it prefilled, hand out its tokens; sequences aborted meanwhile get
        nothing more (they end at the next `_apply_aborts`)."""
        size = self.gpu.tokens_per_block
        for sequence, end in step.chunks:
            if sequence.done or sequence.request_id in self._aborts:
                continue
            sequence.computed = end
            self.prefix_cache.store(sequence.hashes[: end // size], sequence.prompt)
            if end == sequence.prompt_tokens:
                self._prefilling.remove(sequence)
                self._running.append(sequence)
                self._advance(sequence)
        for sequence in step.decoding:
            if not sequence.done and sequence.request_id not in self._aborts:
                self._advance(sequence)
        if any(sequence.done for sequence in self._running):
            for sequence in [s for s in self._running if s.done]:
                self._leave(sequence)
            self._running = [s for s in self._running if not s.done]

    def _advance(self, sequence: _Sequence) -> None:
        """Draw the sequence's next token and send it, ending the sequence if it must."""
        params = sequence.request.params
        token = self._pool[sequence.rng.randrange(len(self._pool))]
        sequence.output.append(token)
        finish = None
        if token in params.stop_token_ids:
            finish = "stop"
        elif sequence.generated >= params.max_tokens or (
            self.max_context is not None and sequence.length >= self.max_context
        ):
            finish = "length"
        logprob, top = self._logprobs(token, params.logprobs)
        if finish is not None:
            self._counters["requests_finished"] += 1
            self._end(sequence)
        sequence.outputs.put_nowait(TokenOutput(token, logprob, top, finish))

    def _logprobs(
        self, token: int, top: int | None
    ) -> tuple[float | None, tuple[tuple[int, float], ...] | None]:
        """A uniform draw's: every id of the pool equally likely, the chosen one listed first."""
        if top is None:
            return None, None
        if top <= 0:
            return self._uniform_logprob, None
        others = (i for i in self._pool if i != token)
        listed = [token, *(next(others) for _ in range(min(top, len(self._pool)) - 1))]
        return self._uniform_logprob, tuple((i, self._uniform_logprob) for i in listed)

    # ------------------------------------------------------------------ sequences leaving

    def _leave(self, sequence: _Sequence) -> None:
        """Keep the full blocks of prompt + generated ids whose KV was computed (all but the last token)."""
        size = self.gpu.tokens_per_block
        computed = sequence.length - 1 if sequence.generated else sequence.computed
        blocks = computed // size
        hashes: Sequence[int] = sequence.hashes
        token_ids: Sequence[int] = sequence.prompt
        if blocks > len(hashes):  # the answer filled blocks of its own: name them too
            token_ids = sequence.prompt + tuple(sequence.output)
            hashes = block_hashes(token_ids[: blocks * size], size, sequence.request.cache_salt)
        self.prefix_cache.store(hashes[:blocks], token_ids)

    def _end(self, sequence: _Sequence) -> None:
        sequence.done = True
        self._live.pop(sequence.request_id, None)
        self._aborts.discard(sequence.request_id)
        if sequence.admitted:
            self._reserved_tokens -= sequence.reserved_tokens

    def _apply_aborts(self) -> None:
        if not self._aborts:
            return
        aborts, self._aborts = self._aborts, set()
        for sequence in [self._live[request_id] for request_id in aborts if request_id in self._live]:
            if sequence.admitted:
                self._leave(sequence)
            self._finish_abort(sequence)
        self._waiting = deque(s for s in self._waiting if not s.done)
        self._prefilling = [s for s in self._prefilling if not s.done]
        self._running = [s for s in self._running if not s.done]

    def _finish_abort(self, sequence: _Sequence) -> None:
        self._counters["requests_aborted"] += 1
        self._end(sequence)
        sequence.outputs.put_nowait(TokenOutput(NO_TOKEN, finish_reason="abort"))

    def _fail_everything(self, error: BaseException) -> None:
        for sequence in list(self._live.values()):
            self._counters["requests_failed"] += 1
            self._end(sequence)
            sequence.outputs.put_nowait(error)
        self._waiting.clear()
        self._prefilling.clear()
        self._running.clear()
        self._aborts.clear()

"""The PyTorch + transformers engine: a real model on CPU (or CUDA), continuously batched, with a prefix KV cache.

How it runs
-----------
One background thread owns the model. ``submit`` validates a request and puts it on a thread-safe queue; the
thread's loop then repeats:

1. take the aborts, then the new submissions;
2. drop aborted sequences (their streams end with ``finish_reason="abort"``);
3. admit waiting requests while the batch has room (``max_batch_size``), up to ``max_prefill_tokens_per_step``
   prompt tokens per iteration so a burst of long prompts does not stall the running sequences for long.
   Each admitted prompt is *prefilled on its own*: the prefix cache gives the longest run of cached full
   blocks (always leaving at least the last prompt token to compute, so there are logits), only the rest is
   run through the model with the cached KV as past; its full blocks are then stored in the prefix cache and
   its first token is sampled;
4. every running sequence takes one decode step *together*, in one batched forward.

Continuous batching
-------------------
The running sequences share one transformers ``DynamicCache`` whose rows are left-padded to a common length:
a 2-D attention mask hides the padding and explicit ``position_ids`` give each row its own positions, so a
row computes what it would compute alone (greedy ids do not depend on the batch). A sequence joins by
left-padding (the batch or the newcomer) and concatenating on the batch dimension; it leaves by selecting
the remaining rows and trimming the padding columns no row needs any more. Copies happen only when the batch
changes; between changes the cache grows as transformers grows it.

What the prefix cache holds
---------------------------
The prompt's full blocks right after its prefill (so a concurrent request sharing the prefix already hits),
and, when a sequence leaves the batch (finished or aborted), the full blocks of prompt + generated ids whose
KV was computed (all but the last sampled token), so a follow-up turn that repeats the answer hits too.
The prefix cache is bounded by ``kv_cache_max_tokens``; the running sequences' own KV is not counted in it.

Sampling
--------
Per sequence, in order: the constraint (``mask_logits``) on the model's logits; logprobs, when asked, are the
log-softmax of those logits — vLLM's default "raw" logprobs, before temperature, top-k and top-p; then
temperature (below 1e-5 means greedy argmax), top-k, top-p, and a draw from the request's own
``torch.Generator`` (seeded with ``seed`` when given, so the same seed gives the same ids whatever else runs).

A sequence ends with "stop" on one of its ``stop_token_ids`` (the engine is id-level: the caller adds the
checkpoint's EOS ids, ``eos_token_ids``, unless it wants to run past them; ``stop_on_eos=True`` makes the
engine add them itself) or when its constraint is finished; with "length" at ``max_tokens`` or at the model's
context length; with "abort" on ``abort`` or ``stop``. The abort output carries no token: its ``token_id`` is
``NO_TOKEN`` (-1). A request that fails inside the model (or its constraint) makes its stream raise the error;
the other requests go on. A reader that stops iterating early (``aclose``) aborts its request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.utils import logging as transformers_logging

from tokenfront.core.kv_blocks import KV_CACHE_HASH
from tokenfront.progress import Progress, format_bytes
from tokenfront.worker.engine import (
    ENGINE_COUNTERS,
    NO_TOKEN,
    Engine,
    EngineInfo,
    GenerationRequest,
    GenerationStream,
    SamplingParams,
    TokenOutput,
    check_runnable,
)
from tokenfront.worker.kv_cache import KvLayers, PrefixKvCache
from tokenfront.worker.kv_events import DEFAULT_MAX_EVENTS, KvEventLog

log = logging.getLogger(__name__)

# The token id of an output that carries no token (the final output of an aborted request).

# Temperatures below this are greedy, as in vLLM.
_GREEDY_EPS = 1e-5


@dataclass(eq=False)
class _Sequence:
    """One request as the engine thread tracks it."""

    request: GenerationRequest
    stream: GenerationStream
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue[TokenOutput | BaseException]
    generator: torch.Generator | None
    token_ids: list[int]
    kv_len: int = 0  # leading token_ids whose KV is in the batch cache
    generated: int = 0
    pending: int | None = None  # the last sampled token, fed to the next decode step
    done: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def params(self) -> SamplingParams:
        return self.request.params


@dataclass
class _Batch:
    """The running sequences and their shared, left-padded KV cache."""

    rows: list[_Sequence] = field(default_factory=list)
    cache: DynamicCache | None = None
    mask: torch.Tensor | None = None  # [rows, cache length], 1 where a row has a real token

    @property
    def length(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])


class TransformersEngine(Engine):
    """Runs a transformers causal LM checkpoint; see the module docstring for scheduling and caching.

    `checkpoint` is a folder with config and weights. `device` "auto" takes CUDA when present. `dtype` defaults
    to float32 on CPU and bfloat16 (float16 where unsupported) on CUDA. `kv_cache_max_tokens` bounds the prefix
    cache (0 disables it). `eos_token_ids` are the checkpoint's EOS ids (generation config, else config);
    with `stop_on_eos` they end every sequence as the request's `stop_token_ids` do, otherwise only the
    request's ids count.
    """

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        device: str = "auto",
        dtype: torch.dtype | None = None,
        tokens_per_block: int = 16,
        kv_cache_max_tokens: int = 32768,
        max_batch_size: int = 8,
        max_prefill_tokens_per_step: int = 2048,
        stop_on_eos: bool = False,
        kv_event_history: int = DEFAULT_MAX_EVENTS,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.device = torch.device(resolve_device(device))
        self.dtype = dtype or _default_dtype(self.device)
        self.model = _load_model(Path(checkpoint), self.device, self.dtype)
        self.config = self.model.config
        _check_cache_layout(self.config)
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self.max_context = getattr(self.config.get_text_config(decoder=True), "max_position_embeddings", None)
        self.eos_token_ids = _eos_token_ids(self.model)
        self._stop_ids = self.eos_token_ids if stop_on_eos else frozenset()
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens_per_step = max_prefill_tokens_per_step
        self.events = KvEventLog(kv_event_history)
        self.prefix_cache = PrefixKvCache(tokens_per_block, kv_cache_max_tokens, self.events)
        self.info = EngineInfo(
            name="transformers",
            tokens_per_block=tokens_per_block,
            kv_cache_hash=KV_CACHE_HASH,
            max_batch_size=max_batch_size,
            kv_cache_max_tokens=kv_cache_max_tokens,
            device=str(self.device),
        )
        self._submissions: queue.Queue[_Sequence | None] = queue.Queue()
        self._lock = threading.Lock()
        self._aborts: set[str] = set()
        self._live: set[str] = set()
        self._waiting: list[_Sequence] = []
        self._batch = _Batch()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._counters: dict[str, float] = dict.fromkeys(ENGINE_COUNTERS, 0.0)

    # ------------------------------------------------------------------ the Engine interface

    async def start(self) -> None:
        """Start the generation thread (again after `stop`, if need be)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tokenfront-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Abort whatever is waiting or running (streams end with "abort") and join the generation thread."""
        thread = self._thread
        if thread is None:
            return
        with self._lock:
            self._stopping = True
        self._submissions.put(None)
        await asyncio.to_thread(thread.join)
        self._thread = None

    def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queue a request (call from the event loop that will read the stream); tokens arrive on the stream.

        Raises ValueError for a request the model cannot run (empty prompt, ids outside the vocabulary, a prompt
        that fills the context, `max_tokens` < 1, a request id already running) and RuntimeError when the
        engine is not started.
        """
        self._validate(request)
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[TokenOutput | BaseException] = asyncio.Queue()
        stream = GenerationStream(request.request_id, len(request.prompt_token_ids))
        stream._outputs = self._iterate(request.request_id, outputs)
        sequence = _Sequence(
            request=request,
            stream=stream,
            loop=loop,
            outputs=outputs,
            generator=_generator(request.params.seed, self.device),
            token_ids=list(request.prompt_token_ids),
        )
        # Checked and queued under the lock that `stop` takes: a request is either refused or seen by the
        # thread's final drain, never left unanswered in the queue.
        with self._lock:
            if self._thread is None or self._stopping:
                raise RuntimeError("the engine is not running: call start() first")
            if request.request_id in self._live:
                raise ValueError(f"request id {request.request_id!r} is already running")
            self._live.add(request.request_id)
            self._submissions.put(sequence)
        self._counters["requests_submitted"] += 1
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a waiting or running request at the next step; unknown or finished ids are ignored."""
        with self._lock:
            if request_id not in self._live:
                return
            self._aborts.add(request_id)
        self._submissions.put(None)  # wake an idle loop

    def abort_all(self) -> int:
        """Abort every waiting or running request at the next step (the shutdown deadline: their streams end
        with "abort"); returns how many there were."""
        self.cut_at_shutdown = True
        with self._lock:
            live = set(self._live)
            self._aborts |= live
        if live:
            self._submissions.put(None)  # wake an idle loop
        return len(live)

    def kv_events(self, after: int, limit: int = 1000, log_id: str | None = None) -> dict[str, Any]:
        """The KV event log after `after` (see `worker/kv_events.py` for the events and the reply's fields);
        a reader that missed events gets the prefix cache's snapshot instead."""
        return self.events.read(after, limit, log_id=log_id, snapshot=self.prefix_cache.snapshot)

    def stats(self) -> dict[str, float]:
        """Counters: requests, prompt tokens (total / from cache / computed), decode steps and batch sizes."""
        stats = dict(self._counters)
        steps = stats["decode_steps"]
        stats["decode_batch_size_mean"] = stats["decode_tokens"] / steps if steps else 0.0
        stats["running"] = float(len(self._batch.rows))
        stats["waiting"] = float(len(self._waiting) + self._submissions.qsize())
        stats["kv_cache_blocks"] = float(self.prefix_cache.num_blocks)
        stats["kv_cache_tokens"] = float(self.prefix_cache.num_tokens)
        stats["kv_cache_max_tokens"] = float(self.prefix_cache.max_tokens)
        stats["kv_cache_stored_blocks"] = float(self.prefix_cache.stored_blocks)
        stats["kv_cache_evicted_blocks"] = float(self.prefix_cache.evicted_blocks)
        stats["kv_events_last_seq"] = float(self.events.last_seq)
        return stats

    def clear_kv_cache(self) -> None:
        """Drop the prefix cache (a "cleared" event); running sequences keep their own KV."""
        self.prefix_cache.clear()

    # ------------------------------------------------------------------ the event-loop side

    def _validate(self, request: GenerationRequest) -> None:
        check_runnable(request, self.vocab_size, self.max_context)

    async def _iterate(
        self, request_id: str, outputs: asyncio.Queue[TokenOutput | BaseException]
    ) -> AsyncIterator[TokenOutput]:
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finish_reason is not None
                yield item
        finally:
            if not finished:  # the reader walked away: stop spending compute on it
                self.abort(request_id)

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                aborts = self._take_aborts()
                self._receive(block=not self._batch.rows and not self._waiting)
                if self._stopping:
                    break
                try:
                    self._step(aborts)
                except Exception as error:  # a bug must not kill the thread and leave streams hanging
                    log.exception("engine step failed; failing the running requests")
                    self._fail([s for s in self._batch.rows if not s.done], error)
                    self._batch = _Batch()
            self._abort_everything()

    def _step(self, aborts: set[str]) -> None:
        self._apply_aborts(aborts)
        self._admit()
        if self._batch.rows:
            self._decode_step()

    def _take_aborts(self) -> set[str]:
        # Taken before the submissions are drained: a request aborted now was submitted before, so it is
        # already in the queue and is found below.
        with self._lock:
            aborts, self._aborts = self._aborts, set()
        return aborts

    def _receive(self, block: bool) -> None:
        try:
            item = self._submissions.get(block=block)
            while True:
                if item is not None:
                    self._waiting.append(item)
                item = self._submissions.get_nowait()
        except queue.Empty:
            pass

    def _apply_aborts(self, aborts: set[str]) -> None:
        if not aborts:
            return
        for sequence in [s for s in self._waiting if s.request_id in aborts]:
            self._waiting.remove(sequence)
            self._finish_abort(sequence)
        aborted = [s for s in self._batch.rows if s.request_id in aborts]
        for sequence in aborted:
            self._finish_abort(sequence)
        self._leave([s for s in self._batch.rows if s.done])

    def _abort_everything(self) -> None:
        for sequence in self._waiting + self._batch.rows:
            self._finish_abort(sequence)
        self._waiting.clear()
        self._batch = _Batch()
        self._receive(block=False)  # submissions that raced with stop()
        for sequence in self._waiting:
            self._finish_abort(sequence)
        self._waiting.clear()

    def _finish_abort(self, sequence: _Sequence) -> None:
        self._counters["requests_aborted"] += 1
        self._emit(sequence, TokenOutput(NO_TOKEN, finish_reason="abort"))

    # ------------------------------------------------------------------ prefill

    def _admit(self) -> None:
        budget = self.max_prefill_tokens_per_step
        while self._waiting and len(self._batch.rows) < self.max_batch_size and budget > 0:
            sequence = self._waiting.pop(0)
            try:
                budget -= self._prefill(sequence)
            except Exception as error:  # a request the model cannot run fails alone
                self._fail([sequence], error)

    def _prefill(self, sequence: _Sequence) -> int:
        """Run the prompt (after the cached prefix), sample the first token, and join the batch.

        Returns how many prompt tokens were computed.
        """
        started = time.perf_counter()
        prompt = sequence.token_ids
        salt = sequence.request.cache_salt
        # Leave the last prompt token out of the lookup: its logits are needed, so it is always computed.
        cached, past = self.prefix_cache.match(prompt[:-1], salt)
        cache = _dynamic_cache(self.config, past)
        computed = len(prompt) - cached
        output = self.model(
            input_ids=torch.tensor([prompt[cached:]], device=self.device),
            position_ids=torch.arange(cached, len(prompt), device=self.device).unsqueeze(0),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        kv = _kv_of(cache)
        self.prefix_cache.store(prompt, salt, kv)
        sequence.kv_len = len(prompt)
        self._counters["prompt_tokens"] += len(prompt)
        self._counters["prompt_tokens_cached"] += cached
        self._counters["prefill_tokens_computed"] += computed
        self._counters["prefill_seconds"] += time.perf_counter() - started
        self._post(sequence, lambda: setattr(sequence.stream, "cached_tokens", cached))
        self._advance(sequence, output.logits[0, -1].float())
        if not sequence.done:
            self._join(sequence, kv)
        return computed

    # ------------------------------------------------------------------ decode

    def _decode_step(self) -> None:
        batch = self._batch
        rows = batch.rows
        assert batch.cache is not None and batch.mask is not None
        started = time.perf_counter()
        attention_mask = torch.cat([batch.mask, batch.mask.new_ones((len(rows), 1))], dim=1)
        try:
            output = self.model(
                input_ids=torch.tensor([[s.pending] for s in rows], device=self.device),
                attention_mask=attention_mask,
                position_ids=torch.tensor([[s.kv_len] for s in rows], device=self.device),
                cache=batch.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        except Exception as error:  # the batch's KV is now unusable: fail its requests, keep serving
            self._fail(rows, error)
            self._batch = _Batch()
            return
        batch.mask = attention_mask
        logits = output.logits[:, -1].float()
        for index, sequence in enumerate(rows):
            sequence.kv_len += 1
            try:
                self._advance(sequence, logits[index])
            except Exception as error:  # e.g. a grammar that breaks: that request fails, the others go on
                self._fail([sequence], error)
        self._counters["decode_steps"] += 1
        self._counters["decode_tokens"] += len(rows)
        self._counters["decode_batch_size_max"] = max(self._counters["decode_batch_size_max"], len(rows))
        self._counters["decode_seconds"] += time.perf_counter() - started
        self._leave([s for s in rows if s.done])

    def _advance(self, sequence: _Sequence, logits: torch.Tensor) -> None:
        """Pick the sequence's next token from its logits row and send it, ending the sequence if it must."""
        params = sequence.params
        constraint = sequence.request.constraint
        if constraint is not None:
            constraint.mask_logits(logits)
            if not bool(torch.isfinite(logits).any()):
                self._fail([sequence], RuntimeError("the output constraint allows no next token"))
                return
        token = _pick_token(logits, params, sequence.generator)
        logprob, top = _logprobs(logits, token, params.logprobs)
        if constraint is not None:
            constraint.accept(token)
        sequence.token_ids.append(token)
        sequence.generated += 1
        sequence.pending = token
        finish = self._finish_reason(sequence, token)
        if finish is not None:
            self._counters["requests_finished"] += 1
        self._emit(sequence, TokenOutput(token, logprob, top, finish))

    def _finish_reason(self, sequence: _Sequence, token: int) -> str | None:
        params = sequence.params
        constraint = sequence.request.constraint
        if token in params.stop_token_ids or token in self._stop_ids:
            return "stop"
        if constraint is not None and constraint.is_finished():
            return "stop"
        if sequence.generated >= params.max_tokens:
            return "length"
        if self.max_context is not None and len(sequence.token_ids) >= self.max_context:
            return "length"
        return None

    # ------------------------------------------------------------------ the batch

    def _join(self, sequence: _Sequence, kv: KvLayers) -> None:
        """Add a prefilled sequence to the batch: left-pad the shorter side, concatenate on the batch dim."""
        batch = self._batch
        length = max(batch.length, sequence.kv_len)
        row_mask = torch.ones((1, sequence.kv_len), dtype=torch.long, device=self.device)
        if batch.cache is None or batch.mask is None:
            batch.cache = _dynamic_cache(self.config, kv)
            batch.mask = row_mask
        else:
            grow = length - batch.length
            pad = length - sequence.kv_len
            merged = [
                (
                    torch.cat([_left_pad(k, grow), _left_pad(nk, pad)]),
                    torch.cat([_left_pad(v, grow), _left_pad(nv, pad)]),
                )
                for (k, v), (nk, nv) in zip(_kv_of(batch.cache), kv, strict=True)
            ]
            batch.cache = _dynamic_cache(self.config, merged)
            batch.mask = torch.cat([F.pad(batch.mask, (grow, 0)), F.pad(row_mask, (pad, 0))])
        batch.rows.append(sequence)

    def _leave(self, leaving: Sequence[_Sequence]) -> None:
        """Remove finished sequences, keep their computed blocks in the prefix cache, trim shared padding."""
        if not leaving:
            return
        batch = self._batch
        assert batch.cache is not None and batch.mask is not None
        for sequence in leaving:
            self._store_sequence(sequence, batch.rows.index(sequence))
        keep = [i for i, s in enumerate(batch.rows) if s not in leaving]
        batch.rows = [batch.rows[i] for i in keep]
        if not keep:
            self._batch = _Batch()
            return
        # Columns left of the longest remaining row are padding for every row: drop them.
        start = batch.length - max(s.kv_len for s in batch.rows)
        index = torch.tensor(keep, device=self.device)
        kept = [(k[index, :, start:], v[index, :, start:]) for k, v in _kv_of(batch.cache)]
        batch.cache = _dynamic_cache(self.config, kept)
        batch.mask = batch.mask[index, start:]

    def _store_sequence(self, sequence: _Sequence, row: int) -> None:
        """Keep the blocks of prompt + generated ids whose KV the batch computed (all but the pending token)."""
        cache = self._batch.cache
        assert cache is not None
        start = self._batch.length - sequence.kv_len
        kv = [(k[row : row + 1, :, start:], v[row : row + 1, :, start:]) for k, v in _kv_of(cache)]
        self.prefix_cache.store(sequence.token_ids[: sequence.kv_len], sequence.request.cache_salt, kv)

    # ------------------------------------------------------------------ talking to the event loop

    def _emit(self, sequence: _Sequence, output: TokenOutput) -> None:
        if output.finish_reason is not None:
            sequence.done = True
            with self._lock:
                self._live.discard(sequence.request_id)
                self._aborts.discard(sequence.request_id)
        self._post(sequence, lambda: sequence.outputs.put_nowait(output))

    def _fail(self, sequences: Sequence[_Sequence], error: BaseException) -> None:
        for sequence in sequences:
            sequence.done = True
            self._counters["requests_failed"] += 1
            with self._lock:
                self._live.discard(sequence.request_id)
            self._post(sequence, lambda s=sequence: s.outputs.put_nowait(error))

    def _post(self, sequence: _Sequence, callback: Any) -> None:
        # The reader's loop may be gone (its client left and the loop closed): then nobody is listening.
        with contextlib.suppress(RuntimeError):
            sequence.loop.call_soon_threadsafe(callback)


# ---------------------------------------------------------------------- model and cache helpers


def resolve_device(device: str) -> str:
    """The device `--device` names: "auto" is CUDA when present, else CPU.

    ValueError (one line, naming the option) when CUDA is asked for and this torch cannot use it: called before
    the model loads, so the mistake is found at once rather than when the weights are moved.
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = f"this torch ({torch.__version__}) is built without CUDA"
        else:
            why = f"this torch ({torch.__version__}, CUDA {torch.version.cuda}) finds no usable CUDA device"
        raise ValueError(f"--device {device}: {why}; use --device cpu (or auto)")
    return device


def _default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _load_model(checkpoint: Path, device: torch.device, dtype: torch.dtype) -> Any:
    """Load the checkpoint's model onto `device`, reporting progress (a bar on a terminal, log lines
    otherwise) and ending with one line: `model loaded in 2.1 s (538.1 MB of float32 weights on cpu)`."""
    if not (checkpoint / "config.json").is_file():
        raise FileNotFoundError(
            f"{checkpoint} has no config.json: point the engine at a model checkpoint folder"
        )
    started = time.monotonic()
    # Where Hugging Face's bars are off (HF_HUB_DISABLE_PROGRESS_BARS=1, which `--log-format json` sets), so is
    # this one: the load is told in log lines only.
    bar = None if transformers_logging.is_progress_bar_enabled() else False
    with (
        Progress("loading model", unit="tensors", emit=log.info, bar=bar) as progress,
        _loading_bars_to(progress),
    ):
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
        except OSError as error:
            raise FileNotFoundError(f"{checkpoint}: cannot load model weights ({error})") from error
        except SafetensorError as error:  # a truncated or corrupt file: the operator's to fix
            raise ValueError(f"{checkpoint}: unreadable model weights ({error})") from error
        model.to(device)
        model.eval()
        size = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
        weights = str(dtype).removeprefix("torch.")
        took = time.monotonic() - started
        progress.close(
            f"model loaded in {took:.1f} s ({format_bytes(size)} of {weights} weights on {device})"
        )
    return model


@contextlib.contextmanager
def _loading_bars_to(progress: Progress) -> Iterator[None]:
    """Meanwhile, transformers' own loading bars (tqdm, redrawn with carriage returns even into a log file)
    count into `progress` instead, so the load has one report in the worker's style."""
    set_hook = getattr(transformers_logging, "set_tqdm_hook", None)
    if set_hook is None:  # a transformers without the hook: its bars are silenced, the summary line stays
        enabled = transformers_logging.is_progress_bar_enabled()
        transformers_logging.disable_progress_bar()
        try:
            yield
        finally:
            if enabled:
                transformers_logging.enable_progress_bar()
        return
    previous = set_hook(lambda _factory, args, kwargs: _CountedBar(progress, *args, **kwargs))
    try:
        yield
    finally:
        set_hook(previous)


class _CountedBar:
    """Stands in for a tqdm bar transformers opens while loading: its counts go to a `Progress`."""

    def __init__(
        self,
        progress: Progress,
        iterable: Iterable[Any] | None = None,
        *_: Any,
        total: int | None = None,
        **__: Any,
    ) -> None:
        if total is None and iterable is not None:
            with contextlib.suppress(TypeError):
                total = len(iterable)  # type: ignore[arg-type]  # a sized iterable; a generator has none
        self._progress = progress
        self._iterable = iterable
        self._done = 0
        progress.update(0, total=total)

    def __iter__(self) -> Iterator[Any]:
        for item in self._iterable or ():
            yield item
            self.update()

    def update(self, n: int = 1) -> None:
        """Count `n` more items done, as tqdm's `update`."""
        self._done += n
        self._progress.update(self._done)

    def __enter__(self) -> _CountedBar:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def __getattr__(self, _name: str) -> Any:
        # The rest of tqdm's surface (close, set_description, set_postfix, refresh, ...): nothing to do.
        return lambda *args, **kwargs: None


def _check_cache_layout(config: Any) -> None:
    """Batching and block reuse slice KV by position: that needs every layer to keep its full KV."""
    layers = DynamicCache(config=config).layers
    if any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise NotImplementedError(
            f"this engine serves models whose every layer uses full attention; this one has {', '.join(kinds)}"
        )


def _eos_token_ids(model: Any) -> frozenset[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def _dynamic_cache(config: Any, kv: KvLayers | None) -> DynamicCache:
    """A DynamicCache holding `kv` as is (no copy), or an empty one."""
    cache = DynamicCache(config=config)
    if kv is not None:
        for layer, (keys, values) in zip(_layers(cache), kv, strict=True):
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
    return cache


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers, all plain DynamicLayers (checked once by `_check_cache_layout`)."""
    return cast(list[DynamicLayer], cache.layers)


def _kv_of(cache: DynamicCache) -> KvLayers:
    """Every layer's (keys, values), as the cache holds them."""
    kv = [(layer.keys, layer.values) for layer in _layers(cache)]
    assert all(k is not None and v is not None for k, v in kv), "every layer holds KV after a forward"
    return cast(KvLayers, kv)


def _left_pad(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """Pad [batch, heads, tokens, dim] KV with `count` zero positions on the left."""
    return F.pad(tensor, (0, 0, count, 0)) if count else tensor


# ---------------------------------------------------------------------- sampling


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _pick_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Greedy below a temperature of 1e-5, else a draw after temperature, top-k and top-p."""
    if params.temperature < _GREEDY_EPS:
        return int(torch.argmax(logits))
    scores = logits / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first one always stays).
        drop = torch.cumsum(probs, dim=-1) - probs >= params.top_p
        scores = scores.scatter(0, order[drop], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _logprobs(
    logits: torch.Tensor, token: int, top: int | None
) -> tuple[float | None, tuple[tuple[int, float], ...] | None]:
    """The chosen token's log-probability and the `top` most likely, from the (constrained) model logits."""
    if top is None:
        return None, None
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = float(logprobs[token])
    if top <= 0:
        return chosen, None
    values, ids = torch.topk(logprobs, min(top, logprobs.shape[-1]))
    return chosen, tuple((int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True))

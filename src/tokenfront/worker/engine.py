"""The engine interface: what the worker's HTTP layer needs from whatever runs the model.

An engine takes prompt ids and sampling parameters and streams generated ids. It knows nothing of text,
chat templates or HTTP: stop strings, detokenization, parsers and the OpenAI shapes live in the output
core (`tokenfront.core.output`). Two implementations: engines/transformers.py runs a real model,
engines/simulated.py models a GPU worker without one (docs/simulation.md); another engine plugs in here.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token, and when to stop on ids.

    `temperature` 0 is greedy. `top_k` -1 is off. `logprobs` None returns none, 0 the chosen token's, k also
    the k most likely. `stop_token_ids` ends generation when one is produced (it is returned, finish "stop").
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    logprobs: int | None = None


class TokenConstraint(Protocol):
    """Restricts which tokens may come next (a grammar); the engine consults it at every step."""

    def mask_logits(self, logits: Any) -> None:
        """Set the logits of disallowed tokens to -inf, in place (a 1-D float tensor over the vocabulary)."""

    def accept(self, token_id: int) -> None:
        """Advance past the token that was chosen."""

    def is_finished(self) -> bool:
        """Whether the grammar is complete: the engine then ends the sequence with finish reason "stop"."""


@dataclass
class GenerationRequest:
    """One sequence to generate. `n` > 1 is the service layer's business: it submits n of these."""

    request_id: str
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    cache_salt: str | None = None
    constraint: TokenConstraint | None = None


# The token id of an output that carries no token: the last output of an aborted sequence.
NO_TOKEN = -1


# The counters every engine's `stats()` reports (the `tokenfront_engine_*` gauges docs/api.md lists).
ENGINE_COUNTERS = (
    "requests_submitted",
    "requests_finished",
    "requests_aborted",
    "requests_failed",
    "prompt_tokens",
    "prompt_tokens_cached",
    "prefill_tokens_computed",
    "prefill_seconds",
    "decode_steps",
    "decode_tokens",
    "decode_seconds",
    "decode_batch_size_max",
)


def check_runnable(request: GenerationRequest, vocab_size: int, max_context: int | None) -> None:
    """What no engine can run, refused the same way by every engine's `submit` (a ValueError, which the worker
    answers as a 400): an empty prompt, `max_tokens` below 1, ids outside [0, `vocab_size`), a prompt that fills
    the context (`max_context`; None: unknown)."""
    ids = request.prompt_token_ids
    if not ids:
        raise ValueError("the prompt has no tokens")
    if request.params.max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
    if max_context is not None and len(ids) >= max_context:
        raise ValueError(f"the prompt has {len(ids)} tokens; this model's context is {max_context} tokens")


@dataclass(frozen=True)
class TokenOutput:
    """One generated token. `finish_reason` is None until the last: "stop", "length" or "abort".

    An aborted sequence ends with an output whose `token_id` is NO_TOKEN.
    """

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None
    finish_reason: str | None = None


@dataclass
class GenerationStream:
    """The tokens of one request as the engine produces them.

    `cached_tokens` is set once the prompt is prefilled: how many prompt tokens came from the prefix cache.
    Iterate it for TokenOutputs; `cancel()` (or abandoning it via the engine's `abort`) stops the work.
    """

    request_id: str
    prompt_tokens: int
    cached_tokens: int | None = None
    _outputs: AsyncIterator[TokenOutput] | None = field(default=None, repr=False)

    def __aiter__(self) -> AsyncIterator[TokenOutput]:
        assert self._outputs is not None, "a stream is iterated once, as the engine made it"
        outputs, self._outputs = self._outputs, None
        return outputs


@dataclass(frozen=True)
class EngineInfo:
    """What a worker publishes about its engine on /server_info."""

    name: str
    tokens_per_block: int
    kv_cache_hash: str
    max_batch_size: int
    kv_cache_max_tokens: int
    device: str


class Engine(abc.ABC):
    """Runs a model. Thread-safe to call from the event loop; generation happens off the loop."""

    info: EngineInfo
    vocab_size: int  # the model's logits width; prompt ids must be below it
    max_context: int | None  # prompt plus generated tokens may not reach it (None: unknown)
    # Set by `abort_all` (the shutdown deadline): every sequence still in flight was aborted by the server, so
    # a request cut afterwards is not one whose client left.
    cut_at_shutdown: bool = False

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the generation loop (called once, inside the server's event loop)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Finish or abort what is running and stop the loop (graceful shutdown)."""

    @abc.abstractmethod
    def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queue a request; its tokens arrive on the returned stream."""

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Stop generating for a request (client gone, stop string found); its stream ends with "abort"."""

    @abc.abstractmethod
    def kv_events(self, after: int, limit: int = 1000, log_id: str | None = None) -> dict[str, Any]:
        """The KV cache event log after sequence number `after` (see worker/kv_events.py); a reader whose
        cursor is behind the history, or whose `log_id` is another life's, gets the cache's snapshot."""

    def stats(self) -> dict[str, float]:
        """Counters for /metrics (prefill tokens computed, prompt tokens from cache, ...)."""
        return {}

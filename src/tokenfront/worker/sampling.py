"""Sampling defaults and the token budget: the request's values, else the checkpoint's, as vLLM orders them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tokenfront.core.checkpoint import Checkpoint
from tokenfront.protocol import MIN_TOP_P, RequestLimits
from tokenfront.server.errors import APIError
from tokenfront.worker.engine import SamplingParams

__all__ = [
    "SamplingDefaults",
    "check_request_size",
    "check_request_tokens",
    "context_length",
]


def check_request_size(prompts: int, n: int, limits: RequestLimits, *, param: str = "n") -> None:
    """A 400 before any work when `prompts` x `n` sequences are more than a request may ask for (`limits`:
    the server's, `protocol.limits`)."""
    sequences = prompts * n
    if sequences > limits.max_sequences_per_request:
        raise APIError(
            400,
            f"this request asks for {sequences} sequences ({prompts} prompts x n={n}); this server generates "
            f"at most {limits.max_sequences_per_request} per request: lower n or send the prompts in several requests",
            param=param,
            code="request_too_large",
        )


def check_request_tokens(budgets: list[tuple[int, int]], n: int, limits: RequestLimits) -> None:
    """A 400 when the sequences' tokens, `n` x (prompt ids + generation budget) over the (prompt length,
    budget) pairs, are more than a request may ask for (`limits`: the server's)."""
    total = n * sum(prompt + budget for prompt, budget in budgets)
    if total > limits.max_tokens_per_request:
        raise APIError(
            400,
            f"this request asks for {total} tokens ({len(budgets)} prompts x n={n}, prompt tokens plus "
            f"max_tokens each); this server takes at most {limits.max_tokens_per_request} per request: set a lower "
            "max_tokens, lower n or send the prompts in several requests",
            param="max_tokens",
            code="request_too_large",
        )


@dataclass(frozen=True)
class SamplingDefaults:
    """What the checkpoint says about sampling: generation_config.json's values, the EOS ids, the context.

    `eos_ids` end every sequence and are never shown: generation_config's (else config's) and the
    tokenizer's. `context_length` None: unknown (requests must then send max_tokens, unless
    generation_config has max_new_tokens).
    """

    generation: dict[str, Any]
    eos_ids: frozenset[int]
    context_length: int | None

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Checkpoint, *, engine_context: int | None = None
    ) -> SamplingDefaults:
        """Read the checkpoint's files; `engine_context` (the engine's own limit) wins over the config's."""
        context = engine_context or context_length(checkpoint.config)
        return cls(dict(checkpoint.generation_config), checkpoint.eos_token_ids, context)

    def params(
        self, request: Any, prompt_length: int, max_tokens: int | None, logprobs: int | None
    ) -> SamplingParams:
        """Sampling parameters of a chat or completions request whose prompt is `prompt_length` ids."""
        defaults = self.generation
        top_k = request.top_k if request.top_k is not None else defaults.get("top_k", -1)
        if not isinstance(top_k, int) or (top_k < -1):
            raise APIError(400, "top_k must be -1 or 0 (off) or a positive number of tokens", param="top_k")
        return SamplingParams(
            max_tokens=self.max_tokens(prompt_length, max_tokens),
            temperature=_first(request.temperature, defaults.get("temperature"), 1.0),
            top_p=max(_first(request.top_p, defaults.get("top_p"), 1.0), MIN_TOP_P),
            top_k=top_k if top_k > 0 else -1,
            seed=request.seed,
            stop_token_ids=frozenset(request.stop_token_ids or ())
            | self.stop_ids(getattr(request, "ignore_eos", None)),
            logprobs=logprobs,
        )

    def stop_ids(self, ignore_eos: bool | None) -> frozenset[int]:
        """The EOS ids that end a sequence: none when the request asks to `ignore_eos` (vLLM's meaning)."""
        return frozenset() if ignore_eos else self.eos_ids

    def max_tokens(self, prompt_length: int, requested: int | None) -> int:
        """The token budget: `requested` if the context has room for it, else the room (or max_new_tokens)."""
        limit = self.context_length
        if limit is None:
            room = None
        else:
            room = limit - prompt_length
            if room < 1:
                raise APIError(
                    400,
                    f"the prompt is {prompt_length} tokens, which leaves no room to generate in this model's "
                    f"context of {limit} tokens; shorten the prompt",
                    param="messages",
                    code="context_length_exceeded",
                )
        if requested is not None:
            if room is not None and requested > room:
                raise APIError(
                    400,
                    f"this model's context is {limit} tokens; the prompt takes {prompt_length}, so at most "
                    f"{room} tokens can be generated, and {requested} were requested: lower max_tokens",
                    param="max_tokens",
                    code="context_length_exceeded",
                )
            return requested
        default = self.generation.get("max_new_tokens")
        candidates = [value for value in (room, default) if isinstance(value, int) and value > 0]
        if not candidates:
            raise APIError(400, "this model has no known context length: send max_tokens", param="max_tokens")
        return min(candidates)

    @staticmethod
    def for_choice(params: SamplingParams, index: int) -> SamplingParams:
        """Choice `index`'s parameters: n choices of one seeded request differ, yet stay reproducible."""
        if params.seed is None or not index:
            return params
        return replace(params, seed=params.seed + index)


def context_length(config: dict[str, Any]) -> int | None:
    """The context length a model config declares (its text config's, for a multimodal model)."""
    text_config = config.get("text_config") or {}
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        for source in (config, text_config):
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _first(*values: Any) -> Any:
    return next(value for value in values if value is not None)

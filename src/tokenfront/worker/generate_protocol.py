"""The request schema of `POST /inference/v1/generate`, field for field vLLM 0.33's `GenerateRequest`.

Tokens in, tokens out (vLLM's `entrypoints/scale_out/token_in_token_out/protocol.py`): a caller that has
rendered the prompt itself sends its ids and vLLM's `SamplingParams`; the answer is ids (`output_mode`
"tokens"), also their text ("text"), or the parsed assistant message ("derender").

vLLM accepts keys it does not know (at the top level and in `sampling_params`) and ignores them; so does
this model. What tokenfront's engine cannot do is refused by `unsupported_sampling()` with a 400 naming the
field, unless the value is the one that changes nothing (vLLM's default).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tokenfront.protocol import (
    MIN_TOP_P,
    NamedToolChoice,
    Tool,
    check_seed,
    check_stop_strings,
    check_tool_count,
)

__all__ = [
    "GenerateRequest",
    "GenerateSamplingParams",
    "GenerateStreamOptions",
    "OutputMode",
    "ParseContext",
    "unsupported_sampling",
]

OutputMode = Literal["tokens", "text", "derender"]

# vLLM sampling parameters tokenfront's engine does not implement, with the value that means "off" (vLLM's
# default). Any other value is a 400; None is always accepted (vLLM's defaults apply).
_NEUTRAL_SAMPLING: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "min_tokens": (0,),
    "prompt_logprobs": (),
    "prompt_logprob_token_ids": (),
    "prompt_logprob_start": (),
    "logprob_token_ids": (),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "structured_outputs": (),
    "logit_bias": ({},),
    "allowed_token_ids": (),
    "bad_words": ([],),
    "extra_args": ({},),
    "thinking_token_budget": (),
    "repetition_detection": (),
    "watermarking": (),
    "skip_reading_prefix_cache": (False,),
    "trace_decode_token_ids": (),
}


class GenerateSamplingParams(BaseModel):
    """vLLM's `SamplingParams` as JSON: the fields tokenfront honours, typed; the rest kept for checking.

    Ignored as vLLM's server ignores or overrides them: `output_kind`, `stream_interval`, `skip_clone`,
    `flat_logprobs`, `spaces_between_special_tokens`, `output_text_buffer_length`,
    `routed_experts_prompt_start`, and unknown keys.
    """

    model_config = ConfigDict(extra="allow")

    n: int = Field(default=1, ge=1, le=128)
    # vLLM's SamplingParams refuses a temperature above 2 and one that is not finite.
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    # vLLM: the number of top candidates besides the sampled token (-1: the whole vocabulary).
    logprobs: int | None = Field(default=None, ge=0, le=20)
    detokenize: bool = True

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_in_range(cls, value: Any) -> Any:
        return check_seed(value)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings_bounded(cls, value: Any) -> Any:
        return check_stop_strings(value)

    @field_validator("top_p")
    @classmethod
    def _top_p_floor(cls, value: float) -> float:
        # See protocol.MIN_TOP_P: the same answer (the most likely token), without float32 rounding it to 0.
        return max(value, MIN_TOP_P)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value < -1:
            raise ValueError("top_k must be -1 or 0 (off) or a positive number of tokens")
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings, as a tuple."""
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class GenerateStreamOptions(BaseModel):
    """vLLM's `StreamOptions`."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ParseContext(BaseModel):
    """What `/render` hands the generate server so it can parse output (`output_mode` "derender")."""

    model_config = ConfigDict(extra="allow")

    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = "none"
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    history_tool_call_cnt: int = Field(default=0, ge=0)

    @field_validator("tools", mode="before")
    @classmethod
    def _not_too_many_tools(cls, value: Any) -> Any:
        return check_tool_count(value)


class GenerateRequest(BaseModel):
    """vLLM's `GenerateRequest` (see the module docstring)."""

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    token_ids: list[int] = Field(min_length=1)
    token_offsets: list[tuple[int, int]] | None = None
    features: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None
    sampling_params: GenerateSamplingParams
    model: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    return_token_ids: bool | None = None
    output_mode: OutputMode = "tokens"
    parse_context: ParseContext | None = None
    stream: bool | None = False
    stream_options: GenerateStreamOptions | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    priority: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None

    @field_validator("token_ids")
    @classmethod
    def _non_negative(cls, value: list[int]) -> list[int]:
        if any(token_id < 0 for token_id in value):
            raise ValueError("token_ids must not contain negative values")
        return value

    @model_validator(mode="after")
    def _vllm_rules(self) -> GenerateRequest:
        if self.content_parts and self.features:
            raise ValueError("content_parts and features are mutually exclusive")
        if self.output_mode != "tokens" and not self.sampling_params.detokenize:
            raise ValueError(
                f"output_mode={self.output_mode!r} requires sampling_params.detokenize to be true"
            )
        if (
            self.output_mode == "derender"
            and self.parse_context is not None
            and self.parse_context.model_extra
        ):
            unknown = sorted(self.parse_context.model_extra)
            raise ValueError(
                f"Unknown parse_context fields {unknown}; the render server is newer than this generate server"
            )
        return self


def unsupported_sampling(params: GenerateSamplingParams) -> str | None:
    """The first sampling parameter set to something tokenfront's engine cannot do, or None."""
    for name, value in (params.model_extra or {}).items():
        neutral = _NEUTRAL_SAMPLING.get(name)
        if neutral is not None and value is not None and value not in neutral:
            return name
    return None

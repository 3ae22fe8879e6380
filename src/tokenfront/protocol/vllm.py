"""vLLM's own request and response bodies tokenfront speaks, declared once for every side that speaks them.

- `/tokenize` and `/detokenize` (vLLM 0.33's `entrypoints/serve/tokenize/protocol.py`);
- the derender bodies (`POST /v1/chat/completions/derender`, `/v1/completions/derender`): vLLM's generate
  answers (`GenerateOutput`) with the prompt they answer;
- `POST /inference/v1/generate`'s request, field for field vLLM 0.33's `GenerateRequest`. Tokens in, tokens out
  (vLLM's `entrypoints/scale_out/token_in_token_out/protocol.py`): a caller that has rendered the prompt
  itself sends its ids and vLLM's `SamplingParams`; the answer is ids (`output_mode` "tokens"), also their
  text ("text"), or the parsed assistant message ("derender"). vLLM accepts keys it does not know (at the top
  level and in `sampling_params`) and ignores them; so does this model. What tokenfront's engine cannot do is
  refused by `unsupported_sampling()` with a 400 naming the field, unless the value is the one that changes
  nothing (vLLM's default).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    field_validator,
    model_validator,
)

from tokenfront.protocol.base import StrictModel
from tokenfront.protocol.limits import (
    BOUNDED_MESSAGES,
    BOUNDED_STOP,
    BOUNDED_TOOLS,
    DEFAULT_LIMITS,
    RequestLimits,
    validation_context,
)
from tokenfront.protocol.openai import (
    MIN_TOP_P,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    NamedToolChoice,
    Tool,
    check_seed,
)


class TokenizeRequest(StrictModel):
    """vLLM's `TokenizeCompletionRequest` (`prompt`) or `TokenizeChatRequest` (`messages`), in one body.

    With `messages` it is a chat request (as vLLM reads a body that has both); `add_special_tokens` defaults to
    true for a prompt and false for messages, as in vLLM.
    """

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage] | None, BOUNDED_MESSAGES] = Field(default=None, min_length=1)
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = False
    # chat only
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Annotated[list[Tool] | None, BOUNDED_TOOLS] = None

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if self.messages is None and self.prompt is None:
            raise ValueError("give `prompt` (text) or `messages` (a chat)")
        return self

    @property
    def is_chat(self) -> bool:
        """Whether the body is a chat (`messages`), not a text prompt."""
        return self.messages is not None

    def chat_request(self, limits: RequestLimits = DEFAULT_LIMITS) -> ChatCompletionRequest:
        """The chat request this body renders as (vLLM's `to_chat_completion_request`), held to `limits`."""
        request = ChatCompletionRequest.model_validate(
            {
                "model": self.model,
                "messages": [message.model_dump(exclude_unset=True) for message in self.messages or ()],
                "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
                "add_special_tokens": bool(self.add_special_tokens),
                "chat_template": self.chat_template,
                "chat_template_kwargs": self.chat_template_kwargs,
            },
            context=validation_context(limits),
        )
        # /tokenize takes `tools: []`, which the chat route refuses; the template gets it as sent.
        return request if self.tools is None else request.model_copy(update={"tools": self.tools})


class TokenizeResponse(BaseModel):
    """vLLM's `TokenizeResponse`, field for field."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(StrictModel):
    """vLLM's `DetokenizeRequest`."""

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    """vLLM's `DetokenizeResponse`."""

    prompt: str


# -- POST /inference/v1/generate (vLLM 0.33's `GenerateRequest`) ----------------------------------------------

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
    stop: Annotated[str | list[str] | None, BOUNDED_STOP] = None
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

    tools: Annotated[list[Tool] | None, BOUNDED_TOOLS] = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = "none"
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    history_tool_call_cnt: int = Field(default=0, ge=0)


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


# -- derender (vLLM 0.33's `DerenderChatRequest`, `DerenderCompletionRequest` and their stream forms) ----------


class GenerateChoice(BaseModel):
    """One choice of vLLM's `GenerateTokensResponse` (or of a stream chunk)."""

    model_config = ConfigDict(extra="allow")

    index: NonNegativeInt = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[NonNegativeInt] | None = None


class GenerateOutput(BaseModel):
    """vLLM's `GenerateTokensResponse` / `GenerateTokensStreamResponse` (`output_mode` "tokens" only)."""

    model_config = ConfigDict(extra="allow")

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    output_mode: Literal["tokens"] = "tokens"
    choices: list[GenerateChoice]
    prompt_token_ids: list[NonNegativeInt] | None = None
    usage: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None


class _DerenderBody(BaseModel):
    stream: bool = False
    model: str | None = None
    generate_chunk: GenerateOutput | None = None
    stream_state: dict[str, Any] | None = None


class ChatDerenderRequest(_DerenderBody):
    """`DerenderChatRequest` (stream false) or `DerenderChatStreamRequest` (stream true)."""

    generate_response: GenerateOutput | None = None
    prompt_tokens: int | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None
    chat_request: ChatCompletionRequest | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ChatDerenderRequest:
        _require(self.stream, self.generate_response is not None, "generate_response")
        return self


class CompletionDerenderRequest(_DerenderBody):
    """`DerenderCompletionRequest` (stream false) or `DerenderCompletionStreamRequest` (stream true)."""

    generate_responses: list[GenerateOutput] | None = None
    prompt_tokens: list[int] | int | None = None
    prompt_token_ids: list[list[NonNegativeInt] | None] | list[NonNegativeInt] | None = None
    completion_request: CompletionRequest | None = None

    @model_validator(mode="after")
    def _one_form(self) -> CompletionDerenderRequest:
        _require(self.stream, self.generate_responses is not None, "generate_responses")
        if not self.stream:
            count = len(self.generate_responses or ())
            for name in ("prompt_tokens", "prompt_token_ids"):
                value = getattr(self, name)
                if value is not None and (not isinstance(value, list) or len(value) != count):
                    raise ValueError(f"{name} must be a list as long as generate_responses ({count})")
        return self


def _require(stream: bool, has_whole: bool, whole: str) -> None:
    # Called inside a validator: a ValueError becomes the usual 400 naming the field.
    if stream and has_whole:
        raise ValueError(f"a streaming derender (stream: true) takes generate_chunk, not {whole}")
    if not stream and not has_whole:
        raise ValueError(f"{whole} is required (or stream: true with generate_chunk)")

"""Request and response models at the HTTP boundary: the OpenAI subset tokenfront reads, and the render schema.

Requests are validated strictly (no silent coercion of "5" to 5) but keep unknown fields, because the original
body is echoed back in render responses and forwarded to workers unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class FunctionCall(_Strict):
    name: str
    # OpenAI sends a JSON string; some clients send the object itself.
    arguments: str | dict[str, Any] | None = None


class ToolCall(_Strict):
    id: str | None = None
    type: str | None = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Role
    # Parts are checked by the core (core/messages.py) so that multimodal parts get their own clear error.
    content: str | list[Any] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    thinking: str | None = None


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool | None = None


class _GenerationFields(_Strict):
    """Sampling fields shared by chat and completions; the renderer ignores them, the worker reads them."""

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=1, ge=1, le=128)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    cache_salt: str | None = None
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool | None = None

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _int_is_a_float(cls, value: Any) -> Any:
        # JSON has one number type; strict mode would otherwise reject `"temperature": 0`.
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _positive_or_minus_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1 and value != -1:
            raise ValueError("must be a positive number of tokens to keep, or -1 for the model's maximum")
        return value


class ChatCompletionRequest(_GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's values; Harmony (gpt-oss) and mistral-common read it, templates see it only via chat_template_kwargs.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    prompt_token_ids: list[int] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @property
    def named_tool(self) -> str | None:
        """The function a named `tool_choice` forces, if any."""
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None


PromptShape = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_GenerationFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: PromptShape) -> PromptShape:
        if isinstance(value, list) and not value:
            raise ValueError("must not be an empty list")
        if isinstance(value, list) and any(isinstance(item, list) and not item for item in value):
            raise ValueError("must not contain an empty token list")
        return value

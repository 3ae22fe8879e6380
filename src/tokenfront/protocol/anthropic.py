"""The Anthropic Messages body (vLLM 0.33's `entrypoints/anthropic/protocol.py`), which the render routes
convert to the chat request vLLM builds from it (core/requests/anthropic.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from tokenfront.protocol.base import StrictModel
from tokenfront.protocol.limits import BOUNDED_MESSAGES, BOUNDED_TOOLS


class AnthropicToolReference(StrictModel):
    type: Literal["tool_reference"]
    name: str


class AnthropicTool(StrictModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    defer_loading: bool | None = None


class AnthropicToolDefinition(StrictModel):
    type: Literal["tool_definition"]
    definition: AnthropicTool


class AnthropicContentBlock(StrictModel):
    """One content block; which fields apply depends on `type`."""

    type: Literal[
        "text",
        "image",
        "tool_use",
        "tool_result",
        "tool_reference",
        "thinking",
        "redacted_thinking",
        "tool_addition",
        "tool_removal",
    ]
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    tool_name: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    tool: AnthropicToolReference | AnthropicToolDefinition | None = Field(default=None, discriminator="type")

    @model_validator(mode="after")
    def _tool_change_has_its_tool(self) -> AnthropicContentBlock:
        if self.type in ("tool_addition", "tool_removal"):
            if self.tool is None:
                raise ValueError(f"tool is required for {self.type} blocks")
            if self.type == "tool_removal" and self.tool.type != "tool_reference":
                raise ValueError("tool_removal only accepts a tool_reference")
        return self


def _no_tool_changes(content: str | list[AnthropicContentBlock] | None) -> None:
    for block in content if isinstance(content, list) else ():
        if block.type in ("tool_addition", "tool_removal"):
            raise ValueError(f'{block.type} blocks are only allowed in messages with role "system"')


class AnthropicMessage(StrictModel):
    role: Literal["user", "assistant", "system"]
    content: str | list[AnthropicContentBlock]

    @model_validator(mode="after")
    def _tool_changes_only_in_system(self) -> AnthropicMessage:
        if self.role != "system":
            _no_tool_changes(self.content)
        return self


class AnthropicToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> AnthropicToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


AnthropicEffort = Literal["low", "medium", "high", "xhigh", "max"]


class AnthropicOutputConfig(StrictModel):
    effort: AnthropicEffort | None = None
    format: dict[str, Any] | None = None


class AnthropicThinkingEnabled(StrictModel):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Literal["summarized", "omitted", "updates"] | None = None


class AnthropicThinkingDisabled(StrictModel):
    type: Literal["disabled"]


class AnthropicThinkingAdaptive(StrictModel):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted", "updates"] | None = None


class AnthropicMessagesRequest(StrictModel):
    """An Anthropic Messages body (`POST /v1/messages/render`), validated as vLLM validates it."""

    model: str = Field(min_length=1)
    messages: Annotated[list[AnthropicMessage], BOUNDED_MESSAGES]
    max_tokens: int = Field(gt=0)
    system: str | list[AnthropicContentBlock] | None = None
    tools: Annotated[list[AnthropicTool] | None, BOUNDED_TOOLS] = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinkingEnabled | AnthropicThinkingDisabled | AnthropicThinkingAdaptive | None = Field(
        default=None, discriminator="type"
    )
    output_config: AnthropicOutputConfig | None = None
    metadata: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    # vLLM's additions
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    chat_template_kwargs: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _int_is_a_float(cls, value: Any) -> Any:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("system")
    @classmethod
    def _no_tool_changes_in_system_field(
        cls, value: str | list[AnthropicContentBlock] | None
    ) -> str | list[AnthropicContentBlock] | None:
        _no_tool_changes(value)
        return value

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> AnthropicMessagesRequest:
        # A disaggregated prefill leg (do_remote_decode) is sent with max_tokens=1; vLLM skips the check there.
        remote_decode = bool((self.kv_transfer_params or {}).get("do_remote_decode"))
        thinking = self.thinking
        if (
            isinstance(thinking, AnthropicThinkingEnabled)
            and not remote_decode
            and thinking.budget_tokens >= self.max_tokens
        ):
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self

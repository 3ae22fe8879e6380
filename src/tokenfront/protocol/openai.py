"""The OpenAI chat and completions bodies tokenfront reads (the subset vLLM 0.33 reads).

What vLLM 0.33's request models refuse beyond the schema (`tools: []`, a `tool_choice` without its tool, tool
calls without `id`, `type` or string `arguments`, null content outside assistant messages) is refused here with
a `RenderError`, as the render core refuses what it cannot render, so every path (template, Harmony,
mistral-common) answers the same 400. What vLLM's models fill in is filled in here too: a tool dumps as vLLM's
`ChatCompletionToolsParam` does (`"description": null` and all), and `reasoning_effort` reaches the template as
`reasoning_effort` and `enable_thinking` (vLLM's `build_chat_params`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from tokenfront.core.errors import RenderError
from tokenfront.protocol.base import StrictModel
from tokenfront.protocol.limits import BOUNDED_MESSAGES, BOUNDED_STOP, BOUNDED_TOOLS

# vLLM's request models take a seed in the 64-bit signed range; the engine seeds choice i with seed + i.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# top_p below this keeps the most likely token only, as any top_p below that token's probability (at least
# 1/vocabulary) does; a smaller value is read as this one, so that float32 sampling does not round it to 0.
MIN_TOP_P = 1e-8

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
# Roles whose `content` may be null (OpenAI's assistant and function message params); others may leave it out.
_NULL_CONTENT_ROLES = frozenset({"assistant", "function"})


def check_seed(value: Any) -> Any:
    """vLLM's range for `seed` (a 64-bit signed integer), checked before the type (a before-validator).

    orjson reads an integer beyond 64 bits as a float: a whole float of magnitude 2**63 or more is such an
    integer, out of range too, rather than "not an integer".
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        out_of_range = not SEED_MIN <= value <= SEED_MAX
    else:
        out_of_range = isinstance(value, float) and value.is_integer() and abs(value) >= 2**63
    if out_of_range:
        raise ValueError(f"must be a 64-bit signed integer, from {SEED_MIN} to {SEED_MAX}")
    return value


class FunctionCall(StrictModel):
    name: str
    # A JSON string, as OpenAI and vLLM require; anything else is refused by ChatCompletionRequest's rules (a
    # RenderError naming the message), not by the schema.
    arguments: Any = None


class ToolCall(StrictModel):
    # Required by OpenAI and vLLM; checked by ChatCompletionRequest's rules.
    id: str | None = None
    type: str | None = None
    function: FunctionCall


class ChatMessage(StrictModel):
    role: Role
    # Parts are checked by the core (core/messages.py) so that multimodal parts get their own clear error.
    content: str | list[Any] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    thinking: str | None = None


class FunctionDefinition(StrictModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None

    @model_serializer(mode="plain")
    def _as_vllm_dumps_it(self) -> dict[str, Any]:
        return self.vllm_dump()

    def vllm_dump(self) -> dict[str, Any]:
        """vLLM's FunctionDefinition dump, which is what templates see: name, description and parameters always
        (null when absent), strict and defer_loading only when set, unknown keys dropped, in this order."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }
        if self.strict is not None:
            out["strict"] = self.strict
        if self.defer_loading is not None:
            out["defer_loading"] = self.defer_loading
        return out


class Tool(StrictModel):
    """A function tool. Dumped (`model_dump`) as vLLM's `ChatCompletionToolsParam` dumps it for the template."""

    type: Literal["function"] = "function"
    function: FunctionDefinition
    defer_loading: bool | None = None

    @model_serializer(mode="plain")
    def _as_vllm_dumps_it(self) -> dict[str, Any]:
        return self.vllm_dump()

    def vllm_dump(self) -> dict[str, Any]:
        """vLLM's dump of the tool (what `model_dump` gives, without pydantic's copy of the values): the
        function's, `defer_loading` passed down to it as vLLM does."""
        function = self.function.vllm_dump()
        if self.defer_loading is not None and self.function.defer_loading is None:
            function["defer_loading"] = self.defer_loading  # vLLM's _propagate_defer_loading
        out: dict[str, Any] = {"type": self.type, "function": function}
        if self.defer_loading is not None:
            out["defer_loading"] = self.defer_loading
        return out


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(StrictModel):
    include_usage: bool | None = None


class _GenerationFields(StrictModel):
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
    stop: Annotated[str | list[str] | None, BOUNDED_STOP] = None
    stop_token_ids: list[int] | None = None
    # vLLM's: generate past the model's EOS ids (only max_tokens and stop_token_ids end the sequence).
    ignore_eos: bool | None = None
    cache_salt: str | None = None
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool | None = None

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _int_is_a_float(cls, value: Any) -> Any:
        # JSON has one number type; strict mode would otherwise reject `"temperature": 0`.
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_in_range(cls, value: Any) -> Any:
        return check_seed(value)

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _positive_or_minus_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1 and value != -1:
            raise ValueError("must be a positive number of tokens to keep, or -1 for the model's maximum")
        return value


class ChatCompletionRequest(_GenerationFields):
    messages: Annotated[list[ChatMessage], BOUNDED_MESSAGES] = Field(min_length=1)
    tools: Annotated[list[Tool] | None, BOUNDED_TOOLS] = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's values; Harmony (gpt-oss) and mistral-common read it; templates get it as template variables.
    reasoning_effort: ReasoningEffort | None = None
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

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the template sees them (vLLM's dump of each), or None without tools."""
        return None if self.tools is None else [tool.vllm_dump() for tool in self.tools]

    @model_validator(mode="after")
    def _vllm_request_rules(self) -> ChatCompletionRequest:
        check_tools(self.tools, self.tool_choice)
        check_messages(self.messages)
        if self.reasoning_effort is not None:
            self.chat_template_kwargs = reasoning_effort_kwargs(
                self.reasoning_effort, self.chat_template_kwargs
            )
        return self


def check_tools(tools: list[Tool] | None, tool_choice: Any) -> None:
    """vLLM's `check_tool_usage`: no empty tool list; a tool_choice other than none needs tools; a named one,
    its tool."""
    if tools is not None and not tools:
        raise RenderError(
            "`tools` must not be an empty array: give at least one tool or leave the field out", param="tools"
        )
    if tool_choice is None or tool_choice == "none":
        return
    if tools is None:
        raise RenderError(
            "tool_choice needs tools: set `tools`, or leave tool_choice out", param="tool_choice"
        )
    if isinstance(tool_choice, NamedToolChoice):
        name = tool_choice.function.name
        if all(tool.function.name != name for tool in tools):
            raise RenderError(
                f"tool_choice names the function {name!r}, which is not among the request's tools",
                param="tool_choice",
            )


def check_messages(messages: list[ChatMessage]) -> None:
    """What vLLM's message models refuse: null content outside assistant (and function) messages, and
    assistant tool calls without an `id`, without `type: "function"`, or whose `arguments` is not a string."""
    for index, message in enumerate(messages):
        if (
            message.content is None
            and message.role not in _NULL_CONTENT_ROLES
            and "content" in message.model_fields_set
        ):
            raise RenderError(
                f"messages[{index}].content is null: a {message.role} message needs content (a string or a "
                "list of parts), or leave the field out",
                param=f"messages[{index}].content",
            )
        if message.tool_calls:
            for position, call in enumerate(message.tool_calls):
                _check_tool_call(call, f"messages[{index}].tool_calls[{position}]")


def _check_tool_call(call: ToolCall, where: str) -> None:
    if call.id is None:
        raise RenderError(
            f"{where}.id is required: give each tool call the id its tool result refers to",
            param=f"{where}.id",
        )
    if call.type != "function":
        raise RenderError(f'{where}.type must be "function"', param=f"{where}.type")
    arguments = call.function.arguments
    if not isinstance(arguments, str):
        shape = (
            "an object" if isinstance(arguments, dict) else "null" if arguments is None else "not a string"
        )
        raise RenderError(
            f"{where}.function.arguments must be a string (got {shape}): send the arguments JSON-encoded "
            "as a string, as the OpenAI API requires",
            param=f"{where}.function.arguments",
        )


def reasoning_effort_kwargs(
    effort: str | None, chat_template_kwargs: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The template kwargs with a request's `reasoning_effort`, as vLLM's `build_chat_params` passes it: as
    `reasoning_effort` (over a kwarg of that name), and as `enable_thinking` (`effort != "none"`) unless the
    kwargs set it."""
    if effort is None:
        return chat_template_kwargs
    given = chat_template_kwargs or {}
    derived: dict[str, Any] = {"reasoning_effort": effort}
    if "enable_thinking" not in given:
        derived["enable_thinking"] = effort != "none"
    return {**given, **derived}


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

    @property
    def prompt_count(self) -> int:
        """How many prompts `prompt` holds: a text or one id list is one; a list of texts or of id lists, its
        length."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return len(prompt)
        return 1

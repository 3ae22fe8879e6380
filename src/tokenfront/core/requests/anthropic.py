"""An Anthropic Messages request as the chat request vLLM 0.33 builds from it.

A port of `vllm/entrypoints/anthropic/serving.py` (`AnthropicServingMessages.to_chat_completion_request`) for
what reaches the prompt:

- `system` (a string, or text blocks joined with nothing) becomes the first system message; a text block
  starting with Claude Code's `x-anthropic-billing-header` is left out;
- inline `system` messages stay where they are, unless the chat template insists on one leading system
  message (it fails on [system, user, system, user]: `merges_inline_system`), then their text joins the first;
- content blocks: `text` (non-empty) and `image` become parts (one text part becomes a plain string);
  `thinking` blocks are joined into the message's `reasoning`; `redacted_thinking` is dropped; `tool_use`
  becomes a tool call (`input` JSON-encoded); a user's `tool_result` becomes a `tool` message placed *before*
  the rest of that user message (text items joined with "\\n"; images as a user message of their own;
  `tool_reference` items as a tool message of `tool_reference` parts); an assistant's `tool_result` becomes the
  text "Tool result: ..."; a user message with nothing left is dropped;
- `tools` become function tools (`input_schema` as the parameters, `"type": "object"` added when missing),
  after the `tool_addition` / `tool_removal` blocks of system messages are applied; `tool_choice` auto / any /
  none / tool becomes auto / required / none / the named function; tools without a tool_choice mean auto;
- `output_config.effort` becomes `reasoning_effort`; `thinking: {"type": "disabled"}` becomes
  `reasoning_effort` "none", or "low" for a template that ignores "none" (`disabled_thinking_effort`);
- `chat_template_kwargs` and `cache_salt` pass through.

The tool list and tool choice are set after validation, as vLLM sets them: `tools: []` renders (with an empty
tool list) and a named tool_choice is not checked against the tools.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenfront.core.errors import RenderError
from tokenfront.core.messages import CLAUDE_CODE_BILLING_HEADER
from tokenfront.core.requests import chat_request_from, tools_from
from tokenfront.protocol import (
    DEFAULT_LIMITS,
    AnthropicContentBlock,
    AnthropicEffort,
    AnthropicMessage,
    AnthropicMessagesRequest,
    AnthropicTool,
    AnthropicToolDefinition,
    ChatCompletionRequest,
    NamedFunction,
    NamedToolChoice,
    RequestLimits,
)

if TYPE_CHECKING:
    from tokenfront.core.render import RenderPipeline

__all__ = ["AnthropicTemplateTraits", "merges_inline_system", "to_chat_request"]

# vLLM's probe conversation: a template that fails on it needs inline system messages merged into the first.
_INLINE_SYSTEM_PROBE = [
    {"role": "system", "content": "t"},
    {"role": "user", "content": "t"},
    {"role": "system", "content": "t"},
    {"role": "user", "content": "t"},
]


@dataclass(frozen=True)
class AnthropicTemplateTraits:
    """What vLLM finds out about the chat template once, at start-up, for the Messages API."""

    merge_inline_system: bool
    disabled_thinking_effort: str  # the reasoning_effort `thinking: {"type": "disabled"}` becomes

    @classmethod
    def probe(cls, pipeline: RenderPipeline) -> AnthropicTemplateTraits:
        """Probe the pipeline's templates as vLLM probes its own."""
        return cls(
            merge_inline_system=merges_inline_system(_template_sources(pipeline)),
            disabled_thinking_effort=disabled_thinking_effort(pipeline),
        )


def _template_sources(pipeline: RenderPipeline) -> list[str | None]:
    # vLLM checks the templates a request without tools and one with `tools: []` would use.
    checkpoint = pipeline.checkpoint
    if checkpoint.tokenizer_mode == "mistral" or checkpoint.chat_templates is None:
        return [None]  # no template (mistral-common renders): vLLM merges
    return [checkpoint.chat_templates.select(has_tools=has_tools) for has_tools in (False, True)]


def merges_inline_system(sources: list[str | None]) -> bool:
    """vLLM's `_detect_merge_inline_system`: True when a template (or its absence) needs one leading system
    message, found by rendering [system, user, system, user] in a plain Jinja sandbox."""
    return any(_needs_leading_system(source) for source in sources)


def _needs_leading_system(source: str | None) -> bool:
    if not source:
        return True
    # Deliberately not tokenfront's template environment: vLLM probes without the HF globals, so a template
    # that calls raise_exception fails here on the undefined name, as it does in vLLM.
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    try:
        environment.from_string(source).render(messages=_INLINE_SYSTEM_PROBE, add_generation_prompt=False)
    except Exception:
        return True
    return False


def disabled_thinking_effort(pipeline: RenderPipeline) -> str:
    """vLLM's `DisabledThinkingEffortResolver`: "none", unless a chat saying "Hi" renders with "none" as with
    some effort (or fails), then "low"."""
    none = _probe_prompt(pipeline, "none")
    if none is None:
        return "low"
    for effort in get_args(AnthropicEffort):
        if _probe_prompt(pipeline, effort) == none:
            return "low"
    return "none"


def _probe_prompt(pipeline: RenderPipeline, effort: str) -> tuple[list[int], str | None] | None:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort}
    )
    try:
        rendered = pipeline.render_chat(request)
    except RenderError:
        return None
    return rendered.token_ids, rendered.prompt_text


# -- the conversion ----------------------------------------------------------------------------------------


def to_chat_request(
    request: AnthropicMessagesRequest, traits: AnthropicTemplateTraits, limits: RequestLimits = DEFAULT_LIMITS
) -> ChatCompletionRequest:
    """The chat request vLLM renders for an Anthropic Messages request (held to the server's `limits`)."""
    messages: list[dict[str, Any]] = []
    _system_message(request, messages, merge_inline_system=traits.merge_inline_system)
    for message in request.messages:
        _convert_message(message, messages, merge_inline_system=traits.merge_inline_system)
    if not messages:
        raise RenderError(
            "the request has no messages to render: send `messages` (or `system`)", param="messages"
        )
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    for field in ("cache_salt", "chat_template_kwargs"):
        if getattr(request, field) is not None:
            body[field] = getattr(request, field)
    effort = _reasoning_effort(request, traits)
    if effort is not None:
        body["reasoning_effort"] = effort
    chat = chat_request_from(body, source="Anthropic Messages", limits=limits)
    tools = _resolve_tools(request)
    if tools is None:
        return chat
    function_tools = tools_from([_function_tool(tool) for tool in tools], param="tools")
    return chat.model_copy(update={"tools": function_tools, "tool_choice": _tool_choice(request) or "auto"})


def _system_message(
    request: AnthropicMessagesRequest, messages: list[dict[str, Any]], *, merge_inline_system: bool
) -> None:
    parts: list[str] = []
    if isinstance(request.system, str):
        parts.append(request.system)  # an empty string adds nothing
    elif request.system:
        parts.extend(_block_texts(request.system))
    if merge_inline_system:
        for message in request.messages:
            if message.role == "system" and (text := _system_text(message)):
                parts.append(text)
    if "".join(parts):
        messages.append({"role": "system", "content": "".join(parts)})


def _block_texts(blocks: list[AnthropicContentBlock]) -> list[str]:
    return [
        block.text
        for block in blocks
        if block.type == "text" and block.text and not block.text.startswith(CLAUDE_CODE_BILLING_HEADER)
    ]


def _system_text(message: AnthropicMessage) -> str | None:
    if isinstance(message.content, str):
        return None if message.content.startswith(CLAUDE_CODE_BILLING_HEADER) else message.content
    return "".join(_block_texts(message.content)) or None


def _convert_message(
    message: AnthropicMessage, messages: list[dict[str, Any]], *, merge_inline_system: bool
) -> None:
    if message.role == "system":
        text = None if merge_inline_system else _system_text(message)
        if text:
            messages.append({"role": "system", "content": text})
        return
    chat: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, str):
        chat["content"] = message.content
    else:
        _convert_blocks(message.role, message.content, chat, messages)
    if not (message.role == "user" and "content" not in chat):
        messages.append(chat)


def _convert_blocks(
    role: str, blocks: list[AnthropicContentBlock], chat: dict[str, Any], messages: list[dict[str, Any]]
) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        if block.type == "text" and block.text:
            parts.append({"type": "text", "text": block.text})
        elif block.type == "image" and block.source:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.source)}})
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            calls.append(
                {
                    # vLLM's fallback id; templates that print ids see it
                    "id": block.id or f"call_{int(time.time())}",
                    "type": "function",
                    "function": {"name": block.name or "", "arguments": json.dumps(block.input or {})},
                }
            )
        elif block.type == "tool_result":
            if role == "user":
                messages.extend(_tool_result_messages(block))
            else:
                # vLLM writes the result's Python str(), list or not.
                result = str(block.content) if block.content else ""
                parts.append({"type": "text", "text": f"Tool result: {result}"})
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        chat["content"] = parts[0]["text"] if only_text else parts


def _tool_result_messages(block: AnthropicContentBlock) -> list[dict[str, Any]]:
    text, images, references = "", [], []
    if isinstance(block.content, str):
        text = block.content
    elif isinstance(block.content, list):
        texts = []
        for item in block.content:
            kind = item.get("type")
            if kind == "text":
                texts.append(_item_text(item))
            elif kind == "image" and (url := _image_url(item.get("source", {}))):
                images.append(url)
            elif kind == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
                references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.tool_use_id or ""
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": text or ""}]
    if images:
        out.append(
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}} for url in images]}
        )
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})
    return out


def _item_text(item: dict[str, Any]) -> str:
    text = item.get("text", "")
    if not isinstance(text, str):
        raise RenderError("a tool_result's text item must have a string `text`", param="messages")
    return text


def _image_url(source: Any) -> str:
    if not isinstance(source, dict):
        raise RenderError("an image's `source` must be an object", param="messages")
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _reasoning_effort(request: AnthropicMessagesRequest, traits: AnthropicTemplateTraits) -> str | None:
    if request.thinking is not None and request.thinking.type == "disabled":
        return traits.disabled_thinking_effort
    return request.output_config.effort if request.output_config else None


def _tool_choice(request: AnthropicMessagesRequest) -> str | NamedToolChoice | None:
    choice = request.tool_choice
    if choice is None:
        return None
    if choice.type == "tool":
        return NamedToolChoice(function=NamedFunction(name=str(choice.name)))
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _resolve_tools(request: AnthropicMessagesRequest) -> list[AnthropicTool] | None:
    # vLLM's _resolve_tools: the tools in effect at the end of the conversation, after the tool_addition and
    # tool_removal blocks of system messages.
    changes = [
        block
        for message in request.messages
        if not isinstance(message.content, str)
        for block in message.content
        if block.type in ("tool_addition", "tool_removal")
    ]
    if not changes:
        return request.tools
    tools = {tool.name: tool for tool in request.tools or []}
    removed: set[str] = set()
    for block in changes:
        change = block.tool
        assert change is not None  # the model requires it on these blocks
        if isinstance(change, AnthropicToolDefinition):
            name = change.definition.name
            tools[name] = change.definition
        else:
            name = change.name
            if name not in tools:
                raise RenderError(
                    f"{block.type} references tool {name!r}, which is not declared in tools", param="messages"
                )
            if block.type == "tool_addition":
                tools[name] = tools[name].model_copy(update={"defer_loading": None})
        if block.type == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [tool for name, tool in tools.items() if name not in removed]


def _function_tool(tool: AnthropicTool) -> dict[str, Any]:
    schema = tool.input_schema
    if "type" not in schema:
        schema = {**schema, "type": "object"}  # vLLM adds it last
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": schema,
            "strict": tool.strict,
            "defer_loading": tool.defer_loading,
        },
    }

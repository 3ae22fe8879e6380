"""An OpenAI Responses request as the chat request vLLM 0.33 builds from it.

A port of `vllm/entrypoints/openai/responses/utils.py` (`construct_input_messages`, `construct_tool_dicts`)
and `ResponsesRequest.build_chat_params`, for what reaches the prompt:

- `instructions` becomes the first (system) message; a string `input` one user message;
- input items, in order: a message item (`role` user / system / developer / assistant) is a chat message,
  its `input_text` / `output_text` parts text parts; an assistant message contributes its first part's text,
  and fills the content of the assistant message just before it when that has none; `function_call` (and
  `custom_tool_call`, its input wrapped as `{"input": ...}`) becomes a tool call, added to the assistant
  message just before it when there is one; `reasoning` (its first content text, else its first summary text)
  becomes `reasoning`, of the assistant message just before it when that has none; `function_call_output`
  (and `custom_tool_call_output`) becomes a `tool` message; anything else is refused;
- tools: function tools as they are, custom tools as a function taking one string `input`, namespace tools
  flattened to `<namespace>__<name>`; other tool types (web search, ...) are not shown to the model. No tools
  means no tool list; tools with no function among them, an empty one;
- the last item an assistant message or reasoning still `in_progress` / `incomplete`: that message is
  continued (`continue_final_message`, no generation prompt);
- `reasoning.effort` becomes `reasoning_effort`; `truncation: "auto"` keeps the prompt's last tokens that fit.

`previous_response_id` needs stored responses, which a stateless renderer has none of: refused, as vLLM's
render endpoint refuses it.
"""

from __future__ import annotations

import json
from typing import Any

from tokenfront.core.errors import RenderError
from tokenfront.core.requests import chat_request_from, tools_from
from tokenfront.protocol import DEFAULT_LIMITS, ChatCompletionRequest, RequestLimits, ResponsesRequest, Tool

__all__ = ["CUSTOM_TOOL_PARAMETERS", "NAMESPACE_SEPARATOR", "to_chat_request"]

NAMESPACE_SEPARATOR = "__"
_CUSTOM_INPUT = "input"
# The schema a custom (free-form) tool is shown with (vLLM's `custom_tool_parameters`).
CUSTOM_TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        _CUSTOM_INPUT: {"type": "string", "description": "The freeform text payload for this tool."}
    },
    "required": [_CUSTOM_INPUT],
    "additionalProperties": False,
}
# Tuples, not sets: the values compared come from the client and may be unhashable.
_TEXT_PART_TYPES = ("input_text", "output_text")
_OPEN_STATUSES = ("in_progress", "incomplete")


def to_chat_request(
    request: ResponsesRequest, limits: RequestLimits = DEFAULT_LIMITS
) -> ChatCompletionRequest:
    """The chat request vLLM renders for a Responses request (held to the server's `limits`)."""
    if request.previous_response_id is not None:
        raise RenderError(
            "previous_response_id is not supported by the stateless render endpoint: send the conversation "
            "in `input`",
            param="previous_response_id",
        )
    if request.prompt is not None:
        raise RenderError("prompt templates are not supported: send `input`", param="prompt")
    shown = _function_tools(request.tools)
    # Validated before tool_choice is checked against their names: a function tool's name may be anything a
    # client sent (vLLM's request model refuses a tool that is not a valid function tool first, too).
    tools = tools_from(shown, param="tools")
    _check_tool_choice(request.tool_choice, request.tools, tools)
    messages = _messages(request)
    if not messages:
        raise RenderError(
            "the request has no messages to render: send `input` (and `instructions`)", param="input"
        )
    continued = _continues_final_message(request.input)
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "add_generation_prompt": not continued,
        "continue_final_message": continued,
    }
    if request.reasoning is not None and request.reasoning.effort is not None:
        body["reasoning_effort"] = request.reasoning.effort
    if request.truncation not in (None, "disabled"):
        body["truncate_prompt_tokens"] = -1
    for field in ("cache_salt", "chat_template_kwargs"):
        if getattr(request, field) is not None:
            body[field] = getattr(request, field)
    chat = chat_request_from(body, source="Responses", limits=limits)
    if not request.tools:
        return chat
    return chat.model_copy(update={"tools": tools})


# -- input ---------------------------------------------------------------------------------------------------


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    for index, item in enumerate(request.input):
        message = _from_item(item, f"input[{index}]", messages[-1] if messages else None)
        if message is not None:
            messages.append(message)
    return messages


def _from_item(item: dict[str, Any], param: str, previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """The message an input item adds, or None when it completes the assistant message before it."""
    assistant = previous if previous is not None and previous.get("role") == "assistant" else None
    kind = item.get("type")
    if kind in ("function_call", "custom_tool_call"):
        call = _tool_call(item, param)
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        reasoning = _reasoning_text(item, param)
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in ("function_call_output", "custom_tool_call_output"):
        call_id = _string(item, "call_id", param)
        output = item.get("output")
        return {"role": "tool", "content": _content(output, f"{param}.output"), "tool_call_id": call_id}
    if "role" in item and kind in (None, "message"):
        return _message(item, param, assistant)
    raise RenderError(f"{param}: unsupported input item type {kind!r}", param=f"{param}.type")


def _message(item: dict[str, Any], param: str, assistant: dict[str, Any] | None) -> dict[str, Any] | None:
    role, content = item["role"], item.get("content")
    if role == "assistant":
        text = content if isinstance(content, str) else _first_text(content)
        if text is not None:
            if assistant is not None and assistant.get("content") is None:
                assistant["content"] = text
                return None
            return {"role": "assistant", "content": text}
    message = {key: value for key, value in item.items() if key not in ("type", "id", "status")}
    if content is not None:
        message["content"] = _content(content, f"{param}.content")
    return message


def _first_text(content: Any) -> str | None:
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _content(content: Any, param: str) -> Any:
    """Responses content as chat content: `input_text` / `output_text` parts become `text` parts."""
    if not isinstance(content, list):
        return content
    converted = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in _TEXT_PART_TYPES:
            part = {"type": "text", "text": part.get("text")}
        converted.append(part)
    return converted


def _tool_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    name = _string(item, "name", param)
    if item["type"] == "custom_tool_call":
        payload = item.get(_CUSTOM_INPUT) or ""
        arguments = json.dumps({_CUSTOM_INPUT: payload}, ensure_ascii=False)
    else:
        arguments = _string(item, "arguments", param)
        if item.get("namespace") is not None:
            namespace = _string(item, "namespace", param)
            name = f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name
    return {
        "id": _string(item, "call_id", param),
        "function": {"name": name, "arguments": arguments},
        "type": "function",
    }


def _reasoning_text(item: dict[str, Any], param: str) -> str:
    if item.get("encrypted_content"):
        raise RenderError(
            f"{param}: encrypted reasoning content is not supported: send the reasoning text in `content`",
            param=f"{param}.encrypted_content",
        )
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            text = parts[0].get("text") if isinstance(parts[0], dict) else None
            if not isinstance(text, str):
                raise RenderError(f"{param}.{key}[0].text must be a string", param=f"{param}.{key}[0].text")
            return text
    return ""


def _string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise RenderError(f"{param}.{key} is required and must be a string", param=f"{param}.{key}")
    return value


def _continues_final_message(items: str | list[dict[str, Any]]) -> bool:
    # vLLM's should_continue_final_message: a last message or reasoning item still being written.
    if isinstance(items, str) or not items:
        return False
    last = items[-1]
    return last.get("type", "message") in ("message", "reasoning") and last.get("status") in _OPEN_STATUSES


# -- tools ---------------------------------------------------------------------------------------------------


def _function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools the model is shown, as chat function tools (vLLM's `get_function_tools`)."""
    shown = []
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "function":
            shown.append(_as_chat_tool(tool))
        elif kind == "namespace":
            namespace = _string(tool, "name", f"tools[{index}]")
            inner_tools = tool.get("tools")
            for inner in inner_tools if isinstance(inner_tools, list) else ():
                if isinstance(inner, dict) and inner.get("type") == "function":
                    name = _string(inner, "name", f"tools[{index}].tools")
                    shown.append(_as_chat_tool({**inner, "name": f"{namespace}{NAMESPACE_SEPARATOR}{name}"}))
        elif kind == "custom":
            form = tool.get("format")
            if isinstance(form, dict) and form.get("type") == "grammar":
                raise RenderError(
                    "custom tools with a grammar format are not supported; only free-form text custom tools are",
                    param=f"tools[{index}].format",
                )
            shown.append(
                _as_chat_tool(
                    {
                        "name": tool.get("name"),
                        "description": tool.get("description"),
                        "parameters": CUSTOM_TOOL_PARAMETERS,
                    }
                )
            )
    return shown


def _as_chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fields = ("name", "description", "parameters", "strict", "defer_loading")
    return {"type": "function", "function": {key: tool.get(key) for key in fields}}


def _check_tool_choice(choice: str | dict[str, Any], tools: list[dict[str, Any]], shown: list[Tool]) -> None:
    # vLLM's ResponsesRequest.check_tool_usage.
    named = isinstance(choice, dict) and choice.get("type") in ("function", "custom")
    if not tools:
        if choice == "required":
            raise RenderError("tool_choice 'required' needs `tools`", param="tool_choice")
        if named:
            raise RenderError("tool_choice names a function but there are no `tools`", param="tool_choice")
        return
    if named:
        assert isinstance(choice, dict)
        name = choice.get("name")
        names = [tool.function.name for tool in shown]
        local = [n for n in names if n.rpartition(NAMESPACE_SEPARATOR)[2] == name]
        if name not in names and len(local) != 1:
            raise RenderError(
                f"tool_choice names {name!r}, which is not among the request's tools", param="tool_choice"
            )

"""Qwen3's chat template (Qwen3-0.6B to Qwen3-235B-A22B, hermes-style tools and `<think>` reasoning) as Python.

Statement for statement what the Jinja source does, on the same normalized messages, so the text is the same:
the lines quote the template. Anything outside the shapes this was checked on (a content that is not a string,
a tool call without a name, a variable that shadows one the template reads) returns `DECLINE`, and the Jinja
template renders the request as before, with its errors and limits.
"""

from __future__ import annotations

import json
from typing import Any

from tokenfront.core.native_templates.base import DECLINE, Declined
from tokenfront.core.native_templates.tojson import request_value_json

__all__ = ["render_qwen3"]

# What the template reads from its context besides messages, tools and add_generation_prompt: a request variable
# of one of these names would change what the Jinja template does (`namespace` is a global it calls).
_SHADOWED = frozenset(
    {"namespace", "content", "reasoning_content", "ns", "message", "tool", "tool_call", "index"}
)


def render_qwen3(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    variables: dict[str, Any],
) -> str | Declined:
    """The prompt text Qwen3's template renders, or `DECLINE`."""
    if not messages or not _SHADOWED.isdisjoint(variables) or not all(_plain(m) for m in messages):
        return DECLINE
    out: list[str] = []
    first = messages[0]
    # {%- if tools %}
    if tools:
        out.append("<|im_start|>system\n")
        if first["role"] == "system":
            out.append(first["content"] + "\n\n")
        out.append(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
            "with function signatures within <tools></tools> XML tags:\n<tools>"
        )
        for tool in tools:
            out.append("\n")
            out.append(request_value_json(tool))  # {{- tool | tojson }}
        out.append(
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            "<args-json-object>}\n</tool_call><|im_end|>\n"
        )
    elif first["role"] == "system":
        out.append("<|im_start|>system\n" + first["content"] + "<|im_end|>\n")
    # {%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %} and the reversed loop:
    # the last user message that is not a tool response wrapped as one.
    last = len(messages) - 1
    last_query_index = last
    for index in range(last, -1, -1):
        message = messages[index]
        content = message["content"]
        if message["role"] == "user" and not (
            content.startswith("<tool_response>") and content.endswith("</tool_response>")
        ):
            last_query_index = index
            break
    for index, message in enumerate(messages):
        role = message["role"]
        content = message["content"]
        if role == "user" or (role == "system" and index != 0):
            out.append("<|im_start|>" + role + "\n" + content + "<|im_end|>" + "\n")
        elif role == "assistant":
            reasoning = message.get("reasoning_content")
            if reasoning is None:  # {%- if message.reasoning_content is defined and ... is not none %}
                reasoning = ""
                if "</think>" in content:
                    whole = content
                    content = whole.split("</think>")[-1].lstrip("\n")
                    reasoning = whole.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            elif type(reasoning) is not str:
                return DECLINE
            if index > last_query_index and (index == last or reasoning):
                out.append(
                    "<|im_start|>"
                    + role
                    + "\n<think>\n"
                    + reasoning.strip("\n")
                    + "\n</think>\n\n"
                    + content.lstrip("\n")
                )
            else:
                out.append("<|im_start|>" + role + "\n" + content)
            tool_calls = message.get("tool_calls")
            if tool_calls and not _calls(out, tool_calls, content):
                return DECLINE
            out.append("<|im_end|>\n")
        elif role == "tool":
            if index == 0 or messages[index - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + content + "\n</tool_response>")
            if index == last or messages[index + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        # {%- if enable_thinking is defined and enable_thinking is false %}
        if variables.get("enable_thinking", True) is False:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


def _plain(message: dict[str, Any]) -> bool:
    """A message of the shape this port reproduces: string role and content (the template would fail, or
    behave as Jinja's undefined does, on others)."""
    return type(message.get("role")) is str and type(message.get("content")) is str


def _calls(out: list[str], tool_calls: Any, content: str) -> bool:
    """An assistant message's tool calls, appended to `out`; False for a shape left to Jinja."""
    if not isinstance(tool_calls, list):
        return False
    for position, call in enumerate(tool_calls):
        if type(call) is not dict:
            return False
        if position != 0 or content:
            out.append("\n")
        function = call.get("function")
        if function:  # {%- if tool_call.function %}{%- set tool_call = tool_call.function %}
            call = function
            if type(call) is not dict:
                return False
        name = call.get("name")
        if type(name) is not str or "arguments" not in call:
            return False
        arguments = call["arguments"]
        out.append('<tool_call>\n{"name": "' + name + '", "arguments": ')
        if isinstance(arguments, str):  # {%- if tool_call.arguments is string %}
            out.append(arguments)
        else:
            try:
                out.append(json.dumps(arguments, ensure_ascii=False))
            except (TypeError, ValueError):
                return False
        out.append("}\n</tool_call>")
    return True

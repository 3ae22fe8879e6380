"""Request normalization before the template sees the messages (docs/contract.md §3).

These are the mainstream servers' rules (vLLM 0.33's chat message parsing, `vllm/renderers/chat_utils/`, which
TensorRT-LLM shares). They change ids, so they are part of the rendering contract, not a convenience:

- content `null`/absent is no parts, a string one text part; the template gets a list of
  `{"type": "text", "text": ...}` parts ("openai" content format) or the non-empty texts joined with `"\\n"`
  ("string");
- text-like parts: `text` (`"text": null` skips the part), `refusal`, `thinking` (its `thinking` text),
  `tool_reference` (its `name`: the text for "string" templates, the part itself for "openai" ones); a part
  must be an object with a `type`; `input_text` / `output_text` are Responses parts, converted before they get
  here (core/requests/responses.py), and refused in chat requests as vLLM refuses them;
- a `tool` message's text parts are joined with `"\\n"` even for "openai" templates (structured parts such
  as `tool_reference` stay parts);
- assistant `tool_calls`: arguments (a JSON string, see protocol/openai.py) parsed to an object (empty, invalid or
  non-object JSON is `{}`); an empty list is dropped;
- assistant reasoning: `reasoning`, else the older `reasoning_content`, is passed as both; `thinking` is not
  a message field for vLLM and is not passed on; `tool_call_id` is passed for tool messages, `tools` for
  developer messages, `name` and `task` (DeepSeek V4) for every role;
- a system text part starting with Claude Code's `x-anthropic-billing-header` line loses that line;
- developer messages become system messages (all merged into one first message) for a template that never
  names the developer role.
"""

from __future__ import annotations

import json
from typing import Any

from tokenfront.core.content_format import ContentFormat
from tokenfront.core.errors import RenderError, UnsupportedContentError

__all__ = [
    "CLAUDE_CODE_BILLING_HEADER",
    "MEDIA_PARTS",
    "normalize_messages",
    "parse_tool_arguments",
    "refuse_media_part",
]

CLAUDE_CODE_BILLING_HEADER = "x-anthropic-billing-header"

# Roles whose message of a role and a string content needs nothing but its one text part (a system text may
# carry a billing header line; developer messages may be merged).
_PLAIN_ROLES = frozenset({"user", "assistant", "tool"})
# Content part types that carry text, and the field the text is in.
_TEXT_PARTS = {"text": "text", "refusal": "refusal", "thinking": "thinking"}
# Parts vLLM's chat request takes with a null text (`"text": null`, present), and skips.
_SKIPPED_WHEN_NULL = frozenset({"text"})
# Content part types that carry media; rendering them needs a processor, which is not supported yet.
MEDIA_PARTS = frozenset(
    {
        "image_url",
        "image",
        "image_pil",
        "image_embeds",
        "input_image",
        "audio_url",
        "input_audio",
        "audio",
        "audio_embeds",
        "video_url",
        "video",
        "video_embeds",
        "file",
        "input_file",
    }
)


def refuse_media_part(kind: object, param: str) -> None:
    """A 400 for a content part that carries media: every chat format renders text parts only. Also a 400
    for a `type` that is not a string (`kind` is the part's `type` as sent, None when absent), the same on
    every chat format: a list or an object is no part type (and not hashable)."""
    if kind is not None and not isinstance(kind, str):
        raise RenderError(_type_not_a_string(param, kind), param=f"{param}.type")
    if kind in MEDIA_PARTS:
        raise UnsupportedContentError(
            f"{param} is a {kind!r} part: multimodal content (images, audio, video, files) is not yet supported "
            "by tokenfront's render endpoints; send text parts only",
            param=param,
            code="multimodal_not_supported",
        )


def normalize_messages(
    messages: list[dict[str, Any]], *, content_format: ContentFormat, template_knows_developer: bool
) -> list[dict[str, Any]]:
    """Turn request messages into what the chat template receives."""
    normalized = [
        _normalize_message(message, index=i, content_format=content_format)
        for i, message in enumerate(messages)
    ]
    if not template_knows_developer and any(m["role"] == "developer" for m in normalized):
        normalized = _merge_system_messages(normalized, content_format)
    return normalized


def _normalize_message(
    message: dict[str, Any], *, index: int, content_format: ContentFormat
) -> dict[str, Any]:
    role = message["role"]
    content = message.get("content")
    if type(content) is str and len(message) == 2 and role in _PLAIN_ROLES:
        # Most messages: a role and a string, one text part (what the general path below makes of them).
        if content_format == "string" or role == "tool":
            return {"role": role, "content": content}
        return {"role": role, "content": [{"type": "text", "text": content}]}
    parts = _content_parts(message.get("content"), param=f"messages[{index}].content")
    if role == "system":
        parts = _without_billing_header(parts)
    out: dict[str, Any] = {"role": role, "content": _content(parts, role, content_format)}
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        if tool_calls:
            out["tool_calls"] = [_normalize_tool_call(call) for call in tool_calls]
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif role == "tool" and message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    elif role == "developer" and message.get("tools") is not None:
        out["tools"] = message["tools"]
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    return out


def _content(parts: list[dict[str, str]], role: str, content_format: ContentFormat) -> Any:
    if content_format == "string":
        # vLLM joins the parts' texts and leaves out empty ones (`if parse_res:`).
        return "\n".join(text for text in (_part_text(part) for part in parts) if text)
    if role == "tool" and all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _part_text(part: dict[str, str]) -> str:
    return part["text"] if part["type"] == "text" else part["name"]


def _content_parts(content: Any, *, param: str) -> list[dict[str, str]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = []
    for i, part in enumerate(content):
        parsed = _part(part, param=f"{param}[{i}]")
        if parsed is not None:
            parts.append(parsed)
    return parts


def _without_billing_header(parts: list[dict[str, str]]) -> list[dict[str, str]]:
    # Claude Code's attribution line changes on every request (a hash): vLLM drops that first line of a system
    # text part (and the part when nothing follows), so the prompt prefix stays cacheable.
    kept = []
    for part in parts:
        if part["type"] == "text" and part["text"].startswith(CLAUDE_CODE_BILLING_HEADER):
            rest = part["text"].partition("\n")[2]
            if not rest:
                continue
            part = {**part, "text": rest}
        kept.append(part)
    return kept


def _part(part: Any, *, param: str) -> dict[str, str] | None:
    if not isinstance(part, dict):
        raise RenderError(
            f'{param} must be a content part object like {{"type": "text", "text": ...}}', param=param
        )
    kind = part.get("type")
    if kind is None:
        media = next((key for key in part if key in MEDIA_PARTS), None)
        if media is None:
            raise RenderError(
                f'{param} has no "type": give each content part one, e.g. {{"type": "text", "text": ...}}',
                param=f"{param}.type",
            )
        kind = media
    refuse_media_part(kind, param)  # also refuses a type that is not a string
    if kind == "tool_reference":
        name = part.get("name")
        if name is None:
            return None  # names no tool: vLLM renders nothing for it
        if not isinstance(name, str):
            raise RenderError(f"{param}.name must be a string", param=f"{param}.name")
        return {"type": "tool_reference", "name": name}
    field = _TEXT_PARTS.get(kind)
    if field is None:
        raise RenderError(
            f"{param} has unknown content part type {kind!r}; supported: "
            '"text", "refusal", "thinking" and "tool_reference"',
            param=param,
        )
    text = part.get(field)
    if text is None and field in part and kind in _SKIPPED_WHEN_NULL:
        return None
    if not isinstance(text, str):
        raise RenderError(f"{param}.{field} must be a string", param=f"{param}.{field}")
    return {"type": "text", "text": text}


def _type_not_a_string(param: str, kind: object) -> str:
    shape = {list: "a list", dict: "an object", bool: "a boolean", int: "a number", float: "a number"}
    return f'{param}.type must be a string such as "text" (got {shape.get(type(kind), type(kind).__name__)})'


def _normalize_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call["function"])
    function["arguments"] = parse_tool_arguments(function.get("arguments"))
    out = {key: value for key, value in call.items() if value is not None}
    out["function"] = function
    return out


def parse_tool_arguments(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments as an object: JSON strings are parsed; empty, invalid or non-object JSON is `{}`."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _merge_system_messages(
    messages: list[dict[str, Any]], content_format: ContentFormat
) -> list[dict[str, Any]]:
    # A template that cannot tell developer from system gets one system message (vLLM's consolidation):
    # developer turns become system turns; a lone system message already in front stays as it is; otherwise
    # the non-empty ones are merged, in order, into one first message with string content.
    messages = [_as_system(m) if m["role"] == "developer" else m for m in messages]
    system = [m for m in messages if m["role"] == "system"]
    if len(system) == 1 and messages[0] is system[0]:
        return messages
    texts = [text for text in (_flat_text(m["content"]) for m in system) if text]
    rest = [m for m in messages if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


def _as_system(message: dict[str, Any]) -> dict[str, Any]:
    return {**{key: value for key, value in message.items() if key != "tools"}, "role": "system"}


def _flat_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if "text" in part)

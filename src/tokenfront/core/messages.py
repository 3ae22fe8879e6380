"""Request normalization before the template sees the messages (SPEC §3).

These are the mainstream servers' rules (vLLM's chat message parsing, which TensorRT-LLM shares). They change
ids, so they are part of the rendering contract, not a convenience.
"""

from __future__ import annotations

import json
from typing import Any

from tokenfront.core.errors import RenderError, UnsupportedContentError
from tokenfront.core.templates import ContentFormat

# Content part types that carry text.
_TEXT_PARTS = {"text": "text", "input_text": "text", "refusal": "refusal"}
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
        "file",
        "input_file",
    }
)
# Message keys a template may see; anything else in a request message is not passed on (as in vLLM).
_KEPT_KEYS = ("name", "tool_call_id", "reasoning_content", "reasoning", "thinking")


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
    texts = _content_texts(message.get("content"), param=f"messages[{index}].content")
    out: dict[str, Any] = {"role": role}
    if role == "tool" or content_format == "string":
        out["content"] = "\n".join(texts)
    else:
        out["content"] = [{"type": "text", "text": text} for text in texts]
    tool_calls = message.get("tool_calls")
    if role == "assistant" and tool_calls:
        out["tool_calls"] = [_normalize_tool_call(call) for call in tool_calls]
    for key in _KEPT_KEYS:
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def _content_texts(content: Any, *, param: str) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    texts = []
    for i, part in enumerate(content):
        texts.append(_part_text(part, param=f"{param}[{i}]"))
    return texts


def _part_text(part: Any, *, param: str) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise RenderError(
            f'{param} must be a content part object like {{"type": "text", "text": ...}}', param=param
        )
    kind = part.get("type")
    if kind is None:
        kind = "text" if "text" in part else next((key for key in part if key in MEDIA_PARTS), None)
    if kind in MEDIA_PARTS:
        raise UnsupportedContentError(
            f"{param} is a {kind!r} part: multimodal content (images, audio, video, files) is not yet supported "
            "by tokenfront's render endpoints; send text parts only",
            param=param,
            code="multimodal_not_supported",
        )
    field = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
    if field is None:
        raise RenderError(
            f'{param} has unknown content part type {kind!r}; supported: "text" (and "refusal")', param=param
        )
    text = part.get(field)
    if not isinstance(text, str):
        raise RenderError(f"{param}.{field} must be a string", param=f"{param}.{field}")
    return text


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
    messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
    system = [m for m in messages if m["role"] == "system"]
    if len(system) == 1 and messages[0] is system[0]:
        return messages
    texts = [text for text in (_flat_text(m["content"]) for m in system) if text]
    rest = [m for m in messages if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


def _flat_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)

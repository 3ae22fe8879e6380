"""The probe corpus: a fixed set of `/tokenize` requests two servers must render alike, and how an answer is read.

One copy, used by the router's `verify=probe` (router/probe.py: a worker without a fingerprint against the
router's own pipeline) and by `tokenfront check` (check/: every server against the renderer). The bodies are
vLLM's `POST /tokenize` schema, which tokenfront's renderer, a worker with its render routes, the router and
vLLM all answer. The module imports nothing heavy: `tokenfront check` is a client tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# How much of a refusal's message is kept (it ends up in a log line or a table).
_MESSAGE_CHARS = 200


class Answer(Protocol):
    """An answer as the corpus reads it: httpx's `Response` (`tokenfront check`) or the router's `CheckAnswer`."""

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


@dataclass(frozen=True)
class ProbeCase:
    """One probe request: a name for the reasons and logs, and the `/tokenize` body (never mutated)."""

    name: str
    body: Mapping[str, Any]


_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

# CJK, emoji (with a skin-tone modifier and a ZWJ sequence), combining accents, and right-to-left scripts.
UNICODE_TEXT = (
    "日本語と中文を混ぜた文章。한국어도 있어요. 🙂👍🏽👩‍💻 "
    "cafe\u0301 n\u0303o Zu\u0308rich; مرحبا بالعالم; שלום עולם."
)

PROBE_CASES: tuple[ProbeCase, ...] = (
    ProbeCase(
        "system_user",
        {
            "messages": [
                {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
            "add_generation_prompt": True,
        },
    ),
    ProbeCase(
        "multi_turn",
        {
            "messages": [
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Another one, please -- and spell it backwards."},
            ],
            "add_generation_prompt": True,
        },
    ),
    ProbeCase(
        "tools",
        {
            "messages": [{"role": "user", "content": "Is it raining in Paris?"}],
            "tools": [_WEATHER_TOOL],
            "add_generation_prompt": True,
        },
    ),
    ProbeCase(
        "tool_history",
        {
            "messages": [
                {"role": "user", "content": "What's the weather in Paris, in celsius?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call00001",  # 9 alphanumerics: what Mistral templates require
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": '{"city": "Paris", "unit": "celsius"}',
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call00001", "content": '{"temperature": 14, "rain": true}'},
            ],
            "tools": [_WEATHER_TOOL],
            "add_generation_prompt": True,
        },
    ),
    ProbeCase(
        "unicode",
        {"messages": [{"role": "user", "content": UNICODE_TEXT}], "add_generation_prompt": True},
    ),
    ProbeCase(
        "completion",
        {
            "prompt": "The quick brown fox jumps over the lazy dog.\n\nOnce upon a time",
            "add_special_tokens": True,
        },
    ),
    ProbeCase(
        "continue_final",
        {
            "messages": [
                {"role": "user", "content": "Write a haiku about the sea."},
                {"role": "assistant", "content": "Waves fold into foam,"},
            ],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
)


def token_ids(response: Answer) -> list[int] | None:
    """The `tokens` of a `/tokenize` answer; None when the body has no list of integer ids."""
    try:
        body = response.json()
    except ValueError:
        return None
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        return None
    return tokens


def first_difference(a: list[int], b: list[int]) -> int | None:
    """None when the ids are equal, else the index of the first id that differs (or where the shorter ends)."""
    if a == b:
        return None
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return first if first is not None else min(len(a), len(b))


def refusal_message(response: Answer) -> str:
    """The error message of a refusal: OpenAI's `error.message`, vLLM's older top-level `message`, or text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:_MESSAGE_CHARS] or "no body"
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else body.get("message")
        if isinstance(message, str):
            return message[:_MESSAGE_CHARS]
    return str(body)[:_MESSAGE_CHARS]

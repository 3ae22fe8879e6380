"""`{{ value | tojson }}` for the native templates: `json.dumps(value, ensure_ascii=False)`, remembered.

A fleet's clients send the same tools with every request of a conversation, and a template writes each one as
JSON: with the standard library's encoder that is several microseconds a tool, more than the rest of a short
render. So the text is remembered, keyed by the value's compact orjson encoding, which is a tenth of the cost:
a request's values are parsed JSON (strings, finite numbers, booleans, null, lists, string-keyed objects), and
for those two equal encodings mean equal values, key order included, and so the same `json.dumps` text. A
value orjson does not encode (an integer beyond 64 bits) is written directly. What is remembered is bounded
(`MAX_REMEMBERED` texts of at most `MAX_REMEMBERED_CHARS` characters; forgotten all at once when full).

Only for values that come from a request body: a value a template builds (a NaN, which orjson writes as null)
takes `json.dumps` itself.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["MAX_REMEMBERED", "MAX_REMEMBERED_CHARS", "remembered", "request_value_json"]

MAX_REMEMBERED = 256
MAX_REMEMBERED_CHARS = 16_384

_texts: dict[bytes, str] = {}


def request_value_json(value: Any) -> str:
    """`json.dumps(value, ensure_ascii=False)` of a value parsed from a request body (see the module doc)."""
    try:
        key = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits
        return json.dumps(value, ensure_ascii=False)
    text = _texts.get(key)
    if text is None:
        text = json.dumps(value, ensure_ascii=False)
        if len(text) <= MAX_REMEMBERED_CHARS:
            if len(_texts) >= MAX_REMEMBERED:
                _texts.clear()
            _texts[key] = text
    return text


def remembered() -> int:
    """How many texts are remembered now."""
    return len(_texts)

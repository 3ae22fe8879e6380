"""The native templates' `tojson` (core/native_templates/tojson.py): `json.dumps(value, ensure_ascii=False)` of
request values, remembered by their orjson encoding; the text is the standard library's every time, and what
is remembered stays bounded."""

from __future__ import annotations

import json
import math
from typing import Any

from tokenfront.core.native_templates.tojson import (
    MAX_REMEMBERED,
    MAX_REMEMBERED_CHARS,
    remembered,
    request_value_json,
)

_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": 'Weather for a city — 天気 \u00e9\n\t"quoted" \\ </script>',
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}

# Values that encode alike in one encoder and not the other would be told apart by their key; numbers above
# all: 1 and 1.0, 0.0 and -0.0, floats json and orjson spell differently (1e+16 / 1e16), integers at and past
# 64 bits (orjson refuses 2**64: written directly).
VALUES: list[Any] = [
    _WEATHER,
    {"function": _WEATHER["function"], "type": "function"},  # the same items, another key order
    {"a": 1},
    {"a": 1.0},
    {"a": 0.0},
    {"a": -0.0},
    {"a": 1e16},
    {"a": 1.5e-7},
    {"a": 123456789.125},
    {"a": 2**63 - 1},
    {"a": -(2**63)},
    {"a": 2**64},
    {"a": 2**70},
    {"a": True},
    {"a": None},
    {"a": "1"},
    {"a": []},
    {"a": {}},
    {"a": [1, "1", 1.0, None, False, {"b": [{}]}]},
    {"": "\x00\x1f\x7f\u2028\U0001f600"},
    "a string",
    [_WEATHER, _WEATHER],
    3,
    None,
]


def test_the_text_is_json_dumps_every_time() -> None:
    compared = 0
    for _ in range(3):  # the first pass writes and remembers, the next two read what was remembered
        for value in VALUES:
            assert request_value_json(value) == json.dumps(value, ensure_ascii=False), value
            compared += 1
    assert compared == 3 * len(VALUES) == 72
    texts = {request_value_json(value) for value in VALUES}
    assert len(texts) == len(VALUES)  # no two of them share a text: none was taken for another
    assert request_value_json({"a": 1e16}) == '{"a": 1e+16}'
    assert request_value_json({"a": -0.0}) == '{"a": -0.0}'


def test_what_is_remembered_stays_bounded() -> None:
    request_value_json({"fill": 0})
    assert 1 <= remembered() <= MAX_REMEMBERED
    for number in range(2 * MAX_REMEMBERED + 7):
        assert request_value_json({"fill": number}) == f'{{"fill": {number}}}'
        assert 1 <= remembered() <= MAX_REMEMBERED
    before = remembered()
    long = {"text": "x" * MAX_REMEMBERED_CHARS}
    assert request_value_json(long) == json.dumps(long)
    assert remembered() == before  # a text past the size limit is not kept
    assert math.isclose(json.loads(request_value_json({"a": 0.1}))["a"], 0.1)

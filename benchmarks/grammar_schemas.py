"""Tool schemas for the worker's grammar limits (worker/schema_limits.py): the largest one they allow, and the
ones that grew or stalled the worker before them (issue 17).

Shared by `benchmarks.health_latency` (which measures `/health` and the worker's memory while they compile)
and tests/worker/test_guided_limits.py (which checks the statuses, `/health` meanwhile and the memory cap).
"""

from __future__ import annotations

from typing import Any

from tokenfront.worker.schema_limits import SCHEMA_LIMITS

__all__ = ["TOOL_NAME", "largest_allowed_schema", "named_tool_body", "over_limit_schemas", "schema_depth"]

TOOL_NAME = "fill_form"


def schema_depth(value: Any) -> int:
    """JSON nesting levels of `value`, as `SchemaLimits.max_depth` counts them (a scalar is one)."""
    if isinstance(value, dict):
        return 1 + max((schema_depth(child) for child in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((schema_depth(child) for child in value), default=0)
    return 1


def _deepest(room: int) -> dict[str, Any]:
    """Nested objects (each with an optional string) as deep as `room` levels hold."""
    schema: dict[str, Any] = {"type": "string"}
    while True:
        deeper = {
            "type": "object",
            "properties": {"x": schema, "note": {"type": "string"}},
            "required": ["x"],
        }
        if schema_depth(deeper) > room:
            return schema
        schema = deeper


def largest_allowed_schema() -> dict[str, Any]:
    """A tool `parameters` schema at, or just under, every limit of `SCHEMA_LIMITS` at once (so the costliest
    one the worker compiles): 7 objects of the most properties an object may have, 3 enums of the most values
    (near the literal-character limit), 255 bounded numbers, 4 uri-template formats and 4 patterns whose
    repetition counts come near the limit, the deepest nesting, an optional recursion, a fixed array near the
    minimal-instance limit, and descriptions up to the node limit."""
    limits = SCHEMA_LIMITS
    per_object = limits.max_object_properties
    objects = limits.max_properties // per_object - 1  # room for the other properties below
    form = {
        f"o{j}": {
            "type": "object",
            "properties": {
                f"f{i}": {"type": "string", "description": f"field {i}"} for i in range(per_object)
            },
        }
        for j in range(objects)
    }
    value_chars = 16  # 3 x 1,024 values of 16 characters (18 as JSON): 55 k of the 64 Ki literal characters
    enums = {
        f"e{j}": {"enum": [f"{j}-{i}-".ljust(value_chars, "v") for i in range(limits.max_enum_values)]}
        for j in range(3)
    }
    ranges = [
        {"type": "number", "minimum": i / 2, "maximum": 1e12 + i}
        for i in range(limits.max_bounded_numbers - 1)
    ]
    patterns = limits.max_patterns // 2
    repeat = min(limits.max_pattern_repeat, limits.max_pattern_repeats // patterns - 10)
    texts: dict[str, Any] = {f"u{i}": {"type": "string", "format": "uri-template"} for i in range(patterns)}
    texts |= {
        f"p{i}": {"type": "string", "pattern": f"^[a-z]{{1,{repeat}}}-[0-9]{{1,10}}$"}
        for i in range(patterns)
    }
    tree = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/properties/tree"}},
        },
        "required": ["name"],
    }
    # 14 bytes an item ('"xxxxxxxxxx", '): the array's fixed text takes most of the minimal-instance budget.
    fixed = {
        "type": "array",
        "items": {"const": "xxxxxxxxxx"},
        "minItems": limits.max_minimal_instance_bytes // 16,
    }
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "form": {"type": "object", "properties": form},
            "choices": {"type": "object", "properties": enums, "required": ["e0"]},
            "amount": {"anyOf": ranges},
            "texts": {"type": "object", "properties": texts},
            "deep": {},
            "tree": tree,
            "fixed": fixed,
        },
        "required": ["choices", "fixed"],
    }
    schema["properties"]["deep"] = _deepest(limits.max_depth - 2)  # under root.properties
    return schema


def over_limit_schemas() -> dict[str, dict[str, Any]]:
    """The schemas of issue 17, each now a 400 `schema_limit` before compiling: a required `$ref` to the root
    (the worker grew past 6 GB in 6.5 s), an enum of 200,000 strings (`/health` took 20 s), 20,000 required
    properties (17 s) and 200 nested objects."""
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        nested = {"type": "object", "properties": {"x": nested}, "required": ["x"]}
    return {
        "ref_recursion": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
        "enum_200000": {
            "type": "object",
            "properties": {"e": {"enum": [f"value-{i}" for i in range(200_000)]}},
            "required": ["e"],
        },
        "required_20000": {
            "type": "object",
            "properties": {f"p{i}": {"type": "string"} for i in range(20_000)},
            "required": [f"p{i}" for i in range(20_000)],
        },
        "nested_200": nested,
    }


def named_tool_body(parameters: dict[str, Any], *, max_tokens: int = 8) -> dict[str, Any]:
    """A chat request forcing a call to one tool whose `parameters` are `parameters`."""
    return {
        "messages": [{"role": "user", "content": "Fill in the form."}],
        "tools": [{"type": "function", "function": {"name": TOOL_NAME, "parameters": parameters}}],
        "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}},
        "max_tokens": max_tokens,
        "temperature": 0,
    }

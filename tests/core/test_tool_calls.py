"""Tool-call parsers: registry, forced-call prefixes and parsing complete output."""

from __future__ import annotations

import json
import re

import pytest

from tokenfront.core.tool_calls import (
    TOOL_CALL_PARSERS,
    ParsedToolCalls,
    ToolCall,
    UnknownParserError,
    get_tool_call_parser,
    make_tool_call_id,
)

HERMES = get_tool_call_parser("hermes")
LLAMA3 = get_tool_call_parser("llama3_json")


# --- registry, ids -------------------------------------------------------------------


def test_registry_and_aliases() -> None:
    assert set(TOOL_CALL_PARSERS) == {"hermes", "llama3_json", "mistral", "openai"}
    assert TOOL_CALL_PARSERS["hermes"] is HERMES
    assert get_tool_call_parser("qwen25") is HERMES
    assert get_tool_call_parser("llama3-json") is LLAMA3
    assert HERMES.name == "hermes"
    assert LLAMA3.name == "llama3_json"


def test_each_parser_knows_where_its_calls_begin() -> None:
    # What a stream holds back until the parser reads the whole output (core/output/calls.py).
    markers = {name: (p.call_markers, p.call_openings) for name, p in TOOL_CALL_PARSERS.items()}
    assert markers == {
        "hermes": (("<tool_call>",), ()),
        "llama3_json": (("<|python_tag|>",), ("{",)),
        "mistral": (("[TOOL_CALLS]",), ()),
        "openai": (None, ()),  # Harmony's channels, not markers, say what a call is
    }
    # A marker is where the parser itself finds a call: text before it is content.
    calls = {
        "hermes": '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        "llama3_json": '<|python_tag|>{"name": "f", "parameters": {}}',
        "mistral": "[TOOL_CALLS]f[ARGS]{}",
    }
    for name, call in calls.items():
        parsed = TOOL_CALL_PARSERS[name].parse("Sure. " + call)
        assert (parsed.content, [c.name for c in parsed.calls]) == ("Sure.", ["f"]), name


def test_unknown_tool_call_parser_names_the_known_ones() -> None:
    with pytest.raises(UnknownParserError) as caught:
        get_tool_call_parser("pythonic")
    message = str(caught.value)
    assert message.startswith("unknown tool-call parser 'pythonic'")
    assert "hermes" in message
    assert "llama3_json" in message
    assert isinstance(caught.value, ValueError)


def test_tool_call_ids_are_openai_style_and_distinct() -> None:
    ids = {make_tool_call_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", call_id) for call_id in ids)


def test_tool_call_equality_ignores_the_random_id() -> None:
    first, second = ToolCall("f", "{}"), ToolCall("f", "{}")
    assert first == second
    assert first.id != second.id
    assert first.to_openai() == {
        "id": first.id,
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }


# --- forced calls --------------------------------------------------------------------


def test_hermes_forced_call_prefix_matches_qwen_template() -> None:
    assert HERMES.forced_call_prefix("get_weather") == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert HERMES.forced_call_suffix == "}\n</tool_call>"


def test_llama3_forced_call_prefix() -> None:
    assert LLAMA3.forced_call_prefix("get_weather") == '{"name": "get_weather", "parameters": '
    assert LLAMA3.forced_call_suffix == "}"


def test_forced_prefix_json_encodes_the_name() -> None:
    assert HERMES.forced_call_prefix('a"b') == '<tool_call>\n{"name": "a\\"b", "arguments": '
    assert HERMES.forced_call_prefix("{name}") == '<tool_call>\n{"name": "{name}", "arguments": '
    assert HERMES.forced_call_prefix("météo") == '<tool_call>\n{"name": "météo", "arguments": '


@pytest.mark.parametrize("parser", [HERMES, LLAMA3])
def test_forced_call_round_trips_through_parse(parser) -> None:
    arguments = '{"city": "Paris", "units": {"temp": "C"}}'
    text = parser.forced_call_text("get_weather", arguments)
    parsed = parser.parse(text)
    assert parsed.content is None
    assert parsed.calls == [ToolCall("get_weather", arguments)]


def test_fingerprint_component_is_the_prefix_template() -> None:
    assert HERMES.fingerprint_component() == {
        "forced_call_prefix": '<tool_call>\n{"name": {name}, "arguments": ',
        "forced_call_suffix": "}\n</tool_call>",
    }
    assert LLAMA3.fingerprint_component() == {
        "forced_call_prefix": '{"name": {name}, "parameters": ',
        "forced_call_suffix": "}",
    }
    # The alias must not change the component: the ids are the same.
    assert get_tool_call_parser("qwen").fingerprint_component() == HERMES.fingerprint_component()
    json.dumps(HERMES.fingerprint_component())  # JSON-able


# --- hermes parsing ------------------------------------------------------------------


def _calls(parsed: ParsedToolCalls) -> list[tuple[str, object]]:
    return [(call.name, json.loads(call.arguments)) for call in parsed.calls]


def test_hermes_one_call_as_qwen_writes_it() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    parsed = HERMES.parse(text)
    assert parsed.content is None
    assert parsed.calls == [ToolCall("get_weather", '{"city": "Paris"}')]


def test_hermes_two_calls_and_text_before() -> None:
    text = (
        "Let me check both.\n"
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name":"time","arguments":{"tz":"CET"}}</tool_call>'
    )
    parsed = HERMES.parse(text)
    assert parsed.content == "Let me check both."
    assert _calls(parsed) == [("weather", {"city": "Paris"}), ("time", {"tz": "CET"})]
    assert parsed.calls[0].id != parsed.calls[1].id


def test_hermes_nested_json_and_a_close_tag_inside_a_string() -> None:
    arguments = {"query": {"filters": [{"k": "a", "v": [1, 2, {"deep": None}]}]}, "note": "</tool_call> ok"}
    text = f"<tool_call>\n{json.dumps({'name': 'search', 'arguments': arguments})}\n</tool_call>"
    parsed = HERMES.parse(text)
    assert parsed.content is None
    assert _calls(parsed) == [("search", arguments)]


def test_hermes_keeps_non_ascii_arguments_readable() -> None:
    parsed = HERMES.parse('<tool_call>{"name": "f", "arguments": {"city": "Zürich"}}</tool_call>')
    assert parsed.calls[0].arguments == '{"city": "Zürich"}'


def test_hermes_whitespace_and_newlines_are_tolerated() -> None:
    text = '  <tool_call>  \n\n {"name" : "f" ,\n "arguments" : { "a" : 1 } } \n\n </tool_call>  \n'
    parsed = HERMES.parse(text)
    assert parsed.content is None
    assert _calls(parsed) == [("f", {"a": 1})]


def test_hermes_malformed_json_stays_content() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'
    assert HERMES.parse(text) == ParsedToolCalls(content=text, calls=[])


def test_hermes_malformed_block_kept_next_to_a_good_one() -> None:
    bad = '<tool_call>{"name": "broken", "arguments": </tool_call>'
    good = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    parsed = HERMES.parse(f"{bad}\n{good}\nDone.")
    assert _calls(parsed) == [("ok", {})]
    assert parsed.content == f"{bad}\n\nDone."


@pytest.mark.parametrize(
    "body",
    [
        '["f", {}]',  # not an object
        '{"arguments": {"a": 1}}',  # no name
        '{"name": "", "arguments": {}}',
        '{"name": 3, "arguments": {}}',
        '{"name": "f", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "f", "arguments": "not json"}',
    ],
)
def test_hermes_json_that_is_not_a_call_stays_content(body: str) -> None:
    text = f"<tool_call>{body}</tool_call>"
    assert HERMES.parse(text) == ParsedToolCalls(content=text, calls=[])


def test_hermes_arguments_given_as_a_json_string_or_missing() -> None:
    parsed = HERMES.parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert parsed.calls == [ToolCall("f", '{"a": 1}')]
    parsed = HERMES.parse('<tool_call>{"name": "f"}</tool_call>')
    assert parsed.calls == [ToolCall("f", "{}")]


def test_hermes_unclosed_last_block_is_a_call() -> None:
    # Generation stopped on "</tool_call>" (a stop string) or at the end of the call.
    parsed = HERMES.parse('Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n')
    assert parsed.content == "Sure."
    assert _calls(parsed) == [("f", {"a": 1})]


def test_hermes_text_after_an_unclosed_object_is_not_a_call() -> None:
    text = '<tool_call>{"name": "f", "arguments": {}} and more'
    assert HERMES.parse(text) == ParsedToolCalls(content=text, calls=[])


def test_hermes_plain_text_is_content_unchanged() -> None:
    assert HERMES.parse("  Hello, world.\n") == ParsedToolCalls(content="  Hello, world.\n", calls=[])
    assert HERMES.parse("") == ParsedToolCalls(content=None, calls=[])
    assert HERMES.parse("a <tool_call> b") == ParsedToolCalls(content="a <tool_call> b", calls=[])


# --- llama3_json parsing -------------------------------------------------------------


def test_llama3_plain_call() -> None:
    parsed = LLAMA3.parse('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert parsed.content is None
    assert parsed.calls == [ToolCall("get_weather", '{"city": "Paris"}')]


def test_llama3_python_tag_and_text_before_it() -> None:
    parsed = LLAMA3.parse('<|python_tag|>{"name": "f", "parameters": {"a": {"b": [1]}}}')
    assert parsed.content is None
    assert _calls(parsed) == [("f", {"a": {"b": [1]}})]
    parsed = LLAMA3.parse('Checking.<|python_tag|>{"name": "f", "parameters": {}}')
    assert parsed.content == "Checking."
    assert _calls(parsed) == [("f", {})]


def test_llama3_two_calls_separated_by_semicolons() -> None:
    parsed = LLAMA3.parse('{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": 2}}')
    assert parsed.content is None
    assert _calls(parsed) == [("a", {"x": 1}), ("b", {"y": 2})]


def test_llama3_text_after_the_calls_is_content() -> None:
    parsed = LLAMA3.parse('\n{"name": "a", "parameters": {}}\nThat is all.')
    assert _calls(parsed) == [("a", {})]
    assert parsed.content == "That is all."


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 4.",
        'Here: {"name": "a", "parameters": {}}',  # a call must come first
        '{"name": "a", "parameters": {}',  # truncated
        '{"city": "Paris"}',  # an object that is not a call
        '<|python_tag|>{"name": "a", "parameters": ',
        "",
    ],
)
def test_llama3_text_that_is_not_a_call_is_content(text: str) -> None:
    assert LLAMA3.parse(text) == ParsedToolCalls(content=text or None, calls=[])

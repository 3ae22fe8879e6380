"""Output parsers of the model families: gpt-oss's Harmony channels, Mistral's ``[TOOL_CALLS]`` and ``[THINK]``.

Expected values come from vLLM 0.33's own parsers, run on the same outputs in vLLM's environment (scratch
scripts; CI never uses that environment):

- Harmony: each text was encoded to ids with the harmony library (o200k vocabulary built from the gpt-oss
  checkpoint's tokenizer.json) and parsed as vLLM's chat server parses a gpt-oss answer: a ``HarmonyParser``
  composed by ``ParserManager`` for ``--reasoning-parser openai_gptoss`` / ``--tool-call-parser openai``
  (or one of them), ``parse`` on the ids. Every value in ``HARMONY_CASES`` is vLLM's.
- Mistral: each text was encoded with mistral-common tekken tokenizers of versions 3 (JSON array calls),
  11 (``name[ARGS]{...}``) and 13 (``[THINK]``), special tokens as their ids, and parsed by the
  ``ParserManager``-composed parser for ``--tool-call-parser mistral`` (and ``--reasoning-parser mistral``
  where a case reasons). The cases in ``MISTRAL_CASES`` give vLLM's value; the cases in
  ``MISTRAL_MALFORMED_CASES`` are where tokenfront deliberately differs, each with vLLM's answer beside it.

The streaming paths are checked against the whole-text parse, split at every point: what a stream shows is
what the non-streaming answer holds. (vLLM's own streaming differs from its non-streaming answer in one
place: messages of one kind are joined with a newline only when not streaming; tokenfront joins them in both.)
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, NamedTuple

import pytest

from tokenfront.core.errors import CheckpointError
from tokenfront.core.output.harmony import (
    HarmonyDelta,
    HarmonyHeader,
    HarmonyStream,
    parse_harmony,
    parse_harmony_header,
    reads_harmony,
)
from tokenfront.core.output.reasoning import ReasoningStream, split_reasoning
from tokenfront.core.reasoning import REASONING_PARSERS, get_reasoning_parser, reasoning_ended
from tokenfront.core.tool_calls import (
    TOOL_CALL_PARSERS,
    HarmonyToolCallParser,
    MistralToolCallParser,
    get_tool_call_parser,
    make_mistral_tool_call_id,
)

GPTOSS = get_reasoning_parser("openai_gptoss")
HARMONY_TOOLS = get_tool_call_parser("openai")
MISTRAL_REASONING = get_reasoning_parser("mistral")
MISTRAL_TOOLS = get_tool_call_parser("mistral")
HERMES = get_tool_call_parser("hermes")
QWEN3 = get_reasoning_parser("qwen3")


class Case(NamedTuple):
    id: str
    text: str
    reasoning: str | None
    content: str | None
    calls: list[tuple[str, str]]
    with_reasoning: bool = True
    with_tools: bool = True


def _harmony(
    case_id: str,
    text: str,
    reasoning: str | None,
    content: str | None,
    calls: list[tuple[str, str]],
    *,
    reasoning_parser: bool = True,
    tools: bool = True,
) -> Any:
    return pytest.param(Case(case_id, text, reasoning, content, calls, reasoning_parser, tools), id=case_id)


# (id, output text, vLLM's reasoning, content, calls); reasoning_parser / tools: which parsers are configured.
HARMONY_CASES = [
    _harmony(
        "analysis_then_final",
        "<|channel|>analysis<|message|>User says hi. Respond.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Hello! How can I help?<|return|>",
        "User says hi. Respond.",
        "Hello! How can I help?",
        [],
    ),
    _harmony(
        "analysis_only_truncated",
        "<|channel|>analysis<|message|>The user asks about the weather, so I",
        "The user asks about the weather, so I",
        None,
        [],
    ),
    _harmony(
        "analysis_only_ended",
        "<|channel|>analysis<|message|>Thinking done.<|end|>",
        "Thinking done.",
        None,
        [],
    ),
    _harmony(
        "final_only", "<|channel|>final<|message|>Just the answer.<|return|>", None, "Just the answer.", []
    ),
    _harmony(
        "final_without_stop_token",
        "<|channel|>final<|message|>Cut off by max_tokens",
        None,
        "Cut off by max_tokens",
        [],
    ),
    _harmony(
        "tool_call_after_analysis",
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"location":"Tokyo"}<|call|>',
        "Need the weather.",
        None,
        [("get_weather", '{"location": "Tokyo"}')],
    ),
    _harmony(
        "tool_call_recipient_before_channel",
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"
        '<|channel|>commentary json<|message|>{"location": "Tokyo"}<|call|>',
        "Need the weather.",
        None,
        [("get_weather", '{"location": "Tokyo"}')],
    ),
    _harmony(
        "tool_call_first_message",
        ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"location": "Paris", '
        '"unit": "c"}<|call|>',
        None,
        None,
        [("get_weather", '{"location": "Paris", "unit": "c"}')],
    ),
    _harmony(
        "tool_call_constrain_without_space",
        '<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{"location": "Oslo"}<|call|>',
        None,
        None,
        [("get_weather", '{"location": "Oslo"}')],
    ),
    _harmony(
        "preamble_then_tool_call",
        "<|channel|>analysis<|message|>Check weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Let me look that up.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"location": "Tokyo"}<|call|>',
        "Check weather.",
        "Let me look that up.",
        [("get_weather", '{"location": "Tokyo"}')],
    ),
    _harmony(
        "two_tool_calls",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": "Tokyo"}'
        "<|call|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"
        '{"tz": "Asia/Tokyo"}<|call|>',
        None,
        None,
        [("get_weather", '{"location": "Tokyo"}'), ("get_time", '{"tz": "Asia/Tokyo"}')],
    ),
    _harmony(
        "tool_call_without_call_token",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": "Tokyo"}',
        None,
        None,
        [("get_weather", '{"location": "Tokyo"}')],
    ),
    _harmony(
        "tool_call_args_reserialized_ascii",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"Zürich",  '
        '"days":[1,2]}<|call|>',
        None,
        None,
        [("get_weather", '{"location": "Z\\u00fcrich", "days": [1, 2]}')],
    ),
    _harmony(
        "tool_call_invalid_json_kept",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": <|call|>',
        None,
        None,
        [("get_weather", '{"location": ')],
    ),
    _harmony(
        "tool_call_non_json_content_type",
        "<|channel|>commentary to=functions.run <|constrain|>code<|message|>print(1)<|call|>",
        None,
        None,
        [("run", "print(1)")],
    ),
    _harmony(
        "bare_recipient_is_a_function",
        '<|channel|>commentary to=get_weather <|constrain|>json<|message|>{"location": "Rome"}<|call|>',
        None,
        None,
        [("get_weather", '{"location": "Rome"}')],
    ),
    _harmony(
        "builtin_tool_on_analysis_is_reasoning",
        "<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>analysis to=browser.search "
        '<|constrain|>json<|message|>{"query": "x"}<|call|>',
        'Search.\n{"query": "x"}',
        None,
        [],
    ),
    _harmony(
        "builtin_tool_on_commentary_dropped",
        '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query": "x"}<|call|>',
        None,
        None,
        [],
    ),
    _harmony(
        "header_cut_off",
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin",
        "x",
        "<|start|>assistant<|channel|>fin",
        [],
    ),
    _harmony(
        "two_finals_joined",
        "<|channel|>final<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b<|return|>",
        None,
        "a\nb",
        [],
    ),
    _harmony(
        "two_analyses_joined",
        "<|channel|>analysis<|message|>first<|end|><|start|>assistant<|channel|>analysis<|message|>second<|end|>"
        "<|start|>assistant<|channel|>final<|message|>done<|return|>",
        "first\nsecond",
        "done",
        [],
    ),
    _harmony(
        "no_reasoning_parser_drops_analysis",
        "<|channel|>analysis<|message|>hidden<|end|><|start|>assistant<|channel|>final<|message|>shown<|return|>",
        None,
        "shown",
        [],
        reasoning_parser=False,
    ),
    _harmony(
        "no_tool_parser_drops_call",
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"location": "Tokyo"}<|call|>',
        "Need weather.",
        None,
        [],
        tools=False,
    ),
    _harmony(
        "tool_parser_only",
        "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>commentary<|message|>pre<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
        None,
        "pre",
        [("f", "{}")],
        reasoning_parser=False,
    ),
    _harmony(
        "text_between_messages_skipped",
        "<|channel|>analysis<|message|>r<|end|>stray text<|start|>assistant<|channel|>final<|message|>c<|return|>",
        "r",
        "c",
        [],
    ),
    _harmony(
        "unknown_channel_dropped",
        "<|channel|>scratch<|message|>ignored<|end|><|start|>assistant<|channel|>final<|message|>kept<|return|>",
        None,
        "kept",
        [],
    ),
    _harmony(
        "not_harmony_at_all",
        "Hello world, no channels here.",
        None,
        "Hello world, no channels here.",
        [],
    ),
    _harmony(
        "tool_role_message_dropped",
        "<|channel|>final<|message|>a<|end|><|start|>functions.get_weather to=assistant<|channel|>commentary"
        '<|message|>{"t": 1}<|end|>',
        None,
        "a",
        [],
    ),
    _harmony(
        "special_text_inside_content",
        "<|channel|>analysis<|message|>abc<|start|>assistant<|channel|>final<|message|>def<|return|>",
        "abc<|start|>assistant<|channel|>final<|message|>def",
        None,
        [],
    ),
    _harmony(
        "empty_channel_header_fails",
        "<|channel|><|message|>lost<|end|><|start|>assistant<|channel|>final<|message|>after<|return|>",
        None,
        "after",
        [],
    ),
    _harmony("empty_output", "", None, None, []),
    _harmony(
        "final_with_newlines_and_unicode",
        "<|channel|>final<|message|>Line 1\n\nLine 2: naïve 😀 日本語<|return|>",
        None,
        "Line 1\n\nLine 2: naïve 😀 日本語",
        [],
    ),
]


def _harmony_result(out: HarmonyDelta) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    return (
        out.reasoning or None,
        out.content or None,
        [(call.name, call.arguments) for call in out.tool_calls],
    )


def _stream_harmony(case: Case, pieces: list[str], *, resume: bool = False) -> HarmonyDelta:
    """Stream `pieces`; with `resume`, every piece goes to a new reader resumed from the last one's state."""
    stream = HarmonyStream(reasoning=case.with_reasoning, tools=case.with_tools)
    total = HarmonyDelta()
    for piece in pieces:
        if resume:
            state = json.loads(json.dumps(stream.state()))  # what a client would carry
            stream = HarmonyStream.from_state(state, reasoning=case.with_reasoning, tools=case.with_tools)
        out = stream.feed(piece)
        assert not out.tool_calls  # calls come with the end of the output
        total.reasoning += out.reasoning
        total.content += out.content
    last = stream.finish()
    return HarmonyDelta(total.reasoning + last.reasoning, total.content + last.content, last.tool_calls)


# --- Harmony: whole outputs, as vLLM reads them --------------------------------------------------------------


@pytest.mark.parametrize("case", HARMONY_CASES)
def test_harmony_matches_vllm(case: Case) -> None:
    out = parse_harmony(case.text, reasoning=case.with_reasoning, tools=case.with_tools)
    assert _harmony_result(out) == (case.reasoning, case.content, case.calls)


def test_harmony_case_count() -> None:
    assert len(HARMONY_CASES) == 32


# --- Harmony: streaming -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", HARMONY_CASES)
def test_harmony_stream_split_anywhere_equals_whole(case: Case) -> None:
    whole = _harmony_result(parse_harmony(case.text, reasoning=case.with_reasoning, tools=case.with_tools))
    for cut in range(len(case.text) + 1):
        pieces = [case.text[:cut], case.text[cut:]]
        assert _harmony_result(_stream_harmony(case, pieces)) == whole, cut


@pytest.mark.parametrize("case", HARMONY_CASES)
def test_harmony_stream_resumed_from_its_state_anywhere_equals_whole(case: Case) -> None:
    whole = _harmony_result(parse_harmony(case.text, reasoning=case.with_reasoning, tools=case.with_tools))
    for cut in range(len(case.text) + 1):
        pieces = [case.text[:cut], case.text[cut:]]
        assert _harmony_result(_stream_harmony(case, pieces, resume=True)) == whole, cut
    assert _harmony_result(_stream_harmony(case, list(case.text), resume=True)) == whole


def test_harmony_state_keeps_a_finished_call_and_its_id() -> None:
    stream = HarmonyStream()
    stream.feed('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a":1}<|call|><|start|>as')
    state = stream.state()
    [pending] = state["calls"]
    assert (pending["name"], pending["arguments"]) == ("f", '{"a": 1}')
    resumed = HarmonyStream.from_state(json.loads(json.dumps(state)))
    assert resumed.feed("sistant<|channel|>final<|message|>ok") == HarmonyDelta(content="ok")
    last = resumed.finish()
    assert [(c.id, c.name, c.arguments) for c in last.tool_calls] == [(pending["id"], "f", '{"a": 1}')]


@pytest.mark.parametrize(
    "change",
    [
        {"state": "nowhere"},
        {"pending": 3},
        {"message": ["assistant"]},
        {"calls": [{"name": "f"}]},
        {"seen": "x"},
    ],
)
def test_harmony_state_that_does_not_hold_is_refused(change: dict[str, Any]) -> None:
    state = {**HarmonyStream().state(), **change}
    with pytest.raises(ValueError):
        HarmonyStream.from_state(state)


@pytest.mark.parametrize("case", HARMONY_CASES)
def test_harmony_stream_of_single_characters_equals_whole(case: Case) -> None:
    whole = _harmony_result(parse_harmony(case.text, reasoning=case.with_reasoning, tools=case.with_tools))
    assert _harmony_result(_stream_harmony(case, list(case.text))) == whole


def test_harmony_stream_three_way_splits() -> None:
    text = (
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>p<|end|>"
        "<|start|>assistant<|channel|>final<|message|>b<|end|><|start|>assistant<|channel|>final<|message|>c"
    )
    case = Case("three_way", text, "a", "p\nb\nc", [])
    for first, second in itertools.combinations(range(len(text) + 1), 2):
        pieces = [text[:first], text[first:second], text[second:]]
        assert _harmony_result(_stream_harmony(case, pieces)) == ("a", "p\nb\nc", [])


def test_harmony_stream_shows_text_as_it_comes_and_never_a_partial_marker() -> None:
    stream = HarmonyStream()
    assert stream.feed("<|channel|>analysis<|mess") == HarmonyDelta()  # still the header
    assert stream.feed("age|>Let me") == HarmonyDelta(reasoning="Let me")
    assert stream.feed(" think<|e") == HarmonyDelta(reasoning=" think")  # "<|e" may be <|end|>
    assert stream.feed("nd|><|start|>assistant<|channel|>final<|message|>Hi <|") == HarmonyDelta(
        content="Hi "
    )
    assert stream.feed("x") == HarmonyDelta(content="<|x")  # it was not a marker after all
    assert stream.finish() == HarmonyDelta()


def test_harmony_stream_joins_messages_of_one_kind_with_a_newline() -> None:
    stream = HarmonyStream()
    assert stream.feed("<|channel|>final<|message|>a<|end|>") == HarmonyDelta(content="a")
    assert stream.feed("<|start|>assistant<|channel|>analysis<|message|>r<|end|>") == HarmonyDelta(
        reasoning="r"
    )
    # An empty final message adds nothing, not even a newline; the next one does.
    assert stream.feed("<|start|>assistant<|channel|>final<|message|><|end|>") == HarmonyDelta()
    assert stream.feed("<|start|>assistant<|channel|>final<|message|>b") == HarmonyDelta(content="\nb")


def test_harmony_stream_returns_calls_at_the_end() -> None:
    stream = HarmonyStream()
    text = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a":1}<|call|>'
    assert stream.feed(text) == HarmonyDelta()
    last = stream.finish()
    assert [(call.name, call.arguments) for call in last.tool_calls] == [("f", '{"a": 1}')]
    assert re.fullmatch(r"call_[0-9a-f]{24}", last.tool_calls[0].id)


# --- Harmony: headers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "role", "expected"),
    [
        ("<|channel|>analysis", "assistant", HarmonyHeader("assistant", "analysis", None, None)),
        (
            "<|channel|>commentary to=functions.f <|constrain|>json",
            "assistant",
            HarmonyHeader("assistant", "commentary", "functions.f", "<|constrain|>json"),
        ),
        (
            "assistant to=functions.f<|channel|>commentary json",
            None,
            HarmonyHeader("assistant", "commentary", "functions.f", "json"),
        ),
        (
            "functions.f to=assistant<|channel|>commentary",
            None,
            HarmonyHeader("tool", "commentary", "assistant", None),
        ),
        ("<|channel|>final", None, None),  # no role where one is needed
        ("<|channel|>", "assistant", None),  # a channel marker without a channel
        ("stranger", None, None),  # an unknown role without a recipient
        ("<|channel|>final a b c", "assistant", None),  # words left over
    ],
)
def test_harmony_headers(header: str, role: str | None, expected: HarmonyHeader | None) -> None:
    assert parse_harmony_header(header, role=role) == expected


# --- Harmony: parsers, registries -----------------------------------------------------------------------------


def test_gpt_oss_parsers_are_registered_under_vllms_names() -> None:
    assert REASONING_PARSERS["openai_gptoss"] is GPTOSS and GPTOSS.harmony
    assert TOOL_CALL_PARSERS["openai"] is HARMONY_TOOLS and isinstance(HARMONY_TOOLS, HarmonyToolCallParser)
    assert HARMONY_TOOLS.harmony
    assert GPTOSS.fingerprint_component() is None  # it never reads the mode off the prompt
    # A rendered gpt-oss prompt ends with "<|start|>assistant": reasoning has neither started nor ended.
    assert reasoning_ended(GPTOSS, "<|start|>user<|message|>hi<|end|><|start|>assistant") is None


def test_reads_harmony_needs_both_parsers_to_be_gpt_oss() -> None:
    assert reads_harmony(GPTOSS, HARMONY_TOOLS)
    assert reads_harmony(GPTOSS, None)
    assert reads_harmony(None, HARMONY_TOOLS)
    assert not reads_harmony(QWEN3, HERMES)
    assert not reads_harmony(None, None)
    with pytest.raises(CheckpointError, match="openai_gptoss"):
        reads_harmony(QWEN3, HARMONY_TOOLS)
    with pytest.raises(CheckpointError, match="cannot be combined"):
        reads_harmony(GPTOSS, HERMES)


def test_harmony_forced_call_opens_a_call_message_and_reads_back() -> None:
    prefix = HARMONY_TOOLS.forced_call_prefix("get_weather")
    # What follows the prompt's "<|start|>assistant", as the harmony library renders a call in history.
    assert prefix == "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    parsed = HARMONY_TOOLS.parse(HARMONY_TOOLS.forced_call_text("get_weather", '{"location": "Tokyo"}'))
    assert [(call.name, call.arguments) for call in parsed.calls] == [
        ("get_weather", '{"location": "Tokyo"}')
    ]
    assert parsed.content is None
    assert HARMONY_TOOLS.fingerprint_component() == {
        "forced_call_prefix": "<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
        "forced_call_suffix": "<|call|>",
    }


def test_harmony_tool_parser_without_calls_leaves_the_text() -> None:
    text = "<|channel|>final<|message|>no call<|return|>"
    assert HARMONY_TOOLS.parse(text).calls == []
    assert HARMONY_TOOLS.parse(text).content == text


# --- Mistral tool calls -----------------------------------------------------------------------------------------


def _mistral(case_id: str, text: str, content: str | None, calls: list[tuple[str, str]]) -> Any:
    return pytest.param(Case(case_id, text, None, content, calls), id=case_id)


# (id, output text with special tokens kept, vLLM's content and calls). v3 = tokenizer before v11.
MISTRAL_CASES = [
    _mistral(
        "v3_json_array",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v3_two_calls",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": '
        '{"a": 1}}]',
        None,
        [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1}')],
    ),
    _mistral(
        "v3_bare_object",
        '[TOOL_CALLS] {"name": "get_weather", "arguments": {"city": "Paris"}}',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v3_string_arguments_kept",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v3_missing_arguments",
        '[TOOL_CALLS] [{"name": "get_weather"}]',
        None,
        [("get_weather", "{}")],
    ),
    _mistral(
        "v3_content_before_and_after",
        'Before [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}] after',
        "Before ",
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v3_whitespace_before",
        '  [TOOL_CALLS] [{"name": "get_weather", "arguments": {}}]',
        None,
        [("get_weather", "{}")],
    ),
    _mistral(
        "v3_repeated_marker",
        '[TOOL_CALLS][TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Zürich"}}]',
        None,
        [("get_weather", '{"city": "Zürich"}')],
    ),
    _mistral(
        "v3_second_marker_dropped",
        '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}][TOOL_CALLS] [{"name": "b", "arguments": {}}]',
        None,
        [("a", '{"x": 1}')],
    ),
    _mistral(
        "v11_one_call",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v11_content_then_two_calls",
        'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
        "Let me check.",
        [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1, "b": 2}')],
    ),
    _mistral(
        "v11_content_stripped",
        'Hello [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "Hello",
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v11_text_after_call_dropped",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} and more text',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v11_brace_without_args_marker",
        '[TOOL_CALLS]get_weather{"city": "Paris"}',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v11_calls_on_separate_lines",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}\n[TOOL_CALLS]add[ARGS]{"a": 1}',
        None,
        [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1}')],
    ),
    _mistral("v11_empty_arguments", "[TOOL_CALLS]get_weather[ARGS]", None, [("get_weather", "{}")]),
    _mistral(
        "v11_arguments_as_written",
        '[TOOL_CALLS]get_weather[ARGS]{"a": {"b": [1,2]}}',
        None,
        [("get_weather", '{"a": {"b": [1,2]}}')],
    ),
    _mistral(
        "v11_unicode_arguments",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich"}',
        None,
        [("get_weather", '{"city": "Zürich"}')],
    ),
    _mistral(
        "v11_whitespace_around_arguments",
        '[TOOL_CALLS]get_weather[ARGS] {"city":"Paris"} ',
        None,
        [("get_weather", '{"city":"Paris"}')],
    ),
    _mistral(
        "v11_whitespace_around_name",
        '[TOOL_CALLS] get_weather [ARGS]{"city": "Paris"}',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v11_whitespace_before",
        '  \n[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral(
        "v11_trailing_empty_marker",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral("no_call", "plain answer", "plain answer", []),
    # Without --reasoning-parser mistral, reasoning markers are content.
    _mistral(
        "think_markers_without_reasoning_parser",
        '[THINK]r[/THINK]Ok.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "[THINK]r[/THINK]Ok.",
        [("get_weather", '{"city": "Paris"}')],
    ),
]

# Where tokenfront differs, on purpose: a call without a name or whose arguments are not a JSON object is never
# handed to a client (as with the other parsers); such output stays content, unchanged. vLLM's answers:
MISTRAL_MALFORMED_CASES = [
    # vLLM: a call ("get_weather", '{"city":') -- arguments cut off by max_tokens.
    _mistral(
        "v11_truncated_arguments",
        '[TOOL_CALLS]get_weather[ARGS]{"city": ',
        '[TOOL_CALLS]get_weather[ARGS]{"city": ',
        [],
    ),
    # vLLM: a call ("get_weather", "not json").
    _mistral(
        "v11_arguments_not_json",
        "[TOOL_CALLS]get_weather[ARGS]not json",
        "[TOOL_CALLS]get_weather[ARGS]not json",
        [],
    ),
    # vLLM: a call ("", "{}").
    _mistral("v11_no_name", "[TOOL_CALLS][ARGS]{}", "[TOOL_CALLS][ARGS]{}", []),
    # vLLM: a call ("get_wea", "{}") -- a name cut off by max_tokens.
    _mistral("v11_name_cut_off", "Sure, [TOOL_CALLS] get_wea", "Sure, [TOOL_CALLS] get_wea", []),
    # vLLM: calls get_weather and ("get_wea", "{}"), no content. The valid call is kept; the rest stays content.
    _mistral(
        "v11_valid_call_then_cut_off_one",
        "[TOOL_CALLS] get_weather[ARGS]{} [TOOL_CALLS] get_wea",
        "[TOOL_CALLS] get_wea",
        [("get_weather", "{}")],
    ),
    # vLLM: content "Answer: " (the marker dropped), no call.
    _mistral("v11_marker_alone", "Answer: [TOOL_CALLS]", "Answer: [TOOL_CALLS]", []),
    # vLLM: a call ("", '{"city": "Paris"}').
    _mistral(
        "v3_no_name",
        '[TOOL_CALLS] [{"arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS] [{"arguments": {"city": "Paris"}}]',
        [],
    ),
    # vLLM: content '[{"name": "get_weather", "arguments": {"city":' (the text before the marker dropped).
    _mistral(
        "v3_truncated_array",
        'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": ',
        'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": ',
        [],
    ),
    # vLLM: content "[1, 2]".
    _mistral("v3_not_calls", "[TOOL_CALLS] [1, 2]", "[TOOL_CALLS] [1, 2]", []),
    # vLLM: content "not json at all".
    _mistral("v3_not_json", "[TOOL_CALLS] not json at all", "[TOOL_CALLS] not json at all", []),
]


def _calls(parsed: Any) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in parsed.calls]


@pytest.mark.parametrize("case", MISTRAL_CASES)
def test_mistral_tool_calls_match_vllm(case: Case) -> None:
    parsed = MISTRAL_TOOLS.parse(case.text)
    assert (parsed.content, _calls(parsed)) == (case.content, case.calls)
    # Mistral's ids: 9 letters and digits (vLLM's MistralToolCall), the only ones mistral-common accepts back.
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", call.id) for call in parsed.calls)


@pytest.mark.parametrize("case", MISTRAL_MALFORMED_CASES)
def test_mistral_malformed_calls_stay_content(case: Case) -> None:
    parsed = MISTRAL_TOOLS.parse(case.text)
    assert (parsed.content, _calls(parsed)) == (case.content, case.calls)


def test_mistral_case_counts() -> None:
    assert (len(MISTRAL_CASES), len(MISTRAL_MALFORMED_CASES), len(MISTRAL_REASONING_CASES)) == (24, 10, 16)


def test_mistral_tool_call_ids_are_distinct() -> None:
    ids = {make_mistral_tool_call_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", call_id) for call_id in ids)


def test_mistral_forced_call_reads_back() -> None:
    assert isinstance(MISTRAL_TOOLS, MistralToolCallParser)
    assert MISTRAL_TOOLS.forced_call_prefix("get_weather") == "[TOOL_CALLS]get_weather[ARGS]"
    parsed = MISTRAL_TOOLS.parse(MISTRAL_TOOLS.forced_call_text("get_weather", '{"city": "Paris"}'))
    assert (parsed.content, _calls(parsed)) == (None, [("get_weather", '{"city": "Paris"}')])


# --- Mistral reasoning ------------------------------------------------------------------------------------------


def _mistral_reasoning(
    case_id: str,
    text: str,
    reasoning: str | None,
    content: str | None,
    calls: list[tuple[str, str]],
    *,
    tools: bool = True,
) -> Any:
    return pytest.param(Case(case_id, text, reasoning, content, calls, True, tools), id=case_id)


# (id, text, vLLM's reasoning, content, calls) with --reasoning-parser mistral (tokenizer v13, [THINK] tokens),
# and --tool-call-parser mistral unless tools=False.
MISTRAL_REASONING_CASES = [
    _mistral_reasoning(
        "think_then_answer",
        "[THINK]Let me think.[/THINK]The answer is 4.",
        "Let me think.",
        "The answer is 4.",
        [],
        tools=False,
    ),
    _mistral_reasoning(
        "trailing_reasoning_whitespace_dropped",
        "[THINK]Let me think. \n[/THINK]\n\nThe answer is 4.",
        "Let me think.",
        "\n\nThe answer is 4.",
        [],
        tools=False,
    ),
    _mistral_reasoning("only_thinking_cut_off", "[THINK]only thinking", "only thinking", None, []),
    _mistral_reasoning(
        "cut_off_with_trailing_whitespace", "[THINK]cut off here  \n", "cut off here", None, [], tools=False
    ),
    _mistral_reasoning("no_think", "no think here", None, "no think here", []),
    _mistral_reasoning(
        "think_mid_content", "Hi [THINK]inner[/THINK]after", "inner", "Hi after", [], tools=False
    ),
    _mistral_reasoning("two_blocks", "[THINK]a[/THINK]b[THINK]c[/THINK]d", "ac", "bd", [], tools=False),
    _mistral_reasoning("whitespace_before_think_kept", "  [THINK]x[/THINK]y", "x", "  y", [], tools=False),
    _mistral_reasoning(
        "leading_reasoning_whitespace_kept",
        "[THINK] leading space[/THINK]ok",
        " leading space",
        "ok",
        [],
        tools=False,
    ),
    _mistral_reasoning("stray_end_dropped", "[/THINK]stray", None, "stray", [], tools=False),
    _mistral_reasoning("repeated_start_dropped", "[THINK][THINK]dup[/THINK]z", "dup", "z", [], tools=False),
    _mistral_reasoning("repeated_end_dropped", "[THINK]a\n\n[/THINK][/THINK]b", "a", "b", [], tools=False),
    _mistral_reasoning(
        "call_from_inside_reasoning",
        '[THINK]need it\n[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "need it",
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral_reasoning(
        "call_after_reasoning",
        '[THINK]hmm, weather[/THINK]I will call.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "hmm, weather",
        "I will call.",
        [("get_weather", '{"city": "Paris"}')],
    ),
    _mistral_reasoning(
        "call_without_tool_parser_is_content",
        "[THINK]r[TOOL_CALLS]get_weather[ARGS]{}",
        "r",
        "[TOOL_CALLS]get_weather[ARGS]{}",
        [],
        tools=False,
    ),
    _mistral_reasoning("only_reasoning", "[THINK]only[/THINK]", "only", None, [], tools=False),
]


def _split_mistral(text: str, *, tools: bool) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    reasoning, content = split_reasoning(MISTRAL_REASONING, text)
    if not tools:
        return reasoning, content, []
    parsed = MISTRAL_TOOLS.parse(content or "")
    return reasoning, parsed.content, _calls(parsed)


@pytest.mark.parametrize("case", MISTRAL_REASONING_CASES)
def test_mistral_reasoning_matches_vllm(case: Case) -> None:
    assert _split_mistral(case.text, tools=case.with_tools) == (case.reasoning, case.content, case.calls)


@pytest.mark.parametrize("case", MISTRAL_REASONING_CASES)
def test_mistral_reasoning_stream_split_anywhere_equals_whole(case: Case) -> None:
    whole = split_reasoning(MISTRAL_REASONING, case.text)
    for pieces in [list(case.text)] + [
        [case.text[:cut], case.text[cut:]] for cut in range(len(case.text) + 1)
    ]:
        stream = ReasoningStream(MISTRAL_REASONING)
        parts = [stream.feed(piece) for piece in pieces] + [stream.finish()]
        reasoning = "".join(part.reasoning or "" for part in parts) or None
        content = "".join(part.content or "" for part in parts) or None
        assert (reasoning, content) == whole, pieces


def test_mistral_reasoning_holds_back_trailing_whitespace_and_partial_markers() -> None:
    stream = ReasoningStream(MISTRAL_REASONING)
    assert tuple(stream.feed("Hi [TH")) == (None, "Hi ")
    assert tuple(stream.feed("INK]step one \n")) == ("step one", None)  # the whitespace waits
    assert tuple(stream.feed("two[/TH")) == (" \ntwo", None)  # more reasoning came: it was inside
    assert tuple(stream.feed("INK]done")) == (None, "done")
    assert tuple(stream.finish()) == (None, None)


def test_mistral_reasoning_parser_markers() -> None:
    parser = REASONING_PARSERS["mistral"]
    assert (parser.start, parser.end, parser.markers_are_special_tokens) == ("[THINK]", "[/THINK]", True)
    assert parser.fingerprint_component() is None


def test_existing_parsers_keep_their_behaviour() -> None:
    # The new options are off for the parsers that were there before.
    for name in ("qwen3", "deepseek_r1", "deepseek_v3", "glm45", "poolside_v1", "minimax_m3"):
        parser = REASONING_PARSERS[name]
        assert not (parser.markers_anywhere or parser.strips_trailing_whitespace or parser.harmony)
        assert parser.content_markers == ()
    assert split_reasoning(QWEN3, "a <think>b</think>c", chat_template_kwargs={"enable_thinking": False}) == (
        None,
        "a <think>b</think>c",
    )


def test_harmony_tool_call_arguments_json_is_compact_like_vllm() -> None:
    out = parse_harmony('<|channel|>commentary to=functions.f json<|message|>{"a":{"b":[1,"é"]}}<|call|>')
    assert [call.arguments for call in out.tool_calls] == [json.dumps({"a": {"b": [1, "é"]}})]

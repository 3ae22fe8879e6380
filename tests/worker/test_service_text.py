"""The worker's text pipeline without a model: detokenization, stop strings, tool-call holding, SSE, logprobs.

Ids come from the real SmolLM2 tokenizer (the `tiny-random` fixture's folder: tokenizer files only are read
here); expected texts come from that tokenizer's own `decode` and from the core parsers run on whole texts,
so streaming a text piece by piece must give what parsing it at once gives.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tokenfront.core.families import GENERIC
from tokenfront.core.reasoning import ReasoningStream, get_reasoning_parser, split_reasoning
from tokenfront.core.tool_calls import get_tool_call_parser
from tokenfront.worker.engine import TokenOutput
from tokenfront.worker.service import chat_logprobs, completion_logprobs, usage_prompt_tokens
from tokenfront.worker.streaming import (
    ChoiceText,
    ForcedToolCall,
    IncrementalDetokenizer,
    StopStringMatcher,
    TextDelta,
    ToolCallHold,
)

EOS = 2  # <|im_end|>
MIXED_TEXT = "Voilà: café — naïve 😀 日本語 text,\n  with   spaces and ünïcödé €100."


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Callable[[str], Path]) -> Any:
    return AutoTokenizer.from_pretrained(str(checkpoint("tiny-random")))


def _decoder(tokenizer: Any, *, skip_special_tokens: bool = True) -> Callable[[Sequence[int]], str]:
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _feed_chars(consume: Callable[[str], str], text: str) -> list[str]:
    return [consume(char) for char in text]


# --- detokenization ----------------------------------------------------------------------------------------


def test_incremental_detokenizer_equals_whole_decode(tokenizer: Any) -> None:
    ids = tokenizer.encode(MIXED_TEXT, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(_decoder(tokenizer))
    deltas = [detokenizer.push(token_id) for token_id in ids]
    deltas.append(detokenizer.flush())
    assert "".join(deltas) == tokenizer.decode(ids) == MIXED_TEXT
    # A character split across byte tokens is never shown half-done.
    assert not any("\ufffd" in delta for delta in deltas)
    # The emoji and the CJK characters take several byte tokens: some pushes show nothing.
    assert "" in deltas[:-1]


def test_choice_text_hides_eos_and_special_tokens(tokenizer: Any) -> None:
    ids = [*tokenizer.encode("Paris.", add_special_tokens=False), EOS]
    text = ChoiceText(_decoder(tokenizer), hidden_ids={EOS})
    shown = TextDelta()
    for token_id in ids:
        shown.extend(text.push(token_id))
    shown.extend(text.finish())
    assert shown.content == "Paris."
    assert not text.stopped


# --- stop strings ------------------------------------------------------------------------------------------


def test_stop_string_cuts_before_it_and_holds_partial_prefixes() -> None:
    matcher = StopStringMatcher(["STOP", "\n\n"])
    assert matcher.feed("Hello S") == "Hello "  # "S" might start STOP
    assert matcher.feed("T") == ""
    assert matcher.feed("ay") == "STay"  # it did not
    assert matcher.feed(" then\n") == " then"
    assert matcher.feed("\nrest") == ""
    assert matcher.stopped
    assert matcher.feed("more") == ""


def test_stop_string_streamed_char_by_char_equals_cut_of_whole_text() -> None:
    text = "The capital of France is Paris. It is lovely."
    for stop in (["Paris"], ["is P", "zzz"], ["."], ["lovely", "capital"]):
        matcher = StopStringMatcher(stop)
        released = "".join(_feed_chars(matcher.feed, text)) + ("" if matcher.stopped else matcher.flush())
        first = min(text.find(s) for s in stop if s in text)
        assert released == text[:first], stop
        assert matcher.stopped


def test_no_stop_string_releases_everything() -> None:
    matcher = StopStringMatcher(["END"])
    text = "no end here, only EN"
    released = "".join(_feed_chars(matcher.feed, text))
    assert released == "no end here, only "  # "EN" could still become END
    assert matcher.flush() == "EN"
    assert not matcher.stopped


def test_stop_string_spanning_tokens_in_choice_text(tokenizer: Any) -> None:
    ids = tokenizer.encode("The capital of France is Paris.", add_special_tokens=False)
    text = ChoiceText(_decoder(tokenizer), hidden_ids={EOS}, stop=["France is"])
    shown = TextDelta()
    used = 0
    for token_id in ids:
        used += 1
        shown.extend(text.push(token_id))
        if text.stopped:
            break
    shown.extend(text.finish())
    assert shown.content == "The capital of "
    assert text.stopped
    assert used < len(ids)  # the engine would be aborted here, before "Paris"


# --- tool calls in streamed content ------------------------------------------------------------------------

HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    "text",
    [
        "Let me check. " + HERMES_CALL,
        "Let me check.\n\n" + HERMES_CALL + "\nDone.",
        HERMES_CALL,
        "  " + HERMES_CALL,
        "\n Sure. " + HERMES_CALL,  # leading whitespace the parser strips: held to the end
        "\n No call, leading whitespace kept.",
        "No call here, only a < sign and <tool",
        "Plain answer.\n",
        "<tool_call>not json</tool_call> after",
    ],
)
def test_hermes_hold_streams_a_prefix_of_the_parsed_content(text: str) -> None:
    parser = get_tool_call_parser("hermes")
    hold = ToolCallHold(parser)
    streamed = "".join(_feed_chars(hold.feed, text))
    rest, calls = hold.finish()
    parsed = parser.parse(text)
    expected = (parsed.content or "") if parsed.calls else text
    assert streamed + rest == expected
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (c.name, json.loads(c.arguments)) for c in parsed.calls
    ]
    assert "<tool_call>" not in streamed


def test_hermes_hold_streams_content_before_a_call_early() -> None:
    hold = ToolCallHold(get_tool_call_parser("hermes"))
    assert hold.feed("Let me check the weather") == "Let me check the weather"
    assert hold.feed(" for you. ") == " for you."  # the trailing space waits
    assert hold.feed("<tool") == ""


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        'Sure.<|python_tag|>{"name": "f", "parameters": {}}',
        "The answer is {not a call}.",
        "Plain answer.",
    ],
)
def test_llama3_json_hold_matches_the_parser(text: str) -> None:
    parser = get_tool_call_parser("llama3_json")
    hold = ToolCallHold(parser)
    streamed = "".join(_feed_chars(hold.feed, text))
    rest, calls = hold.finish()
    parsed = parser.parse(text)
    assert streamed + rest == ((parsed.content or "") if parsed.calls else text)
    assert [c.name for c in calls] == [c.name for c in parsed.calls]


def test_forced_tool_call_reads_the_arguments_back() -> None:
    forced = ForcedToolCall(get_tool_call_parser("hermes"), "get_weather")
    assert "".join(_feed_chars(forced.feed, '{"city": "Paris", "unit": "celsius"}')) == ""
    content, calls = forced.finish()
    assert content == ""
    assert len(calls) == 1
    assert calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris", "unit": "celsius"}


def test_forced_tool_call_cut_off_gives_no_call() -> None:
    forced = ForcedToolCall(get_tool_call_parser("hermes"), "get_weather")
    forced.feed('{"city": "Par')
    assert forced.finish() == ("", [])


# --- reasoning + tools in one choice -----------------------------------------------------------------------


def test_choice_text_streams_reasoning_then_content_like_the_whole_split(tokenizer: Any) -> None:
    parser = get_reasoning_parser("qwen3")
    generated = "<think>\nThe user asks about France.\n</think>\n\nParis is the capital."
    ids = tokenizer.encode(generated, add_special_tokens=False)
    text = ChoiceText(_decoder(tokenizer), reasoning=ReasoningStream(parser))
    total = TextDelta()
    for token_id in ids:
        delta = text.push(token_id)
        assert "</think>" not in delta.reasoning + delta.content
        total.extend(delta)
    total.extend(text.finish())
    whole = split_reasoning(parser, generated)
    assert (total.reasoning, total.content) == (whole.reasoning, whole.content)


def test_choice_text_tool_call_after_reasoning(tokenizer: Any) -> None:
    generated = "<think>weather needed</think>Checking. " + HERMES_CALL
    ids = tokenizer.encode(generated, add_special_tokens=False)
    text = ChoiceText(
        _decoder(tokenizer, skip_special_tokens=False),
        hidden_ids={EOS},
        reasoning=ReasoningStream(get_reasoning_parser("qwen3")),
        tools=ToolCallHold(get_tool_call_parser("hermes")),
    )
    total = TextDelta()
    for token_id in [*ids, EOS]:
        total.extend(text.push(token_id))
    total.extend(text.finish())
    assert total.reasoning == "weather needed"
    assert total.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in total.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]


# --- logprobs --------------------------------------------------------------------------------------


def _token_text(tokenizer: Any) -> Callable[[int], str]:
    return lambda token_id: tokenizer.decode([token_id])


def test_chat_logprobs_shape(tokenizer: Any) -> None:
    ids = tokenizer.encode(" Paris é", add_special_tokens=False)
    outputs = [TokenOutput(i, -0.5, ((i, -0.5), (EOS, float("-inf")))) for i in ids]
    body = chat_logprobs(outputs, _token_text(tokenizer))
    assert list(body) == ["content"]
    assert len(body["content"]) == len(ids)
    first = body["content"][0]
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
    assert first["token"] == tokenizer.decode([ids[0]])
    assert first["bytes"] == list(first["token"].encode("utf-8"))
    assert [t["token"] for t in first["top_logprobs"]] == [first["token"], "<|im_end|>"]
    # -inf (a token the grammar forbade) is not JSON: it is clamped, as vLLM does.
    assert first["top_logprobs"][1]["logprob"] == -9999.0
    json.dumps(body, allow_nan=False)


def test_completion_logprobs_shape_and_offsets(tokenizer: Any) -> None:
    ids = tokenizer.encode(" is Paris.", add_special_tokens=False)
    outputs = [TokenOutput(i, -1.0, ((i, -1.0),)) for i in ids]
    body, end = completion_logprobs(outputs, _token_text(tokenizer), text_offset=5)
    assert list(body) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    assert "".join(body["tokens"]) == " is Paris."
    assert body["token_logprobs"] == [-1.0] * len(ids)
    assert body["top_logprobs"][0] == {body["tokens"][0]: -1.0}
    starts = [5]
    for token in body["tokens"][:-1]:
        starts.append(starts[-1] + len(token))
    assert body["text_offset"] == starts
    assert end == 5 + len(" is Paris.")


def test_generic_family_counts_every_prompt_token() -> None:
    assert usage_prompt_tokens(GENERIC, "anything", [1, 2, 3], lambda ids: "") == 3

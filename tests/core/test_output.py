"""The output core (core/output): generated ids into reasoning, content, tool calls, finish reasons and
OpenAI shapes, streamed, whole, and resumed from a carried state.

Ids come from real tokenizers (SmolLM2's from the `tiny-random` fixture, gpt-oss's from `tiny-gptoss`,
Mistral's tekken from `tiny-mistral`, a sentencepiece Mistral from `mistral-sp`; tokenizer files only).
Expected texts come from the tokenizers' own `decode` and from the parsers run on whole texts; the streaming
and resumed paths must give exactly what the whole output gives.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tokenfront.core.checkpoint import load_checkpoint
from tokenfront.core.errors import RenderError
from tokenfront.core.output import (
    AnswerHead,
    ChatFormatter,
    ChoiceParser,
    CompletionFormatter,
    FinishedChoice,
    OutputConfig,
    OutputDelta,
    OutputStateError,
    chat_logprobs,
    completion_logprobs,
    parse_output,
    usage,
)
from tokenfront.core.output.calls import ForcedToolCall, ToolCallHold
from tokenfront.core.output.detokenizer import IncrementalDetokenizer
from tokenfront.core.output.harmony import parse_harmony
from tokenfront.core.output.reasoning import split_reasoning
from tokenfront.core.output.stop_strings import StopStringMatcher
from tokenfront.core.reasoning import OutputStart, get_reasoning_parser
from tokenfront.core.tool_calls import ToolCall, get_tool_call_parser
from tokenfront.protocol import ChatCompletionRequest

EOS = 2  # SmolLM2's <|im_end|>
MIXED_TEXT = "Voilà: café — naïve 😀 日本語 text,\n  with   spaces and ünïcödé €100."
QWEN3 = get_reasoning_parser("qwen3")
HERMES = get_tool_call_parser("hermes")
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def smol(checkpoint: Callable[[str], Path]) -> Any:
    return AutoTokenizer.from_pretrained(str(checkpoint("tiny-random")))


@pytest.fixture(scope="module")
def gptoss(checkpoint: Callable[[str], Path]) -> Any:
    return AutoTokenizer.from_pretrained(str(checkpoint("tiny-gptoss")))


@pytest.fixture(scope="module")
def tekken(checkpoint: Callable[[str], Path]) -> Any:
    return load_checkpoint(str(checkpoint("tiny-mistral")), tokenizer_mode="mistral").tokenizer


def _decoder(tokenizer: Any, *, skip_special_tokens: bool = True) -> Callable[[Sequence[int]], str]:
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _feed_chars(consume: Callable[[str], str], text: str) -> list[str]:
    return [consume(char) for char in text]


def _calls(calls: Sequence[ToolCall]) -> list[tuple[str, Any]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


def _result(delta: OutputDelta) -> tuple[str, str, list[tuple[str, Any]], str | None]:
    return delta.reasoning, delta.content, _calls(delta.tool_calls), delta.finish_reason


def _chat(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "Weather in Paris?"}], **extra)


# --- detokenization ----------------------------------------------------------------------------------------


def test_incremental_detokenizer_equals_whole_decode(smol: Any) -> None:
    ids = smol.encode(MIXED_TEXT, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(_decoder(smol))
    deltas = [detokenizer.push(token_id) for token_id in ids]
    deltas.append(detokenizer.flush())
    assert "".join(deltas) == smol.decode(ids) == MIXED_TEXT
    # A character split across byte tokens is never shown half-done.
    assert not any("\ufffd" in delta for delta in deltas)
    # The emoji and the CJK characters take several byte tokens: some pushes show nothing.
    assert "" in deltas[:-1]


def test_detokenizer_state_is_a_small_window_and_resumes_mid_character(smol: Any) -> None:
    ids = smol.encode(MIXED_TEXT, add_special_tokens=False)
    for cut in range(len(ids) + 1):
        first = IncrementalDetokenizer(_decoder(smol))
        head = "".join(first.push(i) for i in ids[:cut])
        state = json.loads(json.dumps(first.state()))
        assert len(state["window"]) <= 6  # the window, not the whole output
        second = IncrementalDetokenizer.from_state(_decoder(smol), state)
        assert head + "".join(second.push(i) for i in ids[cut:]) + second.flush() == MIXED_TEXT, cut


def test_context_ids_decode_the_first_token_as_it_follows_the_prompt(
    checkpoint: Callable[[str], Path],
) -> None:
    # A sentencepiece tokenizer drops the leading space of a text's first token; after the prompt it stays.
    sentencepiece = AutoTokenizer.from_pretrained(str(checkpoint("mistral-sp")))
    hello, paris = sentencepiece.encode("Hello Paris", add_special_tokens=False)
    config = OutputConfig()
    assert parse_output(config, sentencepiece, [paris], "stop").content == "Paris"
    assert parse_output(config, sentencepiece, [paris], "stop", context_ids=[hello]).content == " Paris"


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


def test_stop_string_spanning_tokens_stops_the_choice(smol: Any) -> None:
    ids = smol.encode("The capital of France is Paris.", add_special_tokens=False)
    parser = ChoiceParser(OutputConfig(stop=("France is",), hidden_ids=frozenset({EOS})), smol)
    shown = OutputDelta()
    used = 0
    for token_id in ids:
        used += 1
        shown.extend(parser.push(token_id))
        if parser.stopped:
            break
    shown.extend(parser.finish("length"))
    assert (shown.content, shown.finish_reason) == ("The capital of ", "stop")  # a stop string wins
    assert used < len(ids)  # the engine would be aborted here, before "Paris"
    # A chunk pushed at once stops at the same place, and ignores the rest.
    assert parse_output(OutputConfig(stop=("France is",)), smol, ids, "length").content == "The capital of "


def test_eos_is_never_shown(smol: Any) -> None:
    ids = [*smol.encode("Paris.", add_special_tokens=False), EOS]
    assert parse_output(OutputConfig(hidden_ids=frozenset({EOS})), smol, ids, "stop").content == "Paris."


# --- tool calls in streamed content ------------------------------------------------------------------------


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
    hold = ToolCallHold(HERMES)
    streamed = "".join(_feed_chars(hold.feed, text))
    rest, calls = hold.finish()
    parsed = HERMES.parse(text)
    expected = (parsed.content or "") if parsed.calls else text
    assert streamed + rest == expected
    assert _calls(calls) == _calls(parsed.calls)
    assert "<tool_call>" not in streamed


def test_hermes_hold_streams_content_before_a_call_early() -> None:
    hold = ToolCallHold(HERMES)
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


def test_a_parser_without_markers_holds_all_content() -> None:
    hold = ToolCallHold(get_tool_call_parser("openai"))
    assert "".join(_feed_chars(hold.feed, "Plain answer.")) == ""
    assert hold.finish() == ("Plain answer.", [])


def test_forced_tool_call_reads_the_arguments_back() -> None:
    forced = ForcedToolCall(HERMES, "get_weather")
    assert "".join(_feed_chars(forced.feed, '{"city": "Paris", "unit": "celsius"}')) == ""
    content, calls = forced.finish()
    assert content == ""
    assert _calls(calls) == [("get_weather", {"city": "Paris", "unit": "celsius"})]


def test_forced_tool_call_cut_off_gives_no_call() -> None:
    forced = ForcedToolCall(HERMES, "get_weather")
    forced.feed('{"city": "Par')
    assert forced.finish() == ("", [])


# --- the configuration of a request's output ---------------------------------------------------------------


def test_chat_config_follows_the_request_and_the_parsers() -> None:
    parsers = {"reasoning_parser": QWEN3, "tool_call_parser": HERMES}
    config = OutputConfig.for_chat(_chat(tools=TOOLS, stop="END"), hidden_ids=[EOS], **parsers)
    assert (config.reasoning, config.tool_calls, config.forced_tool, config.harmony) == (
        QWEN3,
        HERMES,
        None,
        False,
    )
    assert (config.stop, config.hidden_ids, config.reasoning_start) == (
        ("END",),
        {EOS},
        OutputStart.REASONING,
    )
    assert config.keep_special_tokens  # call markers may be special tokens
    # No tools, or tool_choice none: calls are not parsed, and special tokens are skipped.
    for request in (_chat(), _chat(tools=TOOLS, tool_choice="none")):
        config = OutputConfig.for_chat(request, **parsers)
        assert config.tool_calls is None
        assert not config.keep_special_tokens
    # Thinking off (the server's default, or the request's): the output decides.
    off = OutputConfig.for_chat(_chat(), **parsers, default_chat_template_kwargs={"enable_thinking": False})
    assert off.reasoning_start is OutputStart.UNDECIDED
    named = _chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    forced = OutputConfig.for_chat(named, **parsers)
    assert (forced.forced_tool, forced.tool_calls, forced.reasoning) == ("get_weather", HERMES, None)
    # A reading-the-prompt parser takes the mode the prompt ended in.
    laguna = OutputConfig.for_chat(
        _chat(),
        reasoning_parser=get_reasoning_parser("laguna"),
        tool_call_parser=None,
        prompt_reasoning_ended=False,
    )
    assert laguna.reasoning_start is OutputStart.REASONING


def test_harmony_config_and_mixed_parsers() -> None:
    gptoss, harmony_tools = get_reasoning_parser("openai_gptoss"), get_tool_call_parser("openai")
    config = OutputConfig.for_chat(_chat(), reasoning_parser=gptoss, tool_call_parser=harmony_tools)
    assert (config.harmony, config.reasoning, config.tool_calls) == (True, gptoss, None)
    assert config.keep_special_tokens
    with pytest.raises(Exception, match="cannot be combined"):
        OutputConfig.for_chat(_chat(), reasoning_parser=gptoss, tool_call_parser=HERMES)
    with pytest.raises(ValueError, match="tool-call parser"):
        OutputConfig(forced_tool="f")


def test_completion_config() -> None:
    config = OutputConfig.for_completion(stop="\n", hidden_ids=[EOS])
    assert (config.stop, config.hidden_ids, config.keep_special_tokens) == (("\n",), {EOS}, False)
    assert config.reasoning is None and config.tool_calls is None


# --- one choice: streamed, whole and resumed give the same answer ------------------------------------------

Case = tuple[str, str, OutputConfig, str, str, tuple[str, str, list[tuple[str, Any]], str]]

SMOL_CASES: list[Case] = [
    (
        "reasoning_then_content",
        "smol",
        OutputConfig(reasoning=QWEN3, reasoning_start=OutputStart.REASONING, hidden_ids=frozenset({EOS})),
        "<think>\nThe user asks about France.\n</think>\n\nParis is the capital.<|im_end|>",
        "stop",
        ("\nThe user asks about France.\n", "\n\nParis is the capital.", [], "stop"),
    ),
    (
        "call_after_reasoning",
        "smol",
        OutputConfig(
            reasoning=QWEN3,
            reasoning_start=OutputStart.REASONING,
            tool_calls=HERMES,
            hidden_ids=frozenset({EOS}),
        ),
        "<think>weather needed</think>Checking. " + HERMES_CALL + "<|im_end|>",
        "stop",
        ("weather needed", "Checking.", [("get_weather", {"city": "Paris"})], "tool_calls"),
    ),
    (
        "call_cut_by_length",
        "smol",
        OutputConfig(tool_calls=HERMES),
        'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        "length",
        ("", 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', [], "length"),
    ),
    (
        "forced_call",
        "smol",
        OutputConfig(tool_calls=HERMES, forced_tool="get_weather"),
        '{"city": "Zürich 😀"}',
        "stop",
        ("", "", [("get_weather", {"city": "Zürich 😀"})], "tool_calls"),
    ),
    (
        "stop_string_in_unicode",
        "smol",
        OutputConfig(stop=("日本",)),
        MIXED_TEXT,
        "length",
        ("", "Voilà: café — naïve 😀 ", [], "stop"),
    ),
    (
        "plain_unicode",
        "smol",
        OutputConfig(),
        MIXED_TEXT,
        "length",
        ("", MIXED_TEXT, [], "length"),
    ),
]
GPTOSS_CASES: list[Case] = [
    (
        "harmony_call",
        "gptoss",
        OutputConfig(
            reasoning=get_reasoning_parser("openai_gptoss"),
            tool_calls=get_tool_call_parser("openai"),
            harmony=True,
        ),
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Let me look that up.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"location":"Tokyo"}<|call|>',
        "stop",
        ("Need the weather.", "Let me look that up.", [("get_weather", {"location": "Tokyo"})], "tool_calls"),
    ),
    (
        "harmony_final_without_reasoning_parser",
        "gptoss",
        OutputConfig(harmony=True),
        "<|channel|>analysis<|message|>hidden<|end|><|start|>assistant<|channel|>final<|message|>Hi 😀<|return|>",
        "stop",
        ("", "Hi 😀", [], "stop"),
    ),
]
TEKKEN_CASES: list[Case] = [
    (
        "mistral_calls",
        "tekken",
        OutputConfig(tool_calls=get_tool_call_parser("mistral")),
        'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Tokyo"}}]',
        "stop",
        ("", "Checking. ", [("get_weather", {"location": "Tokyo"})], "tool_calls"),
    ),
]


def _ids(tokenizer: Any, text: str) -> list[int]:
    if "[TOOL_CALLS]" in text:  # mistral-common reads no control token out of text
        before, after = text.split("[TOOL_CALLS]")
        marker = tokenizer.convert_tokens_to_ids("[TOOL_CALLS]")
        return [*_ids(tokenizer, before), marker, *_ids(tokenizer, after)]
    return list(tokenizer.encode(text, add_special_tokens=False))


def _streamed(config: OutputConfig, tokenizer: Any, ids: list[int], reason: str) -> OutputDelta:
    parser = ChoiceParser(config, tokenizer)
    total = OutputDelta()
    for token_id in ids:
        delta = parser.push(token_id)
        assert not delta.tool_calls and delta.finish_reason is None  # both come with the end
        total.extend(delta)
    total.extend(parser.finish(reason))
    return total


def _resumed(
    config: OutputConfig, tokenizer: Any, ids: list[int], reason: str, cuts: Sequence[int]
) -> OutputDelta:
    """The output fed in chunks, each to a new parser resumed from the last one's state, carried as JSON."""
    total, state = OutputDelta(), None
    for start, end in zip((0, *cuts), (*cuts, len(ids)), strict=True):
        parser = (
            ChoiceParser(config, tokenizer)
            if state is None
            else ChoiceParser.resume(config, tokenizer, state)
        )
        total.extend(parser.push_ids(ids[start:end]))
        state = json.loads(json.dumps(parser.state()))
    assert state is not None
    total.extend(ChoiceParser.resume(config, tokenizer, state).finish(reason))
    return total


@pytest.mark.parametrize(
    "case", [pytest.param(case, id=case[0]) for case in (*SMOL_CASES, *GPTOSS_CASES, *TEKKEN_CASES)]
)
def test_whole_streamed_and_resumed_outputs_are_one_answer(
    case: Case, request: pytest.FixtureRequest
) -> None:
    _, tokenizer_name, config, text, reason, expected = case
    tokenizer = request.getfixturevalue(tokenizer_name)
    ids = _ids(tokenizer, text)
    whole = parse_output(config, tokenizer, ids, reason)
    assert _result(whole) == expected
    assert _result(_streamed(config, tokenizer, ids, reason)) == expected
    for cut in range(len(ids) + 1):
        assert _result(_resumed(config, tokenizer, ids, reason, [cut])) == expected, cut
    thirds = [len(ids) // 3, 2 * len(ids) // 3]
    assert _result(_resumed(config, tokenizer, ids, reason, thirds)) == expected


def test_whole_output_equals_the_parsers_on_the_decoded_text(smol: Any, gptoss: Any) -> None:
    text = "<think>a < b</think>Answer. " + HERMES_CALL
    ids = _ids(smol, text)
    config = OutputConfig(reasoning=QWEN3, reasoning_start=OutputStart.REASONING, tool_calls=HERMES)
    reasoning, content = split_reasoning(QWEN3, smol.decode(ids), chat_template_kwargs={})
    parsed = HERMES.parse(content or "")
    whole = parse_output(config, smol, ids, "stop")
    assert (whole.reasoning, whole.content, _calls(whole.tool_calls)) == (
        reasoning,
        parsed.content,
        _calls(parsed.calls),
    )
    harmony_text = GPTOSS_CASES[0][3]
    out = parse_harmony(gptoss.decode(_ids(gptoss, harmony_text), skip_special_tokens=False))
    whole = parse_output(GPTOSS_CASES[0][2], gptoss, _ids(gptoss, harmony_text), "stop")
    assert (whole.reasoning, whole.content, _calls(whole.tool_calls)) == (
        out.reasoning,
        out.content,
        _calls(out.tool_calls),
    )


def test_replaying_the_output_ids_rebuilds_the_state(smol: Any) -> None:
    # vLLM's stream_state carries all output ids: pushing them again gives the state a parser carried.
    config = SMOL_CASES[1][2]
    ids = _ids(smol, SMOL_CASES[1][3])
    carried = ChoiceParser(config, smol)
    for token_id in ids[:20]:
        carried.push(token_id)
    replayed = ChoiceParser(config, smol)
    replayed.push_ids(ids[:20])
    assert replayed.state() == carried.state()


def test_the_state_holds_what_the_output_leaves_behind(smol: Any) -> None:
    config = SMOL_CASES[1][2]
    parser = ChoiceParser(config, smol)
    parser.push_ids(_ids(smol, "<think>plan</th"))
    state = parser.state()
    assert set(state) == {"version", "detokenizer", "stop", "reasoning", "tool_calls"}
    assert state["reasoning"] == {"phase": "reasoning", "pending": "</th"}
    assert state["stop"] == {"pending": "", "stopped": False}
    assert state["tool_calls"] == {"text": "", "released": 0}
    assert smol.decode(state["detokenizer"]["window"]).endswith("h")
    assert ChoiceParser(OutputConfig(), smol).state() == {
        "version": 1,
        "detokenizer": {"window": [], "read": 0},
        "stop": {"pending": "", "stopped": False},
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 99}, "version 1"),
        ({"reasoning": None}, "malformed"),
        ({"detokenizer": {"window": [1, 2], "read": 5}}, "malformed"),
        ({"stop": {"pending": 1, "stopped": False}}, "malformed"),
        ({"harmony": {}}, "this request's output needs"),
    ],
)
def test_a_state_that_cannot_be_resumed_is_a_400(smol: Any, change: dict[str, Any], message: str) -> None:
    config = OutputConfig(reasoning=QWEN3)
    state = {**ChoiceParser(config, smol).state(), **change}
    with pytest.raises(OutputStateError, match=message) as error:
        ChoiceParser.resume(config, smol, state)
    assert isinstance(error.value, RenderError)
    assert (error.value.param, error.value.code) == ("stream_state", "invalid_stream_state")
    # A state made for another request's parsers does not fit.
    with pytest.raises(OutputStateError, match="tool_calls"):
        ChoiceParser.resume(OutputConfig(), smol, ChoiceParser(OutputConfig(tool_calls=HERMES), smol).state())


# --- OpenAI shapes -----------------------------------------------------------------------------------------


class _Token:
    def __init__(self, token_id: int, logprob: float | None, top: tuple[tuple[int, float], ...] = ()) -> None:
        self.token_id, self.logprob, self.top_logprobs = token_id, logprob, top


def test_chat_logprobs_shape(smol: Any) -> None:
    ids = smol.encode(" Paris é", add_special_tokens=False)
    tokens = [_Token(i, -0.5, ((i, -0.5), (EOS, float("-inf")))) for i in ids]
    body = chat_logprobs(tokens, lambda token_id: smol.decode([token_id]))
    assert list(body) == ["content"]
    assert len(body["content"]) == len(ids)
    first = body["content"][0]
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
    assert first["token"] == smol.decode([ids[0]])
    assert first["bytes"] == list(first["token"].encode("utf-8"))
    assert [t["token"] for t in first["top_logprobs"]] == [first["token"], "<|im_end|>"]
    # -inf (a token the grammar forbade) is not JSON: it is clamped, as vLLM does.
    assert first["top_logprobs"][1]["logprob"] == -9999.0
    json.dumps(body, allow_nan=False)


def test_completion_logprobs_shape_and_offsets(smol: Any) -> None:
    ids = smol.encode(" is Paris.", add_special_tokens=False)
    tokens = [_Token(i, -1.0, ((i, -1.0),)) for i in ids]
    body, end = completion_logprobs(tokens, lambda token_id: smol.decode([token_id]), text_offset=5)
    assert list(body) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    assert "".join(body["tokens"]) == " is Paris."
    assert body["token_logprobs"] == [-1.0] * len(ids)
    assert body["top_logprobs"][0] == {body["tokens"][0]: -1.0}
    starts = [5]
    for token in body["tokens"][:-1]:
        starts.append(starts[-1] + len(token))
    assert body["text_offset"] == starts
    assert end == 5 + len(" is Paris.")


HEAD = AnswerHead(request_id="chatcmpl-1", model="m", created=7, include_usage=True)


def test_chat_formatter_answers_and_chunks() -> None:
    call = ToolCall("get_weather", '{"city": "Paris"}')
    formatter = ChatFormatter(HEAD, reasoning_field=True)
    choices = [
        FinishedChoice(1, OutputDelta(content="Hi", finish_reason="stop")),
        FinishedChoice(0, OutputDelta(reasoning="r", tool_calls=[call], finish_reason="tool_calls")),
    ]
    body = formatter.response(choices, usage(3, 4, 1))
    assert (body["id"], body["object"], body["created"], body["model"]) == (
        "chatcmpl-1",
        "chat.completion",
        7,
        "m",
    )
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 1},
    }
    first, second = body["choices"]
    assert first == {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": None,  # all calls and reasoning: null, as vLLM answers
            "tool_calls": [call.to_openai()],
            "reasoning_content": "r",
        },
        "logprobs": None,
        "finish_reason": "tool_calls",
    }
    assert second["message"] == {
        "role": "assistant",
        "content": "Hi",
        "tool_calls": [],
        "reasoning_content": None,
    }
    assert ChatFormatter(HEAD).response(choices[:1], {})["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hi",
        "tool_calls": [],
    }
    assert formatter.first_chunk(0)["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    chunk = formatter.chunk(
        0, OutputDelta(reasoning="r", content="c", tool_calls=[call], finish_reason="tool_calls")
    )
    assert chunk is not None
    assert (chunk["object"], chunk["usage"]) == ("chat.completion.chunk", None)
    assert chunk["choices"][0]["delta"] == {
        "reasoning_content": "r",
        "content": "c",
        "tool_calls": [{"index": 0, **call.to_openai()}],
    }
    assert formatter.chunk(0, OutputDelta()) is None
    assert formatter.usage_chunk(usage(1, 1, 0))["choices"] == []


def test_completion_formatter_echoes_and_counts_offsets_across_chunks(smol: Any) -> None:
    ids = smol.encode(" is Paris.", add_special_tokens=False)
    tokens = [_Token(i, -1.0) for i in ids]
    text = lambda token_id: smol.decode([token_id])  # noqa: E731
    head = AnswerHead("cmpl-1", "m", 7)
    whole = CompletionFormatter(head, echo={0: "Capital"}, logprobs=True, token_text=text).response(
        [FinishedChoice(0, OutputDelta(content=" is Paris.", finish_reason="length"), tokens)], {}
    )
    choice = whole["choices"][0]
    assert (whole["object"], choice["text"], choice["finish_reason"]) == (
        "text_completion",
        "Capital is Paris.",
        "length",
    )
    streamed = CompletionFormatter(head, echo={0: "Capital"}, logprobs=True, token_text=text)
    assert streamed.first_chunk(0)["choices"][0]["text"] == "Capital"
    offsets = []
    for token in tokens:
        chunk = streamed.chunk(0, OutputDelta(content=text(token.token_id)), [token])
        assert chunk is not None and "usage" not in chunk
        offsets += chunk["choices"][0]["logprobs"]["text_offset"]
    assert offsets == choice["logprobs"]["text_offset"]
    assert offsets[0] == len("Capital")

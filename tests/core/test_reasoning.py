"""Reasoning parsers: registry, the prompt-tail rule (docs/contract.md §4) and output splitting."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tokenfront.core.errors import TokenfrontError
from tokenfront.core.output.reasoning import ReasoningStream, SplitText, split_reasoning
from tokenfront.core.reasoning import (
    REASONING_PARSERS,
    OutputStart,
    UnknownParserError,
    get_reasoning_parser,
    output_start,
    prompt_carries_reasoning_mode,
    reasoning_ended,
)

QWEN3 = get_reasoning_parser("qwen3")
R1 = get_reasoning_parser("deepseek_r1")
LAGUNA = get_reasoning_parser("laguna")
M3 = get_reasoning_parser("minimax_m3")

# --- registry ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "start", "end", "reads_prompt"),
    [
        ("qwen3", "<think>", "</think>", False),
        ("deepseek_r1", "<think>", "</think>", False),
        ("poolside_v1", "<think>", "</think>", True),
        ("minimax_m3", "<mm:think>", "</mm:think>", True),
    ],
)
def test_registered_parsers_have_their_markers(name: str, start: str, end: str, reads_prompt: bool) -> None:
    parser = get_reasoning_parser(name)
    assert (parser.name, parser.start, parser.end, parser.reads_mode_from_prompt) == (
        name,
        start,
        end,
        reads_prompt,
    )
    assert REASONING_PARSERS[name] is parser


def test_laguna_is_an_alias_of_poolside_v1() -> None:
    assert get_reasoning_parser("laguna") is get_reasoning_parser("poolside_v1")
    assert "laguna" in get_reasoning_parser("poolside_v1").aliases
    assert "laguna" not in REASONING_PARSERS  # aliases are not registry keys


def test_other_servers_spellings_are_accepted() -> None:
    assert get_reasoning_parser("deepseek-r1") is R1
    assert get_reasoning_parser(" Qwen3 ") is QWEN3


def test_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(UnknownParserError) as caught:
        get_reasoning_parser("qwen4")
    message = str(caught.value)
    assert "'qwen4'" in message
    for known in ("qwen3", "deepseek_r1", "poolside_v1", "laguna", "minimax_m3"):
        assert known in message
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, TokenfrontError)


def test_parsers_are_immutable() -> None:
    with pytest.raises(AttributeError):
        QWEN3.start = "<x>"  # type: ignore[misc]
    with pytest.raises(TypeError):
        REASONING_PARSERS["x"] = QWEN3  # type: ignore[index]


def test_fingerprint_component_only_for_prompt_reading_parsers() -> None:
    assert QWEN3.fingerprint_component() is None
    assert R1.fingerprint_component() is None
    assert LAGUNA.fingerprint_component() == {"start": "<think>", "end": "</think>"}
    assert M3.fingerprint_component() == {"start": "<mm:think>", "end": "</mm:think>"}


# --- reasoning_ended / prompt_carries_reasoning_mode --------------------------------

QWEN3_NO_THINKING_TAIL = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_DEFAULT_TAIL = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    ("parser", "prompt", "expected"),
    [
        (QWEN3, QWEN3_NO_THINKING_TAIL, True),
        (QWEN3, QWEN3_DEFAULT_TAIL, None),
        (QWEN3, "<|im_start|>assistant\n<think>\n", False),
        (QWEN3, "<|im_start|>assistant\n<think>", False),
        (QWEN3, "...</think>", True),
        (QWEN3, "...</think> \t\r\n\n  ", True),  # any trailing whitespace
        (QWEN3, "<think>\n \u3000", False),  # unicode whitespace too, like str.rstrip
        # Earlier turns hold closed blocks; only the tail counts.
        (QWEN3, "<think>a</think>b<|im_end|>\n<|im_start|>assistant\n", None),
        (QWEN3, "</think>x", None),
        (QWEN3, "</think>.", None),
        (QWEN3, "", None),
        (QWEN3, "   \n", None),
        (QWEN3, "think>", None),
        (M3, "<mm:think>", False),
        (M3, "a</mm:think>\n", True),
        (M3, "<think>", None),  # other parsers' markers do not count
        (M3, "</think>", None),
        (None, "</think>", None),
    ],
)
def test_reasoning_ended_reads_the_prompt_tail(parser, prompt: str, expected: bool | None) -> None:
    assert reasoning_ended(parser, prompt) is expected
    assert prompt_carries_reasoning_mode(parser, prompt) is (expected is not None)


def test_reasoning_ended_with_long_trailing_whitespace() -> None:
    prompt = "x" * 10_000 + "</think>" + " \n" * 5_000
    assert reasoning_ended(QWEN3, prompt) is True
    assert reasoning_ended(QWEN3, "</think>" + "x" * 10_000) is None


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen3))


def test_real_qwen3_template_enable_thinking(qwen3_tokenizer) -> None:
    messages = [{"role": "user", "content": "Name three primary colors."}]

    def render(**kwargs) -> str:
        return qwen3_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )

    no_thinking = render(enable_thinking=False)
    assert no_thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert reasoning_ended(QWEN3, no_thinking) is True
    assert reasoning_ended(QWEN3, render()) is None
    assert reasoning_ended(QWEN3, render(enable_thinking=True)) is None


def test_real_qwen3_template_earlier_reasoning_is_not_the_tail(qwen3_tokenizer) -> None:
    # After a tool call in the current turn, Qwen3 keeps the turn's reasoning block in the prompt.
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should call the tool.",
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": "sunny"},
    ]
    prompt = qwen3_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<think>\nI should call the tool.\n</think>" in prompt
    assert reasoning_ended(QWEN3, prompt) is None


# --- where generation starts ---------------------------------------------------------


@pytest.mark.parametrize(
    ("parser", "prompt_ended", "kwargs", "expected"),
    [
        (QWEN3, None, None, OutputStart.REASONING),
        (QWEN3, None, {"enable_thinking": True}, OutputStart.REASONING),
        (QWEN3, None, {"enable_thinking": False}, OutputStart.UNDECIDED),
        # qwen3 does not read the prompt: forwarding ids must not change the split.
        (QWEN3, True, None, OutputStart.REASONING),
        (R1, None, {"enable_thinking": False}, OutputStart.REASONING),
        (get_reasoning_parser("deepseek_v3"), None, None, OutputStart.UNDECIDED),
        (get_reasoning_parser("deepseek_v3"), None, {"thinking": True}, OutputStart.REASONING),
        (LAGUNA, True, None, OutputStart.CONTENT),
        (LAGUNA, False, None, OutputStart.REASONING),
        (LAGUNA, None, {"enable_thinking": True}, OutputStart.UNDECIDED),  # the prompt decides
        (M3, False, None, OutputStart.REASONING),
        (M3, None, None, OutputStart.UNDECIDED),
    ],
)
def test_output_start(parser, prompt_ended, kwargs, expected: OutputStart) -> None:
    assert output_start(parser, prompt_reasoning_ended=prompt_ended, chat_template_kwargs=kwargs) is expected


# --- split_reasoning -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>\nplan\n</think>\n\nHello.", ("\nplan\n", "\n\nHello.")),
        ("plan</think>Hello.", ("plan", "Hello.")),  # <think> prefilled by the template
        ("<think>cut off", ("cut off", None)),
        ("no markers at all", ("no markers at all", None)),  # thinking on: truncated reasoning
        ("<think>plan</think>", ("plan", None)),
        ("<think></think>Hi", (None, "Hi")),
        ("  \n<think>plan</think>Hi", ("plan", "Hi")),
        ("plan</think>a</think>b", ("plan", "a</think>b")),  # only the first end marker splits
        ("x<think>y</think>z", ("x<think>y", "z")),  # only a leading start marker is dropped
        ("", (None, None)),
    ],
)
def test_qwen3_split_thinking_on(text: str, expected: tuple[str | None, str | None]) -> None:
    assert split_reasoning(QWEN3, text) == SplitText(*expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello.", (None, "Hello.")),
        ("\n\nHello.", (None, "\n\nHello.")),
        ("<think>plan</think>Hi", ("plan", "Hi")),
        ("</think>Hi", (None, "Hi")),  # a stray closer is dropped
        ("Hi</think>there", (None, "Hi</think>there")),
        ("<thin", (None, "<thin")),
    ],
)
def test_qwen3_split_thinking_off(text: str, expected: tuple[str | None, str | None]) -> None:
    kwargs = {"enable_thinking": False}
    assert split_reasoning(QWEN3, text, chat_template_kwargs=kwargs) == SplitText(*expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Okay, so 2+2.</think>\n\n4", ("Okay, so 2+2.", "\n\n4")),
        ("<think>\nOkay.</think>4", ("\nOkay.", "4")),  # R1-0528 writes <think> itself
        ("Okay, still thinking", ("Okay, still thinking", None)),
        ("</think>4", (None, "4")),
    ],
)
def test_deepseek_r1_starts_inside_reasoning(text: str, expected: tuple[str | None, str | None]) -> None:
    assert split_reasoning(R1, text) == SplitText(*expected)
    # It ignores the prompt and the thinking switch.
    assert split_reasoning(R1, text, prompt_reasoning_ended=True) == SplitText(*expected)


@pytest.mark.parametrize(
    ("prompt_ended", "text", "expected"),
    [
        (False, "plan</mm:think>answer", ("plan", "answer")),
        (False, "<mm:think>plan</mm:think>answer", ("plan", "answer")),
        (False, "still planning", ("still planning", None)),
        (True, "answer</mm:think>tail", (None, "answer</mm:think>tail")),  # all content
        (True, "<mm:think>x</mm:think>", (None, "<mm:think>x</mm:think>")),
        (None, "<mm:think>plan</mm:think>answer", ("plan", "answer")),
        (None, "</mm:think>answer", (None, "answer")),
        (None, "answer", (None, "answer")),
        (None, "answer <mm:think>x</mm:think>", (None, "answer <mm:think>x</mm:think>")),
        (None, "<think>not ours</think>", (None, "<think>not ours</think>")),
    ],
)
def test_minimax_m3_reads_the_prompt(
    prompt_ended: bool | None, text: str, expected: tuple[str | None, str | None]
) -> None:
    assert split_reasoning(M3, text, prompt_reasoning_ended=prompt_ended) == SplitText(*expected)


def test_laguna_follows_the_rendered_prompt() -> None:
    thinking_prompt = "<assistant>\n<think>\n"
    plain_prompt = "<assistant>\n</think>\n"
    output = "plan</think>answer"
    for prompt, expected in ((thinking_prompt, ("plan", "answer")), (plain_prompt, (None, output))):
        ended = reasoning_ended(LAGUNA, prompt)
        assert split_reasoning(LAGUNA, output, prompt_reasoning_ended=ended) == SplitText(*expected)


def test_no_parser_means_all_content() -> None:
    assert split_reasoning(None, "<think>x</think>y") == SplitText(None, "<think>x</think>y")
    assert split_reasoning(None, "") == SplitText(None, None)


# --- streaming -----------------------------------------------------------------------


def _stream(parser, deltas, **kwargs) -> tuple[list[SplitText], SplitText]:
    stream = ReasoningStream(parser, **kwargs)
    return [stream.feed(delta) for delta in deltas], stream.finish()


def _joined(pieces: list[SplitText]) -> SplitText:
    reasoning = "".join(piece.reasoning or "" for piece in pieces)
    content = "".join(piece.content or "" for piece in pieces)
    return SplitText(reasoning or None, content or None)


STREAM_CASES = [
    (QWEN3, {}, "<think>\nplan a < b\n</think>\n\nHello </ there."),
    (QWEN3, {}, "plan</think>answer"),
    (QWEN3, {}, "<think>cut off </thi"),
    (QWEN3, {"chat_template_kwargs": {"enable_thinking": False}}, "Hello <think> there"),
    (QWEN3, {"chat_template_kwargs": {"enable_thinking": False}}, " <think>p</think>x"),
    (QWEN3, {"chat_template_kwargs": {"enable_thinking": False}}, "</think>x"),
    (R1, {}, "Okay </think"),
    (R1, {}, "<think>a</think>b"),
    (M3, {"prompt_reasoning_ended": None}, "<mm:think>p<</mm:think>c"),
    (M3, {"prompt_reasoning_ended": False}, "p</mm:think></mm:think>"),
    (M3, {"prompt_reasoning_ended": True}, "c</mm:think>d"),
]


def _splits(text: str, parts: int):
    """Every way to cut ``text`` into ``parts`` deltas (empty deltas included)."""
    for cuts in itertools.combinations_with_replacement(range(len(text) + 1), parts - 1):
        bounds = (0, *cuts, len(text))
        yield [text[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(("parser", "kwargs", "text"), STREAM_CASES)
def test_stream_equals_whole_text_for_every_two_and_three_way_split(parser, kwargs, text: str) -> None:
    expected = split_reasoning(parser, text, **kwargs)
    for parts in (1, 2, 3):
        for deltas in _splits(text, parts):
            emitted, last = _stream(parser, deltas, **kwargs)
            assert _joined([*emitted, last]) == expected, deltas


@pytest.mark.parametrize(("parser", "kwargs", "text"), STREAM_CASES)
def test_stream_of_single_characters(parser, kwargs, text: str) -> None:
    emitted, last = _stream(parser, list(text), **kwargs)
    assert _joined([*emitted, last]) == split_reasoning(parser, text, **kwargs)


@pytest.mark.parametrize(("parser", "kwargs", "text"), STREAM_CASES)
def test_stream_resumed_from_its_state_at_any_point_equals_whole_text(parser, kwargs, text: str) -> None:
    expected = split_reasoning(parser, text, **kwargs)
    for cut in range(len(text) + 1):
        first = ReasoningStream(parser, **kwargs)
        head = first.feed(text[:cut])
        state = json.loads(json.dumps(first.state()))  # what a client would carry between calls
        second = ReasoningStream.from_state(parser, state)
        assert _joined([head, second.feed(text[cut:]), second.finish()]) == expected, cut


def test_stream_state_is_the_phase_and_the_held_back_text() -> None:
    stream = ReasoningStream(QWEN3)
    assert stream.state() == {"phase": "reasoning_opening", "pending": ""}
    stream.feed("<think>plan</th")
    assert stream.state() == {"phase": "reasoning", "pending": "</th"}
    with pytest.raises(ValueError):
        ReasoningStream.from_state(QWEN3, {"phase": "elsewhere", "pending": ""})


@pytest.mark.parametrize("cut", range(1, len("</think>")))
def test_stream_never_emits_a_partial_end_marker(cut: int) -> None:
    marker = "</think>"
    stream = ReasoningStream(QWEN3)
    assert stream.feed("<think>plan" + marker[:cut]) == SplitText("plan", None)
    assert stream.in_reasoning
    assert stream.feed(marker[cut:] + "Hi") == SplitText(None, "Hi")
    assert not stream.in_reasoning
    assert stream.finish() == SplitText(None, None)


@pytest.mark.parametrize("cut", range(1, len("<mm:think>")))
def test_stream_never_emits_a_partial_start_marker(cut: int) -> None:
    marker = "<mm:think>"
    stream = ReasoningStream(M3)
    assert stream.feed(marker[:cut]) == SplitText(None, None)
    assert stream.feed(marker[cut:] + "plan") == SplitText("plan", None)
    assert stream.feed("</mm:think>ok") == SplitText(None, "ok")


def test_stream_releases_a_held_back_prefix_that_was_not_a_marker() -> None:
    stream = ReasoningStream(QWEN3)
    assert stream.feed("a </th") == SplitText("a ", None)
    assert stream.feed("ere") == SplitText("</there", None)
    assert stream.feed("</") == SplitText(None, None)
    assert stream.finish() == SplitText("</", None)


def test_stream_in_content_passes_markers_through() -> None:
    stream = ReasoningStream(M3, prompt_reasoning_ended=True)
    assert stream.feed("<mm:th") == SplitText(None, "<mm:th")
    assert stream.feed("ink>") == SplitText(None, "ink>")

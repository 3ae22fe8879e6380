"""gpt-oss chat in the Harmony format (families/gpt_oss.py), checked against oss-harmony itself.

Every case of `corpus_gpt_oss.py` goes through `RenderPipeline` on the gpt-oss checkpoint without a template
(as the tokenizer package ships it) and with llama.cpp's Harmony template (which must change nothing). The
reference for a case is written here, independently of the conversion code: the Harmony messages the request
should become (`EXPECTED`), rendered by the library as one conversation, with vLLM's pre-0.0.10 tool-call
headers spelled out. The ids must equal the reference's, and the prompt text must encode back to the same ids
with the checkpoint's transformers tokenizer (where a tokenizer reading the whole text can: NO_TEXT_ROUND_TRIP).
Cases vLLM refuses must raise `RenderError` (a 400).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from corpus_gpt_oss import CHAT_CASES, COMPLETION_CASES, LONG_TEXT, SEARCH_TOOL, TIME_TOOL, WEATHER_TOOL
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
)

from tokenfront.core.errors import CheckpointError, RenderError, UnsupportedContentError
from tokenfront.core.families import gpt_oss
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest

DATE = "2026-01-15"
CHECKPOINTS = ("gptoss-bare", "gptoss")  # without a template, and with llama.cpp's Harmony template

# -- the expected Harmony messages of every case that renders ------------------------------------------------


def user(*texts: str) -> Message:
    return Message.from_role_and_contents(Role.USER, [TextContent(text=text) for text in texts])


def final(*texts: str) -> Message:
    return Message.from_role_and_contents(Role.ASSISTANT, [TextContent(text=t) for t in texts]).with_channel(
        "final"
    )


def analysis(text: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")


def commentary(text: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary")


def call(name: str, arguments: str) -> Message:
    message = Message.from_role_and_content(Role.ASSISTANT, arguments).with_channel("commentary")
    return message.with_recipient(f"functions.{name}").with_content_type("json")


def tool(name: str, text: str) -> Message:
    message = Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), text)
    return message.with_channel("commentary").with_recipient("assistant")


def developer(instructions: str | None = None, tools: list[dict[str, Any]] | None = None) -> Message:
    content = DeveloperContent.new()
    if instructions is not None:
        content = content.with_instructions(instructions)
    if tools:
        described = [
            ToolDescription.new(
                t["function"]["name"], t["function"].get("description", ""), t["function"].get("parameters")
            )
            for t in tools
        ]
        content = content.with_function_tools(described)
    return Message.from_role_and_content(Role.DEVELOPER, content)


PING = {"function": {"name": "ping"}}
ANY = {"function": {"name": "anything", "parameters": {}}}
WEATHER_CALL = [
    user("What's the weather in Paris?"),
    commentary("Let me look that up."),
    analysis("The user wants the weather; call get_weather."),
    call("get_weather", '{"city": "Paris"}'),
    tool("get_weather", '{"temperature": 18, "sky": "cloudy"}'),
]
COUNTING = [
    m for turn in range(8) for m in (user(f"Count to {turn}."), final(" ".join(map(str, range(turn + 1)))))
]

# case -> (reasoning effort of the system message, the messages after it)
EXPECTED: dict[str, tuple[str, list[Message]]] = {
    "user_only": ("medium", [user("Hi")]),
    "system_user": ("medium", [developer("Be brief."), user("Hi")]),
    "developer_user": ("medium", [developer("Answer in French."), user("Hi")]),
    "system_empty": ("medium", [user("Hi")]),
    "system_and_user_without_content": ("medium", [user("")]),
    "system_parts": ("medium", [developer("Be kind."), user("Hi")]),
    "later_system_and_developer": (
        "medium",
        [
            developer("First instructions."),
            developer("Second instructions."),
            user("Hi"),
            developer("Late system."),
        ],
    ),
    "later_system_empty": ("medium", [user("Hi"), developer("")]),
    "only_system": ("medium", [developer("Only instructions.")]),
    "effort_low": ("low", [user("Hi")]),
    "effort_medium": ("medium", [user("Hi")]),
    "effort_high": ("high", [developer("Think."), user("Hi")]),
    "effort_in_template_kwargs_ignored": ("medium", [user("Hi")]),
    "multi_turn": ("medium", [user("Hi"), final("Hello! How can I help?"), user("Tell me a joke.")]),
    "assistant_null_content_dropped": ("medium", [user("Hi"), user("again")]),
    "empty_user_content": ("medium", [user("Hi"), user("")]),
    "content_parts": ("medium", [user("First part.", "Second part."), final("C", "D"), user("")]),
    "assistant_first_part_empty_dropped": ("medium", [user("Q"), user("Z")]),
    "refusal_part_renders_empty": ("medium", [user("", "ok")]),
    "unicode": (
        "medium",
        [
            developer("Réponds en français, s'il te plaît. 🙂"),
            user("Grüße! 你好，世界 — «ça va?» עברית 👋🏽 e\u0301 \u00a0nbsp"),
        ],
    ),
    "whitespace": ("medium", [user("  leading\n\n\ttabs   and trailing  \n")]),
    "special_token_text_is_text": ("medium", [user("Say <|end|> and <|start|>assistant literally.")]),
    "long_content_uncached": ("medium", [user(LONG_TEXT)]),
    "user_name_ignored": ("medium", [user("Hi")]),
    "add_generation_prompt_false_ignored": ("medium", [user("Hi")]),
    "continue_final_message_ignored": ("medium", [user("Hi"), final("Partial answer")]),
    "add_special_tokens_ignored": ("medium", [user("Hi")]),
    "reasoning_history_dropped": (
        "medium",
        [user("Hi"), final("Hello"), user("More"), final("Sure"), user("Last")],
    ),
    "reasoning_after_last_final_kept": (
        "medium",
        [user("Q"), final("A"), user("Q2"), analysis("still thinking")],
    ),
    "reasoning_wins_over_reasoning_content": ("medium", [user("Q"), analysis("R1")]),
    "thinking_field_ignored": ("medium", [user("Q"), final("A")]),
    "tools_weather": ("medium", [developer(tools=[WEATHER_TOOL]), user("Weather in Oslo?")]),
    "tools_with_instructions": ("medium", [developer("Use tools.", [TIME_TOOL, PING]), user("Time?")]),
    "tools_with_empty_instructions": ("medium", [developer("", [PING]), user("Q")]),
    "tools_nested_schema": ("medium", [developer(tools=[SEARCH_TOOL, ANY]), user("Find docs")]),
    "tool_choice_none_keeps_tools": ("medium", [developer(tools=[WEATHER_TOOL]), user("Q")]),
    "tool_choice_required": ("medium", [developer(tools=[WEATHER_TOOL]), user("Q")]),
    "tool_choice_named": ("medium", [developer(tools=[WEATHER_TOOL, TIME_TOOL]), user("Q")]),
    "tool_call_history": ("medium", [developer(tools=[WEATHER_TOOL]), *WEATHER_CALL]),
    "tool_call_then_final": (
        "medium",
        [
            developer(tools=[WEATHER_TOOL]),
            *[m for m in WEATHER_CALL if m.channel != "analysis"],  # before the last final: dropped
            final("It is 18 °C and cloudy."),
            user("And tomorrow?"),
            analysis("Call again."),
            call("get_weather", '{"city":"Paris"}'),
            tool("get_weather", ""),
        ],
    ),
    "parallel_calls_and_odd_tool_messages": (
        "medium",
        [
            user("Q"),
            commentary("P1P2"),
            call("get_time", '{"timezone": "UTC"}'),
            call("ping", ""),
            tool("ping", "pong"),
            tool("", "orphan"),
            tool("", "no id"),
        ],
    ),
    "trailing_tool_call": ("medium", [user("Q"), call("ping", "{}")]),
    "arguments_not_json": ("medium", [user("Q"), call("ping", "not json")]),
    "empty_tool_calls_list": ("medium", [user("Q"), final("Answer"), user("Z")]),
    "tool_calls_null": ("medium", [user("Q"), final("C")]),
    "developer_tools_field_ignored": ("medium", [developer("D"), user("Q")]),
    "long_conversation": (
        "low",
        [developer("You are a counting assistant."), *COUNTING, user("Now backwards.")],
    ),
}
# The prompt text encodes back to the ids except where Harmony tokenizes pieces a tokenizer reading the whole
# text would not: text holding special-token strings (Harmony encodes them as text) and a message with several
# text parts (each part is encoded by itself). Only the ids are compared for these.
NO_TEXT_ROUND_TRIP = {"special_token_text_is_text", "content_parts"}

RENDERED = [(name, body) for name, body, status in CHAT_CASES if status == 200]
REFUSED = [(name, body) for name, body, status in CHAT_CASES if status != 200]


def reference_ids(encoding: HarmonyEncoding, effort: str, messages: list[Message]) -> list[int]:
    """The library's rendering of the conversation, with tool-call headers in the shape vLLM 0.33 sends."""
    system = SystemContent.new().with_reasoning_effort(ReasoningEffort(effort.capitalize()))
    conversation = Conversation.from_messages(
        [Message.from_role_and_content(Role.SYSTEM, system.with_conversation_start_date(DATE)), *messages]
    )
    ids = encoding.render_conversation_for_completion(
        conversation, Role.ASSISTANT, config=RenderConversationConfig(auto_drop_analysis=False)
    )
    for message in messages:
        if message.recipient is not None and message.author.role == Role.ASSISTANT:
            ids = _replace(ids, _library_header(encoding, message), _vllm_header(encoding, message))
    return ids


def _library_header(encoding: HarmonyEncoding, message: Message) -> list[int]:
    alone = encoding.render(message)
    return alone[: alone.index(_special(encoding, "<|message|>")) + 1]


def _vllm_header(encoding: HarmonyEncoding, message: Message) -> list[int]:
    # `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`
    return [
        _special(encoding, "<|start|>"),
        *encoding.encode(f"assistant to={message.recipient}"),
        _special(encoding, "<|channel|>"),
        *encoding.encode(f"{message.channel} {message.content_type}"),
        _special(encoding, "<|message|>"),
    ]


def _special(encoding: HarmonyEncoding, token: str) -> int:
    [token_id] = encoding.encode(token, allowed_special="all")
    return token_id


def _replace(ids: list[int], old: list[int], new: list[int]) -> list[int]:
    for at in range(len(ids) - len(old) + 1):
        if ids[at : at + len(old)] == old:
            return ids[:at] + new + ids[at + len(old) :]
    raise AssertionError(f"header {old} not in the rendered conversation")


# -- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipelines(checkpoint: Callable[[str], Path]) -> Iterator[dict[str, RenderPipeline]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_SYSTEM_START_DATE", DATE)
        yield {name: RenderPipeline.load(RenderOptions(model=str(checkpoint(name)))) for name in CHECKPOINTS}


@pytest.fixture(scope="module")
def encoding(pipelines: dict[str, RenderPipeline]) -> HarmonyEncoding:
    chat_format = pipelines["gptoss-bare"].chat_format
    assert isinstance(chat_format, gpt_oss.HarmonyChatFormat)
    return chat_format.encoding


def _render(pipeline: RenderPipeline, body: dict[str, Any]) -> Any:
    # As the servers hand it over: parsed once, validated, with the model.
    parsed = json.loads(json.dumps(body))
    return pipeline.render_chat(ChatCompletionRequest.model_validate(parsed), body=parsed)


# -- the corpus ----------------------------------------------------------------------------------------------


def test_every_rendered_case_has_an_expectation() -> None:
    assert sorted(EXPECTED) == sorted(name for name, _ in RENDERED)
    assert len(CHAT_CASES) >= 30 and len(REFUSED) >= 10


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_corpus_matches_harmony(
    name: str, pipelines: dict[str, RenderPipeline], encoding: HarmonyEncoding
) -> None:
    """Each rendered case: ids equal the library's rendering of the expected messages; the prompt text is the
    decoded ids and encodes back to them with the transformers tokenizer."""
    pipeline = pipelines[name]
    compared = round_trips = 0
    failures = []
    for case, body in RENDERED:
        rendered = _render(pipeline, body)
        expected = reference_ids(encoding, *EXPECTED[case])
        if rendered.token_ids != expected:
            failures.append(
                f"{case}: {encoding.decode(rendered.token_ids)!r}\n  != {encoding.decode(expected)!r}"
            )
        assert rendered.prompt_text == encoding.decode(rendered.token_ids), case
        again = list(pipeline.tokenizer(rendered.prompt_text, add_special_tokens=False)["input_ids"])
        if case in NO_TEXT_ROUND_TRIP:
            assert again != rendered.token_ids, f"{case} round-trips: drop it from NO_TEXT_ROUND_TRIP"
        else:
            assert again == rendered.token_ids, case
            round_trips += 1
        compared += 1
    assert not failures, "\n".join(failures)
    assert compared == len(RENDERED) == 47
    assert round_trips == compared - len(NO_TEXT_ROUND_TRIP)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_corpus_refusals(name: str, pipelines: dict[str, RenderPipeline]) -> None:
    """What vLLM answers with a 4xx raises RenderError (a 400), with a message naming the field."""
    refused = 0
    for case, body in REFUSED:
        with pytest.raises(RenderError) as error:
            _render(pipelines[name], body)
        assert error.value.message and error.value.param, case
        refused += 1
    assert refused == len(REFUSED) == 18


def test_template_changes_nothing(pipelines: dict[str, RenderPipeline]) -> None:
    """The folder's chat template is ignored for gpt-oss, as vLLM ignores it: same ids, same fingerprint."""
    bare, templated = pipelines["gptoss-bare"], pipelines["gptoss"]
    assert templated.checkpoint.chat_templates is not None and bare.checkpoint.chat_templates is None
    for _case, body in RENDERED:
        assert _render(bare, body).token_ids == _render(templated, body).token_ids
    assert bare.fingerprint.digest == templated.fingerprint.digest


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_completions(name: str, pipelines: dict[str, RenderPipeline]) -> None:
    """Completions are plain tokenization (Harmony plays no part): the transformers tokenizer's ids."""
    pipeline = pipelines[name]
    compared = 0
    for case, body, status in COMPLETION_CASES:
        request = CompletionRequest.model_validate(body)
        if status != 200:
            with pytest.raises(RenderError):
                pipeline.render_completion(request)
            continue
        prompts = (
            body["prompt"]
            if isinstance(body["prompt"], list) and isinstance(body["prompt"][0], str)
            else [body["prompt"]]
        )
        rendered = pipeline.render_completion(request)
        for prompt, item in zip(prompts, rendered, strict=True):
            expected = prompt if isinstance(prompt, list) else pipeline.tokenizer(prompt)["input_ids"]
            assert item.token_ids == list(expected), case
            compared += 1
    assert compared == 6


# -- what tokenfront adds ------------------------------------------------------------------------------------


def test_fingerprint_names_harmony(pipelines: dict[str, RenderPipeline]) -> None:
    compared = pipelines["gptoss-bare"].fingerprint.compared
    assert compared["chat_format"] == {
        "name": "harmony",
        "encoding": "HarmonyGptOss",
        "library": "oss-harmony",
        "version": "0.0.11",
        "semantics": "1",
        "conversation_start_date": DATE,  # pinned: a worker that is not renders other ids
    }
    assert compared["chat_templates"] == {}  # the folder's template decides nothing


def test_media_parts_are_refused(pipelines: dict[str, RenderPipeline]) -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
        ]
    }
    with pytest.raises(UnsupportedContentError, match="not yet supported"):
        _render(pipelines["gptoss-bare"], body)


def test_special_token_in_a_tool_name_is_refused(pipelines: dict[str, RenderPipeline]) -> None:
    """vLLM fails with a 500 (oss-harmony refuses to re-encode the tool-call header); tokenfront answers 400."""
    call = {"id": "a", "type": "function", "function": {"name": "x<|end|>", "arguments": "{}"}}
    body = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "tool_calls": [call]}]}
    with pytest.raises(RenderError, match=re.escape("cannot address a message to 'functions.x<|end|>'")):
        _render(pipelines["gptoss-bare"], body)


def test_lone_surrogate_is_refused(pipelines: dict[str, RenderPipeline]) -> None:
    """vLLM cannot hand such text to the library (its conversation JSON is invalid): a 400, not U+FFFD."""
    for message in ({"role": "user", "content": "a \ud800 b"}, {"role": "system", "content": "\udfff"}):
        with pytest.raises(RenderError):
            _render(pipelines["gptoss-bare"], {"messages": [message, {"role": "user", "content": "Hi"}]})


def test_date_is_utc_today_unless_pinned(
    checkpoint: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_SYSTEM_START_DATE", raising=False)
    pipeline = RenderPipeline.load(RenderOptions(model=str(checkpoint("gptoss-bare"))))
    before = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    text = _render(pipeline, {"messages": [{"role": "user", "content": "Hi"}]}).prompt_text
    after = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    assert f"Current date: {before}\n" in text or f"Current date: {after}\n" in text
    assert "conversation_start_date" not in pipeline.fingerprint.compared["chat_format"]
    assert "TIKTOKEN_ENCODINGS_BASE" not in os.environ  # set for the library's load only


# -- the vocabulary ------------------------------------------------------------------------------------------


def test_vocabulary_file_is_written_once(
    checkpoint: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The o200k file derived from tokenizer.json has o200k_base's sha256; it lands in the cache (a private
    directory when the cache cannot be written) and is not rewritten."""
    folder = checkpoint("gptoss-bare")  # before the cache moves
    monkeypatch.setenv("TOKENFRONT_CACHE", str(tmp_path / "cache"))
    directory = gpt_oss.tiktoken_encodings_dir(folder)
    file = directory / "o200k_base.tiktoken"
    assert directory == tmp_path / "cache" / "harmony"
    assert hashlib.sha256(file.read_bytes()).hexdigest() == gpt_oss.O200K_BASE_SHA256
    written = file.stat().st_mtime_ns
    assert gpt_oss.tiktoken_encodings_dir(folder) == directory
    assert file.stat().st_mtime_ns == written and sorted(p.name for p in directory.iterdir()) == [file.name]

    (tmp_path / "not-a-directory").write_text("")
    monkeypatch.setenv("TOKENFRONT_CACHE", str(tmp_path / "not-a-directory"))
    private = gpt_oss.tiktoken_encodings_dir(folder)
    assert private != directory and (private / "o200k_base.tiktoken").read_bytes() == file.read_bytes()


def test_other_vocabulary_is_a_startup_error(checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """A gpt_oss config on a tokenizer that is not o200k (Qwen3's): one clear error when the pipeline loads."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(checkpoint("qwen3") / name, tmp_path / name)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    with pytest.raises(CheckpointError, match=r"Harmony format, whose vocabulary is o200k.*not o200k"):
        RenderPipeline.load(RenderOptions(model=str(tmp_path)))


def test_shuffled_vocabulary_is_refused() -> None:
    with pytest.raises(CheckpointError, match="not o200k"):
        gpt_oss.o200k_base_file({"a": 0, "b": 1})


def test_special_tokens_must_match(encoding: HarmonyEncoding) -> None:
    class Tokenizer:
        def __init__(self, added: dict[str, int]) -> None:
            self.added = added

        def get_added_vocab(self) -> dict[str, int]:
            return self.added

    format_tokens = (
        "<|start|>",
        "<|message|>",
        "<|end|>",
        "<|channel|>",
        "<|constrain|>",
        "<|call|>",
        "<|return|>",
    )
    harmony = {token: _special(encoding, token) for token in format_tokens}
    gpt_oss.check_special_tokens(encoding, Tokenizer({**harmony, "<|endofprompt|>": 200018}))
    with pytest.raises(CheckpointError, match=r"<\|start\|> is 5 in the tokenizer, \[200006\] in Harmony"):
        gpt_oss.check_special_tokens(encoding, Tokenizer({**harmony, "<|start|>": 5}))
    without_call = {token: token_id for token, token_id in harmony.items() if token != "<|call|>"}
    with pytest.raises(CheckpointError, match=r"<\|call\|> is missing"):
        gpt_oss.check_special_tokens(encoding, Tokenizer(without_call))

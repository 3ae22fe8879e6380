"""Request normalization (docs/contract.md §3): the mainstream servers' rules, which change ids."""

from __future__ import annotations

from typing import Any

import pytest

from tokenfront.core.errors import RenderError, UnsupportedContentError
from tokenfront.core.messages import normalize_messages, parse_tool_arguments
from tokenfront.protocol import ChatCompletionRequest


def _one(message: dict, fmt: str = "string") -> dict:
    return normalize_messages([message], content_format=fmt, template_knows_developer=True)[0]  # type: ignore[arg-type]


def test_string_format_joins_text_parts_with_newlines() -> None:
    message = {
        "role": "user",
        "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}],
    }
    assert _one(message)["content"] == "First part.\nSecond part."


def test_openai_format_gets_parts_and_strings_become_one_part() -> None:
    assert _one({"role": "user", "content": "hi"}, "openai")["content"] == [{"type": "text", "text": "hi"}]
    assert _one({"role": "user", "content": None}, "openai")["content"] == []


def test_null_content_is_empty_string_for_string_templates() -> None:
    assert _one({"role": "assistant", "content": None})["content"] == ""


def test_tool_message_parts_are_joined_even_for_openai_templates() -> None:
    message = {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    out = _one(message, "openai")
    assert out == {"role": "tool", "content": "a\nb", "tool_call_id": "c1"}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"city": "Paris"}', {"city": "Paris"}),
        ("", {}),
        ("not json", {}),
        ("[1, 2]", {}),
        ({"already": "object"}, {"already": "object"}),
        (None, {}),
    ],
)
def test_tool_call_arguments_become_objects(arguments: object, expected: dict) -> None:
    assert parse_tool_arguments(arguments) == expected


def test_empty_tool_calls_are_dropped_and_unknown_keys_are_not_passed() -> None:
    out = _one({"role": "assistant", "content": "x", "tool_calls": [], "weird": 1, "name": "bob"})
    assert out == {"role": "assistant", "content": "x", "name": "bob"}


def test_developer_becomes_system_and_systems_merge_when_the_template_does_not_know_it() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in JSON."}]},
        {"role": "system", "content": ""},
    ]
    out = normalize_messages(messages, content_format="openai", template_knows_developer=False)
    assert out[0] == {"role": "system", "content": "Be brief.\n\nAnswer in JSON."}
    assert [m["role"] for m in out] == ["system", "user"]
    kept = normalize_messages(messages, content_format="string", template_knows_developer=True)
    assert [m["role"] for m in kept] == ["user", "system", "developer", "system"]


def test_lone_leading_developer_message_only_changes_role() -> None:
    messages = [{"role": "developer", "content": "Rules."}, {"role": "user", "content": "hi"}]
    out = normalize_messages(messages, content_format="openai", template_knows_developer=False)
    assert out[0] == {"role": "system", "content": [{"type": "text", "text": "Rules."}]}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "http://x/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
        {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}},
        {"type": "file", "file": {"file_id": "f"}},
    ],
)
def test_multimodal_parts_are_not_yet_supported(part: dict) -> None:
    with pytest.raises(UnsupportedContentError, match="not yet supported") as caught:
        _one({"role": "user", "content": [{"type": "text", "text": "look"}, part]})
    assert caught.value.param == "messages[0].content[1]"


def test_unknown_part_type_is_a_clear_error() -> None:
    with pytest.raises(RenderError, match="unknown content part type 'banana'"):
        _one({"role": "user", "content": [{"type": "banana"}]})


# -- vLLM 0.33's message rules beyond the basics (issue 9, item 5) --------------------------------------------


def test_assistant_reasoning_is_passed_as_both_names_and_reasoning_wins() -> None:
    out = _one({"role": "assistant", "content": "x", "reasoning_content": "old"})
    assert (out["reasoning"], out["reasoning_content"]) == ("old", "old")
    both = _one({"role": "assistant", "content": "x", "reasoning": "new", "reasoning_content": "old"})
    assert (both["reasoning"], both["reasoning_content"]) == ("new", "new")


def test_thinking_field_and_reasoning_of_other_roles_are_not_passed() -> None:
    assert _one({"role": "assistant", "content": "x", "thinking": "t"}) == {
        "role": "assistant",
        "content": "x",
    }
    assert _one({"role": "user", "content": "x", "reasoning": "r"}) == {"role": "user", "content": "x"}


def test_tool_call_id_is_passed_for_tool_messages_only() -> None:
    assert "tool_call_id" not in _one({"role": "user", "content": "x", "tool_call_id": "c1"})
    assert _one({"role": "tool", "content": "x", "tool_call_id": "c1"})["tool_call_id"] == "c1"


def test_text_like_parts() -> None:
    parts = [
        {"type": "thinking", "thinking": "T"},
        {"type": "text", "text": None},  # skipped, as vLLM skips a null text
        {"type": "text", "text": ""},
        {"type": "refusal", "refusal": "R"},
    ]
    # "string" templates: the non-empty texts joined; "openai" templates: every part that has text.
    assert _one({"role": "user", "content": parts})["content"] == "T\nR"
    assert _one({"role": "user", "content": parts}, "openai")["content"] == [
        {"type": "text", "text": "T"},
        {"type": "text", "text": ""},
        {"type": "text", "text": "R"},
    ]


def test_tool_reference_parts() -> None:
    message = {
        "role": "tool",
        "tool_call_id": "c",
        "content": [{"type": "tool_reference", "name": "get_weather"}],
    }
    assert _one(message)["content"] == "get_weather"
    # A tool message with a structured part keeps its parts for "openai" templates.
    assert _one(message, "openai")["content"] == [{"type": "tool_reference", "name": "get_weather"}]


@pytest.mark.parametrize(
    ("part", "param", "match"),
    [
        ({"text": "no type"}, "messages[0].content[0].type", 'has no "type"'),
        ("a bare string", "messages[0].content[0]", "must be a content part object"),
        (
            {"type": "input_text", "text": "x"},
            "messages[0].content[0]",
            "unknown content part type 'input_text'",
        ),
        ({"type": "thinking", "thinking": None}, "messages[0].content[0].thinking", "must be a string"),
    ],
)
def test_parts_vllms_chat_request_refuses(part: object, param: str, match: str) -> None:
    with pytest.raises(RenderError, match=match) as caught:
        _one({"role": "user", "content": [part]})
    assert caught.value.param == param


def test_claude_code_billing_header_line_is_dropped_from_system_text() -> None:
    header = "x-anthropic-billing-header: cc_version=2; cch=9f8e7d"
    assert _one({"role": "system", "content": f"{header}\nYou are terse."})["content"] == "You are terse."
    parts = [{"type": "text", "text": header}, {"type": "text", "text": "Rules."}]
    assert _one({"role": "system", "content": parts})["content"] == "Rules."
    assert _one({"role": "user", "content": header})["content"] == header  # only system messages


def test_developer_tools_are_passed_and_dropped_when_it_becomes_system() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    developer = {"role": "developer", "content": "Use f.", "tools": tools}
    assert _one(developer)["tools"] == tools
    [merged] = normalize_messages([developer], content_format="string", template_knows_developer=False)
    assert merged == {"role": "system", "content": "Use f."}


# -- the request rules of vLLM's request models (protocol.py) ------------------------------------------------


def _chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}], **fields})


def test_a_tool_dumps_as_vllms_tool_model() -> None:
    sent = {
        "function": {"parameters": {"type": "object"}, "name": "f", "strict": None, "examples": [1]},
        "x": 1,
    }
    assert _chat(tools=[sent]).tool_dicts() == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}}
    ]
    [dumped] = _chat(tools=[sent]).tool_dicts() or []
    assert list(dumped["function"]) == [
        "name",
        "description",
        "parameters",
    ]  # vLLM's order, whatever was sent
    deferred = {"type": "function", "function": {"name": "g", "strict": True}, "defer_loading": True}
    assert _chat(tools=[deferred]).tool_dicts() == [
        {
            "type": "function",
            "function": {
                "name": "g",
                "description": None,
                "parameters": None,
                "strict": True,
                "defer_loading": True,
            },
            "defer_loading": True,
        }
    ]
    # The model-dump path (worker, router) renders the same tools as the body path.
    assert _chat(tools=[sent]).model_dump(exclude_unset=True)["tools"] == _chat(tools=[sent]).tool_dicts()


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
WITH_TOOL = {"tools": [{"type": "function", "function": {"name": "f"}}]}


@pytest.mark.parametrize(
    ("fields", "param", "match"),
    [
        ({"tools": []}, "tools", "must not be an empty array"),
        ({"tool_choice": "auto"}, "tool_choice", "needs tools"),
        (
            {**WITH_TOOL, "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice",
            "'g', which is not among",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
            r"must be a string \(got an object\)",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f"}}]}]},
            "messages[0].tool_calls[0].function.arguments",
            r"\(got null\)",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{k: v for k, v in CALL.items() if k != "id"}]}
                ]
            },
            "messages[0].tool_calls[0].id",
            "is required",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{k: v for k, v in CALL.items() if k != "type"}]}
                ]
            },
            "messages[0].tool_calls[0].type",
            'must be "function"',
        ),
        ({"messages": [{"role": "system", "content": None}]}, "messages[0].content", "content is null"),
        ({"messages": [{"role": "tool", "content": None}]}, "messages[0].content", "content is null"),
    ],
)
def test_what_vllms_request_models_refuse(fields: dict[str, Any], param: str, match: str) -> None:
    with pytest.raises(RenderError, match=match) as caught:
        _chat(**fields)
    assert caught.value.param == param


def test_what_vllms_request_models_accept() -> None:
    assert _chat(tool_choice="none").tools is None
    assert (
        _chat(messages=[{"role": "assistant", "content": None}, {"role": "user"}]).messages[1].content is None
    )
    assert _chat(messages=[{"role": "assistant", "tool_calls": [CALL]}], **WITH_TOOL).messages[0].tool_calls


def test_reasoning_effort_reaches_the_template_as_vllm_passes_it() -> None:
    assert _chat(reasoning_effort="none").chat_template_kwargs == {
        "reasoning_effort": "none",
        "enable_thinking": False,
    }
    assert _chat(
        reasoning_effort="high", chat_template_kwargs={"enable_thinking": False, "x": 1}
    ).chat_template_kwargs == {
        "enable_thinking": False,
        "x": 1,
        "reasoning_effort": "high",
    }
    assert _chat(
        reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "max"}
    ).chat_template_kwargs == {
        "reasoning_effort": "low",
        "enable_thinking": True,
    }
    assert _chat().chat_template_kwargs is None

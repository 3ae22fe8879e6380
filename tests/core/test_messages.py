"""Request normalization (SPEC §3): the mainstream servers' rules, which change ids."""

from __future__ import annotations

import pytest

from tokenfront.core.errors import RenderError, UnsupportedContentError
from tokenfront.core.messages import normalize_messages, parse_tool_arguments


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

"""core/requests/anthropic.py: an Anthropic Messages body becomes the chat conversation vLLM 0.33 builds from it.

The expected conversations are vLLM's own: `data/vllm_request_conversions.json` holds, for each body of
tests/renderer/protocol_cases.py, what vLLM's `AnthropicServingMessages.to_chat_completion_request` and its chat
parsing (`parse_chat_messages`, both content formats) make of it, written by
`python -m benchmarks.compare_vllm_protocol --write-conversations` (vLLM 0.33 run in its own venv). tokenfront's
side is the converted request after tokenfront's normalization: what the template sees.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tokenfront.core.errors import RenderError
from tokenfront.core.messages import normalize_messages
from tokenfront.core.render import RenderPipeline
from tokenfront.core.requests.anthropic import (
    AnthropicTemplateTraits,
    disabled_thinking_effort,
    merges_inline_system,
    to_chat_request,
)
from tokenfront.options import RenderOptions
from tokenfront.protocol import AnthropicMessagesRequest, ChatCompletionRequest, reasoning_effort_kwargs

VLLM = json.loads(
    (Path(__file__).parent / "data" / "vllm_request_conversions.json").read_text(encoding="utf-8")
)
CASES = VLLM["messages"]
QWEN3_TRAITS = AnthropicTemplateTraits(merge_inline_system=False, disabled_thinking_effort="none")


def _convert(body: dict[str, Any], *, merge: bool = False, effort: str = "none") -> ChatCompletionRequest:
    traits = AnthropicTemplateTraits(merge_inline_system=merge, disabled_thinking_effort=effort)
    return to_chat_request(AnthropicMessagesRequest.model_validate(body), traits)


def _seen(chat: ChatCompletionRequest) -> dict[str, list[dict[str, Any]]]:
    messages = chat.model_dump(exclude_unset=True)["messages"]
    return {
        fmt: normalize_messages(messages, content_format=fmt, template_knows_developer=True)  # type: ignore[arg-type]
        for fmt in ("string", "openai")
    }


def _without_none(conversation: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    # vLLM gives a developer message `"tools": None`; None-valued keys never reach a template (transformers
    # drops them, as tokenfront's template does), so they are not compared.
    return {
        fmt: [{key: value for key, value in m.items() if value is not None} for m in messages]
        for fmt, messages in conversation.items()
    }


def test_the_corpus_has_enough_bodies_with_tools_and_tool_history() -> None:
    assert len(CASES) >= 5
    assert sum(case["tools"] is not None for case in CASES.values()) >= 3
    with_history = [
        case
        for case in CASES.values()
        if any("tool_calls" in message for message in case["conversation"]["string"])
    ]
    assert len(with_history) >= 2


@pytest.mark.parametrize("name", sorted(CASES))
def test_conversion_equals_vllms(name: str) -> None:
    case = CASES[name]
    chat = _convert(case["body"], merge=case["merge_inline_system"])
    assert _seen(chat) == _without_none(case["conversation"])
    assert chat.tool_dicts() == case["tools"]
    choice = chat.tool_choice.model_dump() if hasattr(chat.tool_choice, "model_dump") else chat.tool_choice
    assert choice == case["tool_choice"]
    assert chat.reasoning_effort == case["reasoning_effort"]
    assert chat.chat_template_kwargs == reasoning_effort_kwargs(
        case["reasoning_effort"], case["chat_template_kwargs"]
    )


def test_tool_results_come_before_the_rest_of_their_user_message() -> None:
    chat = _convert(CASES["tools_and_tool_use_history"]["body"])
    roles = [(m.role, m.tool_call_id) for m in chat.messages]
    assert roles == [
        ("user", None),
        ("assistant", None),
        ("tool", "toolu_1"),
        ("tool", "toolu_2"),
        ("user", None),
    ]
    assert chat.messages[3].content == "21:04\nJST"
    assert chat.messages[4].content == "Thanks!"


def test_disabled_thinking_uses_the_probed_effort_and_output_effort_otherwise() -> None:
    body = CASES["thinking_history_thinking_disabled"]["body"]
    assert _convert(body, effort="none").chat_template_kwargs == {
        "reasoning_effort": "none",
        "enable_thinking": False,
    }
    assert _convert(body, effort="low").reasoning_effort == "low"
    named = CASES["named_tool_choice_effort_and_assistant_tool_result"]["body"]
    assert _convert(named).reasoning_effort == "low"  # output_config.effort


def test_inline_system_messages_merge_into_the_first_only_when_the_template_needs_it() -> None:
    body = CASES["inline_system_message"]["body"]
    kept = [m.role for m in _convert(body, merge=False).messages]
    merged = _convert(body, merge=True).messages
    assert kept == ["system", "user", "assistant", "system", "user"]
    assert [m.role for m in merged] == ["system", "user", "assistant", "user"]
    assert merged[0].content == "Rule one. Reminder: be brief."


def test_tool_use_without_an_id_gets_vllms_fallback_id() -> None:
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {"a": 1}}]}
        ],
    }
    [message] = _convert(body).messages
    [call] = message.tool_calls or []
    assert re.fullmatch(r"call_\d+", call.id or "")
    assert call.function.arguments == '{"a": 1}'


def test_tool_removal_and_unknown_tool_reference() -> None:
    tools = [
        {"name": "a", "input_schema": {"type": "object"}},
        {"name": "b", "input_schema": {"type": "object"}},
    ]
    removal = {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "a"}}
    body = {
        "model": "m",
        "max_tokens": 8,
        "tools": tools,
        "messages": [{"role": "system", "content": [removal]}, {"role": "user", "content": "Hi"}],
    }
    assert [tool.function.name for tool in _convert(body).tools or []] == ["b"]
    unknown = {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "zzz"}}
    body["messages"] = [{"role": "system", "content": [unknown]}, {"role": "user", "content": "Hi"}]
    with pytest.raises(RenderError, match="references tool 'zzz'"):
        _convert(body)


def test_an_empty_conversation_is_a_clear_400() -> None:
    with pytest.raises(RenderError, match="no messages"):
        _convert({"model": "m", "max_tokens": 8, "messages": []})


# -- what vLLM probes the template for ---------------------------------------------------------------------

QWEN3_STYLE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
SYSTEM_FIRST = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}{{ m.content }}{% endfor %}"
)
SYSTEM_FIRST_JINJA_ERROR = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ m.content.missing.attr }}{% endif %}"
    "{% endfor %}"
)


@pytest.mark.parametrize(
    ("sources", "merges"),
    [
        ([QWEN3_STYLE, QWEN3_STYLE], False),
        ([QWEN3_STYLE, SYSTEM_FIRST], True),  # the tool template refuses: merged
        ([SYSTEM_FIRST_JINJA_ERROR], True),
        ([None], True),  # no template at all: vLLM merges
    ],
)
def test_merges_inline_system(sources: list[str | None], merges: bool) -> None:
    assert merges_inline_system(sources) is merges


def test_disabled_thinking_effort_probe(checkpoint: Callable[[str], Path]) -> None:
    # Qwen3's template reads enable_thinking, which reasoning_effort "none" turns off: "none" changes the prompt.
    qwen3 = RenderPipeline.load(RenderOptions(model=str(checkpoint("qwen3"))))
    assert disabled_thinking_effort(qwen3) == "none"
    assert AnthropicTemplateTraits.probe(qwen3) == QWEN3_TRAITS
    # Llama 3's template reads neither: "none" renders as every effort does, so vLLM falls back to "low".
    llama3 = RenderPipeline.load(RenderOptions(model=str(checkpoint("llama3"))))
    assert disabled_thinking_effort(llama3) == "low"

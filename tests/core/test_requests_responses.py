"""core/requests/responses.py: an OpenAI Responses body becomes the chat conversation vLLM 0.33 builds from it.

The expected conversations are vLLM's own: `data/vllm_request_conversions.json` holds, for each body of
tests/renderer/protocol_cases.py, what vLLM's `construct_input_messages`, `construct_tool_dicts` and
`ResponsesRequest.build_chat_params`, then its chat parsing (`parse_chat_messages`, both content formats), make
of it, written by `python -m benchmarks.compare_vllm_protocol --write-conversations` (vLLM 0.33 in its own
venv). tokenfront's side is the converted request after tokenfront's normalization: what the template sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenfront.core.errors import RenderError
from tokenfront.core.messages import normalize_messages
from tokenfront.core.requests.responses import CUSTOM_TOOL_PARAMETERS, to_chat_request
from tokenfront.protocol import ChatCompletionRequest, ResponsesRequest

VLLM = json.loads(
    (Path(__file__).parent / "data" / "vllm_request_conversions.json").read_text(encoding="utf-8")
)
CASES = VLLM["responses"]


def _convert(body: dict[str, Any]) -> ChatCompletionRequest:
    return to_chat_request(ResponsesRequest.model_validate(body))


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
        case for case in CASES.values() if any(m["role"] == "tool" for m in case["conversation"]["string"])
    ]
    assert len(with_history) >= 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_conversion_equals_vllms(name: str) -> None:
    case = CASES[name]
    chat = _convert(case["body"])
    assert _seen(chat) == _without_none(case["conversation"])
    assert chat.tool_dicts() == case["tools"]
    kwargs = {
        "add_generation_prompt": chat.add_generation_prompt,
        "continue_final_message": chat.continue_final_message,
        **(chat.chat_template_kwargs or {}),
    }
    assert kwargs == case["chat_template_kwargs"]


def test_reasoning_and_calls_join_one_assistant_message() -> None:
    chat = _convert(CASES["reasoning_items_and_effort"]["body"])
    assistant = chat.messages[1]
    assert assistant.role == "assistant" and assistant.reasoning == "Call get_time first."
    assert [call.function.name for call in assistant.tool_calls or []] == ["get_time", "get_weather"]
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert chat.chat_template_kwargs == {"reasoning_effort": "none", "enable_thinking": False}


def test_custom_tools_take_one_string_and_namespaces_flatten() -> None:
    chat = _convert(CASES["custom_namespace_and_builtin_tools"]["body"])
    tools = chat.tool_dicts() or []
    assert [tool["function"]["name"] for tool in tools] == [
        "run_sql",
        "files__read",
    ]  # web_search is not shown
    assert tools[0]["function"]["parameters"] == CUSTOM_TOOL_PARAMETERS
    [call] = chat.messages[1].tool_calls or []
    assert json.loads(call.function.arguments) == {"input": "SELECT count(*) FROM u"}


def test_reasoning_summary_is_the_fallback_and_a_second_reasoning_starts_a_message() -> None:
    summary = {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "S"}]}
    chat = _convert({"input": [{"role": "user", "content": "Q"}, summary, {**summary, "id": "r2"}]})
    assert [(m.role, m.reasoning) for m in chat.messages] == [
        ("user", None),
        ("assistant", "S"),
        ("assistant", "S"),
    ]


def test_only_builtin_tools_give_an_empty_tool_list() -> None:
    chat = _convert({"input": "Hi", "tools": [{"type": "web_search"}]})
    assert chat.tools == []


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({"input": "Hi", "prompt": {"id": "p"}}, "prompt", "prompt templates"),
        ({"input": []}, "input", "no messages"),
        ({"input": [{"type": "banana"}]}, "input[0].type", "unsupported input item type 'banana'"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
            "required",
        ),
        (
            {"input": [{"type": "reasoning", "id": "r", "summary": [], "encrypted_content": "x"}]},
            "input[0].encrypted_content",
            "encrypted",
        ),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice", "needs `tools`"),
        (
            {
                "input": "Hi",
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice",
            "'g'",
        ),
        (
            {"input": "Hi", "tools": [{"type": "custom", "name": "c", "format": {"type": "grammar"}}]},
            "tools[0].format",
            "grammar",
        ),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(RenderError, match=message) as caught:
        _convert(body)
    assert caught.value.param == param

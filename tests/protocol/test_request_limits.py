"""Request limits are a value passed to validation (`protocol.limits`), not module globals a CLI patches."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tokenfront.protocol import (
    DEFAULT_LIMITS,
    MAX_MESSAGES,
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    RequestLimits,
    ResponsesRequest,
    TokenizeRequest,
    validation_context,
)
from tokenfront.protocol.vllm import GenerateRequest

HI = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
TWO = validation_context(RequestLimits(max_messages=2, max_tools=1, max_stop_characters=5))


def test_the_defaults_are_the_documented_bounds() -> None:
    assert RequestLimits() == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.max_messages == MAX_MESSAGES == 4096
    ChatCompletionRequest.model_validate({"messages": [HI] * 3})  # no context: the defaults


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (
            ChatCompletionRequest,
            {"messages": [HI] * 3},
            r"3 messages are more than this server accepts in one request \(2\)",
        ),
        (TokenizeRequest, {"messages": [HI] * 3}, "3 messages are more than"),
        (
            AnthropicMessagesRequest,
            {"model": "m", "max_tokens": 5, "messages": [HI] * 3},
            "3 messages are more than",
        ),
        (ResponsesRequest, {"input": [HI] * 3}, "3 input items are more than"),
        (ChatCompletionRequest, {"messages": [HI], "tools": [TOOL, TOOL]}, "2 tools are more than"),
        (ChatCompletionRequest, {"messages": [HI], "stop": ["abc", "def"]}, "add up to 6 characters"),
        (
            GenerateRequest,
            {"token_ids": [1], "sampling_params": {"stop": "abcdef"}},
            "add up to 6 characters",
        ),
    ],
)
def test_a_body_is_held_to_the_limits_it_is_validated_with(model: type, body: dict, message: str) -> None:
    model.model_validate(body)  # within the defaults
    with pytest.raises(ValidationError, match=message):
        model.model_validate(body, context=TWO)


def test_a_tokenize_chat_keeps_the_limits_it_is_given() -> None:
    request = TokenizeRequest.model_validate({"messages": [HI] * 3})
    assert len(request.chat_request().messages) == 3
    with pytest.raises(ValidationError, match="3 messages are more than"):
        request.chat_request(RequestLimits(max_messages=2))

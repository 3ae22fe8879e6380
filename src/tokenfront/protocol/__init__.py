"""Request and response models at the HTTP boundary, one module per API.

- `openai`: the OpenAI chat and completions subset tokenfront reads (vLLM 0.33's);
- `anthropic`: the Anthropic Messages body, `responses`: the OpenAI Responses body (the render routes convert
  both to a chat request: core/requests/);
- `vllm`: vLLM's own bodies (`/tokenize`, `/detokenize`);
- `limits`: what one request may ask for, a `RequestLimits` value passed to validation;
- `base`: the strict model every request body is.

Every model is importable from `tokenfront.protocol` itself.
"""

from __future__ import annotations

from tokenfront.protocol.anthropic import (
    AnthropicContentBlock,
    AnthropicEffort,
    AnthropicMessage,
    AnthropicMessagesRequest,
    AnthropicOutputConfig,
    AnthropicThinkingAdaptive,
    AnthropicThinkingDisabled,
    AnthropicThinkingEnabled,
    AnthropicTool,
    AnthropicToolChoice,
    AnthropicToolDefinition,
    AnthropicToolReference,
)
from tokenfront.protocol.base import StrictModel
from tokenfront.protocol.limits import (
    DEFAULT_LIMITS,
    MAX_MESSAGES,
    MAX_SEQUENCES_PER_REQUEST,
    MAX_STOP_CHARACTERS,
    MAX_TOKENS_PER_REQUEST,
    MAX_TOOLS,
    RequestLimits,
    check_message_count,
    check_stop_strings,
    check_tool_count,
    limits_of,
    validation_context,
)
from tokenfront.protocol.openai import (
    MIN_TOP_P,
    SEED_MAX,
    SEED_MIN,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    PromptShape,
    ReasoningEffort,
    Role,
    StreamOptions,
    Tool,
    ToolCall,
    check_messages,
    check_seed,
    check_tools,
    reasoning_effort_kwargs,
)
from tokenfront.protocol.responses import ResponsesReasoning, ResponsesRequest
from tokenfront.protocol.vllm import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_MESSAGES",
    "MAX_SEQUENCES_PER_REQUEST",
    "MAX_STOP_CHARACTERS",
    "MAX_TOKENS_PER_REQUEST",
    "MAX_TOOLS",
    "MIN_TOP_P",
    "SEED_MAX",
    "SEED_MIN",
    "AnthropicContentBlock",
    "AnthropicEffort",
    "AnthropicMessage",
    "AnthropicMessagesRequest",
    "AnthropicOutputConfig",
    "AnthropicThinkingAdaptive",
    "AnthropicThinkingDisabled",
    "AnthropicThinkingEnabled",
    "AnthropicTool",
    "AnthropicToolChoice",
    "AnthropicToolDefinition",
    "AnthropicToolReference",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "FunctionCall",
    "FunctionDefinition",
    "NamedFunction",
    "NamedToolChoice",
    "PromptShape",
    "ReasoningEffort",
    "RequestLimits",
    "ResponsesReasoning",
    "ResponsesRequest",
    "Role",
    "StreamOptions",
    "StrictModel",
    "TokenizeRequest",
    "TokenizeResponse",
    "Tool",
    "ToolCall",
    "check_message_count",
    "check_messages",
    "check_seed",
    "check_stop_strings",
    "check_tool_count",
    "check_tools",
    "limits_of",
    "reasoning_effort_kwargs",
    "validation_context",
]

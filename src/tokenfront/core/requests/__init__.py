"""Other APIs' request bodies as the chat requests vLLM 0.33 builds from them, for the one rendering pipeline.

- `anthropic`: an Anthropic Messages body (`POST /v1/messages/render`), as vLLM's
  `AnthropicServingMessages.to_chat_completion_request` converts it;
- `responses`: an OpenAI Responses body (`POST /v1/responses/render`), as vLLM's
  `construct_input_messages` / `construct_tool_dicts` / `ResponsesRequest.build_chat_params` convert it.

Each module turns its body into a `ChatCompletionRequest`; `RenderPipeline.render_chat` renders it, so the ids
follow every chat rule (normalization, templates, families) with no second implementation.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tokenfront.core.errors import RenderError
from tokenfront.protocol import DEFAULT_LIMITS, ChatCompletionRequest, RequestLimits, Tool, validation_context

__all__ = ["chat_request_from", "tools_from"]


def chat_request_from(
    body: dict[str, Any], *, source: str, limits: RequestLimits = DEFAULT_LIMITS
) -> ChatCompletionRequest:
    """Validate a converted chat body, held to the server's `limits`; a failure is the client's (a 400 naming
    the `source` API), not ours."""
    try:
        return ChatCompletionRequest.model_validate(body, context=validation_context(limits))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RenderError(
            f"the {source} request converts to a chat request that cannot be rendered: {where}: {first['msg']}",
            param=None,
        ) from None


def tools_from(function_dicts: list[dict[str, Any]], *, param: str) -> list[Tool]:
    """Function tools (`{"type": "function", "function": {...}}`) as validated `Tool`s."""
    tools = []
    for index, tool in enumerate(function_dicts):
        try:
            tools.append(Tool.model_validate(tool))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise RenderError(
                f"{param}[{index}] is not a valid function tool: {where}: {first['msg']}",
                param=f"{param}[{index}]",
            ) from None
    return tools

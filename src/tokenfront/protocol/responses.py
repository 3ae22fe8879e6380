"""The OpenAI Responses body (vLLM 0.33's `entrypoints/openai/responses/protocol.py`), which the render routes
convert to the chat request vLLM builds from it (core/requests/responses.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from tokenfront.protocol.base import StrictModel
from tokenfront.protocol.limits import BOUNDED_INPUT_ITEMS, BOUNDED_TOOLS
from tokenfront.protocol.openai import ReasoningEffort


class ResponsesReasoning(StrictModel):
    effort: ReasoningEffort | None = None
    summary: str | None = None


class ResponsesRequest(StrictModel):
    """An OpenAI Responses body (`POST /v1/responses/render`).

    `input` items and `tools` are checked item by item where they are converted (core/requests/responses.py),
    so that an error names the item (`input[3].call_id`).
    """

    input: Annotated[str | list[dict[str, Any]], BOUNDED_INPUT_ITEMS]
    instructions: str | None = None
    model: str | None = None
    tools: Annotated[list[dict[str, Any]], BOUNDED_TOOLS] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    reasoning: ResponsesReasoning | None = None
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    max_output_tokens: int | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    # vLLM's additions
    request_id: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _int_is_a_float(cls, value: Any) -> Any:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

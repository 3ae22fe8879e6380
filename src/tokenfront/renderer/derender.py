"""The derender routes (docs/contract.md §11): output ids a client sends, answered as the OpenAI response vLLM 0.33 builds.

- `POST /v1/chat/completions/derender`: vLLM's `DerenderChatRequest` (`generate_response`, `prompt_tokens`,
  `prompt_token_ids`, `chat_request`) answered with a `chat.completion`; with `stream: true`, its
  `DerenderChatStreamRequest` (one `generate_chunk` and the `stream_state` of the previous answer) answered
  with `{"chunk", "stream_state"}`.
- `POST /v1/completions/derender`: the same for completions (`generate_responses`, one per prompt).

The ids are read by the pipeline (`RenderPipeline.derender_chat` / `derender_completion`, core/derender.py,
on the output core the worker uses too), where renders run (`server.render_thread`): a large output off the
event loop. The answers carry every field of vLLM's pydantic dumps, in its order, so a client of vLLM's
derender reads tokenfront's unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenfront.core.render import RenderPipeline
from tokenfront.protocol.vllm import ChatDerenderRequest, CompletionDerenderRequest
from tokenfront.renderer.answers import pipeline_for
from tokenfront.server.errors import APIError
from tokenfront.server.lean_routes import LeanRoute
from tokenfront.server.models import check_model
from tokenfront.server.render_thread import render_off_loop
from tokenfront.server.responses import JSONBytesResponse, dumps

__all__ = ["derender_router"]

_Body = TypeVar("_Body", ChatDerenderRequest, CompletionDerenderRequest)
# Bodies up to this size are read on the event loop when the pipeline is free (a stream's chunk of a few ids);
# reading costs tens of microseconds an id, so a larger output goes to the render thread.
_INLINE_BYTES = 4 * 1024


# -- routes -----------------------------------------------------------------------------------------------------


def _pipeline(raw: Request, model: str | None) -> RenderPipeline:
    """The pipeline of `model` (a router of several models has one per model: `pipeline_for`), its name
    checked."""
    pipeline: RenderPipeline | None = getattr(raw.app.state, "pipeline", None)
    if pipeline is not None:
        pipeline = pipeline_for(raw.app, model)
    if pipeline is None:
        raise APIError(
            501,
            "this server was started without a tokenizer (--model), so it cannot derender; start it with "
            "--model, or use a renderer (`tokenfront render`)",
            code="derender_unavailable",
            error_type="server_error",
        )
    check_model(model, pipeline.served_model_names)
    return pipeline


def _encoded(derender: Callable[[_Body], dict[str, Any]], body: _Body) -> bytes:
    """The answer of `derender`, as JSON: both run where the output is read (a million ids take seconds)."""
    return dumps(derender(body))


def derender_router() -> APIRouter:
    """The derender routes; they read ids with the pipeline on `app.state.pipeline`."""
    router = APIRouter(tags=["derender"], route_class=LeanRoute)

    @router.post(
        "/v1/chat/completions/derender",
        summary="Output token ids into a chat.completion (vLLM's derender; stream: true for one chunk)",
    )
    async def derender_chat_route(request: ChatDerenderRequest, raw: Request) -> Response:
        pipeline = _pipeline(raw, request.model)
        answer = await render_off_loop(
            raw, request, _encoded, pipeline.derender_chat, request, inline_bytes=_INLINE_BYTES
        )
        return JSONBytesResponse(answer)

    @router.post(
        "/v1/completions/derender",
        summary="Output token ids into a text_completion (vLLM's derender; stream: true for one chunk)",
    )
    async def derender_completion_route(request: CompletionDerenderRequest, raw: Request) -> Response:
        pipeline = _pipeline(raw, request.model)
        answer = await render_off_loop(
            raw, request, _encoded, pipeline.derender_completion, request, inline_bytes=_INLINE_BYTES
        )
        return JSONBytesResponse(answer)

    return router

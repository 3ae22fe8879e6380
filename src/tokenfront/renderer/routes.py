"""The render routes (docs/contract.md §2, §11): every way a request becomes prompt ids, on one pipeline.

- `POST /v1/chat/completions/render`, `POST /v1/completions/render`: the OpenAI bodies;
- `POST /v1/messages/render` (Anthropic Messages), `POST /v1/responses/render` (OpenAI Responses): the body is
  converted to the chat request vLLM builds from it (core/requests/) and rendered like any chat;
- `POST /tokenize`, `POST /detokenize`: vLLM's schemas, field for field.

Mounted by the standalone renderer, by the worker when TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1, and by the
router: all call the same pipeline, so all answer the same ids.

What each route does per request once its body is validated — the render and the answer's JSON, and the
direct answers of the chat and completions routes — is `renderer/answers.py`'s (compiled); this module is the
routes themselves.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from tokenfront.core.render import RenderedPrompt
from tokenfront.protocol import (
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ResponsesRequest,
    TokenizeRequest,
)
from tokenfront.renderer.answers import (
    RenderAnswer,
    answer_of,
    chat_answer,
    completion_answer,
    direct_answer,
    pipeline_for,
    render_chat_response,
    render_completion_response,
    render_converted_response,
    responses_request_id,
    tokenize_response,
)
from tokenfront.server.lean_routes import LeanEchoRoute, LeanRoute, json_body, raw_body
from tokenfront.server.metrics import ServerMetrics
from tokenfront.server.models import check_model
from tokenfront.server.render_thread import render_off_loop
from tokenfront.server.request_ids import chat_request_id
from tokenfront.server.responses import JSONBytesResponse
from tokenfront.server.tracing import PROMPT_TOKENS, Tracing

__all__ = ["RENDER_PATHS", "render_router"]

# Every route `render_router` mounts (all POST).
RENDER_PATHS = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/messages/render",
    "/v1/responses/render",
    "/tokenize",
    "/detokenize",
)


def render_router(tracing: Tracing | None = None) -> APIRouter:
    """The render routes; they use the pipeline `pipeline_for` picks for the request's `model`
    (`app.state.pipeline` but on a router). With `tracing`, the chat and completions renders are `render`
    spans (chosen here, once: nothing is checked per request)."""
    router = APIRouter(tags=["render"], route_class=LeanEchoRoute)
    chat: RenderAnswer = chat_answer
    completion: RenderAnswer = completion_answer
    if tracing is not None:
        chat = answer_of(tracing.traced("render", render_chat_response, _chat_span), "chat")
        completion = answer_of(
            tracing.traced("render", render_completion_response, _completion_span), "completion"
        )

    @router.post("/v1/chat/completions/render", summary="Render a chat request into prompt token ids")
    async def render_chat(request: ChatCompletionRequest, raw: Request) -> Response:
        content = await render_off_loop(raw, request, chat, raw.app, request, json_body(raw), raw_body(raw))
        return JSONBytesResponse(content)

    @router.post("/v1/completions/render", summary="Render a completions request into prompt token ids")
    async def render_completion(request: CompletionRequest, raw: Request) -> Response:
        content = await render_off_loop(
            raw, request, completion, raw.app, request, json_body(raw), raw_body(raw)
        )
        return JSONBytesResponse(content)

    @router.post(
        "/v1/messages/render",
        summary="Render an Anthropic Messages request into prompt token ids (the conversation vLLM builds)",
    )
    async def render_messages(request: AnthropicMessagesRequest, raw: Request) -> Response:
        pipeline = pipeline_for(raw.app, request.model)
        check_model(request.model, pipeline.served_model_names)
        content, rendered = await render_off_loop(
            raw,
            request,
            functools.partial(
                render_converted_response,
                pipeline,
                request,
                limits=raw.app.request_limits,
                request_id=chat_request_id(),
                body=json_body(raw),
                raw=raw_body(raw),
            ),
        )
        _metrics(raw).count_rendered("messages", 1, len(rendered.token_ids))
        return JSONBytesResponse(content)

    @router.post(
        "/v1/responses/render",
        summary="Render an OpenAI Responses request into prompt token ids (the conversation vLLM builds)",
    )
    async def render_responses(request: ResponsesRequest, raw: Request) -> Response:
        pipeline = pipeline_for(raw.app, request.model)
        check_model(request.model, pipeline.served_model_names)
        content, rendered = await render_off_loop(
            raw,
            request,
            functools.partial(
                render_converted_response,
                pipeline,
                request,
                limits=raw.app.request_limits,
                request_id=responses_request_id(request),
                body=json_body(raw),
                raw=raw_body(raw),
            ),
        )
        _metrics(raw).count_rendered("responses", 1, len(rendered.token_ids))
        return JSONBytesResponse(content)

    @router.post("/tokenize", summary="Token ids of a text prompt or a chat (vLLM's /tokenize)")
    async def tokenize(request: TokenizeRequest, raw: Request) -> Response:
        pipeline = pipeline_for(raw.app, request.model)
        answer = await render_off_loop(
            raw, request, tokenize_response, pipeline, request, pipeline.max_model_len, raw.app.request_limits
        )
        _metrics(raw).count_rendered("tokenize", 1, answer["count"])
        return JSONBytesResponse(answer)

    @router.post("/detokenize", summary="Text of token ids (vLLM's /detokenize)")
    async def detokenize(request: DetokenizeRequest, raw: Request) -> Response:
        pipeline = pipeline_for(raw.app, request.model)
        check_model(request.model, pipeline.served_model_names)
        return JSONBytesResponse(DetokenizeResponse(prompt=pipeline.detokenize(request.tokens)).model_dump())

    _offer_direct(router, "/v1/chat/completions/render", ChatCompletionRequest, chat)
    _offer_direct(router, "/v1/completions/render", CompletionRequest, completion)
    return router


def _chat_span(answer: tuple[bytes, RenderedPrompt]) -> dict[str, Any]:
    return {"tokenfront.render.kind": "chat", PROMPT_TOKENS: len(answer[1].token_ids)}


def _completion_span(answer: tuple[bytes, list[RenderedPrompt]]) -> dict[str, Any]:
    items = answer[1]
    return {
        "tokenfront.render.kind": "completion",
        "tokenfront.prompts": len(items),
        PROMPT_TOKENS: sum(len(item.token_ids) for item in items),
    }


def _offer_direct(router: APIRouter, path: str, model: type[BaseModel], answer: RenderAnswer) -> None:
    """Give the route at `path` a direct answer (`server.direct`): `answer` for a body `model` validates
    (`answers.direct_answer`)."""
    route = next(route for route in router.routes if isinstance(route, LeanRoute) and route.path == path)
    route.direct = direct_answer(model, answer)


def _metrics(raw: Request) -> ServerMetrics:
    metrics: ServerMetrics = raw.app.state.metrics
    return metrics

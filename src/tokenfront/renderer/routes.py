"""The render routes (docs/contract.md §2, §11): every way a request becomes prompt ids, on one pipeline.

- `POST /v1/chat/completions/render`, `POST /v1/completions/render`: the OpenAI bodies;
- `POST /v1/messages/render` (Anthropic Messages), `POST /v1/responses/render` (OpenAI Responses): the body is
  converted to the chat request vLLM builds from it (core/requests/) and rendered like any chat;
- `POST /tokenize`, `POST /detokenize`: vLLM's schemas, field for field.

Mounted by the standalone renderer, by the worker when TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1, and by the
router: all call the same pipeline, so all answer the same ids.

A render answer echoes the original body as its `request` field. It is written as the bytes the client sent,
spliced into the encoded envelope, not decoded and encoded again: that is both faster and exactly "the
original body, unchanged" (key order, number spelling and all).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.protocol import (
    DEFAULT_LIMITS,
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    RequestLimits,
    ResponsesRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from tokenfront.server.lean_routes import LeanEchoRoute, LeanRoute, json_body, raw_body
from tokenfront.server.metrics import ServerMetrics
from tokenfront.server.models import check_model
from tokenfront.server.render_thread import render_off_loop
from tokenfront.server.request_ids import chat_request_id, completion_request_id
from tokenfront.server.responses import JSONBytesResponse, dumps
from tokenfront.server.tracing import PROMPT_TOKENS, Tracing

__all__ = [
    "RENDER_PATHS",
    "RENDER_SCHEMA_VERSION",
    "pipeline_for",
    "render_chat_response",
    "render_completion_response",
    "render_converted_response",
    "render_router",
]

RENDER_SCHEMA_VERSION = 1
# Every route `render_router` mounts (all POST).
RENDER_PATHS = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/messages/render",
    "/v1/responses/render",
    "/tokenize",
    "/detokenize",
)


def _envelope(
    *, kind: str, request_id: str, rendered: RenderedPrompt, request: dict[str, Any], reasoning_kwargs: Any
) -> dict[str, Any]:
    # Field order is part of the contract (docs/contract.md §2); `request` comes last and is added by the caller.
    return {
        "schema_version": RENDER_SCHEMA_VERSION,
        "kind": kind,
        "request_id": request_id,
        "token_ids": rendered.token_ids,
        "model": request.get("model"),
        "reasoning_ended": rendered.reasoning_ended,
        "reasoning_parser_kwargs": reasoning_kwargs,
        "cache_salt": request.get("cache_salt"),
    }


def _with_request(envelope: dict[str, Any], request_json: bytes) -> bytes:
    """The envelope's JSON with `"request": <request_json>` as its last field."""
    return dumps(envelope)[:-1] + b',"request":' + request_json + b"}"


def _chat_envelope(
    pipeline: RenderPipeline,
    rendered: RenderedPrompt,
    *,
    kind: str,
    request_id: str,
    body: dict[str, Any],
    raw: bytes,
) -> bytes:
    reasoning_kwargs = (
        {"chat_template_kwargs": rendered.chat_template_kwargs}
        if pipeline.reasoning_parser is not None
        else None
    )
    envelope = _envelope(
        kind=kind, request_id=request_id, rendered=rendered, request=body, reasoning_kwargs=reasoning_kwargs
    )
    return _with_request(envelope, raw)


def render_chat_response(
    pipeline: RenderPipeline, request: ChatCompletionRequest, body: dict[str, Any], raw: bytes
) -> tuple[bytes, RenderedPrompt]:
    """The render answer for one chat request, as JSON (`body` parsed from `raw`, which is echoed)."""
    check_model(request.model, pipeline.served_model_names)
    # The tools as the template sees them (vLLM's dump of each: `"description": null` and all), not as sent.
    seen = body if request.tools is None else {**body, "tools": request.tool_dicts()}
    rendered = pipeline.render_chat(request, body=seen)
    return _chat_envelope(
        pipeline, rendered, kind="chat", request_id=chat_request_id(), body=body, raw=raw
    ), rendered


def render_converted_response(
    pipeline: RenderPipeline,
    request: AnthropicMessagesRequest | ResponsesRequest,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    request_id: str,
    body: dict[str, Any],
    raw: bytes,
) -> tuple[bytes, RenderedPrompt]:
    """The render answer for another API's body (kind "messages" or "responses"), rendered as the chat
    request vLLM builds from it (held to the server's `limits`); the envelope echoes the original body."""
    if isinstance(request, AnthropicMessagesRequest):
        kind, rendered = "messages", pipeline.render_messages(request, limits=limits)
    else:
        kind, rendered = "responses", pipeline.render_responses(request, limits=limits)
    return _chat_envelope(pipeline, rendered, kind=kind, request_id=request_id, body=body, raw=raw), rendered


def render_completion_response(
    pipeline: RenderPipeline, request: CompletionRequest, body: dict[str, Any], raw: bytes
) -> tuple[bytes, list[RenderedPrompt]]:
    """The render answer for a completions request: one item per prompt, each with its own prompt."""
    check_model(request.model, pipeline.served_model_names)
    items = pipeline.render_completion(request)
    base = completion_request_id()
    encoded = []
    for index, item in enumerate(items):
        envelope = _envelope(
            kind="completion",
            request_id=f"{base}-{index}",
            rendered=item,
            request=body,
            reasoning_kwargs=None,
        )
        # One prompt, as given: the original body is that item's request.
        own = (
            raw
            if len(items) == 1 and item.prompt == body["prompt"]
            else dumps({**body, "prompt": item.prompt})
        )
        encoded.append(_with_request(envelope, own))
    return b"[" + b",".join(encoded) + b"]", items


def tokenize_response(
    pipeline: RenderPipeline,
    request: TokenizeRequest,
    context_length: int,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> dict[str, Any]:
    """vLLM's `/tokenize` answer: a chat rendered as `/v1/chat/completions/render` renders it, or text
    encoded as a completions prompt (`add_special_tokens` defaults: false for chat, true for text)."""
    check_model(request.model, pipeline.served_model_names)
    if request.is_chat:
        ids = pipeline.render_chat(request.chat_request(limits)).token_ids
    else:
        assert request.prompt is not None  # the model requires prompt or messages
        add_special = True if request.add_special_tokens is None else request.add_special_tokens
        ids = pipeline.tokenize(request.prompt, add_special_tokens=add_special)
    strings = list(pipeline.tokenizer.convert_ids_to_tokens(ids)) if request.return_token_strs else None
    return TokenizeResponse(
        count=len(ids), max_model_len=context_length, tokens=ids, token_strs=strings
    ).model_dump()


def _responses_request_id(request: ResponsesRequest) -> str:
    # vLLM's ResponsesRequest.request_id: the client's, else "resp_" and 32 hex digits.
    return request.request_id or f"resp_{secrets.token_hex(16)}"


def pipeline_for(app: FastAPI, model: str | None) -> RenderPipeline:
    """The pipeline that renders a request naming `model`: the app's one (`app.state.pipeline`), or — on a
    router, which may serve several models — the one `app.state.choose_pipeline` picks for that name (its 404
    `model_not_found` for a name no model has)."""
    choose: Callable[[str | None], RenderPipeline] | None = getattr(app.state, "choose_pipeline", None)
    if choose is not None:
        return choose(model)
    pipeline: RenderPipeline = app.state.pipeline
    return pipeline


def render_router(tracing: Tracing | None = None) -> APIRouter:
    """The render routes; they use the pipeline `pipeline_for` picks for the request's `model`
    (`app.state.pipeline` but on a router). With `tracing`, the chat and completions renders are `render`
    spans (chosen here, once: nothing is checked per request)."""
    router = APIRouter(tags=["render"], route_class=LeanEchoRoute)
    chat_answer, completion_answer = _chat_answer, _completion_answer
    if tracing is not None:
        chat_answer = _answer_of(tracing.traced("render", render_chat_response, _chat_span), "chat")
        completion_answer = _answer_of(
            tracing.traced("render", render_completion_response, _completion_span), "completion"
        )

    @router.post("/v1/chat/completions/render", summary="Render a chat request into prompt token ids")
    async def render_chat(request: ChatCompletionRequest, raw: Request) -> Response:
        content = await render_off_loop(
            raw, request, chat_answer, raw.app, request, json_body(raw), raw_body(raw)
        )
        return JSONBytesResponse(content)

    @router.post("/v1/completions/render", summary="Render a completions request into prompt token ids")
    async def render_completion(request: CompletionRequest, raw: Request) -> Response:
        content = await render_off_loop(
            raw, request, completion_answer, raw.app, request, json_body(raw), raw_body(raw)
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
                request_id=_responses_request_id(request),
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

    _offer_direct(router, "/v1/chat/completions/render", ChatCompletionRequest, chat_answer)
    _offer_direct(router, "/v1/completions/render", CompletionRequest, completion_answer)
    return router


def _chat_answer(app: FastAPI, request: ChatCompletionRequest, body: dict[str, Any], raw: bytes) -> bytes:
    """`/v1/chat/completions/render`'s answer, its render counted."""
    content, rendered = render_chat_response(pipeline_for(app, request.model), request, body, raw)
    app.state.metrics.count_rendered("chat", 1, len(rendered.token_ids))
    return content


def _completion_answer(app: FastAPI, request: CompletionRequest, body: dict[str, Any], raw: bytes) -> bytes:
    """`/v1/completions/render`'s answer, its renders counted."""
    content, items = render_completion_response(pipeline_for(app, request.model), request, body, raw)
    app.state.metrics.count_rendered("completion", len(items), sum(len(item.token_ids) for item in items))
    return content


def _answer_of(render: Callable[..., tuple[bytes, Any]], kind: str) -> Callable[..., bytes]:
    """`_chat_answer` (`kind` chat) or `_completion_answer` (completion) on another render function: the
    traced one."""

    def answer(app: FastAPI, request: Any, body: dict[str, Any], raw: bytes) -> bytes:
        content, rendered = render(pipeline_for(app, request.model), request, body, raw)
        items = [rendered] if kind == "chat" else rendered
        app.state.metrics.count_rendered(kind, len(items), sum(len(item.token_ids) for item in items))
        return content

    return answer


def _chat_span(answer: tuple[bytes, RenderedPrompt]) -> dict[str, Any]:
    return {"tokenfront.render.kind": "chat", PROMPT_TOKENS: len(answer[1].token_ids)}


def _completion_span(answer: tuple[bytes, list[RenderedPrompt]]) -> dict[str, Any]:
    items = answer[1]
    return {
        "tokenfront.render.kind": "completion",
        "tokenfront.prompts": len(items),
        PROMPT_TOKENS: sum(len(item.token_ids) for item in items),
    }


_Body = TypeVar("_Body", bound=BaseModel)


def _offer_direct(
    router: APIRouter,
    path: str,
    model: type[_Body],
    answer: Callable[[FastAPI, _Body, dict[str, Any], bytes], bytes],
) -> None:
    """Give the route at `path` a direct answer (`server.direct`): the endpoint's `answer`, for a body that
    `model` validates and that has no template of its own (those render on the render thread); None otherwise,
    for the endpoint to answer."""

    validate = model.__pydantic_validator__.validate_python  # model_validate less its Python wrapper

    def direct(app: FastAPI, raw: bytes, body: dict[str, Any]) -> bytes | None:
        try:
            request = validate(body, context=getattr(app, "validation_context", None))
        except ValidationError:
            return None
        if getattr(request, "chat_template", None) is not None:
            return None
        return answer(app, request, body, raw)

    route = next(route for route in router.routes if isinstance(route, LeanRoute) and route.path == path)
    route.direct = direct


def _metrics(raw: Request) -> ServerMetrics:
    metrics: ServerMetrics = raw.app.state.metrics
    return metrics

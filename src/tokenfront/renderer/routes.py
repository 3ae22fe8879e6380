"""`POST /v1/chat/completions/render` and `POST /v1/completions/render` (SPEC §2).

Mounted by the standalone renderer, and by the worker when TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1: both call
the same pipeline, so both answer the same ids.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.server.errors import model_not_found

RENDER_SCHEMA_VERSION = 1


def chat_request_id() -> str:
    """`chatcmpl-` and 32 lowercase hex digits."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion_request_id() -> str:
    """`cmpl-` and 32 lowercase hex digits; items append `-<index>`."""
    return f"cmpl-{uuid.uuid4().hex}"


def _check_model(pipeline: RenderPipeline, model: str | None) -> None:
    if not pipeline.serves(model):
        raise model_not_found(str(model), pipeline.served_model_names)


def _rendered_body(
    *, kind: str, request_id: str, rendered: RenderedPrompt, request: dict[str, Any], reasoning_kwargs: Any
) -> dict[str, Any]:
    # Field order is part of the contract (SPEC §2).
    return {
        "schema_version": RENDER_SCHEMA_VERSION,
        "kind": kind,
        "request_id": request_id,
        "token_ids": rendered.token_ids,
        "model": request.get("model"),
        "reasoning_ended": rendered.reasoning_ended,
        "reasoning_parser_kwargs": reasoning_kwargs,
        "cache_salt": request.get("cache_salt"),
        "request": request,
    }


def render_chat_response(
    pipeline: RenderPipeline, request: ChatCompletionRequest, body: dict[str, Any]
) -> dict:
    """The render response for one chat request (`body` is the original JSON, echoed unchanged)."""
    _check_model(pipeline, request.model)
    rendered = pipeline.render_chat(request)
    reasoning_kwargs = (
        {"chat_template_kwargs": rendered.chat_template_kwargs}
        if pipeline.reasoning_parser is not None
        else None
    )
    return _rendered_body(
        kind="chat",
        request_id=chat_request_id(),
        rendered=rendered,
        request=body,
        reasoning_kwargs=reasoning_kwargs,
    )


def render_completion_response(
    pipeline: RenderPipeline, request: CompletionRequest, body: dict[str, Any]
) -> list[dict]:
    """The render response for a completions request: one item per prompt, each with its own prompt."""
    _check_model(pipeline, request.model)
    items = pipeline.render_completion(request)
    base = completion_request_id()
    return [
        _rendered_body(
            kind="completion",
            request_id=f"{base}-{index}",
            rendered=item,
            request={**body, "prompt": item.prompt},
            reasoning_kwargs=None,
        )
        for index, item in enumerate(items)
    ]


def render_router() -> APIRouter:
    """The render routes; they use the pipeline on `app.state.pipeline`."""
    router = APIRouter(tags=["render"])

    @router.post("/v1/chat/completions/render", summary="Render a chat request into prompt token ids")
    async def render_chat(request: ChatCompletionRequest, raw: Request) -> JSONResponse:
        pipeline: RenderPipeline = raw.app.state.pipeline
        body = await raw.json()
        response = render_chat_response(pipeline, request, body)
        _count(raw, "chat", [response])
        return JSONResponse(response)

    @router.post("/v1/completions/render", summary="Render a completions request into prompt token ids")
    async def render_completion(request: CompletionRequest, raw: Request) -> JSONResponse:
        pipeline: RenderPipeline = raw.app.state.pipeline
        body = await raw.json()
        response = render_completion_response(pipeline, request, body)
        _count(raw, "completion", response)
        return JSONResponse(response)

    return router


def _count(raw: Request, kind: str, items: list[dict[str, Any]]) -> None:
    metrics = raw.app.state.metrics
    metrics.rendered_prompts.labels(kind).inc(len(items))
    metrics.rendered_tokens.labels(kind).inc(sum(len(item["token_ids"]) for item in items))

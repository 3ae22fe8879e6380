"""`POST /v1/chat/completions/render` and `POST /v1/completions/render` (SPEC §2).

Mounted by the standalone renderer, by the worker when TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1, and by the
router: all call the same pipeline, so all answer the same ids.

The answer echoes the original body as its `request` field. It is written as the bytes the client sent,
spliced into the encoded envelope, not decoded and encoded again: that is both faster and exactly "the
original body, unchanged" (key order, number spelling and all).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.server.lean_routes import LeanRoute, json_body, raw_body
from tokenfront.server.metrics import ServerMetrics
from tokenfront.server.models import check_model
from tokenfront.server.request_ids import chat_request_id, completion_request_id
from tokenfront.server.responses import JSONBytesResponse, dumps

__all__ = ["RENDER_SCHEMA_VERSION", "render_chat_response", "render_completion_response", "render_router"]

RENDER_SCHEMA_VERSION = 1


def _envelope(
    *, kind: str, request_id: str, rendered: RenderedPrompt, request: dict[str, Any], reasoning_kwargs: Any
) -> dict[str, Any]:
    # Field order is part of the contract (SPEC §2); `request` comes last and is added by the caller.
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


def render_chat_response(
    pipeline: RenderPipeline, request: ChatCompletionRequest, body: dict[str, Any], raw: bytes
) -> tuple[bytes, RenderedPrompt]:
    """The render answer for one chat request, as JSON (`body` parsed from `raw`, which is echoed)."""
    check_model(request.model, pipeline.served_model_names)
    rendered = pipeline.render_chat(request, body=body)
    reasoning_kwargs = (
        {"chat_template_kwargs": rendered.chat_template_kwargs}
        if pipeline.reasoning_parser is not None
        else None
    )
    envelope = _envelope(
        kind="chat",
        request_id=chat_request_id(),
        rendered=rendered,
        request=body,
        reasoning_kwargs=reasoning_kwargs,
    )
    return _with_request(envelope, raw), rendered


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


def render_router() -> APIRouter:
    """The render routes; they use the pipeline on `app.state.pipeline`."""
    router = APIRouter(tags=["render"], route_class=LeanRoute)

    @router.post("/v1/chat/completions/render", summary="Render a chat request into prompt token ids")
    async def render_chat(request: ChatCompletionRequest, raw: Request) -> Response:
        pipeline: RenderPipeline = raw.app.state.pipeline
        content, rendered = render_chat_response(pipeline, request, json_body(raw), raw_body(raw))
        metrics: ServerMetrics = raw.app.state.metrics
        metrics.count_rendered("chat", 1, len(rendered.token_ids))
        return JSONBytesResponse(content)

    @router.post("/v1/completions/render", summary="Render a completions request into prompt token ids")
    async def render_completion(request: CompletionRequest, raw: Request) -> Response:
        pipeline: RenderPipeline = raw.app.state.pipeline
        content, items = render_completion_response(pipeline, request, json_body(raw), raw_body(raw))
        metrics: ServerMetrics = raw.app.state.metrics
        metrics.count_rendered("completion", len(items), sum(len(item.token_ids) for item in items))
        return JSONBytesResponse(content)

    return router

"""The render answers: a render request rendered on the pipeline and written as the JSON the render routes send.

`renderer/routes.py` mounts the routes; this module is what each of them does per request once the body is
validated — the pipeline the request's `model` names, the render, the envelope (docs/contract.md §2) with the
original body spliced in as its `request` field — and the chat and completions routes' direct answers
(`server.direct`): a validated body answered in its connection's protocol, or declined to the route.

It runs on every render request, so the wheel compiles it with mypyc (setup.py's hot path; three rules of
mypyc's, docs/architecture.md): the annotations below are checked when a call crosses into it.

A render answer echoes the original body as its `request` field. It is written as the bytes the client sent,
spliced into the encoded envelope, not decoded and encoded again: that is both faster and exactly "the
original body, unchanged" (key order, number spelling and all).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.protocol import (
    DEFAULT_LIMITS,
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    CompletionRequest,
    RequestLimits,
    ResponsesRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from tokenfront.server.direct import DirectAnswer
from tokenfront.server.models import check_model
from tokenfront.server.request_ids import chat_request_id, completion_request_id
from tokenfront.server.responses import dumps

__all__ = [
    "RENDER_SCHEMA_VERSION",
    "answer_of",
    "chat_answer",
    "completion_answer",
    "direct_answer",
    "pipeline_for",
    "render_chat_response",
    "render_completion_response",
    "render_converted_response",
    "responses_request_id",
    "tokenize_response",
]

RENDER_SCHEMA_VERSION = 1

# A route's answer: (the app, the validated request, the body parsed, the body as sent) -> the answer's JSON.
RenderAnswer = Callable[[Any, Any, dict[str, Any], bytes], bytes]


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


def responses_request_id(request: ResponsesRequest) -> str:
    # vLLM's ResponsesRequest.request_id: the client's, else "resp_" and 32 hex digits.
    return request.request_id or f"resp_{secrets.token_hex(16)}"


def pipeline_for(app: Any, model: str | None) -> RenderPipeline:
    """The pipeline that renders a request naming `model`: the app's one (`app.state.pipeline`), or — on a
    router, which may serve several models — the one `app.state.choose_pipeline` picks for that name (its 404
    `model_not_found` for a name no model has)."""
    choose: Callable[[str | None], RenderPipeline] | None = getattr(app.state, "choose_pipeline", None)
    if choose is not None:
        return choose(model)
    pipeline: RenderPipeline = app.state.pipeline
    return pipeline


def chat_answer(app: Any, request: ChatCompletionRequest, body: dict[str, Any], raw: bytes) -> bytes:
    """`/v1/chat/completions/render`'s answer, its render counted."""
    content, rendered = render_chat_response(pipeline_for(app, request.model), request, body, raw)
    app.state.metrics.count_rendered("chat", 1, len(rendered.token_ids))
    return content


def completion_answer(app: Any, request: CompletionRequest, body: dict[str, Any], raw: bytes) -> bytes:
    """`/v1/completions/render`'s answer, its renders counted."""
    content, items = render_completion_response(pipeline_for(app, request.model), request, body, raw)
    app.state.metrics.count_rendered("completion", len(items), sum(len(item.token_ids) for item in items))
    return content


def answer_of(render: Callable[..., tuple[bytes, Any]], kind: str) -> RenderAnswer:
    """`chat_answer` (`kind` chat) or `completion_answer` (completion) on another render function: the
    traced one."""

    def answer(app: Any, request: Any, body: dict[str, Any], raw: bytes) -> bytes:
        content, rendered = render(pipeline_for(app, request.model), request, body, raw)
        items = [rendered] if kind == "chat" else rendered
        app.state.metrics.count_rendered(kind, len(items), sum(len(item.token_ids) for item in items))
        return content

    return answer


def direct_answer(model: type[BaseModel], answer: RenderAnswer) -> DirectAnswer:
    """A route's direct answer (`server.direct`): its `answer` for a body that `model` validates and that has
    no template of its own (those render on the render thread); None otherwise, for the route to answer."""

    validate = model.__pydantic_validator__.validate_python  # model_validate less its Python wrapper

    def direct(app: Any, raw: bytes, body: dict[str, Any]) -> bytes | None:
        try:
            request = validate(body, context=getattr(app, "validation_context", None))
        except ValidationError:
            return None
        if getattr(request, "chat_template", None) is not None:
            return None
        return answer(app, request, body, raw)

    return direct

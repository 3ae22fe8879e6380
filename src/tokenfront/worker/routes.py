"""The worker's own routes: the OpenAI inference routes and the KV cache event feed (docs/contract.md §7)."""

from __future__ import annotations

import re

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.protocol.vllm import GenerateRequest
from tokenfront.server.errors import APIError
from tokenfront.server.lean_routes import LeanRoute
from tokenfront.server.responses import JSONBytesResponse
from tokenfront.worker.generate import GenerateService
from tokenfront.worker.service import WorkerService

# One read returns at most this many events; a router pages with `after`.
MAX_EVENTS_PER_READ = 10_000


def worker_router() -> APIRouter:
    """POST /v1/chat/completions, POST /v1/completions and POST /inference/v1/generate (vLLM's tokens in,
    tokens out), on `app.state.service`."""
    router = APIRouter(tags=["inference"], route_class=LeanRoute)

    @router.post(
        "/v1/chat/completions", summary="Chat completion (messages, or prompt_token_ids with messages)"
    )
    async def chat_completions(request: ChatCompletionRequest, raw: Request) -> Response:
        service: WorkerService = raw.app.state.service
        return await service.chat(request, raw)

    @router.post("/v1/completions", summary="Text completion (text or token-id prompts)")
    async def completions(request: CompletionRequest, raw: Request) -> Response:
        service: WorkerService = raw.app.state.service
        return await service.completion(request, raw)

    @router.post(
        "/inference/v1/generate",
        summary="Tokens in, tokens out (vLLM's GenerateRequest; output_mode tokens, text or derender)",
    )
    async def generate(request: GenerateRequest, raw: Request) -> Response:
        service: WorkerService = raw.app.state.service
        return await GenerateService(service).generate(request, raw)

    return router


def kv_events_router() -> APIRouter:
    """GET /kv_cache_events, on `app.state.service`."""
    router = APIRouter()

    @router.get(
        "/kv_cache_events",
        tags=["kv cache"],
        summary="The prefix cache's stored/removed block events after sequence number `after`; a reader that "
        "missed events gets the cache's snapshot",
        response_class=JSONBytesResponse,
    )
    async def kv_cache_events(
        raw: Request,
        after: str | None = Query(
            None, description="return events with a sequence number above this (default 0)"
        ),
        limit: str | None = Query(
            None, description=f"at most this many events (default 1000, max {MAX_EVENTS_PER_READ})"
        ),
        log_id: str | None = Query(
            None,
            description="the `log_id` the reader's cursor belongs to: another one (the worker restarted since) "
            "counts as truncated",
        ),
    ) -> JSONBytesResponse:
        service: WorkerService = raw.app.state.service
        # Parsed here rather than typed as int, so that a bad value gets a message naming what is expected.
        after_seq = _non_negative_int(after, "after", default=0)
        count = _non_negative_int(limit, "limit", default=1000)
        # Encoded here, not validated against a response model: a snapshot is up to the cache's whole size.
        return JSONBytesResponse(service.engine.kv_events(after_seq, min(count, MAX_EVENTS_PER_READ), log_id))

    return router


# A sequence number or a count: ASCII digits, at most 20 of them (2**64 has 20), so `int()` never meets
# Python's 4300-digit limit nor a digit it cannot read ("²" is a digit to `str.isdigit`).
_QUERY_INT = re.compile(r"[0-9]{1,20}")


def _non_negative_int(value: str | None, name: str, *, default: int) -> int:
    """A query parameter as a non-negative integer, or a 400 saying what is expected."""
    if value is None:
        return default
    text = value.strip()
    if not _QUERY_INT.fullmatch(text):  # also refuses "-1", "1.5", "", "0x10" and "²"
        shown = repr(text) if len(text) <= 40 else f"{len(text)} characters"
        raise APIError(
            400,
            f"query parameter `{name}` must be a non-negative integer of at most 20 digits (a sequence number "
            f"or a count), got {shown}",
            param=name,
        )
    return int(text)

"""What the router renders for a plan: a request's prompt ids and, when they may be forwarded, the body carrying them.

The same function runs wherever the router renders — on its render thread (`server.render_thread`) or in a
render process (`router.render_pool`) — so a plan gets the same thing whichever did it. Everything it returns
pickles (a render process sends it back), and building the forwarded body goes with the render: for a large
body that JSON work is as much the render's as the tokenizer's, and stays off the router's event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.server.responses import dumps, loads

__all__ = ["RenderedRequest", "render_request", "with_field"]


@dataclass(frozen=True)
class RenderedRequest:
    """A rendered request: its prompts (one for chat, each prompt of a completions request), and the client's
    body with the ids set when the caller asked for it.

    `prompts` None: the router cannot render this chat request (it has no chat template; its workers may).
    """

    prompts: tuple[RenderedPrompt, ...] | None
    forwarded_body: bytes | None = None


def render_request(
    pipeline: RenderPipeline,
    request: ChatCompletionRequest | CompletionRequest,
    raw_body: bytes,
    *,
    with_body: bool,
) -> RenderedRequest:
    """Render `request` with `pipeline`; `with_body`: also the body to forward (chat: `prompt_token_ids` set;
    completions: the ids as `prompt`). A client's mistake raises `RenderError`, as the pipeline does."""
    if isinstance(request, ChatCompletionRequest):
        try:
            rendered = pipeline.render_chat(request)
        except RenderError as exc:
            if exc.code == "no_chat_template":
                # The router's own configuration lacks a template, not the request: the workers may have one.
                return RenderedRequest(None)
            raise
        body = with_field(raw_body, "prompt_token_ids", rendered.token_ids) if with_body else None
        return RenderedRequest((rendered,), body)
    items = pipeline.render_completion(request)
    if not with_body:
        return RenderedRequest(tuple(items))
    prompt = items[0].token_ids if len(items) == 1 else [item.token_ids for item in items]
    return RenderedRequest(tuple(items), with_field(raw_body, "prompt", prompt))


def with_field(raw_body: bytes, name: str, value: Any) -> bytes:
    """The client's JSON body with one field set (the rest as the client sent it)."""
    body = loads(raw_body)
    body[name] = value
    return dumps(body)

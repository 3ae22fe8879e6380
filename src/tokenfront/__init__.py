"""tokenfront: render OpenAI requests into the exact prompt token ids a worker computes, once."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenfront.core.errors import RenderError
    from tokenfront.core.render import RenderedPrompt, RenderPipeline
    from tokenfront.options import RenderOptions
    from tokenfront.protocol import (
        AnthropicMessagesRequest,
        ChatCompletionRequest,
        CompletionRequest,
        ResponsesRequest,
        TokenizeRequest,
    )

__version__ = "0.1.0"

__all__ = [
    "AnthropicMessagesRequest",
    "ChatCompletionRequest",
    "CompletionRequest",
    "RenderError",
    "RenderOptions",
    "RenderPipeline",
    "RenderedPrompt",
    "ResponsesRequest",
    "TokenizeRequest",
    "__version__",
]

# Loaded on first use: `import tokenfront.client` (or `tokenfront check`) must not pay for the render core
# (pydantic, Jinja, tokenizers) it never calls.
_LAZY = {
    "RenderError": "tokenfront.core.errors",
    "RenderPipeline": "tokenfront.core.render",
    "RenderedPrompt": "tokenfront.core.render",
    "RenderOptions": "tokenfront.options",
    # The request bodies the pipeline renders (docs/python-api.md), validated as the servers validate them.
    "AnthropicMessagesRequest": "tokenfront.protocol",
    "ChatCompletionRequest": "tokenfront.protocol",
    "CompletionRequest": "tokenfront.protocol",
    "ResponsesRequest": "tokenfront.protocol",
    "TokenizeRequest": "tokenfront.protocol",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tokenfront' has no attribute {name!r}")

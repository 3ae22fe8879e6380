"""Server-sent events as the OpenAI streaming routes frame them: `data: {json}` events, then `data: [DONE]`."""

from __future__ import annotations

from typing import Any

from tokenfront.server.responses import dumps

__all__ = ["SSE_DONE", "SSE_MEDIA_TYPE", "sse_event"]

SSE_DONE = b"data: [DONE]\n\n"
SSE_MEDIA_TYPE = "text/event-stream"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying `payload` as compact JSON."""
    return b"data: " + dumps(payload) + b"\n\n"

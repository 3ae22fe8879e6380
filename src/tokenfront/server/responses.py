"""JSON in and out, fast: orjson where it can, the standard library where orjson cannot (integers beyond 64 bits).

Every server answers through these, so a body is parsed once and a response is encoded once, without the
standard library's slower encoder on the hot path.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from starlette.responses import Response

__all__ = ["JSONBytesResponse", "dumps", "loads"]


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (non-ASCII written as is, like `json.dumps(..., ensure_ascii=False)`)."""
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        # orjson refuses integers beyond 64 bits (a client may send one in chat_template_kwargs).
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def loads(data: bytes | str) -> Any:
    """Parse JSON; ValueError (with the parser's reason) when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:  # orjson refuses integers beyond 64 bits, which JSON allows
            return json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise ValueError(str(exc)) from None


class JSONBytesResponse(Response):
    """A JSON response encoded with `dumps`; `content` may also be JSON bytes already encoded."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        return dumps(content)

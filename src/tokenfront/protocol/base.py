"""The base of every request model: strict types, unknown fields kept.

Requests are validated strictly (no silent coercion of "5" to 5) but keep unknown fields, because the original
body is echoed back in render responses and forwarded to workers unchanged.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel"]


class StrictModel(BaseModel):
    """A request body: strict types, unknown fields kept (and dumped)."""

    model_config = ConfigDict(strict=True, extra="allow")

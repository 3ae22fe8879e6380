"""OpenAI-style request ids: `chatcmpl-` / `cmpl-` and 32 lowercase hex digits (SPEC §2)."""

from __future__ import annotations

import os

__all__ = ["chat_request_id", "completion_request_id"]


def _hex32() -> str:
    return os.urandom(16).hex()


def chat_request_id() -> str:
    """`chatcmpl-` and 32 lowercase hex digits."""
    return f"chatcmpl-{_hex32()}"


def completion_request_id() -> str:
    """`cmpl-` and 32 lowercase hex digits; render items append `-<index>`."""
    return f"cmpl-{_hex32()}"

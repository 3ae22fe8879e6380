"""Chat templates of widely served models, written in Python: the same text as their Jinja source, in a fraction
of the time (no template interpreter, sandbox or per-operation budget: the code is ours, not the request's).

A template's source is matched exactly (its SHA-256): a checkpoint whose template differs by one character
renders through Jinja as before. A native template declines (`DECLINE`) any request outside the shapes it
reproduces, and Jinja renders that one. tests/core/test_native_templates.py renders generated conversations
both ways and requires the same text.
"""

from __future__ import annotations

import hashlib

from tokenfront.core.native_templates.base import DECLINE, Declined, NativeTemplate
from tokenfront.core.native_templates.qwen3 import render_qwen3

__all__ = ["DECLINE", "Declined", "NativeTemplate", "native_template"]

# SHA-256 of the template source -> its native form.
_NATIVE: dict[str, NativeTemplate] = {
    # Qwen3's, as released in Qwen/Qwen3-0.6B's tokenizer_config.json (the qwen3 fixture)
    "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": render_qwen3,
}


def native_template(source: str) -> NativeTemplate | None:
    """The native form of the template with this exact source, if there is one."""
    return _NATIVE.get(hashlib.sha256(source.encode()).hexdigest())

"""What a native template returns when a request is not one it reproduces: `DECLINE` (the Jinja template then
renders it)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["DECLINE", "Declined", "NativeTemplate"]


class Declined(enum.Enum):
    DECLINE = "decline"


DECLINE: Literal[Declined.DECLINE] = Declined.DECLINE

# (messages as the template receives them, tools, add_generation_prompt, the other variables) -> the text.
NativeTemplate = Callable[
    [list[dict[str, Any]], "list[dict[str, Any]] | None", bool, dict[str, Any]], "str | Declined"
]

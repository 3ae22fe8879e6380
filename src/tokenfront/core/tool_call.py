"""One tool call, the value every parser and formatter passes around, and the ids a call is given.

A leaf of the core: `core.tool_calls` (the parsers) and `core.output.harmony` (gpt-oss's channels, which the
Harmony parser reads with) both build on it.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolCall", "make_mistral_tool_call_id", "make_tool_call_id"]


def make_tool_call_id() -> str:
    """A new OpenAI-style tool call id: ``call_`` and 24 lowercase hex characters."""
    return "call_" + secrets.token_hex(12)


_ALPHANUMERIC = string.ascii_letters + string.digits


def make_mistral_tool_call_id() -> str:
    """A new Mistral tool call id: 9 ASCII letters and digits, the only ids mistral-common accepts back."""
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


@dataclass(frozen=True)
class ToolCall:
    """One function call: its name and its arguments as a JSON object string."""

    name: str
    arguments: str
    # Random, so it takes no part in equality.
    id: str = field(default_factory=make_tool_call_id, compare=False)

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` item."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

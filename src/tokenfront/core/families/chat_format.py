"""What a family that builds prompts without a Jinja template provides: a `ChatFormat`, and the `FormattedChat`
it returns (gpt-oss's Harmony, mistral-common). The families' modules and the registry in `core.families`
both import it; it imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tokenfront.protocol import ChatCompletionRequest

__all__ = ["ChatFormat", "FormattedChat"]


@dataclass(frozen=True)
class FormattedChat:
    """A chat prompt built by a `ChatFormat`: its ids, and its text (special tokens spelled out)."""

    token_ids: list[int]
    prompt_text: str


class ChatFormat(Protocol):
    """Builds chat prompts in place of a Jinja chat template (Harmony for gpt-oss, mistral-common)."""

    name: str
    # Whether the mainstream server applies a request's truncate_prompt_tokens to these prompts.
    truncates_prompt: bool

    def render_chat(
        self, request: ChatCompletionRequest, body: Mapping[str, Any], template_kwargs: Mapping[str, Any]
    ) -> FormattedChat:
        """The ids the mainstream servers compute for this request (before truncation); a client mistake
        raises `RenderError` (a 400)."""
        ...

    def fingerprint_component(self) -> dict[str, Any]:
        """The `chat_format` component of the fingerprint: what builds the prompt, and its version."""
        ...

    def tokenizer_components(self) -> tuple[dict[str, Any], list[str]] | None:
        """The tokenizer's part of the fingerprint and why it is incomplete, when the generic one (which reads
        a transformers tokenizer's tokenizer.json) cannot identify this tokenizer; None to use the generic."""
        ...

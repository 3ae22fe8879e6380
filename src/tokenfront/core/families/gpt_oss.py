"""gpt-oss (`model_type` gpt_oss): chat is rendered in the Harmony format, as vLLM 0.33 does, not by a template.

(Stub: the Harmony chat format is being written.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenfront.core.errors import RenderError

if TYPE_CHECKING:
    from tokenfront.core.checkpoint import Checkpoint
    from tokenfront.core.families import FormattedChat
    from tokenfront.protocol import ChatCompletionRequest

MODEL_TYPE = "gpt_oss"


class HarmonyChatFormat:
    """Renders chat requests for gpt-oss with the Harmony encoding."""

    name = "harmony"

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint

    def render_chat(
        self, request: ChatCompletionRequest, body: Mapping[str, Any], template_kwargs: Mapping[str, Any]
    ) -> FormattedChat:
        raise RenderError("gpt-oss chat rendering is not written yet", param="messages")

    def fingerprint_component(self) -> dict[str, Any]:
        return {"name": self.name}

    def tokenizer_components(self) -> tuple[dict[str, Any], list[str]] | None:
        return None

"""Mistral checkpoints in `--tokenizer-mode mistral`: mistral-common's tokenizer and request encoder, as vLLM.

(Stub: the mistral-common chat format is being written.)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenfront.core.errors import CheckpointError, RenderError

if TYPE_CHECKING:
    from tokenfront.core.checkpoint import Checkpoint
    from tokenfront.core.families import FormattedChat
    from tokenfront.protocol import ChatCompletionRequest


def resolve_tokenizer_mode(folder: Path, mode: str) -> str:
    """`hf` or `mistral` for `--tokenizer-mode` `mode` on a tokenizer folder (auto: as vLLM's auto)."""
    if mode == "auto":
        return "hf"
    return mode


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer of a folder in mistral mode."""
    raise CheckpointError("--tokenizer-mode mistral is not written yet")


class MistralChatFormat:
    """Renders chat requests through mistral-common's request validation and encoder."""

    name = "mistral-common"

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint

    def render_chat(
        self, request: ChatCompletionRequest, body: Mapping[str, Any], template_kwargs: Mapping[str, Any]
    ) -> FormattedChat:
        raise RenderError("mistral chat rendering is not written yet", param="messages")

    def fingerprint_component(self) -> dict[str, Any]:
        return {"name": self.name}

    def tokenizer_components(self) -> tuple[dict[str, Any], list[str]] | None:
        return None

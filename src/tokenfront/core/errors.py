"""Errors the render core raises. Each carries a message a person can act on."""

from __future__ import annotations


class TokenfrontError(Exception):
    """Base class of every error tokenfront raises on purpose."""


class CheckpointError(TokenfrontError):
    """A checkpoint, tokenizer or chat template could not be loaded (a start-up problem, not a client's)."""


class RenderError(TokenfrontError):
    """A client request that cannot be rendered: the servers answer it with a 4xx.

    `param` names the request field at fault (OpenAI's error `param`), `code` a stable machine-readable code.
    """

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class UnsupportedContentError(RenderError):
    """Multimodal content (image, audio, video, file parts): not yet supported."""


class TemplateRenderError(RenderError):
    """The chat template refused the request (`raise_exception`) or failed on it."""

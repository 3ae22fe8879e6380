"""The model names a server answers to: the `model` check every route makes, and the `/v1/models` body."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tokenfront.server.errors import model_not_found

__all__ = ["ModelNames", "check_model", "models_body"]

# A provider of the names a server serves now (a router without names of its own serves its workers').
ModelNames = Callable[[], Sequence[str]]


def check_model(model: str | None, served: Sequence[str]) -> None:
    """A 404 `model_not_found` unless `model` is absent (the served model is meant) or one of `served`.

    With no names at all (a router that knows none yet) every name passes: the worker decides.
    """
    if model is None or not served or model in served:
        return
    raise model_not_found(str(model), tuple(served))


def models_body(served: Sequence[str], created: int) -> dict[str, Any]:
    """OpenAI's `GET /v1/models` answer."""
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "tokenfront", "root": name}
            for name in served
        ],
    }

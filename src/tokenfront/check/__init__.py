"""`tokenfront check`: does every worker render requests into the same ids as the renderer?

What an operator runs before adding a worker. A client of the servers' HTTP APIs only (httpx; never torch, never
a model): `fetch` reads each server's `/server_info` and its `POST /tokenize` answers to the probe corpus,
`compare` judges each worker against the renderer, `report` prints the table or the JSON.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenfront.check.compare import Verdict
    from tokenfront.check.run import (
        EXIT_AGREE,
        EXIT_DIFFER,
        EXIT_INCOMPLETE,
        CheckSettings,
        exit_code,
        run_check,
    )

__all__ = [
    "EXIT_AGREE",
    "EXIT_DIFFER",
    "EXIT_INCOMPLETE",
    "CheckSettings",
    "Verdict",
    "exit_code",
    "run_check",
]

# Loaded on first use: the CLI imports `check.command` (its parser) for every command, and a renderer starting
# up must not import the HTTP client this package runs on.
_LAZY = {**dict.fromkeys(__all__, "tokenfront.check.run"), "Verdict": "tokenfront.check.compare"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tokenfront.check' has no attribute {name!r}")

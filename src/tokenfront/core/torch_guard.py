"""Keep torch out of CPU-only processes (the renderer and the router).

transformers imports torch as soon as it finds it installed (configuration classes pull in its RoPE
utilities), which costs a second of start-up and hundreds of MB for a process that never runs a model.
A `None` entry in `sys.modules` makes `importlib.util.find_spec("torch")` answer "not installed", so
transformers takes its torch-free paths, and any stray `import torch` fails loudly instead of loading it.

transformers then warns on import that "PyTorch was not found. Models won't be available ...": alarming, and
wrong where torch is installed, for a process that hides it on purpose (and no news where it is not).
`hide_torch` drops that one warning, whatever logging setup comes later.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["hide_torch"]

# The start of transformers' warning when it finds no torch (transformers/__init__.py).
_TORCH_ABSENCE_WARNING = "PyTorch was not found"


class _NoTorchAbsenceWarning(logging.Filter):
    """Drops transformers' "PyTorch was not found" warning; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _TORCH_ABSENCE_WARNING not in record.getMessage()


def hide_torch() -> bool:
    """Make torch look absent to this process, without transformers' warning about it; False when it is too
    late (torch is already imported)."""
    _silence_torch_absence_warning()
    if sys.modules.get("torch") is not None:
        return False
    sys.modules["torch"] = None  # type: ignore[assignment]
    return True


def _silence_torch_absence_warning() -> None:
    # On the logger transformers writes it to: a filter there holds whatever handlers are added later.
    logger = logging.getLogger("transformers")
    if not any(isinstance(existing, _NoTorchAbsenceWarning) for existing in logger.filters):
        logger.addFilter(_NoTorchAbsenceWarning())

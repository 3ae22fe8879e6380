"""Keep torch out of CPU-only processes (the renderer and the router).

transformers imports torch as soon as it finds it installed (configuration classes pull in its RoPE
utilities), which costs a second of start-up and hundreds of MB for a process that never runs a model.
A `None` entry in `sys.modules` makes `importlib.util.find_spec("torch")` answer "not installed", so
transformers takes its torch-free paths, and any stray `import torch` fails loudly instead of loading it.
"""

from __future__ import annotations

import sys


def hide_torch() -> bool:
    """Make torch look absent to this process; False when it is too late (torch is already imported)."""
    if sys.modules.get("torch") is not None:
        return False
    sys.modules["torch"] = None  # type: ignore[assignment]
    return True

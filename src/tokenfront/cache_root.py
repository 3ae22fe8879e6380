"""Where tokenfront keeps what it fetches or derives once: ``$TOKENFRONT_CACHE``, else ``~/.cache/tokenfront``.

The fixtures (downloads, checkpoints, templates: `tokenfront.fixtures`) and gpt-oss's Harmony vocabulary
(`tokenfront.core.families.gpt_oss`) live under it. A leaf module, so that the core, which must not import
the fixtures, reads the same root.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """The cache root: ``$TOKENFRONT_CACHE`` if set, else ``~/.cache/tokenfront``."""
    env = os.environ.get("TOKENFRONT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tokenfront"

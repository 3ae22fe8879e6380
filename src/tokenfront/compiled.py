"""Which of the package's modules run compiled: the wheel's mypyc extensions (setup.py), found beside their source."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def compiled_modules(package: Path = PACKAGE) -> list[str]:
    """The dotted names of a tokenfront package folder's modules that are C extension modules (none in a pure
    build): this installed package's by default, or a source tree's compiled in place (benchmarks)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = []
    for path in sorted(package.rglob("*")):
        suffix = next((suffix for suffix in suffixes if path.name.endswith(suffix)), None)
        if suffix is not None:
            stem = path.name[: -len(suffix)]
            found.append(".".join(["tokenfront", *path.parent.relative_to(package).parts, stem]))
    return found


def describe() -> str:
    """One line for `tokenfront --version`: how many modules are compiled, or that none is."""
    modules = compiled_modules()
    if not modules:
        return "pure Python: no module compiled"
    return f"{len(modules)} modules compiled by mypyc: " + ", ".join(
        name.removeprefix("tokenfront.") for name in modules
    )

"""Which tokenfront the tests import: the built wheel in site-packages (`make install-test`), or src/ (editable)."""

from __future__ import annotations

from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src" / "tokenfront"


def installed_package() -> Path:
    """The folder `import tokenfront` loads from: site-packages for the built wheel, src/ when editable."""
    import tokenfront

    return Path(tokenfront.__file__).resolve().parent


def stale_files() -> list[str]:
    """The package's files whose installed copy differs from src/ (missing there, or left from older source)."""
    installed = installed_package()
    if installed == SOURCE:
        return []
    stale = []
    for path in sorted(SOURCE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            copy = installed / path.relative_to(SOURCE)
            if not copy.is_file() or copy.read_bytes() != path.read_bytes():
                stale.append(str(path.relative_to(SOURCE.parent)))
    stale += [
        f"{path.relative_to(installed.parent)} (no longer in src/)"
        for path in sorted(installed.rglob("*.py"))
        if not (SOURCE / path.relative_to(installed)).is_file()
    ]
    return stale

"""The import layering, checked statically (the run-time check is tests/renderer/test_no_torch.py).

Every `import` in the package is read with `ast` (inside functions too: a lazy import is still an import):

- `core/` knows no HTTP and no torch: no web framework, no server package of tokenfront;
- the renderer and the router never import torch or the worker (torch is the worker's optional extra);
- `server/` (what every server shares) imports no face: not renderer, worker or router;
- `check/` and `client/` are clients of the servers: no torch, no server code (and the client no core).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "tokenfront"
WEB = ("fastapi", "starlette", "uvicorn", "httpx", "uvloop", "httptools")
FACES = ("tokenfront.server", "tokenfront.renderer", "tokenfront.worker", "tokenfront.router")

# package folder -> module prefixes its files must not import
RULES: dict[str, tuple[str, ...]] = {
    "core": ("torch", *WEB, *FACES, "tokenfront.cli"),
    "renderer": ("torch", "tokenfront.worker", "tokenfront.router", "tokenfront.cli"),
    "router": ("torch", "tokenfront.worker", "tokenfront.cli"),
    "server": ("torch", "tokenfront.renderer", "tokenfront.worker", "tokenfront.router", "tokenfront.cli"),
    # `tokenfront check` is a client of the servers: it reads the core's fingerprint, never a server's code.
    "check": ("torch", *FACES, "tokenfront.cli"),
    # The Python client is httpx and orjson only: importing it must not pull in the core or a server.
    "client": ("torch", "fastapi", "starlette", "uvicorn", *FACES, "tokenfront.core", "tokenfront.cli"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, relative imports resolved against the package."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    return _imports_of(path.read_text(encoding="utf-8"), package)


def _imports_of(text: str, package: str) -> list[tuple[int, str]]:
    tree = ast.parse(text)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.append((node.lineno, module))
    return found


def _forbidden(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("folder", sorted(RULES))
def test_layer_imports(folder: str) -> None:
    files = sorted((PACKAGE / folder).rglob("*.py"))
    assert len(files) >= 3, f"{folder}/ has only {len(files)} files: is the path right?"
    violations = [
        f"{path.relative_to(PACKAGE)}:{line} imports {module}"
        for path in files
        for line, module in _imports(path)
        if _forbidden(module, RULES[folder])
    ]
    assert violations == []


def test_the_checker_sees_violations() -> None:
    """The rule reads what it should: a torch import inside a function, a relative import of a face."""
    text = "def f():\n    import torch\n\nfrom ..worker import engine\nfrom . import render\n"
    modules = [module for _, module in _imports_of(text, "tokenfront.core")]
    assert modules == ["tokenfront.worker", "tokenfront.core", "torch"]  # ast.walk is breadth first
    assert [m for m in modules if _forbidden(m, RULES["core"])] == ["tokenfront.worker", "torch"]

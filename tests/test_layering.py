"""The import layering, checked statically (the run-time check is tests/renderer/test_no_torch.py).

Every `import` in the package is read with `ast` (inside functions too: a lazy import is still an import):

- `core/` knows no HTTP and no torch: no web framework, no server package of tokenfront;
- the renderer and the router never import torch or the worker (torch is the worker's optional extra);
- `server/` (what every server shares) imports no face: not renderer, worker or router;
- `check/` and `client/` are clients of the servers: no torch, no server code (and the client no core);
- no import cycle anywhere in the package: a lazy import counts, importing `a.b.c` counts as importing the
  packages `a.b` and `a` too (their `__init__` runs first), an import under `if TYPE_CHECKING:` does not.
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(text: str, name: str, modules: set[str], *, package: bool = False) -> set[str]:
    """The package's modules the module `name` (source `text`; `package`: an `__init__`) imports when it runs
    (lazily included; type-checking imports left out), with the packages each import runs first."""
    tree = ast.parse(text)
    package_name = name if package else name.rpartition(".")[0]
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    named: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            ((_, base),) = _imports_of(ast.unparse(node), package_name)
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    found: set[str] = set()
    for module in named:
        parts = module.split(".")
        for end in range(2, len(parts) + 1):  # tokenfront.x, tokenfront.x.y, ...: each package's __init__
            prefix = ".".join(parts[:end])
            if prefix in modules and not name.startswith(prefix + "."):
                found.add(prefix)
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(path) for path in files}
    graph = {
        _module_name(path): _runtime_imports(
            path.read_text(encoding="utf-8"), _module_name(path), modules, package=path.name == "__init__.py"
        )
        for path in files
    }
    assert len(graph) >= 120, f"only {len(graph)} modules read: is the path right?"
    assert sum(map(len, graph.values())) >= 300  # the edges are there to find cycles in
    assert _cycles(graph) == []


def test_the_cycle_check_sees_cycles() -> None:
    """A loop is found (and only the loop); a lazy import counts, with the package whose __init__ it runs; an
    import for type checking does not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [["a", "b", "c"]]
    modules = {
        "tokenfront",
        "tokenfront.core",
        "tokenfront.core.output",
        "tokenfront.core.output.harmony",
        "tokenfront.core.tool_calls",
        "tokenfront.server",
        "tokenfront.server.app",
    }
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from tokenfront.server.app import TokenfrontApp\n"
        "def parse():\n    from tokenfront.core.output.harmony import parse_harmony\n"
    )
    found = _runtime_imports(text, "tokenfront.core.tool_calls", modules)
    assert found == {"tokenfront.core.output", "tokenfront.core.output.harmony"}

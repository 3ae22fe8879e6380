"""No test or benchmark reaches a private name of tokenfront: a seam a test needs is a public name, with a
docstring, in the module that owns it.

Every ``*.py`` under tests/ and benchmarks/ is read with `ast` (and so is every string in it that parses as a
program importing tokenfront: the scripts tests run with ``python -c``). What is checked, statically:

- ``from tokenfront.x import _y`` and ``import tokenfront.x._y`` / ``from tokenfront.x._y import z`` (a private
  module), lazy imports inside functions included;
- ``alias._y``, and ``alias.a.b._y`` further down, where ``alias`` was bound by ``import tokenfront...``
  (``import tokenfront.x as alias``, or ``tokenfront`` itself) or by ``from tokenfront.x import alias`` (a
  module, class or function of tokenfront);
- ``setattr`` / ``getattr`` / ``hasattr`` / ``delattr`` and ``monkeypatch.setattr`` / ``delattr`` with such an
  alias and a private attribute name as a string, and ``monkeypatch.setattr("tokenfront.x._y", ...)`` or
  ``mock.patch("tokenfront.x._y")`` with the target as a dotted string.

A name assigned what calling such a name returns counts as tokenfront's too (``index = KvIndex()``,
``deferred = backend_for(...)``, ``with Server(...) as server``), and so on from it, to a fixed point.

Its reach: names, not values. A name is tokenfront's anywhere in its file once bound so (no scopes: a name
reused for something else is checked too); an object reached otherwise (a fixture's argument, an item of a
list, what a test helper returns) is not followed. Private attributes of other libraries' objects that
tokenfront hands out are listed in ``THIRD_PARTY`` (argparse's parser, transformers' tokenizers). The one
exception for tokenfront is written down in ``OPEN_PRIVATE_MODULES``: the Python client keeps httpx's layout
of private modules (``_client``, ``_models``, ``_exceptions``, ``_streaming``) on purpose, and its own tests
import the public names of those modules (never a private one).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("tests", "benchmarks")
PACKAGE = "tokenfront"
# Private module -> the test folder whose files may import its public names (never a private one).
OPEN_PRIVATE_MODULES = {
    "tokenfront.client._client": "tests/client/",
    "tokenfront.client._exceptions": "tests/client/",
    "tokenfront.client._models": "tests/client/",
    "tokenfront.client._streaming": "tests/client/",
}
# Private attributes of other libraries' objects that tokenfront hands out (the end of the access -> whose).
THIRD_PARTY = {
    "tokenizer._tokenizer": "a transformers fast tokenizer's Rust tokenizer (RenderPipeline.tokenizer)",
    "_tokenizer_path": "transformers' MistralCommonBackend (core.families.mistral.load_tokenizer)",
    "_actions": "argparse's parser (cli.build_parser)",
    "_option_string_actions": "argparse's parser (cli.build_parser)",
}
_ATTRIBUTE_FUNCTIONS = {"setattr", "getattr", "hasattr", "delattr"}
_PATCHERS = {"setattr", "delattr", "patch", "object"}  # monkeypatch.setattr, mock.patch, mock.patch.object


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _private_module(module: str) -> str | None:
    """The first private package or module named in a dotted ``module`` path, as the dotted path up to it."""
    parts = module.split(".")
    for end, part in enumerate(parts, 1):
        if _private(part):
            return ".".join(parts[:end])
    return None


@dataclass
class Report:
    """What the check saw: the places it flagged, and how much it looked at."""

    found: list[str] = field(default_factory=list)
    files: int = 0
    programs: int = 0  # code strings checked besides the files
    imports: int = 0  # imports of tokenfront read
    accesses: int = 0  # attribute accesses on a name bound to tokenfront


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything not rooted in a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _aliases(tree: ast.AST, where: str, report: Report, *, open_modules: set[str]) -> set[str]:
    """The names bound to tokenfront's modules or objects in ``tree``; flags private imports on the way."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _ours(alias.name):
                    continue
                report.imports += 1
                private = _private_module(alias.name)
                if private is not None and private not in open_modules:
                    report.found.append(f"{where}:{node.lineno} imports {alias.name}")
                aliases.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _ours(node.module):
            report.imports += 1
            private = _private_module(node.module)
            if private is not None and private not in open_modules:
                report.found.append(f"{where}:{node.lineno} imports from {node.module}")
            for alias in node.names:
                if _private(alias.name):
                    report.found.append(f"{where}:{node.lineno} imports {node.module}.{alias.name}")
                elif alias.name != "*":
                    aliases.add(alias.asname or alias.name)
    return aliases


def _made_by(tree: ast.AST, aliases: set[str]) -> set[str]:
    """The names assigned the result of calling one of ``aliases`` (``index = KvIndex()``, ``cache =
    kv_cache.PrefixKvCache(...)``, ``with Server(...) as server``), and of calling those, to a fixed point."""
    made: set[str] = set()
    while True:
        known = aliases | made
        found = set(made)
        for node in ast.walk(tree):
            pairs: list[tuple[ast.expr | None, ast.expr | None]] = []
            if isinstance(node, ast.Assign):
                pairs = [(target, node.value) for target in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)):
                pairs = [(node.target, node.value)]
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                pairs = [(item.optional_vars, item.context_expr) for item in node.items]
            for target, value in pairs:
                if isinstance(value, ast.Await):
                    value = value.value
                if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
                    continue
                chain = _chain(value.func)
                if chain is not None and chain[0] in known:
                    found.add(target.id)
        if found == made:
            return made
        made = found


def _check_program(text: str, where: str, report: Report, *, open_modules: set[str]) -> None:
    tree = ast.parse(text)
    aliases = _aliases(tree, where, report, open_modules=open_modules)
    aliases |= _made_by(tree, aliases)
    # `a.b._c` is one access: only the outermost attribute of a chain is read (its inner ones are its prefix).
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain = _chain(node)
            if chain is None or chain[0] not in aliases:
                continue
            report.accesses += 1
            private = next((part for part in chain[1:] if _private(part)), None)
            if private is None:
                continue
            shown = ".".join(chain[: chain.index(private) + 1])
            if not any(shown.endswith("." + tail) for tail in THIRD_PARTY):
                report.found.append(f"{where}:{node.lineno} uses {shown}")
        elif isinstance(node, ast.Call):
            _check_call(node, aliases, where, report)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            _check_embedded(node, where, report, open_modules=open_modules)


def _check_call(node: ast.Call, aliases: set[str], where: str, report: Report) -> None:
    """``setattr(alias, "_x", ...)`` and its kin; ``monkeypatch.setattr("tokenfront.x._y", ...)``."""
    function = node.func
    name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
    args = node.args
    if name in _ATTRIBUTE_FUNCTIONS | _PATCHERS and len(args) >= 2:
        target, attribute = _chain(args[0]), args[1]
        if (
            target is not None
            and target[0] in aliases
            and isinstance(attribute, ast.Constant)
            and isinstance(attribute.value, str)
            and _private(attribute.value)
        ):
            report.accesses += 1
            report.found.append(f"{where}:{node.lineno} {name}({'.'.join(target)}, {attribute.value!r})")
    if name in _PATCHERS and args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        dotted = args[0].value
        if _ours(dotted) and any(_private(part) for part in dotted.split(".")):
            report.found.append(f"{where}:{node.lineno} {name}({dotted!r})")


def _check_embedded(node: ast.Constant, where: str, report: Report, *, open_modules: set[str]) -> None:
    """A string that is a program importing tokenfront (a ``python -c`` script) is checked like a file."""
    text = node.value
    assert isinstance(text, str)
    if PACKAGE not in text or "import" not in text or "\n" not in text.strip():
        return
    try:
        ast.parse(text)
    except SyntaxError:
        return
    report.programs += 1
    _check_program(text, f"{where}:{node.lineno} (program)", report, open_modules=open_modules)


def check_text(text: str, where: str, report: Report | None = None) -> Report:
    """Check one file's source; ``where`` is its path relative to the repository (it selects open modules)."""
    report = report if report is not None else Report()
    open_modules = {module for module, folder in OPEN_PRIVATE_MODULES.items() if where.startswith(folder)}
    report.files += 1
    first = len(report.found)
    _check_program(text, where, report, open_modules=open_modules)
    # In line order (the tree is walked breadth first).
    report.found[first:] = sorted(
        report.found[first:], key=lambda place: int(place[len(where) + 1 :].split()[0])
    )
    return report


def test_no_test_or_benchmark_uses_a_private_name_of_tokenfront() -> None:
    report = Report()
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # this file: its planted cases below are there to be found
            check_text(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), report)
    # The check reads what it should: every file, their imports of tokenfront and the accesses through them.
    assert report.files >= 150 and report.imports >= 300 and report.accesses >= 1000, report
    assert report.programs >= 5, report  # the `python -c` scripts
    assert report.found == []


PLANTED = '''
import tokenfront.core._hidden
from tokenfront.core.segmented_encoder import _clean, split_clean_tokens
from tokenfront import fixtures
from tokenfront.client._models import RenderedChat
import tokenfront.worker.guided as guided


def uses(monkeypatch, helpers, pipeline):
    decoding = guided.GuidedDecoding(None, 10)
    fixtures._run([])
    guided.GuidedDecoding._cache.clear()
    monkeypatch.setattr(fixtures, "_lock", None)
    monkeypatch.setattr("tokenfront.core.templates._compile_cached", None)
    helpers._root_conftest(), pipeline._tokenizer, split_clean_tokens([], []), fixtures.ensure_checkpoint("x")
    decoding._cache.clear()
    return fixtures.__doc__, RenderedChat, decoding.pipeline.tokenizer._tokenizer


SCRIPT = """
import sys
from tokenfront import cli
cli._start_tracing(None, sys.argv[1])
"""
'''


def test_the_checker_sees_each_kind_of_private_use() -> None:
    report = check_text(PLANTED, "tests/planted.py")
    assert report.found == [
        "tests/planted.py:2 imports tokenfront.core._hidden",
        "tests/planted.py:3 imports tokenfront.core.segmented_encoder._clean",
        "tests/planted.py:5 imports from tokenfront.client._models",
        "tests/planted.py:11 uses fixtures._run",
        "tests/planted.py:12 uses guided.GuidedDecoding._cache",
        "tests/planted.py:13 setattr(fixtures, '_lock')",
        "tests/planted.py:14 setattr('tokenfront.core.templates._compile_cached')",
        "tests/planted.py:16 uses decoding._cache",
        "tests/planted.py:20 (program):4 uses cli._start_tracing",
    ]
    # Not ours, or not followed: a test's own helper module, a fixture's attribute, a dunder, a public name, a
    # transformers tokenizer's private attribute.
    assert report.files == 1 and report.programs == 1
    # The client's own tests may import the public names of its private modules, and nothing private.
    client = check_text(PLANTED, "tests/client/planted.py")
    assert "tests/client/planted.py:5 imports from tokenfront.client._models" not in client.found
    assert len(client.found) == len(report.found) - 1
    private_of_client = check_text("from tokenfront.client._models import _Rendered\n", "tests/client/x.py")
    assert private_of_client.found == ["tests/client/x.py:1 imports tokenfront.client._models._Rendered"]

"""The pages agree with the code and with each other (README.md, CHANGELOG.md, docs/*.md, the commands' --help).

What a machine can check, beside the links (tests/test_docs_links.py), the reference tables
(tests/test_docs_reference.py) and the manifests' flags (tests/test_deploy.py):

- every commit label a page writes (a short hash, 7 hex digits) names a commit in this checkout's history;
- every `--flag` a page gives a `tokenfront COMMAND` exists in that command's parser, and every other `--flag`
  a page names belongs to some tokenfront command, to a benchmark script, or to a named other program;
- no command's `--help` names a flag the command lacks (unless the text says whose it is), and `fixtures
  --only` parses the way its help says;
- architecture.md's layout lists every top-level module, every package folder and every page of docs/;
- the renderer manifest requests at least the memory benchmarks.md measured;
- one supported Python range: requires-python, the README, the Dockerfiles and mypy's target say the same.

No model is loaded: the parser is built in-process (`tokenfront.cli.build_parser`, what `--help` prints).
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.specifiers import SpecifierSet

from tokenfront.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
PACKAGE = ROOT / "src" / "tokenfront"

# A long option as pages and help texts write it; `--sim-*` (a family of flags) is not one.
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w*-])")

# Flags the pages name that belong to other programs, each said so where it is named.
FOREIGN_FLAGS = {
    # vLLM's `vllm serve` (docs/vllm.md, operations.md, fingerprint.md)
    "--block-size": "vllm",
    "--chat-template-content-format": "vllm",
    "--enable-auto-tool-choice": "vllm",
    "--enable-scale-out": "vllm",
    "--generation-config": "vllm",
    "--kv-events-config": "vllm",
    "--max-model-len": "vllm",
    "--override-generation-config": "vllm",
    "--revision": "vllm",
    "--tokens-only": "vllm",
    "--trust-request-chat-template": "vllm",
    # pip (the README's install commands), docker, kubectl, curl, jq
    "--quiet": "pip install",
    "--no-deps": "pip wheel",
    "--inplace": "setup.py build_ext",
    "--follow-imports": "mypyc",
    "--check": "ruff format",
    "--index-url": "pip install",
    "--build-arg": "docker build",
    "--ulimit": "docker run",
    "--from-literal": "kubectl create secret",
    "--cacert": "curl",
    "--slurpfile": "jq",
    # chromium, as the inspector's browser test starts it (docs/inspector.md)
    "--disable-background-networking": "chromium",
    "--disable-component-update": "chromium",
    "--disable-gpu": "chromium",
    "--disable-quic": "chromium",
    "--disable-sync": "chromium",
    "--headless": "chromium",
    "--no-first-run": "chromium",
    "--no-sandbox": "chromium",
}

# Flags a command's --help names although the command lacks them, because the text says whose they are.
HELP_CROSS_REFERENCES = {
    "check": {"--trust-remote-code"},  # "a server started with --trust-remote-code"
    "simulate": {"--engine"},  # "as `tokenfront serve --engine simulated` runs one"
    "serve": {
        "--kv-events-config",
        "--worker",
    },  # "as vLLM's --kv-events-config", "a router ... with --worker"
}


# -- the pages ---------------------------------------------------------------------------------------------------


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _where(page: Path, line: int) -> str:
    return f"{page.relative_to(ROOT)}:{line}"


# -- commit labels -----------------------------------------------------------------------------------------------

# Seven hex digits with a letter and a digit among them (a word such as `defaced` has no digit, a number no
# letter); a seven-digit number counts only where the text calls it a commit. Longer hex runs are digests.
_HEX7 = re.compile(r"(?<![\w/.#-])([0-9a-f]{7})(?![\w/-])")
_NAMED_COMMIT = re.compile(r"\bcommit(?:s|ted as)?\s+`?$")


def commit_labels(text: str) -> list[tuple[int, str]]:
    """(line, label) for every commit label in a page's text."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _HEX7.finditer(line):
            label = match.group(1)
            mixed = re.search(r"[a-f]", label) and re.search(r"[0-9]", label)
            if mixed or _NAMED_COMMIT.search(line[: match.start()]):
                found.append((number, label))
    return found


@functools.cache
def history() -> tuple[str, ...]:
    """Every commit reachable from HEAD, full hashes (skips the test when this is not a git checkout)."""
    try:
        result = subprocess.run(
            ["git", "-C", str(ROOT), "rev-list", "HEAD"], capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError:
        pytest.skip("no git executable: the commit labels cannot be looked up")
    if result.returncode != 0:
        pytest.skip(
            f"{ROOT} is not a git checkout ({result.stderr.strip()}): no history to look labels up in"
        )
    return tuple(result.stdout.split())


def in_history(label: str) -> bool:
    return any(commit.startswith(label) for commit in history())


def test_the_label_finder_sees_labels_and_nothing_else() -> None:
    text = "\n".join(
        [
            "measured on `fe26e49` (2026-12-01), and before it on c40dfd0.",
            "committed as 4273633; the commit 1234567 too; digest 0b7394e6499f and id a26e7b1c0ffee",
            "not labels: 2026-12-01, 8192 tokens, 10,000, facade1x, deadbee, 1234567 tokens, #a0b1c2d",
        ]
    )
    assert [label for _, label in commit_labels(text)] == ["fe26e49", "c40dfd0", "4273633", "1234567"]


def test_every_commit_label_names_a_commit_in_the_history() -> None:
    labels = [(page, line, label) for page in PAGES for line, label in commit_labels(_text(page))]
    missing = [f"{_where(page, line)}: {label}" for page, line, label in labels if not in_history(label)]
    assert missing == [], "commit labels that name no commit of `git rev-list HEAD`"
    # The pages do label their figures: a finder that found nothing would pass vacuously.
    distinct = {label for _, _, label in labels}
    assert len(labels) >= 60 and len(distinct) >= 25, (len(labels), sorted(distinct))
    assert {"fe26e49", "a07ab23", "3e7b287"} <= distinct
    assert len(history()) >= 100
    assert not in_history("0000000")  # the lookup can say no


# -- flags -------------------------------------------------------------------------------------------------------


@functools.cache
def command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


@functools.cache
def command_flags() -> dict[str, frozenset[str]]:
    """Each command's long options, exactly as its parser accepts them."""
    return {
        name: frozenset(flag for flag in parser._option_string_actions if flag.startswith("--"))
        for name, parser in command_parsers().items()
    }


@functools.cache
def benchmark_flags() -> frozenset[str]:
    """Every quoted `--flag` of the benchmark scripts (their argparse options)."""
    flags: set[str] = set()
    for path in (ROOT / "benchmarks").rglob("*.py"):
        flags |= set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", path.read_text(encoding="utf-8")))
    return frozenset(flags)


@dataclass(frozen=True)
class Invocation:
    """`tokenfront COMMAND ...` as a page writes it, up to the end of the command (a pipe, `&&`, `;`, `#`)."""

    page: Path
    line: int
    command: str
    flags: tuple[str, ...]


_FENCE = re.compile(r"^\s*(```|~~~)")
_SPAN = re.compile(r"(`+)(.+?)\1")
_INVOKE = re.compile(r"(?<![\w/.-])tokenfront\s+([a-z]+)\b(.*)")
_COMMAND_END = re.compile(r"\s(?:\||&&|;|#)\s|\)|$")


def _invocation(page: Path, line: int, text: str) -> Invocation | None:
    match = _INVOKE.search(text)
    if match is None or match.group(1) not in command_flags():
        return None
    rest = match.group(2)
    rest = rest[: _COMMAND_END.search(rest).start()]  # type: ignore[union-attr]
    return Invocation(page, line, match.group(1), tuple(FLAG.findall(rest)))


def invocations(page: Path) -> list[Invocation]:
    """Every `tokenfront COMMAND` with its flags: in fenced blocks (a `\\` continues the line) and code spans."""
    found: list[Invocation] = []
    lines = _text(page).splitlines()
    fenced = False
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            start = number
            while line.endswith("\\") and number < len(lines):
                line = line[:-1] + " " + lines[number]
                number += 1
            if (invocation := _invocation(page, start, line)) is not None:
                found.append(invocation)
        else:
            for span in _SPAN.finditer(line):
                if (invocation := _invocation(page, number, span.group(2))) is not None:
                    found.append(invocation)
    return found


def test_the_invocation_reader_reads_commands_and_stops_where_they_end(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "\n".join(
            [
                "Run `tokenfront route --worker URL --policy round_robin` or `tokenfront serve`; not `tokenfront x`.",
                "```sh",
                "tokenfront render --model /m \\",
                "  --port 8100 | tee log --no-such-flag",
                "pip install tokenfront --quiet",
                "```",
            ]
        ),
        encoding="utf-8",
    )
    found = [(i.line, i.command, i.flags) for i in invocations(page)]
    assert found == [
        (1, "route", ("--worker", "--policy")),
        (1, "serve", ()),
        (3, "render", ("--model", "--port")),
    ]


def test_every_flag_given_to_a_tokenfront_command_exists_in_its_parser() -> None:
    flags = command_flags()
    found = [invocation for page in PAGES for invocation in invocations(page)]
    wrong = [
        f"{_where(i.page, i.line)}: `tokenfront {i.command}` has no {flag}"
        for i in found
        for flag in i.flags
        if flag not in flags[i.command]
    ]
    assert wrong == []
    checked = sum(len(i.flags) for i in found)
    by_command = {command: sum(1 for i in found if i.command == command) for command in flags}
    assert len(found) >= 100 and checked >= 80, (len(found), checked, by_command)
    assert all(by_command[command] >= 1 for command in ("render", "serve", "route", "check", "fixtures")), (
        by_command
    )


def test_every_flag_the_pages_name_belongs_to_something() -> None:
    ours = frozenset().union(*command_flags().values()) | {"--version"}
    unknown = []
    named = 0
    for page in PAGES:
        for number, line in enumerate(_text(page).splitlines(), start=1):
            for flag in FLAG.findall(line):
                named += 1
                if flag not in ours and flag not in benchmark_flags() and flag not in FOREIGN_FLAGS:
                    unknown.append(f"{_where(page, number)}: {flag}")
    assert unknown == [], "flags no tokenfront command, benchmark script or listed program has"
    assert named >= 800, named
    # Each listed program's flag is still named somewhere (a stale entry would hide a wrong flag later).
    text = "\n".join(_text(page) for page in PAGES)
    assert [flag for flag in FOREIGN_FLAGS if flag not in FLAG.findall(text)] == []
    assert [flag for flag in FOREIGN_FLAGS if flag in ours] == []


def test_no_commands_help_names_a_flag_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens: one line per paragraph, whole flags
    flags = command_flags()
    mentioned = {}
    for name, parser in command_parsers().items():
        named = set(FLAG.findall(parser.format_help()))
        mentioned[name] = len(named)
        lacking = named - flags[name] - HELP_CROSS_REFERENCES.get(name, set())
        assert lacking == set(), f"`tokenfront {name} --help` names {sorted(lacking)}, which it does not have"
    assert set(mentioned) == {"render", "serve", "simulate", "route", "check", "fixtures"}
    assert mentioned["fixtures"] >= 5 and mentioned["check"] >= 10 and mentioned["route"] >= 60, mentioned


def test_fixtures_only_parses_as_its_help_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    parser = command_parsers()["fixtures"]
    help_text = " ".join(parser.format_help().split())
    assert "one or more names after --only" in help_text and "--only may be given again" in help_text
    args = build_parser().parse_args(["fixtures", "--only", "qwen3", "tiny-random", "--only", "smollm2"])
    assert args.only == ["qwen3", "tiny-random", "smollm2"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fixtures", "--only", "no-such-fixture"])


# -- the layout --------------------------------------------------------------------------------------------------


def _block_under(text: str, heading: str) -> str:
    """The first fenced block after a heading."""
    rest = text[text.index(heading + "\n") :]
    start = rest.index("```\n") + 4
    return rest[start : rest.index("```", start)]


def _package_entries() -> tuple[list[str], list[str]]:
    """(top-level modules, package folders at any depth) of src/tokenfront, as `name.py` and `name/`."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    folders = sorted(
        f"{p.name}/"
        for p in PACKAGE.rglob("*")
        if p.is_dir() and p.name != "__pycache__" and any(p.iterdir())
    )
    return modules, folders


def test_architecture_layout_lists_every_module_folder_and_page() -> None:
    layout = _block_under(_text(DOCS / "architecture.md"), "## Layout")
    modules, folders = _package_entries()
    pages = sorted(page.name for page in DOCS.glob("*.md"))
    words = set(re.findall(r"[\w.-]+/?", layout))
    missing = [name for name in [*modules, *folders, *pages, "CHANGELOG.md"] if name not in words]
    assert missing == [], "docs/architecture.md's layout does not name these"
    assert len(modules) >= 4 and len(folders) >= 13 and len(pages) >= 16, (modules, folders, pages)


def test_the_readme_layout_lists_every_top_level_entry() -> None:
    layout = _block_under(_text(ROOT / "README.md"), "## Layout")
    modules, _ = _package_entries()
    packages = sorted(f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    words = set(re.findall(r"[\w.-]+/?", layout))
    assert [name for name in [*modules, *packages] if name not in words] == []
    assert len(packages) >= 7, packages


# -- figures and manifests ---------------------------------------------------------------------------------------


def _mib(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


def test_the_renderer_manifest_requests_what_was_measured() -> None:
    text = _text(DOCS / "benchmarks.md")
    section = text[text.index("## Renderer memory\n") :]
    section = section[: section.index("\n## ")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "MB" in line]
    # The RSS column (the second cell) of each row: the steady figures, then the peaks said as such.
    rss = [[int(n) for n in re.findall(r"(\d+) MB", row.split("|")[2])] for row in rows]
    steady = [values[0] for values in rss if values]
    peaks = [value for values in rss for value in values]
    assert len(rows) >= 6 and max(steady) >= 400, rows
    (manifest,) = [
        d
        for d in yaml.safe_load_all(_text(ROOT / "deploy/kubernetes/renderer.yaml"))
        if d["kind"] == "Deployment"
    ]
    resources = manifest["spec"]["template"]["spec"]["containers"][0]["resources"]
    request, limit = _mib(resources["requests"]["memory"]), _mib(resources["limits"]["memory"])
    # The page's MB are MiB, as the manifests' Mi are.
    assert request >= max(steady), (request, steady)
    assert limit >= max(peaks), (limit, peaks)
    assert f"`memory: {resources['requests']['memory']}`" in section
    assert "docs/benchmarks.md#renderer-memory" in _text(ROOT / "deploy/kubernetes/renderer.yaml")


# -- one Python range --------------------------------------------------------------------------------------------


def test_one_supported_python_range() -> None:
    pyproject = tomllib.loads(_text(ROOT / "pyproject.toml"))
    requires = SpecifierSet(pyproject["project"]["requires-python"])
    (minimum,) = [spec.version for spec in requires if spec.operator == ">="]
    assert pyproject["tool"]["mypy"]["python_version"] == minimum
    readme = " ".join(_text(ROOT / "README.md").split())
    assert f'Python {minimum} or newer (`requires-python = ">={minimum}"`' in readme
    assert not re.search(r"Python 3\.\d+\+", readme), "one way of saying the range"
    bases = [
        line.split()[1]
        for dockerfile in sorted((ROOT / "deploy").glob("*.Dockerfile"))
        for line in _text(dockerfile).splitlines()
        if line.startswith("FROM ")
    ]
    assert len(bases) == 4 and all(base == f"python:{minimum}-slim" for base in bases), bases
    # The suite runs inside the range it claims.
    assert requires.contains(f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}")

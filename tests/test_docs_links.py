"""Every link in README.md, CHANGELOG.md and docs/*.md stays inside the repository and resolves.

A relative link (or image) must name a file or folder that exists under the repository root, and a `#anchor`
must name a heading of its target as GitHub slugs it (lowercase, punctuation dropped, spaces to hyphens, `-1`,
`-2` for repeats). No link may carry a scheme (`https:`, `file:`, `mailto:`): the documentation points at
nothing outside the repository. Code blocks and inline code are not links and are skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HTML = re.compile(r"<(?:a|img)\s[^>]*?\b(?:href|src)\s*=\s*\"([^\"]*)\"", re.IGNORECASE)
_AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]+)>")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Link:
    """One link as written: the page and line it is on, and its target."""

    page: Path
    line: int
    target: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: ({self.target})"


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked out."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, _CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line)))
    return lines


def links_of(page: Path, text: str) -> list[Link]:
    """Every link and image target of a markdown page: inline, reference definitions, HTML, autolinks."""
    found = []
    for number, line in _prose_lines(text):
        targets = [m.group(1) for m in _INLINE.finditer(line)]
        targets += [m.group(1) for m in _REFERENCE.finditer(line)]
        targets += [m.group(1) for m in _HTML.finditer(line)]
        targets += [m.group(1) for m in _AUTOLINK.finditer(line)]
        found += [Link(page, number, target) for target in targets]
    return found


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (link targets and markup dropped), lowercased, every character
    but letters, digits, `_`, `-` and spaces removed, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors_of(text: str) -> set[str]:
    """The anchors of a page's headings (outside code blocks), repeats numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    anchors = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match:
            base = slug(match.group(2))
            anchors.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return anchors


def problem(link: Link) -> str | None:
    """What is wrong with a link (None: it resolves inside the repository)."""
    if _SCHEME.match(link.target) or link.target.startswith("//"):
        return "points outside the repository (a URL): link a file in the repository instead"
    path_part, _, anchor = link.target.partition("#")
    if path_part.startswith("/"):
        target = (ROOT / unquote(path_part).lstrip("/")).resolve()
    elif path_part:
        target = (link.page.parent / unquote(path_part)).resolve()
    else:
        target = link.page
    if not target.is_relative_to(ROOT):
        return f"leaves the repository root ({target})"
    if not target.exists():
        return f"{target.relative_to(ROOT)} does not exist"
    if anchor and target.suffix == ".md":
        if anchor not in anchors_of(target.read_text(encoding="utf-8")):
            return f"{target.relative_to(ROOT)} has no heading with the anchor #{anchor}"
    elif anchor:
        return f"#{anchor} on a file that is not markdown: nothing checks it"
    return None


def _all_links() -> list[Link]:
    return [link for page in PAGES for link in links_of(page, page.read_text(encoding="utf-8"))]


def test_every_link_resolves_inside_the_repository() -> None:
    links = _all_links()
    problems = [f"{link.where()} {why}" for link in links if (why := problem(link)) is not None]
    assert problems == []
    # The pages do link: a parser that found nothing would pass the check above vacuously.
    by_page = Counter(link.page.name for link in links)
    assert len(PAGES) >= 8, [page.name for page in PAGES]
    assert by_page["README.md"] >= 15, by_page
    assert len(links) >= 100, by_page
    assert sum(1 for link in links if "#" in link.target) >= 30


def test_the_readme_links_every_docs_page() -> None:
    readme = ROOT / "README.md"
    linked = {
        (readme.parent / link.target.partition("#")[0]).resolve()
        for link in links_of(readme, readme.read_text(encoding="utf-8"))
        if not _SCHEME.match(link.target)
    }
    docs = PAGES[1:]
    assert [page.name for page in docs if page.resolve() not in linked] == []


def test_the_checker_sees_what_is_wrong(tmp_path: Path) -> None:
    """The parser and the rules on a page with one link of each kind, good and bad."""
    text = "\n".join(
        [
            "# A title: with `code` and punctuation!",
            "## Repeated",
            "## Repeated",
            "See [good](#a-title-with-code-and-punctuation), [second](#repeated-1) and ![img](README.md).",
            "A [bad anchor](#nope), a [URL](https://example.com/x), [up](../outside.md), `[in code](nowhere.md)`.",
            "```",
            "[in a block](nowhere.md)",
            "# not a heading",
            "```",
            '[ref]: docs/missing.md "title"',
            '<img src="README.md"> and <https://example.com>',
        ]
    )
    page = ROOT / "docs" / "page-under-test.md"  # never written: its links resolve from docs/
    links = links_of(page, text)
    assert [link.target for link in links] == [
        "#a-title-with-code-and-punctuation",
        "#repeated-1",
        "README.md",
        "#nope",
        "https://example.com/x",
        "../outside.md",
        "docs/missing.md",
        "README.md",
        "https://example.com",
    ]
    assert anchors_of(text) == {"a-title-with-code-and-punctuation", "repeated", "repeated-1"}
    assert slug("§8 Router") == "8-router"
    assert slug("### `POST /v1/chat/completions/render`".lstrip("# ")) == "post-v1chatcompletionsrender"
    assert slug("Renderers: stateless replicas") == "renderers-stateless-replicas"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("../README.md", None),
        ("../README.md#quick-start", None),
        ("../README.md#no-such-heading", "has no heading"),
        ("architecture.md", None),
        ("images", None),
        ("../../shared/SPEC.md", "leaves the repository root"),
        ("https://example.com", "points outside the repository"),
        ("missing.md", "does not exist"),
        ("../pyproject.toml#x", "not markdown"),
    ],
)
def test_problem_of_one_link(target: str, expected: str | None) -> None:
    why = problem(Link(ROOT / "docs" / "operations.md", 1, target))
    assert why is None if expected is None else (why is not None and expected in why), why

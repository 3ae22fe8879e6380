"""docs/python-api.md's examples run, in order, in one interpreter, and print what the page says they print.

Each ```python block is followed by an optional ```text block: the exact output of that block. The blocks run
in a subprocess (a fresh interpreter, as a reader's would be), separated by a marker line, so one block's
output is compared with its own text block and a failing block is named by its first line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "python-api.md"
_BLOCK = re.compile(r"^```(python|text)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_MARKER = "----- tokenfront python-api block -----"


def examples(page: str) -> list[tuple[str, str | None]]:
    """The page's python blocks, each with the text block right after it (None: its output is not shown)."""
    blocks = [(match[1], match[2]) for match in _BLOCK.finditer(page)]
    pairs: list[tuple[str, str | None]] = []
    for index, (kind, body) in enumerate(blocks):
        if kind == "python":
            after = blocks[index + 1] if index + 1 < len(blocks) else None
            pairs.append((body, after[1] if after is not None and after[0] == "text" else None))
        elif index == 0 or blocks[index - 1][0] != "python":
            raise AssertionError(f"a text block that follows no python block: {body[:60]!r}")
    return pairs


def test_the_page_has_examples_with_outputs() -> None:
    pairs = examples(PAGE.read_text(encoding="utf-8"))
    assert len(pairs) == 8
    assert sum(1 for _, output in pairs if output is not None) == 8


def test_the_examples_print_what_the_page_says(qwen3: Path) -> None:
    # `qwen3` makes sure the fixture is built; the page finds it through `ensure_checkpoint` as a reader would.
    pairs = examples(PAGE.read_text(encoding="utf-8"))
    script = "".join(f"{code}print({_MARKER!r}, flush=True)\n" for code, _ in pairs)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = result.stdout.split(_MARKER + "\n")
    assert outputs[-1] == ""  # everything after the last block's marker: nothing
    assert len(outputs) - 1 == len(pairs)
    compared = 0
    for (code, expected), output in zip(pairs, outputs, strict=False):
        if expected is not None:
            assert output == expected, f"the block starting {code.splitlines()[0]!r} printed:\n{output}"
            compared += 1
    assert compared == 8


@pytest.mark.parametrize(
    "name",
    [
        "AnthropicMessagesRequest",
        "ChatCompletionRequest",
        "CompletionRequest",
        "RenderError",
        "RenderOptions",
        "RenderPipeline",
        "RenderedPrompt",
        "ResponsesRequest",
        "TokenizeRequest",
    ],
)
def test_the_package_exports_the_library(name: str) -> None:
    import tokenfront

    assert name in tokenfront.__all__
    assert getattr(tokenfront, name).__name__ == name

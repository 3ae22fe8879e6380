"""The tokenizer hashes of a fingerprint remembered on disk (core/fingerprint_cache.py): the same fingerprint
whether computed or read back, a bad or unwritable cache never an error, a changed tokenizer never a stale hit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tokenfront import RenderOptions, RenderPipeline
from tokenfront.core import fingerprint_cache


def _fingerprint(folder: Path) -> dict[str, object]:
    return RenderPipeline.load(RenderOptions(model=str(folder))).fingerprint.to_json()


def _remembered(root: Path) -> list[Path]:
    return sorted((root / "fingerprints").glob("*.json"))


def test_read_back_gives_the_computed_fingerprint(
    qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Computed with no usable cache directory (a file where the directory would be): nothing written, no error.
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")
    monkeypatch.setenv("TOKENFRONT_CACHE", str(blocked))
    computed = _fingerprint(qwen3)
    # Computed again into an empty cache, then read back from it.
    root = tmp_path / "cache"
    monkeypatch.setenv("TOKENFRONT_CACHE", str(root))
    first = _fingerprint(qwen3)
    files = _remembered(root)
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert sorted(stored) == ["model", "vocab"]
    assert stored["model"] == computed["compared"]["tokenizer"]["model"]  # type: ignore[index]
    assert stored["vocab"] == computed["compared"]["tokenizer"]["vocab"]  # type: ignore[index]
    second = _fingerprint(qwen3)
    assert first == computed and second == computed
    assert _remembered(root) == files


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b"[1, 2]", b'{"model": "abc", "vocab": "def"}', b'{"model": 1, "vocab": null}'],
)
def test_a_malformed_file_is_computed_again(
    qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("TOKENFRONT_CACHE", str(root))
    expected = _fingerprint(qwen3)
    (path,) = _remembered(root)
    path.write_bytes(content)
    assert fingerprint_cache.read_hashes(path.stem) is None
    assert _fingerprint(qwen3) == expected
    assert json.loads(path.read_text())["model"] == expected["compared"]["tokenizer"]["model"]  # type: ignore[index]


def test_a_changed_tokenizer_is_a_new_entry(
    qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("TOKENFRONT_CACHE", str(root))
    original = _fingerprint(qwen3)
    edited = shutil.copytree(qwen3, tmp_path / "edited")
    spec = json.loads((edited / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    first, second = "hello", "world"
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (edited / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    changed = _fingerprint(edited)
    assert len(_remembered(root)) == 2
    tokenizer, other = original["compared"]["tokenizer"], changed["compared"]["tokenizer"]  # type: ignore[index]
    assert tokenizer["vocab"] != other["vocab"] and tokenizer["model"] != other["model"]
    assert original["digest"] != changed["digest"]
    # And each is read back as itself.
    assert _fingerprint(qwen3) == original and _fingerprint(edited) == changed

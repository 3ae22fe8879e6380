"""The tokenizer hashes of a fingerprint, remembered on disk between starts.

Hashing a tokenizer for its fingerprint (`fingerprint._rust_tokenizer_hashes`: the serialized tokenizer parsed,
checked, sorted and written back canonically) costs ~0.5-1.2 s of CPU for a 150k vocabulary, most of what a
renderer or a router spends before it can compare fingerprints: a router restarted beside its fleet is not ready
until then. The two hashes are a pure function of the serialized tokenizer and of the code that hashes it, so
they are kept under `$TOKENFRONT_CACHE/fingerprints/` (default `~/.cache/tokenfront`), one small JSON file per
tokenizer, named by the sha256 of

- the serialized tokenizer's UTF-8 bytes (what the hashes are computed from; ~20 ms to hash 11 MB),
- the source of `tokenfront.core.fingerprint` (any change to how it hashes is a new name), and
- the `tokenizers` library's version (which serializes the tokenizer and builds its vocabulary).

Reading is best-effort: a missing, unreadable or malformed file is computed again, and a directory that cannot be
written (a read-only filesystem) only means the next start computes too; neither is an error. A value read is
used only if it has the exact shape written (two 64-digit lowercase hex strings). Nothing else is trusted from
the directory: whoever can write it can already change the checkpoint the fingerprint describes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from functools import cache
from pathlib import Path

import orjson

from tokenfront.cache_root import cache_root

__all__ = ["cache_key", "read_hashes", "write_hashes"]

log = logging.getLogger(__name__)

_HEX = re.compile(r"[0-9a-f]{64}")


@cache
def _code_salt() -> bytes:
    """What the hashes depend on besides the tokenizer: the hashing code and the tokenizers library."""
    import tokenizers

    source = (
        Path(__file__).with_name("fingerprint.py").read_bytes()
    )  # read, not imported: it imports this module
    return hashlib.sha256(source + b"\0" + tokenizers.__version__.encode()).digest()


def _directory() -> Path:
    return cache_root() / "fingerprints"


def cache_key(serialized: str) -> str:
    """The file name of a serialized tokenizer's hashes (see the module doc)."""
    return hashlib.sha256(_code_salt() + serialized.encode("utf-8")).hexdigest()


def read_hashes(key: str) -> tuple[str, str] | None:
    """The (model, vocab) hashes remembered under `key`; None when there are none usable."""
    try:
        value = orjson.loads((_directory() / f"{key}.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(value, dict):
        return None
    model, vocab = value.get("model"), value.get("vocab")
    if not (
        isinstance(model, str) and isinstance(vocab, str) and _HEX.fullmatch(model) and _HEX.fullmatch(vocab)
    ):
        return None
    return model, vocab


def write_hashes(key: str, model: str, vocab: str) -> None:
    """Remember the hashes under `key` (atomically: a reader sees the whole file or none); a failure is logged
    at debug level and otherwise ignored."""
    directory = _directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".fingerprint-", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(orjson.dumps({"model": model, "vocab": vocab}))
            os.replace(temporary, directory / f"{key}.json")
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        log.debug("tokenizer hashes not remembered in %s: %s", directory, exc)

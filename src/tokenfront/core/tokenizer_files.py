"""What start-up reads off a loaded tokenizer (transformers', or a `DirectTokenizer` built as transformers builds
one): its class, whether transformers implements it, whether it has a vocabulary, its tokenizer.json (serialized
once, shared by the fast backends and the fingerprint), the file it was built from; and handing the memory
start-up freed back to the system. Read by `core.checkpoint`, `core.tokenization` and `core.fingerprint`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from pathlib import Path
from typing import Any

from tokenfront.core.direct_tokenizer import DirectTokenizer

__all__ = [
    "forget_tokenizer_json",
    "has_rust_model",
    "has_vocabulary",
    "is_library_tokenizer",
    "release_freed_memory",
    "splits_special_tokens",
    "tokenizer_class_name",
    "tokenizer_json",
    "tokenizer_source_file",
]


def tokenizer_class_name(tokenizer: Any) -> str:
    """The transformers class of a tokenizer: its own, or for a `DirectTokenizer` the one transformers builds."""
    return (
        tokenizer.transformers_class if isinstance(tokenizer, DirectTokenizer) else type(tokenizer).__name__
    )


def is_library_tokenizer(tokenizer: Any) -> bool:
    """Whether transformers implements the tokenizer (its own class, or a `DirectTokenizer` built as transformers
    builds that class), rather than code shipped with the checkpoint (--trust-remote-code), which may override
    anything."""
    return isinstance(tokenizer, DirectTokenizer) or type(tokenizer).__module__.startswith("transformers.")


def has_vocabulary(tokenizer: Any) -> bool:
    """Whether the tokenizer has at least one ordinary token (not an added or special one): transformers builds
    a tokenizer with none from a folder without vocabulary files, which encodes every text to no ids."""
    size = getattr(tokenizer, "vocab_size", None)
    if not isinstance(size, int) or size > 1024:  # cheap: only a tiny vocabulary is looked at token by token
        return True
    try:
        vocab = tokenizer.get_vocab()
        special = set(getattr(tokenizer, "all_special_ids", ()))
        decoder = getattr(tokenizer, "added_tokens_decoder", None)
        if isinstance(decoder, dict):
            special.update(decoder)
    except Exception:  # a tokenizer that cannot say: take it as it is
        return True
    return any(token_id not in special for token_id in vocab.values())


# Serialized Rust tokenizers, by transformers tokenizer; see `tokenizer_json`. The lock makes a second thread
# asking meanwhile (the backend build, the fingerprint) wait for the first one's string instead of serializing.
_TOKENIZER_JSON: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], str]] = weakref.WeakKeyDictionary()
_SERIALIZING = threading.Lock()


def tokenizer_json(tokenizer: Any, *, keep: bool = True) -> str | None:
    """`tokenizer._tokenizer.to_str()` (the tokenizer.json transformers actually runs), serialized once.

    Start-up needs it three times (fastokens, a `tokenizers` copy if any, the fingerprint) and each call costs
    tens of ms for a 150k vocabulary. With `keep`, the string stays cached until `forget_tokenizer_json` or
    until the tokenizer is gone; it is taken again if the Rust object was replaced or tokens were added since.
    None when the tokenizer has no Rust model.
    """
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is None:
        return None
    key = (id(rust), len(tokenizer))
    with _SERIALIZING:
        try:
            cached = _TOKENIZER_JSON.get(tokenizer)
        except TypeError:  # not weak-referenceable or not hashable: no cache
            return str(rust.to_str())
        if cached is not None and cached[0] == key:
            return cached[1]
        text = str(rust.to_str())
        if keep:
            _TOKENIZER_JSON[tokenizer] = (key, text)
        return text


def release_freed_memory() -> None:
    """Hand memory freed by start-up (tokenizer.json parsed into Python objects by transformers and by the
    fingerprint: ~100 MB for a 150k vocabulary) back to the system. glibc keeps freed heap pages mapped
    otherwise, so the process's RSS would stay at its start-up peak. A no-op where there is no glibc."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            import ctypes

            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM: Any = None


def forget_tokenizer_json(tokenizer: Any) -> None:
    """Drop the cached serialization (tens of MB) once start-up no longer needs it."""
    with _SERIALIZING, contextlib.suppress(TypeError):  # not weak-referenceable: never cached
        _TOKENIZER_JSON.pop(tokenizer, None)


def tokenizer_source_file(tokenizer: Any) -> Path | None:
    """The file a loaded transformers tokenizer was built from: `tokenizer.json` when its folder has one
    (transformers prefers it), else the vocabulary file it converted (a SentencePiece or tiktoken
    `tokenizer.model`, a `*.tiktoken` file), or mistral-common's `tekken.json` / `tokenizer.model.v*`.
    None when it cannot be told (e.g. a tokenizer built in memory)."""
    mistral_file = getattr(tokenizer, "_tokenizer_path", None)  # MistralCommonBackend
    candidates: list[Path] = [Path(mistral_file)] if isinstance(mistral_file, (str, os.PathLike)) else []
    name_or_path = getattr(tokenizer, "name_or_path", "")
    if name_or_path and Path(name_or_path).is_dir():
        candidates.append(Path(name_or_path) / "tokenizer.json")
    vocab_file = (getattr(tokenizer, "init_kwargs", None) or {}).get("vocab_file")
    if isinstance(vocab_file, (str, os.PathLike)):
        candidates.append(Path(vocab_file))
    return next((path for path in candidates if path.is_file()), None)


def splits_special_tokens(tokenizer: Any) -> bool:
    """Whether the tokenizer reads special tokens out of text as plain text (`split_special_tokens`)."""
    return bool(getattr(tokenizer, "split_special_tokens", False))


def has_rust_model(tokenizer: Any) -> bool:
    """Whether a `tokenizers` model does the tokenizer's encoding (the Rust backends may then stand in for it).
    Classes from outside transformers (--trust-remote-code) may override encoding in Python: used as they are."""
    return getattr(tokenizer, "_tokenizer", None) is not None and is_library_tokenizer(tokenizer)

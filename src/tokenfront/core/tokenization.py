"""Tokenizer backends: the ids of `tokenizer(text, add_special_tokens=...)` from transformers, fast.

The Rust `tokenizers` model that transformers itself drives is called directly, which skips transformers'
Python wrapping; tokenizers without one (slow/SentencePiece-only, tiktoken, custom code) go through transformers.
"""

from __future__ import annotations

from typing import Any, Protocol


class TokenizerBackend(Protocol):
    """Turns text into ids exactly like the transformers tokenizer it was built from."""

    name: str

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...


class RustTokenizersBackend:
    """A private copy of the transformers tokenizer's `tokenizers.Tokenizer`, configured as transformers runs it."""

    name = "tokenizers"

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import Tokenizer

        # A copy: transformers flips `encode_special_tokens` per call on its own instance.
        self._tokenizer = Tokenizer.from_str(tokenizer._tokenizer.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        # Special-token strings in text are parsed as special tokens unless the config says to split them.
        self._tokenizer.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)


class TransformersBackend:
    """The transformers tokenizer itself, for tokenizers that have no Rust model to call directly."""

    name = "transformers"

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def backend_for(tokenizer: Any) -> TokenizerBackend:
    """The fastest backend whose ids equal the transformers tokenizer's."""
    if getattr(tokenizer, "_tokenizer", None) is not None and type(tokenizer).__module__.startswith("transformers."):
        return RustTokenizersBackend(tokenizer)
    return TransformersBackend(tokenizer)

"""Tokenizer backends: the ids of `tokenizer(text, add_special_tokens=...)` from transformers, fast.

Three backends give the same ids by contract:
- `fastokens`: a faster encoder of the same `tokenizer.json`, with a segment cache for chat traffic; used
  only after it agrees with `tokenizers` on a probe set at start-up, and dropped (with a warning) otherwise;
- `tokenizers`: the Rust model transformers itself drives, called directly (skips transformers' wrapping);
- `transformers`: the tokenizer object itself, for tokenizers with no Rust model (slow/SentencePiece-only,
  tiktoken, custom code).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

BackendChoice = Literal["auto", "fastokens", "tokenizers", "transformers"]
SEGMENT_CACHE_BYTES = 64 * 1024 * 1024

# Texts the fast backend must encode exactly like `tokenizers` before it is trusted.
_PROBE_TEXTS = (
    "The capital of France is",
    " leading and trailing spaces  ",
    "line one\nline two\r\n\ttabbed\n\n\n",
    "数字 123 4567 東京タワー café naïve Ünïcödé",
    "emoji 🚀🔥 and ZWJ 👩‍💻, RTL עברית مرحبا",
    "code: def f(x):\n    return x ** 2  # comment",
    "don't I'm you'll WE'VE",
    "a" * 300,
    " ".join(str(i) for i in range(64)),
)


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
        self._tokenizer.encode_special_tokens = _splits_special_tokens(tokenizer)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)


class FastokensBackend:
    """`fastokens` on the same serialized tokenizer, with its segment cache on."""

    name = "fastokens"

    def __init__(self, tokenizer: Any) -> None:
        import fastokens

        self._tokenizer = fastokens.Tokenizer.from_json_str(tokenizer._tokenizer.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._tokenizer.enable_segment_cache(SEGMENT_CACHE_BYTES)
        self._split_special = _splits_special_tokens(tokenizer)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        encoding = self._tokenizer.encode(
            text, add_special_tokens=add_special_tokens, split_special_tokens=self._split_special
        )
        return list(encoding.ids)


class TransformersBackend:
    """The transformers tokenizer itself, for tokenizers that have no Rust model to call directly."""

    name = "transformers"

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _splits_special_tokens(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "split_special_tokens", False))


def _has_rust_model(tokenizer: Any) -> bool:
    # Classes from outside transformers (--trust-remote-code) may override encoding in Python: use them as is.
    return getattr(tokenizer, "_tokenizer", None) is not None and type(tokenizer).__module__.startswith(
        "transformers."
    )


def _probes(tokenizer: Any) -> list[str]:
    special = [str(token) for token in getattr(tokenizer, "all_special_tokens", [])][:8]
    return [*_PROBE_TEXTS, "user text with " + " and ".join(special) + " inside"]


def _agrees(candidate: TokenizerBackend, reference: TokenizerBackend, texts: list[str]) -> str | None:
    for text in texts:
        for add_special in (False, True):
            if candidate.encode(text, add_special_tokens=add_special) != reference.encode(
                text, add_special_tokens=add_special
            ):
                return f"ids differ on {text[:40]!r} (add_special_tokens={add_special})"
    return None


def backend_for(tokenizer: Any, choice: BackendChoice = "auto") -> TokenizerBackend:
    """The fastest backend whose ids equal the transformers tokenizer's (or the one asked for)."""
    if choice == "transformers" or not _has_rust_model(tokenizer):
        if choice not in ("auto", "transformers"):
            log.warning(
                "tokenizer %s has no Rust model: using transformers, not %s", type(tokenizer).__name__, choice
            )
        return TransformersBackend(tokenizer)
    reference = RustTokenizersBackend(tokenizer)
    if choice == "tokenizers":
        return reference
    try:
        fast: TokenizerBackend = FastokensBackend(tokenizer)
    except Exception as exc:  # not installed, or a tokenizer.json feature it does not know
        if choice == "fastokens":
            log.warning("fastokens cannot load this tokenizer (%s); using tokenizers", exc)
        return reference
    problem = _agrees(fast, reference, _probes(tokenizer))
    if problem is not None:
        log.warning("fastokens disagrees with tokenizers (%s); using tokenizers", problem)
        return reference
    return fast

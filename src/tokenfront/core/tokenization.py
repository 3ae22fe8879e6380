"""Tokenizer backends: the ids of `tokenizer(text, add_special_tokens=...)` from transformers, fast.

Three backends give the same ids by contract:
- `fastokens`: a faster encoder of the same `tokenizer.json`; used only after it agrees with the transformers
  tokenizer on a probe set at start-up, and dropped (with a warning) otherwise;
- `tokenizers`: the Rust model transformers itself drives, called directly (skips transformers' wrapping);
- `transformers`: the tokenizer object itself, for tokenizers with no Rust model (slow/SentencePiece-only,
  tiktoken, custom code).

`core.segmented_encoder.SegmentedEncoder` (`backend_for` puts it over `tokenizers`) makes a growing conversation
cost its new text: it cuts a prompt at added tokens where `tokenizers` provably encodes each side on its own,
and keeps the ids of the pieces in a bounded cache. fastokens has the same idea built in (its segment cache),
faster, so it is not layered.

`DeferredBackend` lets a server start without waiting for fastokens' build: the transformers tokenizer (the
reference) encodes until fastokens is built and has passed the probe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from tokenfront.core.segmented_encoder import INCREMENTAL_MIN_CHARS, incremental
from tokenfront.core.tokenizer_files import (
    forget_tokenizer_json,
    has_rust_model,
    release_freed_memory,
    splits_special_tokens,
    tokenizer_json,
)

log = logging.getLogger(__name__)

BackendChoice = Literal["auto", "fastokens", "tokenizers", "transformers"]
SEGMENT_CACHE_BYTES = 64 * 1024 * 1024  # fastokens' own segment cache
# The backends `backend_for` puts under a SegmentedEncoder, and from which text length (measured on growing
# chats: over `tokenizers` the layer wins from ~400 characters, 3x at 2 kB, 11x at 46 kB). Not fastokens:
# its own segment cache keeps the same pieces (the text between added tokens) in Rust, and is faster than
# this layer on top of it at every length measured (0.20 vs 0.27 ms at 46 kB; 0.03 vs 0.05 ms at 2 kB).
_INCREMENTAL_MIN_CHARS = {"tokenizers": INCREMENTAL_MIN_CHARS}

# Texts the fast backend must encode exactly like the transformers tokenizer before it is trusted.
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


def _serialized(tokenizer: Any) -> str:
    text = tokenizer_json(tokenizer)
    if text is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no Rust model to serialise")
    return text


class RustTokenizersBackend:
    """A private copy of the transformers tokenizer's `tokenizers.Tokenizer`, configured as transformers runs it."""

    name = "tokenizers"

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import Tokenizer

        # A copy: transformers flips `encode_special_tokens` per call on its own instance.
        self._tokenizer = Tokenizer.from_str(_serialized(tokenizer))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        # Special-token strings in text are parsed as special tokens unless the config says to split them.
        self._tokenizer.encode_special_tokens = splits_special_tokens(tokenizer)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return _id_list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)


class FastokensBackend:
    """`fastokens` on the same serialized tokenizer, with its segment cache (the ids of the text between added
    tokens, by text, LRU within `segment_cache_bytes`; `0` turns it off; not used with split_special_tokens)."""

    name = "fastokens"

    def __init__(
        self, tokenizer: Any, *, segment_cache_bytes: int = SEGMENT_CACHE_BYTES, low_priority: bool = False
    ) -> None:
        import fastokens

        # Parses and builds without the GIL (~1 s for a 150k vocabulary): start-up hashes the fingerprint meanwhile.
        build = fastokens.Tokenizer.from_json_str
        serialized = _serialized(tokenizer)
        self._tokenizer = _at_low_priority(build, serialized) if low_priority else build(serialized)
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._tokenizer.enable_segment_cache(segment_cache_bytes)
        self._split_special = splits_special_tokens(tokenizer)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        encoding = self._tokenizer.encode(
            text, add_special_tokens=add_special_tokens, split_special_tokens=self._split_special
        )
        return _id_list(encoding.ids)

    def segment_cache_stats(self) -> Any:
        """The segment cache's counters and size, as fastokens reports them (a dict), or None when it is off."""
        return self._tokenizer.segment_cache_stats()


class TransformersBackend:
    """The transformers tokenizer itself, for tokenizers that have no Rust model to call directly."""

    name = "transformers"

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _id_list(ids: Any) -> list[int]:
    # Both Rust encodings build a new list on every `.ids` access: copying it again costs ~15% of a warm encode.
    return ids if type(ids) is list else list(ids)


def _probes(tokenizer: Any) -> list[str]:
    special = [str(token) for token in getattr(tokenizer, "all_special_tokens", [])][:8]
    return [*_PROBE_TEXTS, "user text with " + " and ".join(special) + " inside"]


def first_disagreement(
    candidate: TokenizerBackend, reference: TokenizerBackend, texts: list[str]
) -> str | None:
    """Where ``candidate`` encodes one of ``texts`` differently from ``reference`` (with or without special
    tokens), as a short note; None when they agree on all of them."""
    for text in texts:
        for add_special in (False, True):
            if candidate.encode(text, add_special_tokens=add_special) != reference.encode(
                text, add_special_tokens=add_special
            ):
                return f"ids differ on {text[:40]!r} (add_special_tokens={add_special})"
    return None


def rust_backend(tokenizer: Any, choice: BackendChoice, *, low_priority: bool = False) -> TokenizerBackend:
    """The Rust backend ``choice`` asks for: fastokens when it loads the tokenizer and agrees with transformers
    on the probe texts, else `tokenizers`."""
    if choice == "tokenizers":
        return RustTokenizersBackend(tokenizer)
    try:
        fast = FastokensBackend(tokenizer, low_priority=low_priority)
    except Exception as exc:  # not installed, or a tokenizer.json feature it does not know
        if choice == "fastokens":
            log.warning("fastokens cannot load this tokenizer (%s); using tokenizers", exc)
        return RustTokenizersBackend(tokenizer)
    # The reference is the transformers tokenizer itself (the ids every backend must give): no second Rust
    # copy of the tokenizer is built just to probe.
    problem = first_disagreement(fast, TransformersBackend(tokenizer), _probes(tokenizer))
    if problem is not None:
        log.warning("fastokens disagrees with transformers (%s); using tokenizers", problem)
        return RustTokenizersBackend(tokenizer)
    return fast


def _built_backend(
    tokenizer: Any, choice: BackendChoice, incremental_encoding: bool, *, low_priority: bool = False
) -> TokenizerBackend:
    try:
        base = rust_backend(tokenizer, choice, low_priority=low_priority)
    finally:
        forget_tokenizer_json(tokenizer)  # ~20 MB; the fingerprint thread holds its own reference
    release_freed_memory()
    min_chars = _INCREMENTAL_MIN_CHARS.get(base.name)
    if not incremental_encoding or min_chars is None:
        return base
    return incremental(base, tokenizer, min_chars=min_chars)


class DeferredBackend:
    """The chosen backend, built in a background thread while the tokenizer itself serves.

    Building fastokens takes about a second for a 150k vocabulary; a server need not wait for it: until it is
    built and has passed the probe, texts are encoded by the tokenizer itself (transformers', or the same
    Rust tokenizer built by `direct_tokenizer`), the reference every backend must equal (so the ids are the
    same throughout, only slower). The build runs at a lower CPU priority, so it does not slow the rest of
    start-up on a busy machine. `name` is the backend being built (it changes if that one cannot be used);
    `wait()` blocks until the switch.

    Constructed without `background=True` (as `type(backend)(tokenizer)` does), it builds before returning;
    with `background=True, start=False`, the build waits for `start()` (a server starts it once it listens).
    """

    def __init__(
        self,
        tokenizer: Any,
        choice: BackendChoice = "auto",
        *,
        incremental_encoding: bool = True,
        background: bool = False,
        start: bool = True,
    ) -> None:
        self.name = "fastokens" if choice in ("auto", "fastokens") else str(choice)
        self._current: TokenizerBackend = TransformersBackend(tokenizer)
        self._ready = threading.Event()
        arguments = (tokenizer, choice, incremental_encoding)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._build, args=arguments, name="tokenfront-backend", daemon=True
            )
            if start:
                self.start()
        else:
            self._build(*arguments, low_priority=False)

    def start(self) -> None:
        """Start the background build, if it was not started yet."""
        if self._thread is not None and self._thread.ident is None:
            self._thread.start()

    def _build(
        self, tokenizer: Any, choice: BackendChoice, incremental_encoding: bool, *, low_priority: bool = True
    ) -> None:
        started = time.monotonic()
        try:
            backend = _built_backend(tokenizer, choice, incremental_encoding, low_priority=low_priority)
        except Exception as exc:  # keep serving with the reference: slower, the same ids
            log.warning("cannot build the %s tokenizer backend (%s); using transformers", self.name, exc)
            self.name = "transformers"
        else:
            self._current = backend
            self.name = backend.name
            if self._thread is not None:  # a server's: say when the faster backend took over
                log.info(
                    "tokenizer backend %s built in %.1f s: it encodes from now",
                    backend.name,
                    time.monotonic() - started,
                )
        finally:
            self._ready.set()

    @property
    def current(self) -> TokenizerBackend:
        """The backend encoding now: the transformers tokenizer until the built one takes over."""
        return self._current

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the built backend has taken over (or failed to); False on timeout, and at once when the
        build was never started."""
        if self._thread is not None and self._thread.ident is None:
            return False
        return self._ready.wait(timeout)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self._current.encode(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, attribute: str) -> Any:
        # Anything else (a cache's statistics, say) is the current backend's.
        if attribute.startswith("__") or attribute == "_current":
            raise AttributeError(attribute)
        return getattr(self._current, attribute)


def _at_low_priority(function: Callable[[str], Any], argument: str) -> Any:
    """`function(argument)` in a short-lived thread of lower CPU priority (nice +10), so that a long build does
    not slow the rest of start-up on a busy machine. Its own thread: threads started by a thread inherit its
    priority, and fastokens starts its worker on the first encode (which must run at normal priority)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        # Linux schedules threads as tasks: a thread id is a valid PRIO_PROCESS target.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        try:
            outcome["value"] = function(argument)
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="tokenfront-build", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def backend_for(
    tokenizer: Any,
    choice: BackendChoice = "auto",
    *,
    incremental_encoding: bool = True,
    background: bool = False,
    start: bool = True,
) -> TokenizerBackend:
    """The fastest backend whose ids equal the transformers tokenizer's (or the one asked for); `tokenizers`
    under a `SegmentedEncoder` when the tokenizer allows cutting and `incremental_encoding` is on.

    With `background`, fastokens (`auto`/`fastokens`) is built and probed in a background thread and the
    tokenizer itself serves meanwhile (`DeferredBackend`): start-up does not wait for the build, which begins
    at once, or with `start=False` when the `DeferredBackend`'s `start()` is called.
    """
    if choice == "transformers" or not has_rust_model(tokenizer):
        if choice not in ("auto", "transformers"):
            log.warning(
                "tokenizer %s has no Rust model: using transformers, not %s", type(tokenizer).__name__, choice
            )
        return TransformersBackend(tokenizer)
    if background and choice in ("auto", "fastokens"):
        return DeferredBackend(
            tokenizer, choice, incremental_encoding=incremental_encoding, background=True, start=start
        )
    return _built_backend(tokenizer, choice, incremental_encoding)

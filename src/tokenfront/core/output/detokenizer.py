"""Generated ids into text, one id at a time, as vLLM's incremental detokenizer does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Decode", "IncrementalDetokenizer"]

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Turns ids into text one id at a time: decode a short window, emit what the new ids add.

    Decoding ids one by one would break multi-byte characters split across tokens and the spacing rules of
    some tokenizers. Instead two windows are decoded: the ids already shown (from the window's start) and
    the same with the new ids; the difference is the new text, held back while it ends in an incomplete
    character (U+FFFD). The concatenated deltas plus `flush()` equal decoding all ids at once.

    `context` seeds the window with ids before the output (the prompt's last few ids, as vLLM seeds its
    detokenizer), so the first token decodes as it would after them (a sentencepiece leading space); its
    text is never emitted. Only the window is kept, so memory and `state()` stay small.
    """

    def __init__(self, decode: Decode, *, context: Sequence[int] = ()) -> None:
        self._decode = decode
        self._window: list[int] = list(context)  # ids from the decode window's start on
        self._read = len(self._window)  # ids of the window before this are shown

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes ("" while it is held back)."""
        self._window.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return whatever is held back (an incomplete character is shown as it decodes)."""
        return self._advance(final=True) if self._read < len(self._window) else ""

    def state(self) -> dict[str, Any]:
        """The window and how much of it is shown, as JSON data (`from_state` resumes from it)."""
        return {"window": list(self._window), "read": self._read}

    @classmethod
    def from_state(cls, decode: Decode, state: dict[str, Any]) -> IncrementalDetokenizer:
        """A detokenizer that continues where the one whose `state()` this is stopped."""
        window, read = state["window"], state["read"]
        if not (isinstance(window, list) and all(type(i) is int for i in window)):
            raise ValueError("detokenizer window must be a list of token ids")
        if type(read) is not int or not 0 <= read <= len(window):
            raise ValueError("detokenizer read offset must lie within its window")
        detokenizer = cls(decode)
        detokenizer._window, detokenizer._read = list(window), read
        return detokenizer

    def _advance(self, *, final: bool) -> str:
        shown = self._decode(self._window[: self._read])
        with_new = self._decode(self._window)
        if with_new == shown:
            # The new ids add no text (skipped special tokens): count them as read, so a run of them does
            # not widen the window decoded at every step.
            self._read = len(self._window)
            return ""
        if len(with_new) <= len(shown) and not final:
            return ""
        if with_new.endswith("\ufffd") and not final:
            return ""  # a character split across tokens: wait for the rest of its bytes
        # The shown part leaves the window; the new ids are the context of the next step.
        self._window = self._window[self._read :]
        self._read = len(self._window)
        return with_new[len(shown) :]

"""Stop strings: cut streamed text before the first one, never showing a part of it.

All of a request's stop strings are one Aho-Corasick automaton (`StopStrings`, built once per request and
shared by its choices), so each character of output costs one step whatever their number. The automaton's
size and build time grow with the characters of its strings: what a request may send is bounded where
requests are validated (`protocol.limits`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tokenfront.core.output.aho_corasick import ROOT, AhoCorasick

__all__ = ["StopStringMatcher", "StopStrings"]


class StopStrings:
    """A request's stop strings (empty ones dropped, order kept), compiled once into one automaton."""

    def __init__(self, stop: Collection[str]) -> None:
        self.strings = tuple(s for s in stop if s)
        self.automaton = AhoCorasick(self.strings) if self.strings else None


class StopStringMatcher:
    """Finds the first stop string in streamed text and cuts the text before it.

    Text is released only when no stop string can still start in it: a tail that is a proper prefix of a
    stop string is held back until more text (or `flush`) decides. Of the stop strings in the text held and
    fed, the one that starts first wins (the one listed first, when several start there). After a match,
    `stopped` is true and nothing more is accepted.
    """

    def __init__(self, stop: Collection[str] | StopStrings) -> None:
        self._stop = stop if isinstance(stop, StopStrings) else StopStrings(stop)
        self._pending = ""
        # The automaton's state after `_pending` (None: not known, after `from_state`: read it again).
        self._state: int | None = ROOT
        self.stopped = False
        # Which stop string ended the text (vLLM's `stop_reason`); not carried in `state()`: only a whole
        # output is asked (vLLM's streaming derender refuses stop strings).
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        """Add text; return the part that is now certainly before any stop string."""
        automaton = self._stop.automaton
        if self.stopped or not delta:
            return ""
        if automaton is None:
            return delta
        if self._state is None:
            state, found = automaton.earliest(ROOT, self._pending + delta)
        else:
            state, found = automaton.earliest(self._state, delta, len(self._pending))
        self._pending += delta
        if found is not None:
            at, index = found
            self.matched = self._stop.strings[index]
            released, self._pending, self.stopped = self._pending[:at], "", True
            return released
        # The state's depth is the longest tail that may still start a stop string: it is held back.
        cut = len(self._pending) - automaton.depth(state)
        self._state = state
        released, self._pending = self._pending[:cut], self._pending[cut:]
        return released

    def flush(self) -> str:
        """Release what was held back (generation ended without completing a stop string)."""
        released, self._pending, self._state = self._pending, "", ROOT
        return released

    def state(self) -> dict[str, Any]:
        """The held-back text and whether a stop string was found, as JSON data."""
        return {"pending": self._pending, "stopped": self.stopped}

    @classmethod
    def from_state(cls, stop: Collection[str] | StopStrings, state: dict[str, Any]) -> StopStringMatcher:
        """A matcher for `stop` that continues from `state`."""
        pending, stopped = state["pending"], state["stopped"]
        if not isinstance(pending, str) or not isinstance(stopped, bool):
            raise ValueError("stop-string state must hold a string `pending` and a boolean `stopped`")
        matcher = cls(stop)
        matcher._pending, matcher.stopped = pending, stopped
        matcher._state = None if pending else ROOT
        return matcher

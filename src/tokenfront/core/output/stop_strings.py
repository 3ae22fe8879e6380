"""Stop strings: cut streamed text before the first one, never showing a part of it."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tokenfront.core.output.markers import partial_marker_length

__all__ = ["StopStringMatcher"]


class StopStringMatcher:
    """Finds the first stop string in streamed text and cuts the text before it.

    Text is released only when no stop string can still start in it: a tail that is a proper prefix of a
    stop string is held back until more text (or `flush`) decides. After a match, `stopped` is true and
    nothing more is accepted.
    """

    def __init__(self, stop: Collection[str]) -> None:
        self._stop = [s for s in stop if s]
        self._pending = ""
        self.stopped = False
        # Which stop string ended the text (vLLM's `stop_reason`); not carried in `state()`: only a whole
        # output is asked (vLLM's streaming derender refuses stop strings).
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        """Add text; return the part that is now certainly before any stop string."""
        if self.stopped or not delta:
            return ""
        if not self._stop:
            return delta
        self._pending += delta
        found = [at for at in (self._pending.find(s) for s in self._stop) if at >= 0]
        if found:
            at = min(found)
            self.matched = next(s for s in self._stop if self._pending.find(s) == at)
            released, self._pending, self.stopped = self._pending[:at], "", True
            return released
        cut = len(self._pending) - partial_marker_length(self._pending, self._stop)
        released, self._pending = self._pending[:cut], self._pending[cut:]
        return released

    def flush(self) -> str:
        """Release what was held back (generation ended without completing a stop string)."""
        released, self._pending = self._pending, ""
        return released

    def state(self) -> dict[str, Any]:
        """The held-back text and whether a stop string was found, as JSON data."""
        return {"pending": self._pending, "stopped": self.stopped}

    @classmethod
    def from_state(cls, stop: Collection[str], state: dict[str, Any]) -> StopStringMatcher:
        """A matcher for `stop` that continues from `state`."""
        pending, stopped = state["pending"], state["stopped"]
        if not isinstance(pending, str) or not isinstance(stopped, bool):
            raise ValueError("stop-string state must hold a string `pending` and a boolean `stopped`")
        matcher = cls(stop)
        matcher._pending, matcher.stopped = pending, stopped
        return matcher

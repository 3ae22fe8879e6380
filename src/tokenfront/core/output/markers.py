"""Holding back text that could be the start of a marker, the one rule every output stream shares."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["partial_marker_length"]


def partial_marker_length(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`.

    A stream holds that many characters back: the next text decides whether they start a marker.
    """
    longest = 0
    for marker in markers:
        for length in range(min(len(text), len(marker) - 1), longest, -1):
            if text.endswith(marker[:length]):
                longest = length
                break
    return longest

"""Per-worker running totals in numpy columns, so a decision reads every candidate's with one gather.

A policy that keeps numbers per worker (``predicted_ttft``: pending prefill tokens, occupancy) reads them for
every candidate of every request. With a dict per number that is a lookup per candidate in each (O(workers)
Python-level calls: ~50 us at 1,000 workers); here each url has a slot, a row of a 2-D float64 array, and the
candidates' slots are computed once per list of candidates and reused while it stays the same (comparing the
lists is cheap: the router hands the same url objects each time, compared by identity first). A decision then
costs one fancy-index gather, whatever the fleet's size.

Slots are given to every candidate the first time it is seen, not only to workers with something tracked, so
that a worker's first request does not change the layout and invalidate the reused slots. The table stays
bounded: when it holds more than ``max(MIN_PRUNE, 2 x the candidates)`` urls, it keeps only the candidates
and the urls with a non-zero total. Not thread-safe: the policy's lock is held around every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import ClassVar

import numpy as np

__all__ = ["WorkerColumns"]


class WorkerColumns:
    """Named float totals per worker url (0 for a url never added to), read for many urls at once."""

    # Urls remembered before a prune is considered (workers come and go: a fleet's churn must not grow it).
    MIN_PRUNE: ClassVar[int] = 1024

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self._column = {name: i for i, name in enumerate(self.names)}
        self._slot_by_url: dict[str, int] = {}
        # Row i is slot i's totals.
        self._values = np.zeros((16, len(self.names)), np.float64)
        self._layout = 0  # changes whenever slots are given or taken: reused slot arrays are stale then
        self._last: tuple[list[str], int, np.ndarray] | None = None  # (urls, layout, slots)

    def get(self, url: str, name: str) -> float:
        """The url's total of ``name`` (0 when nothing was added)."""
        slot = self._slot_by_url.get(url)
        return 0.0 if slot is None else float(self._values[slot, self._column[name]])

    def add(self, url: str, name: str, amount: float) -> None:
        """Add ``amount`` (negative: take it out) to the url's total of ``name``."""
        slot = self._slot_by_url.get(url)
        if slot is None:
            slot = self._give_slots([url])[0]
        self._values[slot, self._column[name]] += amount

    def clear(self, url: str) -> None:
        """Set every total of the url back to 0 (its slot stays: it is likely a candidate again)."""
        slot = self._slot_by_url.get(url)
        if slot is not None:
            self._values[slot] = 0.0

    def read(self, urls: list[str]) -> np.ndarray:
        """The totals of ``urls``: an array of shape (len(urls), len(names)), a copy the caller may change."""
        slots = self._slots(urls)  # first: giving slots may grow the array
        return self._values[slots]

    def __len__(self) -> int:
        """How many urls have a slot."""
        return len(self._slot_by_url)

    def _slots(self, urls: list[str]) -> np.ndarray:
        last = self._last
        if last is not None and last[1] == self._layout and last[0] == urls:
            return last[2]
        get = self._slot_by_url.get
        missing = [url for url, slot in zip(urls, map(get, urls, repeat(None)), strict=True) if slot is None]
        if missing:
            if len(self._slot_by_url) + len(missing) > max(self.MIN_PRUNE, 2 * len(urls)):
                self._prune(urls)
                missing = [url for url in missing if url not in self._slot_by_url]
            self._give_slots(missing)
        slots = np.fromiter(map(self._slot_by_url.__getitem__, urls), np.intp, len(urls))
        self._last = (list(urls), self._layout, slots)
        return slots

    def _give_slots(self, urls: list[str]) -> list[int]:
        first = len(self._slot_by_url)
        needed = first + len(urls)
        if needed > len(self._values):
            grown = np.zeros((max(needed, 2 * len(self._values)), len(self.names)), np.float64)
            grown[:first] = self._values[:first]
            self._values = grown
        slots = list(range(first, first + len(urls)))
        self._slot_by_url.update(zip(urls, slots, strict=True))
        self._layout += 1
        return slots

    def _prune(self, keep: list[str]) -> None:
        """Keep the slots of ``keep`` and of urls with a non-zero total, renumbered from 0."""
        values = self._values
        kept = dict.fromkeys(keep)
        kept.update((url, None) for url, slot in self._slot_by_url.items() if values[slot].any())
        old_slots = [self._slot_by_url[url] for url in kept if url in self._slot_by_url]
        old_urls = [url for url in kept if url in self._slot_by_url]
        fresh = np.zeros((max(16, 2 * len(old_slots)), len(self.names)), np.float64)
        fresh[: len(old_slots)] = values[old_slots]
        self._values = fresh
        self._slot_by_url = {url: slot for slot, url in enumerate(old_urls)}
        self._layout += 1

"""An Aho-Corasick automaton: every occurrence of a set of strings found in one pass over a text.

Stop strings are matched with it (`stop_strings.StopStringMatcher`): each character of output costs one
transition whatever the number of stop strings, where a loop over them costs one search per stop string per
token. A state is a node of the strings' trie: the longest suffix of the text read so far that starts one of
the strings. So a state also says how much of the text may still become a string (`depth`), the tail a
stream holds back, and it carries over from one chunk of text to the next.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["ROOT", "AhoCorasick"]

ROOT = 0
# A transition's key packs the state and the character's code point (below 2**21) into one int.
_CHAR_BITS = 21


class AhoCorasick:
    """The automaton of `patterns` (non-empty strings; duplicates allowed, the first one counts).

    `earliest(state, text)` reads text and finds the match that starts first; `depth(state)` is the length
    of the text a state stands for. Built once, read by any number of matchers (never changed after
    construction).
    """

    def __init__(self, patterns: Sequence[str]) -> None:
        if any(not pattern for pattern in patterns):
            raise ValueError("an Aho-Corasick pattern must not be empty")
        goto: dict[int, int] = {}
        depth, parent, char = [0], [ROOT], [0]
        terminal: dict[int, int] = {}  # state -> index of the first pattern spelled by it
        for index, pattern in enumerate(patterns):
            state = ROOT
            for character in pattern:
                code = ord(character)
                key = (state << _CHAR_BITS) | code
                child = goto.get(key)
                if child is None:
                    child = goto[key] = len(depth)
                    depth.append(depth[state] + 1)
                    parent.append(state)
                    char.append(code)
                state = child
            terminal.setdefault(state, index)
        # Failure links and the longest pattern ending at each state, in order of depth: both read only
        # states that are shallower.
        count = len(depth)
        fail = [ROOT] * count
        length, index_of = [0] * count, [-1] * count
        for state in sorted(range(1, count), key=depth.__getitem__):
            up = parent[state]
            if up != ROOT:
                key_char = char[state]
                link = fail[up]
                while True:
                    target = goto.get((link << _CHAR_BITS) | key_char)
                    if target is not None:
                        fail[state] = target
                        break
                    if link == ROOT:
                        break
                    link = fail[link]
            if state in terminal:
                length[state], index_of[state] = depth[state], terminal[state]
            else:
                length[state], index_of[state] = length[fail[state]], index_of[fail[state]]
        self._goto = goto
        self._fail = fail
        self._depth = depth
        self._length = length
        self._index = index_of
        self.longest_pattern = max(depth)
        # The characters a pattern starts with: the only ones that take the automaton out of its root.
        starts = "".join(sorted({re.escape(pattern[0]) for pattern in patterns}))
        self._starts = re.compile(f"[{starts}]" if starts else "(?!)")

    def depth(self, state: int) -> int:
        """How many characters of the text read end `state`'s string (the tail that may start a pattern)."""
        return self._depth[state]

    def earliest(self, state: int, text: str, offset: int = 0) -> tuple[int, tuple[int, int] | None]:
        """Read `text` from `state`: (the state after it, the (start, pattern index) of the match that starts
        first, ties going to the pattern listed first; None when no pattern ends in `text`).

        Starts count from `offset` characters before `text` (the text already read in `state`). Reading stops
        once no later match can start as early as the one found, so the state returned is only meaningful
        when there is no match.
        """
        goto, fail, lengths, indexes = self._goto, self._fail, self._length, self._index
        next_start = self._starts.search
        best: tuple[int, int] | None = None
        horizon = self.longest_pattern - 1  # a match ending at e starts at e - horizon or later
        at, end = 0, len(text)
        while at < end:
            if state == ROOT:
                # Text that starts no pattern leaves the root where it is: skip it in one search.
                upcoming = next_start(text, at)
                if upcoming is None:
                    break
                at = upcoming.start()
            position = offset + at
            if best is not None and position - horizon > best[0]:
                break
            code = ord(text[at])
            while True:
                target = goto.get((state << _CHAR_BITS) | code)
                if target is not None:
                    state = target
                    break
                if state == ROOT:
                    break
                state = fail[state]
            length = lengths[state]
            if length:
                found = (position - length + 1, indexes[state])
                if best is None or found < best:
                    best = found
            at += 1
        return state, best

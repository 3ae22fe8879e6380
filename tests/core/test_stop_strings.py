"""The stop-string automaton against the search it replaced: the same text released, the same stop string,
chunk by chunk and resumed from a carried state, on random texts, stop lists and chunkings."""

from __future__ import annotations

import json
import random
from collections.abc import Collection

import pytest
from pydantic import ValidationError

from tokenfront.core.output.markers import partial_marker_length
from tokenfront.core.output.stop_strings import StopStringMatcher, StopStrings
from tokenfront.protocol import MAX_STOP_CHARACTERS, ChatCompletionRequest, CompletionRequest


class _SearchMatcher:
    """The matcher as it was: one search per stop string per fed chunk (the reference)."""

    def __init__(self, stop: Collection[str], pending: str = "", stopped: bool = False) -> None:
        self._stop = [s for s in stop if s]
        self._pending, self.stopped, self.matched = pending, stopped, None

    def feed(self, delta: str) -> str:
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
        released, self._pending = self._pending, ""
        return released


def _chunks(rng: random.Random, text: str) -> list[str]:
    chunks, at = [], 0
    while at < len(text):
        size = rng.choice((1, 1, 2, 3, 5, 8, 40))
        chunks.append(text[at : at + size])
        at += size
    return chunks


def test_the_automaton_releases_and_matches_what_the_search_did() -> None:
    rng = random.Random(20261201)
    alphabet = "abcab\n é😀"
    compared = stopped = resumed = 0
    for case in range(3000):
        stop = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(0, 6))
        ]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        chunks = _chunks(rng, text)
        compiled = StopStrings(stop)
        ours, reference = StopStringMatcher(compiled), _SearchMatcher(stop)
        cut = rng.randint(0, len(chunks))  # resume from the carried state here, as a derender stream does
        matched_before = None  # not carried in the state (only a whole output asks for it)
        for index, chunk in enumerate(chunks):
            if index == cut:
                matched_before = ours.matched
                state = json.loads(json.dumps(ours.state()))
                ours = StopStringMatcher.from_state(stop if case % 2 else compiled, state)
                resumed += 1
            assert ours.feed(chunk) == reference.feed(chunk), (stop, chunks, index)
            assert ours.stopped == reference.stopped
        assert ours.flush() == reference.flush()
        assert (ours.matched or matched_before) == reference.matched, (stop, chunks)
        compared += 1
        stopped += ours.stopped
    assert compared == 3000 and resumed > 2000
    assert 500 < stopped < 2900  # both outcomes are well represented


def test_the_earliest_starting_stop_string_wins_and_ties_go_to_the_first_listed() -> None:
    matcher = StopStringMatcher(["bcd", "abcdef", "ab"])
    assert matcher.feed("xxabcdefg") == "xx"
    assert matcher.matched == "abcdef"  # starts where "ab" does, and is listed before it
    later = StopStringMatcher(["cd", "abcz"])
    assert later.feed("ab") == ""  # both may start here
    assert later.feed("cd") == "ab"
    assert later.matched == "cd"


def test_a_carried_state_holding_a_whole_stop_string_stops_on_the_next_text() -> None:
    matcher = StopStringMatcher.from_state(["END"], {"pending": "xxENDyy", "stopped": False})
    assert matcher.feed("z") == "xx"
    assert matcher.stopped and matcher.matched == "END"


def test_stop_strings_are_bounded_by_their_characters() -> None:
    at_limit = ["x" * 1000] * (MAX_STOP_CHARACTERS // 1000) + ["y" * (MAX_STOP_CHARACTERS % 1000)]
    assert sum(map(len, at_limit)) == MAX_STOP_CHARACTERS
    messages = [{"role": "user", "content": "Hi"}]
    assert ChatCompletionRequest.model_validate({"messages": messages, "stop": at_limit}).stop == at_limit
    for request, body in (
        (CompletionRequest, {"prompt": "Hi", "stop": [*at_limit, "z"]}),
        (ChatCompletionRequest, {"messages": messages, "stop": "z" * (MAX_STOP_CHARACTERS + 1)}),
    ):
        with pytest.raises(ValidationError) as caught:
            request.model_validate(body)
        (error,) = caught.value.errors()
        assert error["loc"] == ("stop",)
        assert f"at most {MAX_STOP_CHARACTERS:,}" in error["msg"]

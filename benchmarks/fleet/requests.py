"""A timed request of a fleet workload: when it is sent, who sends it, its prompt as token ids, its answer size.

A prompt is kept as the pieces it was built from (`segments`: a shared system prompt, a document, each turn's
new ids), shared between the requests that repeat them, so a workload of long conversations holds each id once
rather than once per turn; `prompt_token_ids()` joins them when the request is sent.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["TimedRequest", "random_ids"]


@dataclass(frozen=True)
class TimedRequest:
    """One request of a workload.

    `at` is when it is sent, in seconds from the workload's start, for an open-loop run (every request at its
    time, whatever the answers). `session` names who sends it (a session, a user, a trace line) and `turn` its
    place there; `think_seconds` is, for a closed-loop run, how long after the answer to the session's previous
    turn it is sent (None for a first turn, which is sent at `at`). `max_tokens` is the answer's length.
    """

    at: float
    session: str
    turn: int
    segments: tuple[tuple[int, ...], ...]
    max_tokens: int
    think_seconds: float | None = None

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens."""
        return sum(len(segment) for segment in self.segments)

    def prompt_token_ids(self) -> list[int]:
        """The prompt's ids, the segments joined."""
        ids: list[int] = []
        for segment in self.segments:
            ids.extend(segment)
        return ids

    def completion_body(self, model: str | None = None, *, stream: bool = True) -> dict[str, Any]:
        """The `/v1/completions` body that sends it: the prompt as ids, greedy, `max_tokens` long; streamed
        with usage (its `cached_tokens` is what the worker reused) unless `stream` is false."""
        body: dict[str, Any] = {
            "prompt": self.prompt_token_ids(),
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
        }
        if model is not None:
            body["model"] = model
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body


def random_ids(rng: random.Random, count: int, id_range: tuple[int, int]) -> tuple[int, ...]:
    """`count` token ids drawn uniformly from [low, high): content that no other draw repeats by chance (two
    draws share a given 16-token block with odds of about 1 in 10**72 for the workloads' default range)."""
    low, high = id_range
    # The same draws as from the range itself, but every id is one shared int object: a fleet-sized workload
    # holds tens of millions of ids, at a pointer each rather than an int object each.
    return tuple(rng.choices(_id_objects(low, high), k=count))


@functools.lru_cache(maxsize=8)
def _id_objects(low: int, high: int) -> tuple[int, ...]:
    return tuple(range(low, high))

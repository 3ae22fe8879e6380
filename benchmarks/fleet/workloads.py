"""Fleet workloads as timed requests of token ids: agentic sessions, and groups of users sharing documents.

Both are open workloads: sessions (or users) arrive as a Poisson process, each then sends its turns one after
another, `think_seconds` apart. Every prompt is the session's previous prompt plus what happened since — the
answer, as the next prompt carries it, and the new input — so most of each prompt was sent before: that is
what a KV-cache-aware router can reuse, if it sends the turn where its prefix is cached.

The answers in the next prompt are the workload's own ids, drawn like every other piece, not what a worker
generated (a simulated worker's output is arbitrary): the reuse a workload offers is prompt prefixes only,
which is what `oracle` counts. Everything is drawn from `random.Random` seeded with the workload's `seed` and
the session's number, so the same settings give the same requests, whatever order they are read in.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from benchmarks.fleet.oracle import HitOracle
from benchmarks.fleet.requests import TimedRequest, random_ids

__all__ = ["AgenticSessions", "SharedDocuments", "WorkloadSummary", "summarize"]


@dataclass(frozen=True)
class AgenticSessions:
    """Coding or tool-using agents: long shared instructions, many turns of tool output, short answers.

    `sessions` sessions arrive at `session_rate` a second (Poisson). Each uses one of `agents` system prompts
    with its tool definitions (`system_tokens`, the same ids for every session of that agent), opens with a
    task (`first_message_tokens`), then runs `turns` turns: each answer (`answer_tokens`, the turn's
    `max_tokens`) is followed, `think_seconds` later on average (exponential: the tool running), by the next
    prompt, which adds the answer and the tool's output (`tool_output_tokens`). A session ends early rather
    than send a prompt and answer longer than `max_prompt_tokens`. Ranges are inclusive (low, high), drawn
    uniformly; ids come from `id_range` [low, high). With the defaults about 94 % of the prompt tokens were
    sent before (`summarize`).
    """

    sessions: int = 100
    session_rate: float = 0.5
    agents: int = 1
    system_tokens: tuple[int, int] = (4096, 8192)
    first_message_tokens: tuple[int, int] = (200, 800)
    turns: tuple[int, int] = (20, 40)
    tool_output_tokens: tuple[int, int] = (1024, 3072)
    answer_tokens: tuple[int, int] = (30, 200)
    think_seconds: float = 3.0
    max_prompt_tokens: int = 131_072
    id_range: tuple[int, int] = (256, 32_000)
    seed: int = 0

    def __post_init__(self) -> None:
        _check_settings(self, counts=("sessions", "agents", "max_prompt_tokens"), rates=("session_rate",))

    def requests(self) -> Iterator[TimedRequest]:
        """Every session's turns, in the order of their `at`."""
        rng = random.Random(f"agentic:{self.seed}")
        systems = _pieces(f"agentic:{self.seed}:agent", self.agents, rng, self.system_tokens, self.id_range)
        sessions = [
            self._session(index, start, systems[rng.randrange(self.agents)])
            for index, start in _arrivals(rng, self.sessions, self.session_rate)
        ]
        return heapq.merge(*sessions, key=_sent_at)

    def _session(self, index: int, start: float, system: tuple[int, ...]) -> Iterator[TimedRequest]:
        rng = random.Random(f"agentic:{self.seed}:session:{index}")
        segments = [system, random_ids(rng, _draw(rng, self.first_message_tokens), self.id_range)]
        turns = _draw(rng, self.turns)
        at, think = start, None
        for turn in range(turns):
            answer = _draw(rng, self.answer_tokens)
            request = TimedRequest(at, f"agentic-{index}", turn, tuple(segments), answer, think)
            if request.prompt_tokens + answer > self.max_prompt_tokens:
                return
            yield request
            segments.append(random_ids(rng, answer, self.id_range))
            segments.append(random_ids(rng, _draw(rng, self.tool_output_tokens), self.id_range))
            think = _think(rng, self.think_seconds)
            at += think


@dataclass(frozen=True)
class SharedDocuments:
    """Groups of users asking about the same long documents (a team's codebase, a contract, a manual).

    `users` users arrive at `user_rate` a second (Poisson), each in one of `groups` groups (uniformly), each
    group with its own document (`document_tokens`). A user's prompt is a system prompt everyone shares
    (`system_tokens`), the group's document, then the user's conversation: `questions` questions
    (`question_tokens`), each answered (`answer_tokens`, its `max_tokens`), the next one `think_seconds` later
    on average (exponential) with the answer before it. Ranges are inclusive (low, high), drawn uniformly; ids
    come from `id_range` [low, high).
    """

    groups: int = 16
    users: int = 200
    user_rate: float = 1.0
    system_tokens: int = 512
    document_tokens: tuple[int, int] = (8192, 32768)
    questions: tuple[int, int] = (1, 4)
    question_tokens: tuple[int, int] = (20, 200)
    answer_tokens: tuple[int, int] = (50, 400)
    think_seconds: float = 20.0
    id_range: tuple[int, int] = (256, 32_000)
    seed: int = 0

    def __post_init__(self) -> None:
        _check_settings(self, counts=("groups", "users", "system_tokens"), rates=("user_rate",))

    def requests(self) -> Iterator[TimedRequest]:
        """Every user's questions, in the order of their `at`."""
        rng = random.Random(f"documents:{self.seed}")
        system = random_ids(random.Random(f"documents:{self.seed}:system"), self.system_tokens, self.id_range)
        documents = _pieces(
            f"documents:{self.seed}:group", self.groups, rng, self.document_tokens, self.id_range
        )
        users = [
            self._user(index, start, system, documents[rng.randrange(self.groups)])
            for index, start in _arrivals(rng, self.users, self.user_rate)
        ]
        return heapq.merge(*users, key=_sent_at)

    def _user(
        self, index: int, start: float, system: tuple[int, ...], document: tuple[int, ...]
    ) -> Iterator[TimedRequest]:
        rng = random.Random(f"documents:{self.seed}:user:{index}")
        segments = [system, document]
        at, think = start, None
        for turn in range(_draw(rng, self.questions)):
            segments.append(random_ids(rng, _draw(rng, self.question_tokens), self.id_range))
            answer = _draw(rng, self.answer_tokens)
            yield TimedRequest(at, f"documents-{index}", turn, tuple(segments), answer, think)
            segments.append(random_ids(rng, answer, self.id_range))
            think = _think(rng, self.think_seconds)
            at += think


@dataclass(frozen=True)
class WorkloadSummary:
    """What a workload sends: counts, tokens, how long it lasts open-loop, and how much was sent before.

    `seen_before_share` is the share of prompt tokens in full blocks whose whole prefix an earlier request
    already sent (`oracle.HitOracle` with no capacity bound, blocks of `tokens_per_block`).
    """

    requests: int
    sessions: int
    prompt_tokens: int
    max_prompt_tokens: int
    output_tokens: int
    duration_seconds: float
    seen_before_share: float

    @property
    def mean_prompt_tokens(self) -> float:
        """Prompt tokens per request."""
        return self.prompt_tokens / self.requests if self.requests else 0.0


def summarize(requests: Iterable[TimedRequest], *, tokens_per_block: int = 16) -> WorkloadSummary:
    """Count a workload's requests, sessions and tokens, and its share of prompt tokens sent before."""
    oracle = HitOracle(tokens_per_block=tokens_per_block)
    sessions: set[str] = set()
    count = longest = output = 0
    last = 0.0
    for request in requests:
        oracle.add(request.prompt_token_ids())
        sessions.add(request.session)
        count += 1
        longest = max(longest, request.prompt_tokens)
        output += request.max_tokens
        last = max(last, request.at)
    return WorkloadSummary(
        requests=count,
        sessions=len(sessions),
        prompt_tokens=oracle.prompt_tokens,
        max_prompt_tokens=longest,
        output_tokens=output,
        duration_seconds=last,
        seen_before_share=oracle.hit_rate,
    )


def _sent_at(request: TimedRequest) -> float:
    return request.at


def _arrivals(rng: random.Random, count: int, rate: float) -> Iterator[tuple[int, float]]:
    """`count` arrivals of a Poisson process of `rate` a second: (number, time), in order."""
    start = 0.0
    for index in range(count):
        start += rng.expovariate(rate)
        yield index, start


def _pieces(
    key: str, count: int, rng: random.Random, bounds: tuple[int, int], id_range: tuple[int, int]
) -> list[tuple[int, ...]]:
    """`count` shared prompt pieces (system prompts, documents), their lengths drawn from `bounds` by `rng`,
    their ids from a generator of their own (`key` and the piece's number)."""
    return [
        random_ids(random.Random(f"{key}:{index}"), _draw(rng, bounds), id_range) for index in range(count)
    ]


def _think(rng: random.Random, mean: float) -> float:
    """A think time: exponential with `mean` seconds (0 for a mean of 0)."""
    return rng.expovariate(1 / mean) if mean else 0.0


def _draw(rng: random.Random, bounds: tuple[int, int]) -> int:
    """A whole number drawn uniformly from the inclusive range `bounds`."""
    return rng.randint(*bounds)


def _check_settings(settings: Any, *, counts: tuple[str, ...], rates: tuple[str, ...]) -> None:
    """Refuse settings that cannot make a workload, naming the field: counts below 1, rates not above 0,
    negative think times, ranges upside down or below 1 (`id_range` from 0, its high end above the low)."""
    for item in fields(settings):
        value = getattr(settings, item.name)
        if item.name in counts and value < 1:
            raise ValueError(f"{item.name} must be at least 1, not {value}")
        if item.name in rates and not value > 0:
            raise ValueError(f"{item.name} must be more than 0, not {value}")
        if item.name == "think_seconds" and value < 0:
            raise ValueError(f"think_seconds must not be negative, not {value}")
        if item.name == "id_range":
            if not 0 <= value[0] < value[1]:
                raise ValueError(f"id_range must be [low, high) with 0 <= low < high, not {value}")
        elif isinstance(value, tuple) and not 1 <= value[0] <= value[1]:
            raise ValueError(f"{item.name} must be a range (low, high) with 1 <= low <= high, not {value}")

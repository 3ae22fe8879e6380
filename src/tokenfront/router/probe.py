"""The render probe: does a worker that publishes no fingerprint render a fixed corpus as the router does?

vLLM publishes no rendering fingerprint (its `/server_info` is a 404), so the gate cannot compare it and
blocks forwarding. A worker added with `verify=probe` opts in to a weaker check instead: the router renders a
built-in corpus (`PROBE_CASES`: a system prompt, several turns, tools, a tool-call history, unicode, a text
prompt, a continued final message) with its own pipeline, through the renderer's own `/tokenize` function, and
compares the ids with the worker's `POST /tokenize` answers (vLLM's schema). Equal ids on every case make the
worker eligible for forwarding; the first case that differs, or that the worker refuses, is the reason it is
not. A probe shows that these cases render alike, not that every request does: the gate says so when it
forwards on a probe.

A case the router's own pipeline refuses (a template without system or tool support, say) is skipped, not
asked of the worker. The router's ids are computed once per calendar day (templates may print the date) and
reused by every probe of every worker.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from tokenfront.core.context_length import max_model_len
from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol import TokenizeRequest
from tokenfront.renderer.routes import tokenize_response
from tokenfront.router.connections import describe_error
from tokenfront.server.errors import APIError

NO_PROBER = "the router cannot render (started without --model), so it cannot probe"
# How much of a refusal's message goes into a difference (it ends up in a log line).
_MESSAGE_CHARS = 200


@dataclass(frozen=True)
class ProbeCase:
    """One probe request: a name for the reasons and logs, and the `/tokenize` body (never mutated)."""

    name: str
    body: Mapping[str, Any]


_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

# CJK, emoji (with a skin-tone modifier and a ZWJ sequence), combining accents, and right-to-left scripts.
UNICODE_TEXT = (
    "日本語と中文を混ぜた文章。한국어도 있어요. 🙂👍🏽👩‍💻 "
    "cafe\u0301 n\u0303o Zu\u0308rich; مرحبا بالعالم; שלום עולם."
)

PROBE_CASES: tuple[ProbeCase, ...] = (
    ProbeCase(
        "system_user",
        {
            "messages": [
                {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
            "add_generation_prompt": True,
        },
    ),
    ProbeCase(
        "multi_turn",
        {
            "messages": [
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Another one, please -- and spell it backwards."},
            ],
            "add_generation_prompt": True,
        },
    ),
    ProbeCase(
        "tools",
        {
            "messages": [{"role": "user", "content": "Is it raining in Paris?"}],
            "tools": [_WEATHER_TOOL],
            "add_generation_prompt": True,
        },
    ),
    ProbeCase(
        "tool_history",
        {
            "messages": [
                {"role": "user", "content": "What's the weather in Paris, in celsius?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call00001",  # 9 alphanumerics: what Mistral templates require
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": '{"city": "Paris", "unit": "celsius"}',
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call00001", "content": '{"temperature": 14, "rain": true}'},
            ],
            "tools": [_WEATHER_TOOL],
            "add_generation_prompt": True,
        },
    ),
    ProbeCase(
        "unicode",
        {"messages": [{"role": "user", "content": UNICODE_TEXT}], "add_generation_prompt": True},
    ),
    ProbeCase(
        "completion",
        {
            "prompt": "The quick brown fox jumps over the lazy dog.\n\nOnce upon a time",
            "add_special_tokens": True,
        },
    ),
    ProbeCase(
        "continue_final",
        {
            "messages": [
                {"role": "user", "content": "Write a haiku about the sea."},
                {"role": "assistant", "content": "Waves fold into foam,"},
            ],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
)


@dataclass(frozen=True)
class ProbeResult:
    """One probe of one worker: cases compared, cases the router's pipeline refused, the first difference.

    `difference` None: every compared case gave the same ids. Otherwise it names the case and says how it
    differs, in words that go into the gate's warning.
    """

    compared: int
    skipped: tuple[str, ...] = ()
    difference: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"compared": self.compared, "skipped": list(self.skipped), "difference": self.difference}


class ProbeUnreachable(Exception):
    """The worker's `/tokenize` could not be reached (a connection error or timeout, not an answer)."""


@dataclass(frozen=True)
class ExpectedIds:
    """The router's ids for each case it renders, and the cases it refused, for one day."""

    day: tuple[datetime.date, datetime.date]
    ids: Mapping[str, list[int]]
    skipped: tuple[str, ...]


class Prober:
    """Probes workers against the router's own pipeline."""

    def __init__(self, pipeline: RenderPipeline, cases: tuple[ProbeCase, ...] = PROBE_CASES) -> None:
        self.pipeline = pipeline
        self.cases = cases
        self._context_length: int | None = None
        self._expected: ExpectedIds | None = None

    def expected(self) -> ExpectedIds:
        """The router's ids, rendered again when the (local or UTC) date changed since the last render."""
        day = (datetime.date.today(), datetime.datetime.now(datetime.timezone.utc).date())
        if self._expected is None or self._expected.day != day:
            self._expected = self._render(day)
        return self._expected

    def _render(self, day: tuple[datetime.date, datetime.date]) -> ExpectedIds:
        if self._context_length is None:
            self._context_length = max_model_len(self.pipeline.checkpoint.config)
        ids: dict[str, list[int]] = {}
        skipped: list[str] = []
        for case in self.cases:
            request = TokenizeRequest.model_validate(dict(case.body))
            try:
                answer = tokenize_response(self.pipeline, request, self._context_length)
            except (RenderError, APIError) as exc:
                if exc.status_code >= 500:
                    raise
                skipped.append(case.name)  # the router cannot render it: nothing to compare
                continue
            ids[case.name] = list(answer["tokens"])
        return ExpectedIds(day, ids, tuple(skipped))

    async def run(self, client: httpx.AsyncClient, timeout: float) -> ProbeResult:
        """Ask the worker (`client`'s base URL) for each case the router renders; stop at the first difference.

        ProbeUnreachable when a request fails at the connection (the caller decides what that means).
        """
        expected = self.expected()
        compared = 0
        for case in self.cases:
            ids = expected.ids.get(case.name)
            if ids is None:
                continue
            difference = await self._compare(client, case, ids, timeout)
            if difference is not None:
                return ProbeResult(compared, expected.skipped, difference)
            compared += 1
        if not compared:
            refused = ", ".join(expected.skipped)
            return ProbeResult(
                0, expected.skipped, f"the router's own pipeline refused every probe case ({refused})"
            )
        return ProbeResult(compared, expected.skipped)

    @staticmethod
    async def _compare(
        client: httpx.AsyncClient, case: ProbeCase, expected: list[int], timeout: float
    ) -> str | None:
        try:
            response = await client.post("/tokenize", json=dict(case.body), timeout=timeout)
        except httpx.HTTPError as exc:
            raise ProbeUnreachable(
                f"probe case {case.name!r}: /tokenize unreachable ({describe_error(exc)})"
            ) from exc
        if response.status_code != 200:
            return (
                f"probe case {case.name!r}: /tokenize answered {response.status_code} ({_message(response)})"
            )
        tokens = _tokens(response)
        if tokens is None:
            return f"probe case {case.name!r}: /tokenize answered no list of token ids"
        return _difference(case.name, tokens, expected)


def _tokens(response: httpx.Response) -> list[int] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        return None
    return tokens


def _difference(name: str, worker: list[int], router: list[int]) -> str | None:
    """None when equal, else where the worker's ids first differ from the router's."""
    if worker == router:
        return None
    first = next((i for i, (a, b) in enumerate(zip(worker, router, strict=False)) if a != b), None)
    at = first if first is not None else min(len(worker), len(router))
    return (
        f"probe case {name!r} differs: the worker's /tokenize gave {len(worker)} ids, the router "
        f"{len(router)}; first difference at id {at}"
    )


def _message(response: httpx.Response) -> str:
    """The error message of a refusal: OpenAI's `error.message`, vLLM's older top-level `message`, or text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:_MESSAGE_CHARS] or "no body"
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else body.get("message")
        if isinstance(message, str):
            return message[:_MESSAGE_CHARS]
    return str(body)[:_MESSAGE_CHARS]

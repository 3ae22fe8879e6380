"""The render probe: does a worker that publishes no fingerprint render a fixed corpus as the router does?

vLLM publishes no rendering fingerprint (its `/server_info` is a 404), so the gate cannot compare it and
blocks forwarding. A worker added with `verify=probe` opts in to a weaker check instead: the router renders a
built-in corpus (`tokenfront.probe_corpus`: a system prompt, several turns, tools, a tool-call history, unicode,
a text prompt, a continued final message) with its own pipeline, through the renderer's own `/tokenize`
function, and compares the ids with the worker's `POST /tokenize` answers (vLLM's schema). Equal ids on every case make the
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

from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderPipeline
from tokenfront.probe_corpus import PROBE_CASES, ProbeCase, first_difference, refusal_message, token_ids
from tokenfront.probe_corpus import UNICODE_TEXT as UNICODE_TEXT  # re-exported: the corpus's test reads it
from tokenfront.protocol import TokenizeRequest
from tokenfront.renderer.answers import tokenize_response
from tokenfront.router.check_client import CheckClient, describe_failure
from tokenfront.router.connections import WorkerTransportError
from tokenfront.server.errors import APIError

NO_PROBER = "the router cannot render (started without --model), so it cannot probe"


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
        self._expected: ExpectedIds | None = None

    def expected(self) -> ExpectedIds:
        """The router's ids, rendered again when the (local or UTC) date changed since the last render."""
        day = (datetime.date.today(), datetime.datetime.now(datetime.timezone.utc).date())
        if self._expected is None or self._expected.day != day:
            self._expected = self._render(day)
        return self._expected

    def _render(self, day: tuple[datetime.date, datetime.date]) -> ExpectedIds:
        ids: dict[str, list[int]] = {}
        skipped: list[str] = []
        for case in self.cases:
            request = TokenizeRequest.model_validate(dict(case.body))
            try:
                answer = tokenize_response(self.pipeline, request, self.pipeline.max_model_len)
            except (RenderError, APIError) as exc:
                if exc.status_code >= 500:
                    raise
                skipped.append(case.name)  # the router cannot render it: nothing to compare
                continue
            ids[case.name] = list(answer["tokens"])
        return ExpectedIds(day, ids, tuple(skipped))

    async def run(self, client: CheckClient, timeout: float) -> ProbeResult:
        """Ask the worker (`client`'s) for each case the router renders; stop at the first difference.

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
        client: CheckClient, case: ProbeCase, expected: list[int], timeout: float
    ) -> str | None:
        try:
            response = await client.post("/tokenize", json=dict(case.body), timeout=timeout)
        except WorkerTransportError as exc:
            raise ProbeUnreachable(f"probe case {case.name!r}: {describe_failure('/tokenize', exc)}") from exc
        if response.status_code != 200:
            refusal = refusal_message(response)
            return f"probe case {case.name!r}: /tokenize answered {response.status_code} ({refusal})"
        tokens = token_ids(response)
        if tokens is None:
            return f"probe case {case.name!r}: /tokenize answered no list of token ids"
        return _difference(case.name, tokens, expected)


def _difference(name: str, worker: list[int], router: list[int]) -> str | None:
    """None when equal, else where the worker's ids first differ from the router's."""
    at = first_difference(worker, router)
    if at is None:
        return None
    return (
        f"probe case {name!r} differs: the worker's /tokenize gave {len(worker)} ids, the router "
        f"{len(router)}; first difference at id {at}"
    )

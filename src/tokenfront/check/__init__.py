"""`tokenfront check`: does every worker render requests into the same ids as the renderer?

What an operator runs before adding a worker. A client of the servers' HTTP APIs only (httpx; never torch, never
a model): `fetch` reads each server's `/server_info` and its `POST /tokenize` answers to the probe corpus,
`compare` judges each worker against the renderer, `report` prints the table or the JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

import httpx

from tokenfront.check.compare import AGREES, UNCHECKED, Verdict, compare_worker, rendered_ids
from tokenfront.check.fetch import ServerReport, fetch_server
from tokenfront.check.report import format_table, to_json
from tokenfront.probe_corpus import PROBE_CASES, ProbeCase
from tokenfront.tls import ClientTls

__all__ = [
    "EXIT_AGREE",
    "EXIT_DIFFER",
    "EXIT_INCOMPLETE",
    "CheckSettings",
    "Verdict",
    "exit_code",
    "run_check",
]

EXIT_AGREE = 0  # every worker agrees with the renderer
EXIT_DIFFER = 1  # some worker differs, or is not shown to agree
EXIT_INCOMPLETE = 2  # a server could not be checked (and nothing differed), or a command-line mistake

HELP = "before adding a worker: compare its rendering with the renderer's (fingerprints and a probe corpus)"

DESCRIPTION = """\
Compare every --worker with the --renderer: fetch each server's GET /server_info, compare the rendering
fingerprints component by component (chat template, tokenizer vocabulary, added tokens, model type, ...), and
render a built-in corpus of 7 requests (system prompt, multi-turn, tools, tool-call history, unicode, a text
completion, a continued assistant message; the router's verify=probe corpus) with POST /tokenize on every
server that has it, comparing the ids case by case. Prints a table, then one line per worker naming what
differs and the first differing case.

A worker agrees when nothing differs and something was shown:
  - both publish a complete fingerprint and they are equal (the corpus's ids, where compared, equal too);
    a plain `tokenfront serve` has no /tokenize (TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1 mounts it): it is
    compared by its fingerprint only, and the report says the ids were not compared;
  - it publishes no fingerprint (vLLM) but has POST /tokenize: agreement on the corpus only, said as such
    (a router forwards ids to such a worker only with verify=probe).
It differs when a fingerprint component differs, a fingerprint is incomplete (a server started with
--trust-remote-code), a case's ids differ, or it refuses a case the renderer rendered. A worker with neither a
fingerprint nor /tokenize is not shown to agree. A case the renderer refuses is skipped and not asked of the
workers."""

EPILOG = """\
A client of the servers' HTTP APIs: it loads no model and never imports torch.

exit codes:
  0  every worker agrees with the renderer
  1  some worker differs, or is not shown to agree (whatever the others are)
  2  no worker differs, but some server could not be checked (unreachable, timed out, a key refused, not a
     tokenfront or vLLM server), or a mistake on the command line"""


@dataclass(frozen=True)
class CheckSettings:
    """What `tokenfront check` was asked: the servers, their keys, the per-request timeout, the output form."""

    renderer: str
    workers: tuple[str, ...]
    api_key: str | None = None
    worker_api_key: str | None = None
    timeout: float = 10.0
    json: bool = False
    cases: tuple[ProbeCase, ...] = PROBE_CASES
    # How https:// servers are verified (`--ca-certs`) and the client certificate shown (`--certfile`).
    tls: ClientTls = field(default_factory=ClientTls)


def exit_code(verdicts: Sequence[Verdict]) -> int:
    """0 when every worker agrees; 1 when one differs or is not shown to agree; else 2 (one was unchecked)."""
    states = {verdict.state for verdict in verdicts}
    if states <= {AGREES}:
        return EXIT_AGREE
    if states - {AGREES, UNCHECKED}:
        return EXIT_DIFFER
    return EXIT_INCOMPLETE


def run_check(settings: CheckSettings, out: TextIO | None = None) -> int:
    """Check every worker against the renderer, print the report to `out` (stdout), return the exit code."""
    out = out or sys.stdout
    names = [case.name for case in settings.cases]
    worker_key = settings.worker_api_key if settings.worker_api_key is not None else settings.api_key
    with httpx.Client(timeout=settings.timeout, verify=settings.tls.context()) as client:
        reference = fetch_server(
            client, "renderer", settings.renderer, settings.cases, api_key=settings.api_key
        )
        # Only what the renderer rendered is asked of the workers: a case it refused has nothing to compare.
        rendered = rendered_ids(reference)
        asked = [case for case in settings.cases if case.name in rendered]
        workers: list[ServerReport] = [
            fetch_server(client, f"worker {index}", url, asked, api_key=worker_key)
            for index, url in enumerate(settings.workers, start=1)
        ]
    verdicts = [compare_worker(reference, worker, names) for worker in workers]
    code = exit_code(verdicts)
    if settings.json:
        out.write(json.dumps(to_json(reference, verdicts, names, code), indent=2, ensure_ascii=False) + "\n")
    else:
        out.write(format_table(reference, verdicts, names, code))
    out.flush()
    return code

"""Running `tokenfront check`: fetch every server, compare each worker with the renderer, print the report, and
the exit code that says whether the workers are safe to add."""

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
    "exit_code",
    "run_check",
]

EXIT_AGREE = 0  # every worker agrees with the renderer
EXIT_DIFFER = 1  # some worker differs, or is not shown to agree
EXIT_INCOMPLETE = 2  # a server could not be checked (and nothing differed), or a command-line mistake


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

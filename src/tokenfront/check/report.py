"""What `tokenfront check` prints: a plain-text table (servers, fingerprint components, corpus cases, one line
per worker), or the same facts as one JSON document (`--json`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tokenfront.check.compare import AGREES, SKIPPED, Verdict, rendered_ids
from tokenfront.check.fetch import ServerReport
from tokenfront.core.fingerprint import canonical_json, component_label, components, sha256_json

_HASH = re.compile(r"[0-9a-f]{64}")
_SHORT = 12  # hex digits of a hash shown in the table
_MAX_VALUE = 24  # a component value longer than this is shown as a short hash of its JSON
_STATE_WORDS = {
    AGREES: "agrees",
    "differs": "DIFFERS",
    "unproven": "NOT SHOWN TO AGREE",
    "unchecked": "UNCHECKED",
}


def format_table(
    reference: ServerReport, verdicts: Sequence[Verdict], case_names: Sequence[str], code: int
) -> str:
    """The report an operator reads."""
    workers = [verdict.worker for verdict in verdicts]
    servers = [reference, *workers]
    lines = [
        f"tokenfront check: renderer {reference.url} against {len(workers)} worker"
        + ("s" if len(workers) != 1 else "")
        + f"; {len(case_names)} corpus cases",
        "",
        *_grid(
            [["server", "url", "role", "model", "fingerprint", "render routes"], *map(_server_row, servers)]
        ),
        "",
    ]
    if reference.problem is not None:
        lines += [f"the renderer could not be checked: {reference.problem}", ""]
    else:
        lines += [
            *_component_lines(reference, verdicts),
            "",
            *_case_lines(reference, verdicts, case_names),
            "",
        ]
    width = max(len(worker.name) for worker in workers)
    for verdict in verdicts:
        word = _STATE_WORDS[verdict.state]
        summary = verdict.summary if verdict.summary.startswith(word) else f"{word}: {verdict.summary}"
        lines.append(f"{verdict.worker.name.ljust(width)}  {verdict.worker.url}: {summary}")
        lines.extend(f"{' ' * width}  note: {note}" for note in verdict.notes)
    lines += ["", f"result: {result_words(verdicts)} (exit {code})"]
    return "\n".join(lines) + "\n"


def result_words(verdicts: Sequence[Verdict]) -> str:
    """The last line's verdict over all workers."""
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.state] = counts.get(verdict.state, 0) + 1
    if counts.get(AGREES, 0) == len(verdicts):
        return "every worker agrees with the renderer"
    parts = [f"{count} {_STATE_WORDS[state].lower()}" for state, count in counts.items() if state != AGREES]
    return f"{counts.get(AGREES, 0)} of {len(verdicts)} agree; " + ", ".join(parts)


def to_json(
    reference: ServerReport, verdicts: Sequence[Verdict], case_names: Sequence[str], code: int
) -> dict[str, Any]:
    """The same facts as the table, for scripts."""
    return {
        "exit_code": code,
        "result": result_words(verdicts),
        "corpus": list(case_names),
        "renderer": _server_json(reference),
        "workers": [
            {
                **_server_json(verdict.worker),
                "verdict": verdict.state,
                "summary": verdict.summary,
                "fingerprint_differences": list(verdict.fingerprint_differences),
                "components": {component_label(key): equal for key, equal in verdict.components.items()},
                "cases": {
                    case.name: {"state": case.state, "reason": case.reason}
                    for case in verdict.cases
                    if case.state != SKIPPED
                },
                "compared": verdict.compared,
                "equal": verdict.equal,
                "first_differing_case": getattr(verdict.first_differing_case, "name", None),
                "notes": list(verdict.notes),
            }
            for verdict in verdicts
        ],
    }


def _server_json(report: ServerReport) -> dict[str, Any]:
    fingerprint = report.fingerprint
    return {
        "name": report.name,
        "url": report.url,
        "problem": report.problem,
        "role": report.role,
        "model_names": list(report.model_names),
        "fingerprint": fingerprint.digest if fingerprint is not None else None,
        "fingerprint_complete": fingerprint.complete if fingerprint is not None else None,
        "render_routes": report.render_routes,
        "routes_note": report.routes_note,
        "ids": {name: len(ids) for name, ids in rendered_ids(report).items()},
    }


def _server_row(report: ServerReport) -> list[str]:
    if report.problem is not None:
        return [report.name, report.url, "(could not be read)", "-", "-", "-"]
    fingerprint = report.fingerprint
    if fingerprint is None:
        shown = "none" if report.has_info else "none (no /server_info)"
    else:
        shown = fingerprint.digest[:_SHORT] + ("" if fingerprint.complete else " (incomplete)")
    routes = {True: "yes", False: f"no: {report.routes_note}", None: "not asked"}[report.render_routes]
    return [report.name, report.url, report.role or "-", ", ".join(report.model_names) or "-", shown, routes]


def _component_lines(reference: ServerReport, verdicts: Sequence[Verdict]) -> list[str]:
    if reference.fingerprint is None:
        return ["fingerprint components: not compared (the renderer publishes no rendering fingerprint)"]
    values = components(reference.fingerprint.compared)
    keys = [*values, *(key for v in verdicts for key in v.components if key not in values)]
    header = ["fingerprint component", "renderer", *(verdict.worker.name for verdict in verdicts)]
    rows = [header]
    for key in dict.fromkeys(keys):
        cells = [component_label(key), _short(values.get(key))]
        for verdict in verdicts:
            equal = verdict.components.get(key)
            cells.append("-" if equal is None else "same" if equal else "DIFFERS")
        rows.append(cells)
    return _grid(rows)


def _case_lines(reference: ServerReport, verdicts: Sequence[Verdict], case_names: Sequence[str]) -> list[str]:
    if not reference.answers:
        why = reference.routes_note or "the renderer rendered no corpus case"
        return [f"corpus (POST /tokenize): not compared ({why})"]
    rows = [["corpus case (POST /tokenize)", "renderer", *(verdict.worker.name for verdict in verdicts)]]
    for index, name in enumerate(case_names):
        answer = reference.answers.get(name)
        if answer is None:
            mine = "-"
        elif answer.ids is None:
            mine = f"refused ({answer.status}): skipped"
        else:
            mine = f"{len(answer.ids)} ids"
        rows.append([name, mine, *(v.cases[index].cell if index < len(v.cases) else "-" for v in verdicts)])
    return _grid(rows)


def _short(value: Any) -> str:
    """A component value in a table cell: hashes cut to 12 hex digits, long values as a hash of their JSON."""
    if value is None:
        return "-"
    if isinstance(value, str) and _HASH.fullmatch(value):
        return value[:_SHORT]
    if (
        isinstance(value, dict)
        and value
        and all(isinstance(v, str) and _HASH.fullmatch(v) for v in value.values())
    ):
        return ", ".join(f"{name}:{digest[:_SHORT]}" for name, digest in value.items())  # the chat templates
    text = value if isinstance(value, str) else canonical_json(value)
    if len(text) <= _MAX_VALUE:
        return text
    return "sha256:" + sha256_json(value)[:_SHORT]


def _grid(rows: list[list[str]]) -> list[str]:
    """Rows as left-aligned columns two spaces apart (the last column not padded)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]

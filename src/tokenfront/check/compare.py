"""How `tokenfront check` judges a worker against the renderer: fingerprints, then the corpus's ids.

The fingerprint is compared with `Fingerprint.compare` (the router's gate reads the same reasons), component by
component with `fingerprint.components`; the ids of every corpus case the renderer rendered are compared with
the worker's. A worker

- **agrees** when nothing differs and something was shown: the same complete fingerprint (ids equal too when
  they were compared), or, with no fingerprint on one side, the same ids on every corpus case asked;
- **differs** when a fingerprint component differs, a fingerprint is incomplete, or a case's ids differ or the
  worker refuses a case the renderer rendered;
- is **unproven** when it publishes no fingerprint and has no `/tokenize`: nothing shows it renders alike;
- is **unchecked** when it (or the renderer) could not be read: unreachable, a key refused, not a server.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tokenfront.check.fetch import ServerReport
from tokenfront.core.fingerprint import Fingerprint, components
from tokenfront.probe_corpus import first_difference

AGREES = "agrees"
DIFFERS = "differs"
UNPROVEN = "unproven"
UNCHECKED = "unchecked"

# A case's outcome on one worker.
EQUAL = "equal"
IDS_DIFFER = "differs"
REFUSED = "refused"
NOT_ASKED = "not asked"  # the renderer rendered it, the worker was not asked (no render routes, a problem)
SKIPPED = "skipped"  # the renderer did not render it (refused, or no render routes): nothing to compare


@dataclass(frozen=True)
class CaseOutcome:
    """One corpus case on one worker: `state` (EQUAL, IDS_DIFFER, ...), a short `cell` for the table, and
    for a difference the `reason` in words."""

    name: str
    state: str
    cell: str
    reason: str | None = None


@dataclass(frozen=True)
class Verdict:
    """One worker against the renderer."""

    worker: ServerReport
    state: str
    summary: str
    fingerprint_differences: tuple[str, ...] = ()
    # component key -> equal, when both sides publish a fingerprint
    components: dict[str, bool] = field(default_factory=dict)
    cases: tuple[CaseOutcome, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def compared(self) -> int:
        """Corpus cases whose ids were compared (asked of both, rendered by the renderer)."""
        return sum(case.state in (EQUAL, IDS_DIFFER, REFUSED) for case in self.cases)

    @property
    def equal(self) -> int:
        """Corpus cases that gave the same ids on both."""
        return sum(case.state == EQUAL for case in self.cases)

    @property
    def first_differing_case(self) -> CaseOutcome | None:
        """The first corpus case (in corpus order) that differs or that the worker refused."""
        return next((case for case in self.cases if case.state in (IDS_DIFFER, REFUSED)), None)


def reference_problem(reference: ServerReport) -> str | None:
    """Why the renderer cannot be compared against (None when it can)."""
    if reference.problem is not None:
        return f"the renderer could not be checked: {reference.problem}"
    if reference.fingerprint is None and not rendered_ids(reference):
        routes = reference.routes_note or "it rendered no corpus case"
        return f"the renderer publishes no rendering fingerprint and {routes}: there is nothing to compare against"
    return None


def rendered_ids(report: ServerReport) -> dict[str, list[int]]:
    """The ids of every corpus case the server rendered, by case name."""
    return {name: answer.ids for name, answer in report.answers.items() if answer.ids is not None}


def component_equality(mine: Fingerprint, theirs: Fingerprint) -> dict[str, bool]:
    """Each fingerprint component (both sides' keys, in `components` order) -> whether it is equal."""
    a, b = components(mine.compared), components(theirs.compared)
    keys = [*a, *(key for key in b if key not in a)]
    return {key: a.get(key) == b.get(key) for key in keys}


def compare_worker(reference: ServerReport, worker: ServerReport, case_names: list[str]) -> Verdict:
    """Judge `worker` against `reference` (the renderer) over the corpus cases `case_names`, in order."""
    problem = reference_problem(reference) or worker.problem
    if problem is not None:
        return Verdict(worker, UNCHECKED, problem)
    mine, theirs = reference.fingerprint, worker.fingerprint
    differences: tuple[str, ...] = ()
    equality: dict[str, bool] = {}
    if mine is not None and theirs is not None:
        differences = tuple(mine.compare(theirs, other_name=worker.name))
        equality = component_equality(mine, theirs)
    cases = tuple(_case_outcome(reference, worker, name) for name in case_names)
    verdict = Verdict(worker, AGREES, "", differences, equality, cases, _notes(reference, worker))
    return _judged(verdict, reference)


def _judged(verdict: Verdict, reference: ServerReport) -> Verdict:
    """The verdict's state and its one-line summary."""
    worker = verdict.worker
    both_fingerprinted = reference.fingerprint is not None and worker.fingerprint is not None
    missing = _missing_fingerprint(reference, worker)
    first = verdict.first_differing_case
    compared = verdict.compared
    ids_part = _ids_part(verdict, reference)
    if verdict.fingerprint_differences or first is not None:
        parts = list(verdict.fingerprint_differences)
        if missing is not None:
            parts.append(missing)
        if first is not None:
            parts.append(f"first differing case: {first.name} ({first.reason})")
        else:
            parts.append(ids_part)
        return _with(verdict, DIFFERS, "; ".join(parts))
    if both_fingerprinted:
        return _with(verdict, AGREES, f"agrees: the same rendering fingerprint; {ids_part}")
    if compared:
        return _with(
            verdict,
            AGREES,
            f"agrees on the corpus only: {ids_part}, but {missing}, so only these cases are shown to render "
            "alike (a router forwards ids to such a worker only when it is added with verify=probe)",
        )
    return _with(verdict, UNPROVEN, f"{missing}, and {ids_part}")


def _with(verdict: Verdict, state: str, summary: str) -> Verdict:
    return dataclasses.replace(verdict, state=state, summary=summary)


def _missing_fingerprint(reference: ServerReport, worker: ServerReport) -> str | None:
    if worker.fingerprint is None:
        return f"{worker.name} publishes no rendering fingerprint" + (
            "" if worker.has_info else " (no /server_info)"
        )
    if reference.fingerprint is None:
        return "the renderer publishes no rendering fingerprint"
    return None


def _ids_part(verdict: Verdict, reference: ServerReport) -> str:
    """What the corpus showed, in words: how many cases gave the same ids, or why ids were not compared."""
    compared = verdict.compared
    if compared:
        return f"the same ids on {verdict.equal} of {compared} corpus cases"
    why = reference.routes_note if reference.render_routes is False else verdict.worker.routes_note
    if why is None and not rendered_ids(reference):
        why = "the renderer rendered no corpus case"
    return f"ids not compared ({why or 'no corpus case was asked'})"


def _case_outcome(reference: ServerReport, worker: ServerReport, name: str) -> CaseOutcome:
    expected = reference.answers.get(name)
    if expected is None or expected.ids is None:
        return CaseOutcome(name, SKIPPED, "-")
    answer = worker.answers.get(name)
    if answer is None:
        return CaseOutcome(name, NOT_ASKED, "-")
    if answer.ids is None:
        return CaseOutcome(
            name,
            REFUSED,
            f"refused ({answer.status})",
            f"the renderer rendered it, {worker.name} answered {answer.status}: {answer.message}",
        )
    at = first_difference(answer.ids, expected.ids)
    if at is None:
        return CaseOutcome(name, EQUAL, "equal")
    return CaseOutcome(
        name,
        IDS_DIFFER,
        f"differs at index {at}",
        f"the ids differ from index {at}: {worker.name} gave {len(answer.ids)} ids, the renderer {len(expected.ids)}",
    )


def _notes(reference: ServerReport, worker: ServerReport) -> tuple[str, ...]:
    """What does not change ids but an operator adding the worker wants to know."""
    missing = [
        name for name in reference.model_names if worker.model_names and name not in worker.model_names
    ]
    if not missing:
        return ()
    return (
        f"{worker.name} does not serve {', '.join(missing)} (it serves {', '.join(worker.model_names)}): a "
        "router sends it no request naming those",
    )

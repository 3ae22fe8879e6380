"""The forwarding gate (docs/contract.md §8): may the router send its rendered ids to the workers?

Ids go to workers only when every active worker reports a rendering fingerprint that matches the router's;
otherwise each worker renders the original request itself and the router's ids only choose the worker.
`ForwardingGate.evaluate` decides from the router's fingerprint and what the active workers report, and logs
one warning naming each worker (or the router itself) that blocks forwarding and why — again only when that
set or a reason changes, and once at INFO when forwarding resumes. Each of these records also carries its
content as fields (`GateState.log_fields`), which `--log-format json` writes into the line.

A worker that publishes no fingerprint but was added with `verify=probe` (vLLM) is compared by its render
probe instead (`router.probe`): it is eligible when every probe case gave the router's ids, and the first
differing case is its reason otherwise. That is weaker evidence than a fingerprint, so whenever forwarding is
on with such workers active the gate warns once (per change) that it forwards on a probe.

Some requests are never forwarded whatever the fingerprints say (`never_forward_reason`): a named
`tool_choice` (the worker appends a forced-call prefix when it renders), a model family whose usage count
needs the prompt text (`kimi_k3`), and a prompt that carries a reasoning mode when a worker's reasoning
parser reads that mode from the prompt text. Those are per request, logged at DEBUG only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tokenfront.core.fingerprint import Fingerprint
from tokenfront.core.reasoning import ReasoningParser, prompt_carries_reasoning_mode
from tokenfront.router.worker_report import WorkerReport

log = logging.getLogger(__name__)

NO_MODEL_PATH = "router started without a model path (renders as a generic text model)"
NO_TOKENIZER = "router started without a model path or tokenizer (it cannot render: it routes by load only)"


@dataclass(frozen=True)
class GateState:
    """The gate's decision: forward or not, and who blocks it for what reasons."""

    forwarding: bool
    router_reasons: tuple[str, ...] = ()
    blocking: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Active workers eligible only by their render probe (no fingerprint): URL -> probe cases compared.
    verified_by_probe: Mapping[str, int] = field(default_factory=dict)

    def key(self) -> tuple[object, ...]:
        """What a change is measured on: the router's reasons, each blocking worker's reasons, and — while
        forwarding — the workers it forwards to on a probe."""
        verified = tuple(sorted(self.verified_by_probe.items())) if self.forwarding else ()
        return (self.router_reasons, tuple(sorted(self.blocking.items())), verified)

    def describe(self) -> str:
        """`router reason; URL: reason, reason; ...` for the log (router reasons name the router)."""
        parts = list(self.router_reasons)
        parts += [f"{url}: {', '.join(reasons)}" for url, reasons in sorted(self.blocking.items())]
        return "; ".join(parts)

    def describe_verified(self) -> str:
        """`URL verified by probe, N cases; ...` for the log."""
        return "; ".join(
            f"{url} verified by probe, {cases} cases" for url, cases in sorted(self.verified_by_probe.items())
        )

    def log_fields(self) -> dict[str, object]:
        """The decision as structured log fields (`extra=`): `forwarding`; `router_reasons`; `blocking`, one
        `{"worker": URL, "reasons": [...]}` per blocking worker; `verified_by_probe`, one
        `{"worker": URL, "cases": N}` per worker eligible by its probe alone. Lists, not maps keyed by URL: a
        log store indexes the field names, and a URL is no field name."""
        fields: dict[str, object] = {
            "forwarding": self.forwarding,
            "router_reasons": list(self.router_reasons),
            "blocking": [
                {"worker": url, "reasons": list(reasons)} for url, reasons in sorted(self.blocking.items())
            ],
        }
        if self.verified_by_probe:
            fields["verified_by_probe"] = [
                {"worker": url, "cases": cases} for url, cases in sorted(self.verified_by_probe.items())
            ]
        return fields

    def to_json(self) -> dict[str, object]:
        """The published form (on `/server_info` and `GET /workers`); `verified_by_probe` only when some
        active worker is eligible by its probe alone."""
        published: dict[str, object] = {
            "forwarding": self.forwarding,
            "router_reasons": list(self.router_reasons),
            "blocking_workers": {url: list(reasons) for url, reasons in sorted(self.blocking.items())},
        }
        if self.verified_by_probe:
            published["verified_by_probe"] = dict(sorted(self.verified_by_probe.items()))
        return published


def router_reasons(fingerprint: Fingerprint | None, *, has_model_path: bool) -> tuple[str, ...]:
    """Why the router itself cannot forward, whatever its workers report (empty when it can)."""
    if fingerprint is None:
        return (NO_TOKENIZER,)
    reasons = []
    if not has_model_path:
        reasons.append(NO_MODEL_PATH)
    if not fingerprint.complete:
        reasons.append(
            "the router's tokenizer is not fully identified: " + "; ".join(fingerprint.incomplete_reasons)
        )
    return tuple(reasons)


# How many distinct worker fingerprints a gate remembers its comparison of (a fleet has a handful).
_REMEMBERED_FINGERPRINTS = 64


class ForwardingGate:
    """Decides whether rendered ids may be forwarded, and logs each change of that decision once."""

    def __init__(
        self, fingerprint: Fingerprint | None, *, has_model_path: bool, model: str | None = None
    ) -> None:
        """`model`: the model this gate decides for, named in its log lines (a router of several models has
        one gate per model); None: the router's only model, whose lines name none."""
        self.fingerprint = fingerprint
        self.model = model
        self._router_reasons = router_reasons(fingerprint, has_model_path=has_model_path)
        # Compared as if complete: the router's own incompleteness is a router reason, said once, not once
        # more in every worker's reasons.
        self._comparable = (
            dataclasses.replace(fingerprint, complete=True) if fingerprint is not None else None
        )
        self.state = GateState(forwarding=False, router_reasons=self._router_reasons)
        self._logged: tuple[object, ...] | None = None
        # What each distinct worker fingerprint was found to differ in: every worker's report is compared again
        # at each change of the active set (each check), so a fleet of N identical workers would otherwise pay
        # N full comparisons per check. Keyed by all that a comparison reads of the other side.
        self._differences: dict[tuple[object, ...], tuple[str, ...]] = {}

    def worker_reasons(self, report: WorkerReport | None) -> tuple[str, ...]:
        """Why ids rendered by the router may not be what this worker renders (empty: it matches).

        Without a fingerprint, a worker's render probe decides; with one, the fingerprint does, and a failing
        probe is one more reason.
        """
        if report is None:
            return ("no fingerprint (not checked yet)",)
        probe = report.probe
        if report.fingerprint is None:
            if probe is None:
                return (f"no fingerprint ({report.missing})",)
            return (probe.difference,) if probe.difference is not None else ()
        reasons = self.fingerprint_reasons(report.fingerprint)
        return (*reasons, probe.difference) if probe is not None and probe.difference is not None else reasons

    def fingerprint_reasons(self, fingerprint: Fingerprint) -> tuple[str, ...]:
        """How a worker's fingerprint differs from the router's (empty: it matches)."""
        if self._comparable is None:
            return ()  # nothing to compare against: the router's own reason says it all
        key = (
            fingerprint.version,
            fingerprint.complete,
            tuple(fingerprint.incomplete_reasons),
            fingerprint.digest,
        )
        reasons = self._differences.get(key)
        if reasons is None:
            if len(self._differences) >= _REMEMBERED_FINGERPRINTS:
                self._differences.clear()  # a fleet of many builds: start over rather than grow
            reasons = self._differences[key] = tuple(
                self._comparable.compare(fingerprint, other_name="worker")
            )
        return reasons

    @staticmethod
    def probe_verified(report: WorkerReport | None) -> int | None:
        """The probe cases compared when the worker is eligible by its probe alone (no fingerprint), else None."""
        if report is None or report.fingerprint is not None or report.probe is None:
            return None
        return report.probe.compared if report.probe.difference is None else None

    def evaluate(self, reports: Mapping[str, WorkerReport | None]) -> GateState:
        """Decide for the active workers' reports (URL -> report), and log when the decision changed."""
        blocking = {
            url: reasons for url, report in reports.items() if (reasons := self.worker_reasons(report))
        }
        verified = {
            url: cases
            for url, report in reports.items()
            if (cases := self.probe_verified(report)) is not None
        }
        state = GateState(
            forwarding=not self._router_reasons and not blocking,
            router_reasons=self._router_reasons,
            blocking=blocking,
            verified_by_probe=verified,
        )
        self._log_change(state)
        self.state = state
        return state

    def _log_change(self, state: GateState) -> None:
        key = state.key()
        if key == self._logged:
            return
        first = self._logged is None
        was_forwarding = self.state.forwarding
        self._logged = key
        fields = state.log_fields()
        for_model = ""
        if self.model is not None:
            for_model = f" for model {self.model}"
            fields["model"] = self.model
        if not state.forwarding:
            log.warning(
                "not forwarding token ids%s: workers render each request themselves and the router's ids only "
                "choose the worker. Blocked by %s",
                for_model,
                state.describe(),
                extra=fields,
            )
        elif state.verified_by_probe:
            log.warning(
                "forwarding token ids%s to workers that publish no fingerprint: %s (a probe shows that these "
                "cases render alike, not that every request does)",
                for_model,
                state.describe_verified(),
                extra=fields,
            )
        elif not first and not was_forwarding:
            log.info(
                "forwarding token ids again%s: every active worker matches the router's rendering fingerprint",
                for_model,
                extra=fields,
            )


def never_forward_reason(
    *,
    named_tool_choice: bool,
    family_never_forwards: bool,
    family: str,
    prompt_text: str | None,
    prompt_mode_parsers: Iterable[ReasoningParser],
) -> str | None:
    """Why this one request must go to the worker as sent, whatever the fingerprints say (None: it need not).

    The answer is a short label, used in the debug log and as the `reason` of the router's metrics.
    """
    if named_tool_choice:
        log.debug("not forwarding ids: a named tool_choice needs the worker's own forced-call prefix")
        return "named_tool_choice"
    if family_never_forwards:
        log.debug("not forwarding ids: %s models count usage from the prompt text", family)
        return "model_family"
    if prompt_text is not None:
        for parser in prompt_mode_parsers:
            if prompt_carries_reasoning_mode(parser, prompt_text):
                log.debug(
                    "not forwarding ids: the prompt carries a reasoning mode that %s reads", parser.name
                )
                return "reasoning_mode"
    return None

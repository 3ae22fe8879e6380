"""Render-parity bookkeeping: the outcomes of every template x request pair, summed up at the end of the run."""

from __future__ import annotations

from typing import Any

import pytest

# Parity outcome per sweep key ("checkpoint:qwen3", "template:Qwen3-Coder"), filled by test_parity.py.
_PARITY_OUTCOMES: dict[str, Any] = {}


@pytest.fixture(scope="session")
def parity_outcomes() -> dict[str, Any]:
    """Where the parity sweep records one outcome per checkpoint or template."""
    return _PARITY_OUTCOMES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _PARITY_OUTCOMES:
        return
    outcomes = list(_PARITY_OUTCOMES.values())
    compared = sum(o.compared for o in outcomes)
    equal = sum(o.equal for o in outcomes)
    both_raise = sum(o.both_raise for o in outcomes)
    failures = sum(len(o.failures) for o in outcomes)
    templates = [o for o in outcomes if o.key.startswith("template:")]
    terminalreporter.section("render parity")
    terminalreporter.write_line(
        f"{compared} template x request pairs compared over {len(outcomes)} checkpoints/templates: "
        f"{equal} equal ids, {both_raise} refused by both (400), {failures} mismatches"
    )
    if templates:
        basic = [o for o in templates if o.basic_renders]
        terminalreporter.write_line(
            f"llama.cpp templates: {len(basic)} of {len(templates)} render a plain system + user chat under "
            f"transformers, {sum(1 for o in templates if o.reference_renders)} render at least one corpus request"
        )
        for o in templates:
            if not o.basic_renders:
                reason = o.reference_errors.get("system_user", "?")
                terminalreporter.write_line(
                    f"  {o.key.removeprefix('template:')}: renders {o.reference_renders}/{o.compared}; "
                    f"system + user: {reason}"
                )

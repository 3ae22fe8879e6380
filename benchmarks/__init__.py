"""tokenfront benchmarks: speed measured side by side against the reference path, reported as ratios."""

import sys
from pathlib import Path

from tokenfront import fixtures


def checkpoint_or_tiny(name: str) -> tuple[str, Path]:
    """The fixture checkpoint `name`, or the tiny random model when it cannot be had (said on stderr)."""
    for candidate in (name, "tiny-random"):
        try:
            return candidate, fixtures.ensure_checkpoint(candidate)
        except fixtures.FixtureError as error:
            print(f"checkpoint {candidate} unavailable ({error})", file=sys.stderr)
    raise SystemExit("no checkpoint to benchmark on")

"""What the monitoring tests share: Debian's promtool and prometheus (the `prometheus` package), and the files
under test, parsed. A module of its own, not a conftest: a bare `from conftest import` elsewhere finds
whichever conftest pytest loaded last.

A missing binary skips its tests where one runs them by hand, with the reason; under CI (`CI` set, as every CI
service sets it) it fails them, so the rules never go unchecked unnoticed. `make install-test` installs it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"


def debian_binary(name: str) -> Path:
    """The path of `name` (promtool, prometheus); a skip, or a failure under CI, when it is not installed."""
    found = shutil.which(name)
    if found is not None:
        return Path(found)
    reason = f"{name} is not installed (Debian's prometheus package: apt-get install prometheus; make install-test)"
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{reason}: under CI the monitoring tests must run")
    pytest.skip(reason)


@functools.cache
def rules() -> dict[str, Any]:
    """deploy/monitoring/rules.yml, parsed."""
    loaded: dict[str, Any] = yaml.safe_load((MONITORING / "rules.yml").read_text(encoding="utf-8"))
    return loaded


@functools.cache
def dashboard() -> dict[str, Any]:
    """deploy/monitoring/grafana-dashboard.json, parsed."""
    loaded: dict[str, Any] = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    return loaded


def recorded_names() -> set[str]:
    """The names the recording rules record."""
    return {rule["record"] for group in rules()["groups"] for rule in group["rules"] if "record" in rule}


def expressions() -> list[tuple[str, str]]:
    """Every PromQL expression shipped, as (where, expression): each rule's, each dashboard query's and the
    dashboard's annotation query."""
    found = [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in rules()["groups"]
        for rule in group["rules"]
    ]
    for panel in dashboard()["panels"]:
        found += [(f"panel {panel['title']!r}", target["expr"]) for target in panel.get("targets", ())]
    found += [(f"annotation {a['name']!r}", a["expr"]) for a in dashboard()["annotations"]["list"]]
    return found

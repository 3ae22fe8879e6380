"""Render the same requests on tokenfront and on vLLM 0.33's CPU render server and compare ids and refusals.

For the model families that are not rendered by a Jinja chat template (docs/contract.md §9): gpt-oss (Harmony), with and
without a template in the folder, and a Mistral tekken checkpoint in `--tokenizer-mode mistral`. The corpora
are the ones the CI tests check against the reference libraries directly (`tests/core/corpus_*.py`); here
the reference is vLLM itself, so this needs a venv holding vllm==0.33.0 (`make peer-vllm`, ~10 min, once).
Not run in CI.

    python -m benchmarks.compare_vllm --vllm ~/.cache/tokenfront-peers/vllm [--family gpt-oss] [--json]

Every case is sent to both servers' `/v1/chat/completions/render` or `/v1/completions/render`. A case
passes when both answer 200 with equal token ids, or both refuse it with a 4xx. Exit status 0 only when every
case of every family passed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import Server, launch_tokenfront, launch_vllm_render, wait_healthy
from tokenfront.fixtures import ensure_checkpoint


def _harmony_env(folder: Path) -> dict[str, str]:
    """vLLM loads the Harmony encoding's vocabulary from TIKTOKEN_ENCODINGS_BASE (else it downloads it): point
    it at the copy tokenfront derives from the checkpoint's own tokenizer.json."""
    from tokenfront.core.families.gpt_oss import tiktoken_encodings_dir

    return {"TIKTOKEN_ENCODINGS_BASE": str(tiktoken_encodings_dir(folder))}


@dataclass(frozen=True)
class Family:
    """One checkpoint, the corpus to render on it and the options both servers need."""

    checkpoint: str
    corpus: str  # module with CHAT_CASES and COMPLETION_CASES: lists of (name, body, vLLM's status)
    tokenfront_args: tuple[str, ...] = ()
    vllm_args: tuple[str, ...] = ()
    vllm_env: Callable[[Path], dict[str, str]] | None = None


FAMILIES = {
    "gpt-oss": Family(
        "gptoss-bare",
        "tests.core.corpus_gpt_oss",
        tokenfront_args=("--tool-call-parser", "openai"),
        vllm_args=("--enable-auto-tool-choice", "--tool-call-parser", "openai"),
        vllm_env=_harmony_env,
    ),
    "gpt-oss-with-template": Family(
        "gptoss",
        "tests.core.corpus_gpt_oss",
        tokenfront_args=("--tool-call-parser", "openai"),
        vllm_args=("--enable-auto-tool-choice", "--tool-call-parser", "openai"),
        vllm_env=_harmony_env,
    ),
    "mistral": Family(
        "mistral-tekken",
        "tests.core.corpus_mistral",
        tokenfront_args=("--tokenizer-mode", "mistral", "--tool-call-parser", "mistral"),
        vllm_args=(
            "--tokenizer-mode",
            "mistral",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "mistral",
        ),
    ),
}


@dataclass
class Outcome:
    """What the two servers answered to one case."""

    case: str
    route: str
    expected_status: int
    statuses: dict[str, int] = field(default_factory=dict)
    ids: dict[str, list[list[int]] | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        tokenfront, vllm = self.statuses["tokenfront"], self.statuses["vllm"]
        if tokenfront == 200 and vllm == 200:
            return self.ids["tokenfront"] == self.ids["vllm"]
        return 400 <= tokenfront < 500 and 400 <= vllm < 500

    def describe(self) -> str:
        if self.passed:
            verdict = "equal ids" if self.statuses["vllm"] == 200 else "both refuse"
        elif 200 in self.statuses.values() and set(self.statuses.values()) == {200}:
            verdict = "IDS DIFFER at " + _first_difference(self.ids["tokenfront"], self.ids["vllm"])
        else:
            verdict = "STATUS DIFFERS: " + "; ".join(
                f"{name} {status} {self.errors.get(name, '')[:160]}" for name, status in self.statuses.items()
            )
        note = (
            ""
            if self.statuses["vllm"] == self.expected_status
            else f" (corpus expected {self.expected_status})"
        )
        return f"{self.route:<11} {self.case:<44} {verdict}{note}"


def _first_difference(a: list[list[int]] | None, b: list[list[int]] | None) -> str:
    a, b = a or [], b or []
    for item, (x, y) in enumerate(zip(a, b, strict=False)):
        for position, (i, j) in enumerate(zip(x, y, strict=False)):
            if i != j:
                return f"item {item} position {position}: {i} vs {j}"
        if len(x) != len(y):
            return f"item {item}: {len(x)} vs {len(y)} ids"
    return f"{len(a)} vs {len(b)} items"


def _ids_of(answer: Any) -> list[list[int]]:
    """tokenfront answers one object (chat) or a list (completions); vLLM a GenerateRequest or a list."""
    items = answer if isinstance(answer, list) else [answer]
    return [list(item["token_ids"]) for item in items]


def _post(client: httpx.Client, server: Server, route: str, body: dict[str, Any]) -> tuple[int, Any, str]:
    response = client.post(f"{server.url}/v1/{route}/render", json=body)
    if response.status_code == 200:
        return 200, _ids_of(response.json()), ""
    return response.status_code, None, response.text


def compare_family(name: str, family: Family, venv: Path, log_dir: Path) -> list[Outcome]:
    """Start both servers on the family's checkpoint, send every case to both, stop them."""
    folder = ensure_checkpoint(family.checkpoint)
    corpus = importlib.import_module(family.corpus)
    cases = [("chat/completions", case) for case in corpus.CHAT_CASES] + [
        ("completions", case) for case in corpus.COMPLETION_CASES
    ]
    env = family.vllm_env(folder) if family.vllm_env else {}
    servers = {
        "tokenfront": launch_tokenfront(
            ["render", "--model", str(folder), *family.tokenfront_args],
            log_dir=log_dir,
            name=f"tokenfront-{name}",
        ),
        "vllm": launch_vllm_render(
            venv, str(folder), log_dir=log_dir, extra_args=family.vllm_args, name=f"vllm-{name}", env=env
        ),
    }
    # The corpora send no `model` (the served one): the two servers name the model differently.
    try:
        wait_healthy(servers.values())
        outcomes = []
        with httpx.Client(timeout=60) as client:
            for route, (case, body, expected) in cases:
                outcome = Outcome(case, route, expected)
                for server_name, server in servers.items():
                    status, ids, error = _post(client, server, route, body)
                    outcome.statuses[server_name], outcome.ids[server_name] = status, ids
                    if error:
                        outcome.errors[server_name] = error
                outcomes.append(outcome)
        return outcomes
    finally:
        for server in servers.values():
            server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm", type=Path, required=True, help="a venv holding vllm==0.33.0")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: all")
    parser.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    args = parser.parse_args(argv)
    venv = args.vllm.expanduser()
    if not (venv / "bin" / "vllm").is_file():
        parser.error(f"{venv} holds no vllm: create it with `make peer-vllm`")
    failed = 0
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tokenfront-compare-") as logs:
        for name in args.family or list(FAMILIES):
            outcomes = compare_family(name, FAMILIES[name], venv, Path(logs))
            passed = sum(outcome.passed for outcome in outcomes)
            refused = sum(outcome.passed and outcome.statuses["vllm"] != 200 for outcome in outcomes)
            failed += len(outcomes) - passed
            report[name] = {
                "checkpoint": FAMILIES[name].checkpoint,
                "cases": len(outcomes),
                "equal_ids": passed - refused,
                "both_refuse": refused,
                "failed": len(outcomes) - passed,
                "outcomes": [outcome.__dict__ for outcome in outcomes],
            }
            if not args.json:
                print(
                    f"== {name} ({FAMILIES[name].checkpoint}): {len(outcomes)} cases, "
                    f"{passed - refused} equal ids, {refused} refused by both, {len(outcomes) - passed} differ"
                )
                for outcome in outcomes:
                    print("   " + outcome.describe())
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compare tokenfront with vLLM 0.33's render server on vLLM's scale-out protocol routes (docs/contract.md §11).

Starts vLLM's CPU render server and `tokenfront render` on the same Qwen3 checkpoint, both with the `qwen3`
reasoning parser and `hermes` tool calls and the served name `qwen3`, sends every case of
`tests/renderer/protocol_cases.py` to both, and prints one line per case:

- `/tokenize` (text and chat) and `/detokenize`: the whole answers must be equal (vLLM's schemas);
- `/v1/messages/render` (Anthropic Messages) and `/v1/responses/render` (OpenAI Responses): equal `token_ids`
  (the envelopes differ by design: vLLM answers a `GenerateRequest`, tokenfront docs/contract.md §2's envelope);
- `/v1/chat/completions/render` on the chat normalization cases (tools, tool calls and messages as vLLM's
  request models fill them in, drop or refuse them): equal `token_ids`;
- chat and completions derender (`tests/renderer/derender_cases.py`, whole and streamed, plugged in through
  `extra_groups()`): equal answers but for `created` and tool-call ids;
- refusals: a case both servers answer with a 4xx passes (the messages differ);
- the router's `verify=probe` against vLLM itself: a `tokenfront route` given this vLLM render server as a
  `protocol=generate,verify=probe` worker must find it "verified by probe, N cases", and given a second vLLM
  render server whose chat template differs only in the tools preamble must block it, naming the `tools` case.

A case listed in `KNOWN_DIVERGENCES` is reported with its reason and does not fail the run. Exit status 0 only
when every other case passed. Needs a venv holding vllm==0.33.0 (`make peer-vllm`); not run in CI.

    python -m benchmarks.compare_vllm_protocol --vllm ~/.cache/tokenfront-peers/vllm [--json]
    python -m benchmarks.compare_vllm_protocol --vllm ... --write-pins tests/renderer/data/vllm_protocol_pins.json

`--write-pins` stores vLLM's answers, which tests/renderer pins tokenfront's answers to (no vLLM in CI);
`--write-conversations` stores the conversation vLLM's own conversion code builds from each Anthropic and
Responses case (what its template sees: messages after its chat parsing, tools, template kwargs), which the
converters' unit tests (tests/core/test_requests_*.py) compare with.

More routes plug in through `extra_groups()`: a `Group` names its route, its cases and how two answers are
compared; a `PairedGroup` drives both servers itself (cases of several requests, such as streams).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tests.renderer import protocol_cases as cases

from benchmarks.servers import Server, launch_tokenfront, launch_vllm_render, stop_all, wait_healthy
from tokenfront.fixtures import ensure_checkpoint

SERVED_NAME = cases.MODEL
PARSER_ARGS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes")
VLLM_ARGS = ("--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")

Body = dict[str, Any]
# (vLLM's answer, tokenfront's answer) -> None when they agree, else what differs
Compare = Callable[[Any, Any], str | None]


def equal_answers(vllm: Any, tokenfront: Any) -> str | None:
    """The whole JSON answers are equal (vLLM's own response schema on both sides)."""
    if vllm == tokenfront:
        return None
    keys = (
        sorted(set(vllm) | set(tokenfront)) if isinstance(vllm, dict) and isinstance(tokenfront, dict) else []
    )
    differing = [key for key in keys if vllm.get(key) != tokenfront.get(key)]
    return "answers differ in " + ", ".join(differing or ["shape"])


def equal_token_ids(vllm: Any, tokenfront: Any) -> str | None:
    """The rendered prompts are equal (the render envelopes themselves differ by design)."""
    a, b = list(vllm["token_ids"]), list(tokenfront["token_ids"])
    if a == b:
        return None
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"ids differ at {at} ({len(a)} vs {len(b)} ids): {a[at : at + 5]} vs {b[at : at + 5]}"


@dataclass(frozen=True)
class Group:
    """A route and the cases sent to it."""

    name: str
    route: str
    cases: Sequence[tuple[str, Body]]
    compare: Compare


@dataclass
class Outcome:
    """What both servers answered to one case."""

    group: str
    case: str
    statuses: dict[str, int] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)
    difference: str | None = None
    known: str | None = None
    equal: bool | None = None  # decided by a paired group's own comparison

    @property
    def passed(self) -> bool:
        if self.equal is not None:
            return self.equal
        vllm, tokenfront = self.statuses["vllm"], self.statuses["tokenfront"]
        if vllm == tokenfront == 200:
            return self.difference is None
        return 400 <= vllm < 500 and 400 <= tokenfront < 500

    def verdict(self) -> str:
        if self.passed:
            return "equal" if self.statuses["vllm"] == 200 else "both refuse"
        if self.known is not None:
            return f"KNOWN DIVERGENCE ({self.known})"
        if self.difference is not None:
            return "DIFFERS: " + self.difference
        return "STATUS DIFFERS: " + ", ".join(
            f"{name} {status} {_error_text(self.answers[name])}" for name, status in self.statuses.items()
        )


def _error_text(answer: Any) -> str:
    message = answer.get("error", {}).get("message", "") if isinstance(answer, dict) else ""
    return str(message)[:120] if message else ""


# Refusals: each must be a 4xx on both servers.
REFUSED: list[tuple[str, str, Body]] = [
    ("tokenize", "neither_prompt_nor_messages", {}),
    (
        "tokenize",
        "both_generation_prompt_and_continue",
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "continue_final_message": True,
        },
    ),
    ("detokenize", "negative_id", {"tokens": [-1]}),
    ("messages", "no_max_tokens", {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hi"}]}),
    (
        "messages",
        "thinking_budget_over_max_tokens",
        {
            "model": SERVED_NAME,
            "max_tokens": 2000,
            "thinking": {"type": "enabled", "budget_tokens": 4000},
            "messages": [{"role": "user", "content": "Hi"}],
        },
    ),
    (
        "messages",
        "unknown_model",
        {"model": "nope", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]},
    ),
    ("responses", "previous_response_id", {"input": "Hi", "previous_response_id": "resp_1"}),
    (
        "responses",
        "encrypted_reasoning",
        {"input": [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"}]},
    ),
    ("responses", "required_tool_choice_without_tools", {"input": "Hi", "tool_choice": "required"}),
    ("responses", "unknown_item_type", {"input": [{"type": "banana"}]}),
]

# What tokenfront answers differently on purpose, case by case.
KNOWN_DIVERGENCES = {
    ("detokenize", "id_outside_vocabulary"): (
        "docs/contract.md §2: ids outside [0, vocab_size) are a 400 on tokenfront; vLLM 0.33 decodes them to an empty string"
    ),
    ("derender", "stream_tool_call"): (
        "vLLM 0.33's streamed hermes call is a name piece then an arguments piece, after a content delta of "
        "the whitespace between </think> and <tool_call> ('\\n\\n'), though its own non-streaming answer "
        "has content null; tokenfront's stream adds up to its non-streaming answer, equal to vLLM's (content "
        "null, the whole call in the last chunk)"
    ),
}
DIVERGENT: list[tuple[str, str, Body]] = [
    ("detokenize", "id_outside_vocabulary", {"tokens": [9707, 999999999]})
]


def protocol_groups() -> list[Group]:
    """The cases of this issue's part: /tokenize, /detokenize, Anthropic Messages, OpenAI Responses, and the chat
    normalization rules."""
    by_group: dict[str, list[tuple[str, Body]]] = {
        "tokenize": [],
        "detokenize": [],
        "messages": [],
        "responses": [],
    }
    for group, name, body in [*REFUSED, *DIVERGENT]:
        by_group[group].append((name, body))
    return [
        Group("tokenize", "/tokenize", [*cases.TOKENIZE_CASES, *by_group["tokenize"]], equal_answers),
        Group("detokenize", "/detokenize", [*cases.DETOKENIZE_CASES, *by_group["detokenize"]], equal_answers),
        Group(
            "messages",
            "/v1/messages/render",
            [*cases.ANTHROPIC_CASES, *by_group["messages"]],
            equal_token_ids,
        ),
        Group(
            "responses",
            "/v1/responses/render",
            [*cases.RESPONSES_CASES, *by_group["responses"]],
            equal_token_ids,
        ),
        Group(
            "chat",
            "/v1/chat/completions/render",
            [*cases.NORMALIZATION_CASES, *cases.NORMALIZATION_REFUSED],
            equal_token_ids,
        ),
    ]


# Posts one body to one server: `(status, answer)`.
Post = Callable[[str, Body], tuple[int, Any]]


@dataclass(frozen=True)
class PairedGroup:
    """Cases that drive both servers themselves (a stream threads each answer's state into the next body):
    `compare(post_vllm, post_tokenfront)` gives `(case, equal, vLLM's answer, tokenfront's answer)` each."""

    name: str
    compare: Callable[[Post, Post], list[tuple[str, bool, Any, Any]]]


def extra_groups() -> list[Group | PairedGroup]:
    """The other routes of docs/contract.md §11, from the modules that own their cases: chat and completions derender
    (tests/renderer/derender_cases.py, whole and streamed outputs; `created` and call ids not compared)."""
    from tests.renderer import derender_cases

    return [PairedGroup("derender", derender_cases.compare_derender)]


def run(groups: Sequence[Group | PairedGroup], servers: dict[str, Server]) -> list[Outcome]:
    """Send every case of every group to every server."""
    outcomes = []
    with httpx.Client(timeout=120) as client:
        for group in groups:
            if isinstance(group, PairedGroup):
                outcomes += _paired(group, client, servers)
                continue
            for name, body in group.cases:
                outcome = Outcome(group.name, name, known=KNOWN_DIVERGENCES.get((group.name, name)))
                for server_name, server in servers.items():
                    response = client.post(f"{server.url}{group.route}", json=body)
                    outcome.statuses[server_name] = response.status_code
                    outcome.answers[server_name] = response.json()
                if outcome.statuses["vllm"] == outcome.statuses["tokenfront"] == 200:
                    outcome.difference = group.compare(outcome.answers["vllm"], outcome.answers["tokenfront"])
                outcomes.append(outcome)
    return outcomes


def _paired(group: PairedGroup, client: httpx.Client, servers: dict[str, Server]) -> list[Outcome]:
    def poster(server: Server) -> Post:
        def post(path: str, body: Body) -> tuple[int, Any]:
            response = client.post(f"{server.url}{path}", json=body)
            return response.status_code, response.json()

        return post

    outcomes = []
    for name, equal, vllm, tokenfront in group.compare(
        poster(servers["vllm"]), poster(servers["tokenfront"])
    ):
        outcome = Outcome(
            group.name,
            name,
            answers={"vllm": vllm, "tokenfront": tokenfront},
            equal=equal,
            known=KNOWN_DIVERGENCES.get((group.name, name)),
        )
        outcome.statuses = {key: _status(answer) for key, answer in outcome.answers.items()}
        if not equal:
            outcome.difference = "answers differ (after leaving out `created` and tool-call ids)"
        outcomes.append(outcome)
    return outcomes


def _status(answer: Any) -> int:
    # Paired comparisons return (status, answer) pairs, or the answers alone.
    if isinstance(answer, (list, tuple)) and len(answer) == 2 and isinstance(answer[0], int):
        return answer[0]
    return 200


def pins(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """vLLM's answers to the cases it rendered, for tests/renderer to pin tokenfront's answers to."""
    pinned: dict[str, Any] = {}
    for outcome in outcomes:
        if outcome.statuses["vllm"] != 200 or outcome.equal is not None:
            continue
        answer = outcome.answers["vllm"]
        kept = answer if outcome.group in ("tokenize", "detokenize") else {"token_ids": answer["token_ids"]}
        pinned.setdefault(outcome.group, {})[outcome.case] = kept
    return pinned


# Run with vLLM's interpreter: the Anthropic and Responses cases (stdin) through vLLM's own conversion code.
_VLLM_CONVERSIONS = """
import copy, json, sys
from vllm.config import ModelConfig
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts
from vllm.renderers.chat_utils import parse_chat_messages

folder, cases = sys.argv[1], json.load(sys.stdin)
config = ModelConfig(model=folder, tokenizer=folder)

def conversation(messages):
    return {fmt: parse_chat_messages(messages, config, fmt)[0] for fmt in ("string", "openai")}

out = {"messages": {}, "responses": {}}
for name, body, merge in cases["messages"]:
    chat = AnthropicServingMessages.to_chat_completion_request(
        AnthropicMessagesRequest.model_validate(copy.deepcopy(body)), merge_inline_system=merge, disabled_thinking_effort="none"
    )
    chat_json = json.loads(chat.model_dump_json())
    out["messages"][name] = {
        "body": body,
        "merge_inline_system": merge,
        "conversation": conversation(chat.messages),
        "tools": None if chat.tools is None else [tool.model_dump() for tool in chat.tools],
        "tool_choice": chat_json["tool_choice"],
        "reasoning_effort": chat.reasoning_effort,
        "chat_template_kwargs": chat.chat_template_kwargs,
    }
for name, body in cases["responses"]:
    # vLLM's validators rewrite the dict they validate: keep `body` as sent.
    request = ResponsesRequest.model_validate(copy.deepcopy(body))
    messages = construct_input_messages(request_instructions=request.instructions, request_input=request.input)
    out["responses"][name] = {
        "body": body,
        "conversation": conversation(messages),
        "tools": construct_tool_dicts(request.tools, request.tool_choice),
        "chat_template_kwargs": request.build_chat_params(None, "auto").chat_template_kwargs,
    }
print(json.dumps(out))
"""
# Anthropic cases also converted with inline system messages merged (as for a template that refuses them).
MERGED_VARIANTS = ("inline_system_message",)


def vllm_conversations(venv: Path, folder: Path) -> dict[str, Any]:
    """What vLLM's conversion code makes of each Anthropic and Responses case (needs no server)."""
    anthropic = [[name, body, False] for name, body in cases.ANTHROPIC_CASES]
    anthropic += [[f"{name}+merged", dict(cases.ANTHROPIC_CASES)[name], True] for name in MERGED_VARIANTS]
    payload = json.dumps({"messages": anthropic, "responses": cases.RESPONSES_CASES})
    environment = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", _VLLM_CONVERSIONS, str(folder)],
        input=payload,
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def _pins_json(pinned: dict[str, Any]) -> str:
    """One line per case: readable in a diff, small on disk."""
    lines = ["{"]
    for index, (key, value) in enumerate(pinned.items()):
        comma = "," if index < len(pinned) - 1 else ""
        if not isinstance(value, dict):
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
            continue
        lines.append(f" {json.dumps(key)}: {{")
        for position, (case, answer) in enumerate(value.items()):
            inner = "," if position < len(value) - 1 else ""
            lines.append(f"  {json.dumps(case)}: {json.dumps(answer, ensure_ascii=False)}{inner}")
        lines.append(f" }}{comma}")
    return "\n".join([*lines, "}"]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm", type=Path, required=True, help="a venv holding vllm==0.33.0")
    parser.add_argument("--checkpoint", default="qwen3", help="fixture checkpoint (default: qwen3)")
    parser.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    parser.add_argument(
        "--write-pins", type=Path, help="write vLLM's answers to this file (tests pin to them)"
    )
    parser.add_argument(
        "--write-conversations",
        type=Path,
        help="write what vLLM's conversion code makes of the Anthropic and Responses cases to this file",
    )
    args = parser.parse_args(argv)
    venv = args.vllm.expanduser()
    if not (venv / "bin" / "vllm").is_file():
        parser.error(f"{venv} holds no vllm: create it with `make peer-vllm`")
    folder = ensure_checkpoint(args.checkpoint)
    groups = [*protocol_groups(), *extra_groups()]
    with tempfile.TemporaryDirectory(prefix="tokenfront-compare-protocol-") as logs:
        servers = {
            "vllm": launch_vllm_render(
                venv,
                str(folder),
                log_dir=Path(logs),
                extra_args=(*VLLM_ARGS, "--served-model-name", SERVED_NAME),
            ),
            "tokenfront": launch_tokenfront(
                ["render", "--model", str(folder), "--served-model-name", SERVED_NAME, *PARSER_ARGS],
                log_dir=Path(logs),
            ),
        }
        try:
            wait_healthy(servers.values())
            outcomes = run(groups, servers)
            probes = probe_outcomes(venv, folder, Path(logs), servers["vllm"])
        finally:
            stop_all(servers.values())
    failed = [o for o in [*outcomes, *probes] if not o.passed and o.known is None]
    if args.write_pins:
        header = {
            "_comment": "vLLM 0.33's answers, written by `python -m benchmarks.compare_vllm_protocol --write-pins` "
            f"(checkpoint {args.checkpoint}, {' '.join(VLLM_ARGS)}); tests/renderer pins tokenfront to them",
        }
        args.write_pins.write_text(_pins_json({**header, **pins(outcomes)}), encoding="utf-8")
    if args.write_conversations:
        header = {
            "_comment": "vLLM 0.33's conversions, written by `python -m benchmarks.compare_vllm_protocol "
            f"--write-conversations` (checkpoint {args.checkpoint})"
        }
        converted = vllm_conversations(venv, folder)
        args.write_conversations.write_text(_pins_json({**header, **converted}), encoding="utf-8")
    if args.json:
        json.dump([{**o.__dict__, "passed": o.passed} for o in outcomes], sys.stdout, indent=1)
        print()
    else:
        _print_table(outcomes, groups)
        print("== probe (tokenfront route --worker VLLM,protocol=generate,verify=probe)")
        for outcome in probes:
            print(f"   {outcome.case:<28}  {'pass' if outcome.passed else 'FAIL'}  {outcome.difference}")
    return 1 if failed else 0


def probe_outcomes(venv: Path, folder: Path, logs: Path, vllm: Server) -> list[Outcome]:
    """Start a second vLLM render server whose template says "# Functions" where Qwen3's says "# Tools", and a
    tokenfront router probing both; read what its `/workers` says of each."""
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = logs / "tools-preamble-changed.jinja"
    template.write_text(config["chat_template"].replace("# Tools", "# Functions"), encoding="utf-8")
    other = launch_vllm_render(
        venv,
        str(folder),
        log_dir=logs,
        extra_args=(*VLLM_ARGS, "--served-model-name", SERVED_NAME, "--chat-template", str(template)),
        name="vllm-other-template",
    )
    workers = [f"{vllm.url},protocol=generate,verify=probe", f"{other.url},protocol=generate,verify=probe"]
    command = ["route", "--model", str(folder), "--served-model-name", SERVED_NAME, *PARSER_ARGS]
    for worker in workers:
        command += ["--worker", worker]
    router = launch_tokenfront([*command, "--health-interval", "1"], log_dir=logs, name="router")
    try:
        wait_healthy([other, router])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listed = {w["url"]: w for w in httpx.get(f"{router.url}/workers", timeout=10).json()["workers"]}
            if all(w.get("probe") for w in listed.values()):
                break
            time.sleep(0.5)
        same, changed = listed[vllm.url], listed[other.url]
        log_text = router.log_path.read_text(encoding="utf-8", errors="replace")
        warnings = [line for line in log_text.splitlines() if "probe case" in line]
    finally:
        stop_all([other, router])
    verified = str(same.get("render_check") or "")
    difference = str((changed.get("probe") or {}).get("difference") or "")
    return [
        Outcome(
            "probe",
            "vllm_same_template",
            statuses={"vllm": 200, "tokenfront": 200},
            equal=verified.startswith("verified by probe"),
            difference=f"render_check: {verified or same.get('gate_reasons')}",
        ),
        Outcome(
            "probe",
            "vllm_other_template",
            statuses={"vllm": 200, "tokenfront": 200},
            equal="'tools'" in difference and changed.get("render_check") is None and bool(warnings),
            difference=f"{difference}; router warnings naming a probe case: {len(warnings)}",
        ),
    ]


def _print_table(outcomes: Sequence[Outcome], groups: Sequence[Group | PairedGroup]) -> None:
    width = max(len(o.case) for o in outcomes)
    for group in groups:
        mine = [o for o in outcomes if o.group == group.name]
        passed = sum(o.passed for o in mine)
        where = group.route if isinstance(group, Group) else "paired requests"
        print(f"== {group.name} ({where}): {len(mine)} cases, {passed} pass, {len(mine) - passed} do not")
        for outcome in mine:
            status = f"{outcome.statuses['vllm']}/{outcome.statuses['tokenfront']}"
            print(f"   {outcome.case:<{width}}  {status:<7}  {outcome.verdict()}")
    failed = sum(not o.passed and o.known is None for o in outcomes)
    known = sum(not o.passed and o.known is not None for o in outcomes)
    print(
        f"== {len(outcomes)} cases: {len(outcomes) - failed - known} pass, {known} known divergence, {failed} differ"
    )


if __name__ == "__main__":
    sys.exit(main())

"""Schema fuzzing of the three servers against their own OpenAPI (issue 10, item 2), as real processes on loopback.

Each server's `GET /openapi.json` is loaded with schemathesis and every operation is called with bodies and
parameters generated from it (schemathesis's examples, coverage and fuzzing phases, positive and negative
generation, and each path with the methods it does not declare): a renderer on the Qwen3 fixture
(`--reasoning-parser qwen3 --tool-call-parser hermes`), a worker on the tiny-random fixture, and a router with
`--model <tiny-random>` in front of that worker.

Checks, on every answer:

- `not_a_server_error`: no 5xx, whatever the input;
- `answers_in_declared_media_type` (this module): JSON where the schema says `application/json` (the body
  parses), an OpenAI error object on every 4xx, `text/event-stream` ending in `data: [DONE]` for a
  `"stream": true` generation, and Prometheus text on `/metrics` (which FastAPI declares as JSON: the schema's
  mistake, not the server's). schemathesis's schema-conformance checks are not used: the schemas declare 422
  for what the servers answer 400 (OpenAI's status), and `type: string` for JSON and SSE answers.

The schemas are the servers' own, tailored (`_tailored`) so that valid requests come up as often as invalid
ones: `model` is the served name, token ids lie in the vocabulary, and on the worker and the router generation
is bounded.

What is not fuzzed, and why:

- `POST /workers` on the router: it adds the URL it is given as a worker, connects to it before answering and
  health-checks it from then on: fuzzed URLs would have the router reach out to arbitrary hosts (this machine
  may only talk to loopback), and each added worker would change what the rest of the run routes to.
  `GET /workers` and `DELETE /workers` are fuzzed; the fuzzed router has no `--admin-api-key`, so every `DELETE`
  is the 403 `admin_api_disabled` before its URL is read (tests/router/test_admin_auth.py covers the admin key,
  tests/robustness/test_router_fleet.py `POST /workers` with hostile URLs on loopback).
- Generation is bounded, not skipped: on the worker and the router, every generating body gets `max_tokens`
  (and `max_completion_tokens`, `sampling_params.max_tokens`) of at most 4 and `n` of at most 2 before it is
  sent (the schemas given to schemathesis carry the same bounds), so a case costs milliseconds of the
  tiny-random model, not its whole context.

Budget: in CI each operation gets `max_examples` fuzzing cases (renderer 25, router 12, worker 10) on top of
schemathesis's examples and coverage cases, derandomized: about 9,000 requests, 80 s with start-up. The
per-operation counts and statuses are printed by the module's last test (`-s` shows them). The long run:

    TOKENFRONT_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest tests/robustness/test_fuzz_servers.py -s

sets every server's `max_examples` to that number, with a random seed (200 took 5 minutes here).

The render core's property tests (test_fuzz_render_core.py) go deeper into request shapes than a schema
can; what they found that was a 500 on these servers is checked here over HTTP too (`FOUND`).
"""

from __future__ import annotations

import copy
import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

from tokenfront import fixtures

pytestmark = pytest.mark.slow  # real server processes


_LONG_RUN = int(os.environ.get("TOKENFRONT_FUZZ_EXAMPLES", "0") or 0)
RENDERER_EXAMPLES = _LONG_RUN or 25
ROUTER_EXAMPLES = _LONG_RUN or 12
WORKER_EXAMPLES = _LONG_RUN or 10

# Generation bounds for the worker and the router (see the module docstring).
MAX_TOKENS = 4
MAX_N = 2
_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
# Fields of token ids, and the largest id generated for them (every fixture's vocabulary is larger).
_ID_FIELDS = ("token_ids", "prompt_token_ids", "tokens", "stop_token_ids", "prompt")
ID_MAX = 10_000

# Fuzz cases run, per server and operation ("POST /tokenize"; schemathesis also sends each path the methods it
# does not declare), and the statuses they got, printed by the last test of the module.
CASES: dict[str, Counter[str]] = {"renderer": Counter(), "worker": Counter(), "router": Counter()}
STATUSES: dict[str, dict[str, Counter[int]]] = {server: defaultdict(Counter) for server in CASES}


@pytest.fixture(scope="module")
def fleet(launch: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The renderer and the worker, started side by side, then the router in front of the worker."""
    start_server = launch
    log_dir = tmp_path_factory.mktemp("fuzz-servers")
    qwen3 = str(fixtures.ensure_checkpoint("qwen3"))
    tiny = str(fixtures.ensure_checkpoint("tiny-random"))
    commands = {
        "renderer": [
            "render",
            "--model",
            qwen3,
            "--reasoning-parser",
            "qwen3",
            "--tool-call-parser",
            "hermes",
        ],
        "worker": ["serve", "--model", tiny],
    }
    started: dict[str, Any] = {}
    try:
        with ThreadPoolExecutor(len(commands)) as pool:
            futures = {
                name: pool.submit(start_server, args, log_dir=log_dir, timeout=240.0)
                for name, args in commands.items()
            }
            for name, future in futures.items():
                started[name] = future.result()
        started["router"] = start_server(
            ["route", "--model", tiny, "--worker", started["worker"].url], log_dir=log_dir
        )
        yield started
    finally:
        for server in started.values():
            server.stop()


def _config() -> SchemathesisConfig:
    # Explicit, so that no schemathesis.toml in the working directory changes what runs.
    return SchemathesisConfig.from_dict({})


def _tailored(schema: Any, *, model: str, bounded: bool) -> Any:
    """The server's schema, tailored so that valid requests are generated as often as invalid ones:

    - a `model` string is the served model's name (any other is a 404, tested once, not a thousand times);
    - token ids (`token_ids`, `prompt_token_ids`, `tokens`, `stop_token_ids`, an id `prompt`) are integers from
      0 to ID_MAX, inside every fixture's vocabulary;
    - `bounded` (a generating server): `max_tokens`-like fields at most MAX_TOKENS, `n` at most MAX_N.

    Negative generation still sends everything else (other names, ids out of range, ...)."""
    schema = copy.deepcopy(schema)

    def integers(node: Any, **bounds: int) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                node.update(bounds)
            for value in node.values():
                integers(value, **bounds)
        elif isinstance(node, list):
            for value in node:
                integers(value, **bounds)

    def tailor(node: Any) -> None:
        if isinstance(node, dict):
            for name, prop in (node.get("properties") or {}).items():
                if name == "model":
                    for branch in prop.get("anyOf", [prop]):
                        if branch.get("type") == "string":
                            branch["enum"] = [model]
                elif name in _ID_FIELDS:
                    integers(prop, minimum=0, maximum=ID_MAX)
                elif bounded and name in _TOKEN_FIELDS:
                    integers(prop, maximum=MAX_TOKENS)
                elif bounded and name == "n":
                    integers(prop, maximum=MAX_N)
            for value in node.values():
                tailor(value)
        elif isinstance(node, list):
            for value in node:
                tailor(value)

    tailor(schema.get("components", {}))
    return schema


def _load(server: Any, *, bounded: bool) -> Any:
    raw = httpx.get(f"{server.url}/openapi.json", timeout=30.0).json()
    model = httpx.get(f"{server.url}/v1/models", timeout=30.0).json()["data"][0]["id"]
    schema = schemathesis.openapi.from_dict(_tailored(raw, model=model, bounded=bounded), config=_config())
    schema.config.update(base_url=server.url, request_timeout=120.0)
    return schema


def _cap_generation(body: Any) -> None:
    """Bound a generating body in place (negative generation may go past the schema's bounds)."""
    if not isinstance(body, dict):
        return
    targets = [body]
    if isinstance(body.get("sampling_params"), dict):
        targets.append(body["sampling_params"])
    for target in targets:
        for name in _TOKEN_FIELDS:
            value = target.get(name)
            if value is None or (type(value) is int and value > MAX_TOKENS):
                target[name] = MAX_TOKENS
        value = target.get("n")
        if type(value) is int and value > MAX_N:
            target["n"] = MAX_N


_GENERATING = {"/v1/chat/completions", "/v1/completions", "/inference/v1/generate"}


def answers_in_declared_media_type(ctx: Any, response: Any, case: Any) -> bool | None:
    """JSON where JSON is declared (an OpenAI error object on 4xx), SSE for streams, Prometheus text on /metrics."""
    content_type = (response.headers.get("content-type") or [""])[0].split(";")[0].strip()
    text = response.content.decode("utf-8", errors="replace")
    cut_short = bool(getattr(response, "stream_cut_short", False))
    if case.path == "/metrics" and response.status_code == 200:
        assert content_type == "text/plain", f"/metrics answered {content_type!r}"
        return None
    body = case.body if isinstance(case.body, dict) else {}
    if response.status_code == 200 and body.get("stream") is True and case.path in _GENERATING:
        assert content_type == "text/event-stream", f"a stream answered {content_type!r}"
        events = [line for line in text.splitlines() if line.startswith("data: ")]
        assert cut_short or (events and events[-1] == "data: [DONE]"), (
            f"the stream does not end in [DONE]: {text[-300:]!r}"
        )
        for event in events[:-1]:
            json.loads(event.removeprefix("data: "))
        return None
    assert content_type == "application/json", (
        f"{response.status_code} answered {content_type!r}: {text[:300]!r}"
    )
    parsed = json.loads(text)
    if response.status_code >= 400:
        error = parsed.get("error") if isinstance(parsed, dict) else None
        assert isinstance(error, dict) and isinstance(error.get("message"), str), (
            f"a {response.status_code} without an OpenAI error object: {text[:300]!r}"
        )
    return None


CHECKS = [not_a_server_error, answers_in_declared_media_type]


def _run(server: str, case: Any) -> None:
    operation = f"{case.method.upper()} {case.path}"
    assert operation != "POST /workers", "the router's POST /workers must not be fuzzed (module docstring)"
    CASES[server][operation] += 1
    if server != "renderer" and case.path in _GENERATING:
        _cap_generation(case.body)
    response = case.call_and_validate(checks=CHECKS)
    STATUSES[server][operation][response.status_code] += 1


def _report(server: str, declared: set[str]) -> None:
    counts = CASES[server]
    undeclared = sum(count for operation, count in counts.items() if operation not in declared)
    print(
        f"\n{server}: {sum(counts.values())} fuzz cases: {sum(counts[op] for op in declared)} on its "
        f"{len(declared)} operations, {undeclared} with methods it does not declare"
    )
    for operation in sorted(declared, key=lambda op: op.split()[::-1]):
        statuses = ", ".join(f"{status}: {n}" for status, n in sorted(STATUSES[server][operation].items()))
        print(f"  {counts[operation]:5d}  {operation}  ({statuses})")


@pytest.fixture(autouse=True)
def _pytest9_node_id(request: pytest.FixtureRequest) -> None:
    """schemathesis 4.32's lazy schemas read (and rewrite, for their reports) `node._nodeid`, which pytest 9 no
    longer has: give the test's node one."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


@pytest.fixture
def renderer_schema(fleet: dict[str, Any]) -> Any:
    return _load(fleet["renderer"], bounded=False)


@pytest.fixture
def worker_schema(fleet: dict[str, Any]) -> Any:
    return _load(fleet["worker"], bounded=True)


@pytest.fixture
def router_schema(fleet: dict[str, Any]) -> Any:
    return _load(fleet["router"], bounded=True)


_SETTINGS = {
    "deadline": None,
    "database": None,
    "derandomize": not _LONG_RUN,
    "suppress_health_check": list(HealthCheck),
}

renderer = schemathesis.pytest.from_fixture("renderer_schema")
worker = schemathesis.pytest.from_fixture("worker_schema")
# POST /workers adds (and connects to) the URL it is given: not fuzzed, see the module docstring.
router = schemathesis.pytest.from_fixture("router_schema").exclude(method="POST", path="/workers")


@renderer.parametrize()
@settings(max_examples=RENDERER_EXAMPLES, **_SETTINGS)
def test_renderer_never_answers_5xx(case: Any) -> None:
    _run("renderer", case)


@worker.parametrize()
@settings(max_examples=WORKER_EXAMPLES, **_SETTINGS)
def test_worker_never_answers_5xx(case: Any) -> None:
    _run("worker", case)


@router.parametrize()
@settings(max_examples=ROUTER_EXAMPLES, **_SETTINGS)
def test_router_never_answers_5xx(case: Any) -> None:
    _run("router", case)


# What the render core's properties (test_fuzz_render_core.py) found past this schema fuzzing, each a 500 on the
# renderer: the same bodies, over HTTP.
FOUND = {
    "responses-nameless-tool": (
        "/v1/responses/render",
        {"input": "", "tool_choice": {"type": "function"}, "tools": [{"type": "custom"}]},
    ),
    "derender-usage-not-a-count": (
        "/v1/chat/completions/derender",
        {
            "stream": True,
            "prompt_token_ids": [1],
            "chat_request": {"messages": [{"role": "user", "content": "hi"}]},
            "generate_chunk": {
                "choices": [{"index": 0, "token_ids": [0]}],
                "usage": {"completion_tokens": "x"},
            },
        },
    ),
    "derender-state-negative-id": (
        "/v1/chat/completions/derender",
        {
            "stream": True,
            "chat_request": {"messages": [{"role": "user", "content": "hi"}]},
            "generate_chunk": {"choices": [{"index": 0, "token_ids": [0]}]},
            "stream_state": {
                "output": {
                    "version": 1,
                    "detokenizer": {"window": [-1], "read": 1},
                    "stop": {"pending": "", "stopped": False},
                    "reasoning": {"phase": "reasoning", "pending": ""},
                },
                "role_sent": True,
            },
        },
    ),
}


@pytest.mark.parametrize("server", ["renderer", "router"])
@pytest.mark.parametrize("case", FOUND.values(), ids=FOUND.keys())
def test_what_the_properties_found_is_a_400(
    fleet: dict[str, Any], server: str, case: tuple[str, Any]
) -> None:
    path, body = case
    response = httpx.post(f"{fleet[server].url}{path}", json=body, timeout=60.0)
    assert response.status_code == 400, response.text
    assert isinstance(response.json()["error"]["message"], str)


def test_every_operation_was_fuzzed(fleet: dict[str, Any]) -> None:
    """Runs last in the module: every operation of every server got cases (a filter typo would skip some)."""
    for server, counts in CASES.items():
        if not counts:
            pytest.skip(f"the {server} fuzz test did not run (deselected?)")
        declared = httpx.get(f"{fleet[server].url}/openapi.json", timeout=30.0).json()["paths"]
        operations = {f"{method.upper()} {path}" for path, ops in declared.items() for method in ops}
        if server == "router":
            operations.discard("POST /workers")
        _report(server, operations)
        assert operations <= set(counts), f"{server}: not fuzzed: {sorted(operations - set(counts))}"

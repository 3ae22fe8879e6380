"""The reference pages (docs/api.md, docs/fingerprint.md, docs/contract.md) against the code they describe.

What a machine can check: every error code, not-forwarded reason, fingerprint component and gate reason the
code can produce is in the docs, and the docs name none the code cannot; every route of the real servers is in
the route table with the servers that have it; the render answer's field order, the `/server_info` fields, the
metrics and the router's headers are the ones real servers answer.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenfront.core.fingerprint import Fingerprint, build_fingerprint
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.router.gate import ForwardingGate, router_reasons
from tokenfront.router.probe import NO_PROBER
from tokenfront.router.worker import NO_GENERATE_ROUTE, ROUTER_ITSELF, ROUTER_LOOP, WORKER_API_KEY
from tokenfront.router.worker_report import WorkerReport

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "tokenfront"
DOCS = ROOT / "docs"
SERVERS = ("renderer", "worker", "router")
RENDER_ENV = "TOKENFRONT_ENABLE_RENDER_ENDPOINTS"


def _doc(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The text under a markdown heading, up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1 :]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{level}}} ", rest, flags=re.MULTILINE)]
    return rest[: ends[0]] if ends else rest


def _table_rows(text: str) -> list[list[str]]:
    """The body rows of the markdown tables in `text`, as stripped cells."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-| ]+\|", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


# -- error codes ------------------------------------------------------------------------------------------------

_CODE = re.compile(r"""\bcode="([a-z_]+)"|\b[A-Z_]*CODE\s*=\s*"([a-z_]+)\"""")


def _codes_in_source() -> set[str]:
    codes = set()
    for path in SRC.rglob("*.py"):
        for match in _CODE.finditer(path.read_text(encoding="utf-8")):
            codes.add(match.group(1) or match.group(2))
    return codes


def test_every_error_code_is_in_the_error_table() -> None:
    found = _codes_in_source()
    table = _section(_doc("api.md"), "### Errors with a code")
    documented = {row[2].strip("`") for row in _table_rows(table)[1:]}
    assert len(found) >= 20, sorted(found)  # the scan finds the codes (23 when this was written)
    assert found - documented == set(), "codes the code answers but docs/api.md does not list"
    assert documented - found == set(), "codes docs/api.md lists but no code answers"


def test_every_error_type_is_named() -> None:
    from tokenfront.server.errors import error_response

    # The type each status gets by default, and every type a raise site names itself.
    statuses = (400, 401, 404, 405, 409, 413, 422, 499, 500, 501, 503, 508)
    types = {json.loads(bytes(error_response(status, "x").body))["error"]["type"] for status in statuses}
    for path in SRC.rglob("*.py"):
        types |= set(re.findall(r'error_type="([a-z_]+)"', path.read_text(encoding="utf-8")))
    text = _doc("api.md")
    assert len(types) == 5, sorted(types)
    assert [name for name in sorted(types) if f"`{name}`" not in text] == []


# -- not-forwarded reasons --------------------------------------------------------------------------------------


def _strings(node: ast.AST | None) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.BoolOp):  # `outcome.reason or "no_render"`
        return set().union(*(_strings(value) for value in node.values))
    return set()


def _not_forwarded_reasons() -> set[str]:
    """Every `reason` label the router can count: what `never_forward_reason` returns, what `Planner` passes to
    `_unchanged` or counts directly (and `Proxy` too), the gate's own, and a render's
    (`RenderOutcome(None, reason)`)."""
    reasons: set[str] = set()
    for name in ("bounded_render.py", "planning.py"):
        for node in ast.walk(ast.parse((SRC / "router" / name).read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or ast.unparse(node.func) != "RenderOutcome":
                continue
            reasons |= _strings(node.args[1]) if len(node.args) == 2 else set()
    gate = ast.parse((SRC / "router" / "gate.py").read_text(encoding="utf-8"))
    for function in ast.walk(gate):
        if isinstance(function, ast.FunctionDef) and function.name == "never_forward_reason":
            for node in ast.walk(function):
                if isinstance(node, ast.Return):
                    reasons |= _strings(node.value)
    # Where a plan is made, and where it is sent (`generate_unsupported`, counted by the attempt).
    for name in ("planning.py", "proxy.py"):
        for node in ast.walk(ast.parse((SRC / "router" / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "_unchanged" and len(node.args) >= 6:
                    reasons |= _strings(node.args[5])
                if node.func.attr == "labels" and "not_forwarded" in ast.unparse(node.func.value):
                    for arg in node.args:
                        reasons |= _strings(arg)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "reason" for t in targets):
                    reasons |= _strings(node.value)
            elif isinstance(node, ast.FunctionDef) and node.name == "_gate_reason":
                for inner in ast.walk(node):
                    if isinstance(inner, ast.IfExp):
                        reasons |= _strings(inner.body) | _strings(inner.orelse)
    return reasons


def test_every_not_forwarded_reason_is_documented() -> None:
    found = _not_forwarded_reasons()
    table = _section(_doc("fingerprint.md"), "## Why a request is not forwarded")
    documented = {row[0].strip("`") for row in _table_rows(table)[1:]}
    assert len(found) == 10, sorted(found)
    assert documented == found


# -- fingerprint components and gate reasons ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_pipeline(qwen3: Path) -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(qwen3), tool_call_parser="hermes"))


def _flat_keys(compared: dict[str, Any]) -> list[str]:
    keys = []
    for key, value in compared.items():
        if key in ("tokenizer", "options") and isinstance(value, dict):
            keys += [f"{key}.{sub}" for sub in value]
        else:
            keys.append(key)
    return keys


def _changed(fingerprint: Fingerprint, key: str) -> Fingerprint:
    compared = copy.deepcopy(fingerprint.compared)
    parent, _, sub = key.partition(".")
    holder, name = (compared[parent], sub) if sub else (compared, parent)
    holder[name] = {"default": "another"} if name == "chat_templates" else "another"
    return Fingerprint(compared=compared, complete=True)


def test_every_fingerprint_component_and_its_reason_is_documented(qwen3_pipeline: RenderPipeline) -> None:
    fingerprint = qwen3_pipeline.fingerprint
    text = _doc("fingerprint.md")
    components = _table_rows(_section(text, "## Components"))
    documented = {cell.strip("`") for row in components[1:] for cell in row[1].split(",")}
    keys = _flat_keys(fingerprint.compared)
    assert len(keys) == 16, keys
    assert [key for key in keys if key not in documented] == []
    reasons = []
    for key in keys:
        reason = fingerprint.compare(_changed(fingerprint, key))
        assert len(reason) == 1, (key, reason)
        reasons.append(reason[0])
    # "model type qwen3 vs another" is documented as its pattern; every other reason word for word.
    assert reasons[1] == "model type qwen3 vs another"
    assert "`model type A vs B`" in text
    missing = [
        reason
        for key, reason in zip(keys, reasons, strict=True)
        if key != "model_type" and reason not in text
    ]
    assert missing == []


def test_incomplete_reasons_and_gate_reasons_are_documented(qwen3_pipeline: RenderPipeline) -> None:
    text = _doc("fingerprint.md")
    remote = build_fingerprint(
        model_type="qwen3",
        processor=None,
        chat_templates=None,
        tokenizer=qwen3_pipeline.tokenizer,
        prompt_mode_reasoning_parser=None,
        forced_tool_call_prefix=None,
        default_chat_template_kwargs={},
        remote_code=True,
        info={},
    )
    assert remote.incomplete_reasons == ["the checkpoint's own code was loaded with --trust-remote-code"]
    fingerprint = qwen3_pipeline.fingerprint
    gate = ForwardingGate(fingerprint, has_model_path=True)
    printed = [
        *remote.incomplete_reasons,
        *router_reasons(None, has_model_path=False),
        *router_reasons(fingerprint, has_model_path=False),
        *gate.worker_reasons(None),
        NO_PROBER,
        "no fingerprint (" + str(WorkerReport.from_server_info({}).missing) + ")",
        "no fingerprint (" + str(WorkerReport.from_server_info([]).missing) + ")",
    ]
    assert len(printed) == 7
    assert [reason for reason in printed if f"`{reason}`" not in text] == []


def test_unusable_states_are_documented() -> None:
    states = [
        ROUTER_ITSELF,
        ROUTER_LOOP,
        WORKER_API_KEY,
        NO_GENERATE_ROUTE,
    ]
    fingerprint_doc, api_doc = _doc("fingerprint.md"), _doc("api.md")
    assert [s for s in states if f"`{s}`" not in fingerprint_doc or f"`{s}`" not in api_doc] == []


# -- the contract's sections -------------------------------------------------------------------------------------


def test_contract_has_the_eleven_sections_the_code_cites() -> None:
    headings = re.findall(r"^## §(\d+) ", _doc("contract.md"), flags=re.MULTILINE)
    assert headings == [str(n) for n in range(1, 12)]
    cited = set()
    for path in SRC.rglob("*.py"):
        cited |= set(re.findall(r"(?:SPEC|contract\.md) §(\d+)", path.read_text(encoding="utf-8")))
    assert cited, "no source comment cites a section"
    assert sorted(int(n) for n in cited if not 1 <= int(n) <= 11) == []


# -- real servers ------------------------------------------------------------------------------------------------


def _route_table() -> dict[tuple[str, str], dict[str, str]]:
    """(method, path) -> {server: cell} from docs/api.md's route table."""
    rows = _table_rows(_section(_doc("api.md"), "## Routes"))
    assert rows[0][:5] == ["Method", "Path", *SERVERS]
    return {
        (row[0].strip("`"), row[1].strip("`")): dict(zip(SERVERS, row[2:5], strict=True)) for row in rows[1:]
    }


@pytest.fixture(scope="module")
def servers(
    launch: Callable[..., Any], checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A renderer, a worker with its render routes, one without, and a router in front of the first worker,
    all on the tiny-random checkpoint."""
    model = str(checkpoint("tiny-random"))
    logs = tmp_path_factory.mktemp("docs-servers")
    started: dict[str, Any] = {}
    try:
        started["renderer"] = launch(["render", "--model", model], log_dir=logs)
        started["worker"] = launch(
            ["serve", "--model", model], log_dir=logs, env={RENDER_ENV: "1"}, timeout=240
        )
        started["plain worker"] = launch(
            ["serve", "--model", model], log_dir=logs, env={RENDER_ENV: ""}, timeout=240
        )
        started["router"] = launch(
            ["route", "--model", model, "--worker", started["worker"].url], log_dir=logs
        )
        yield started
    finally:
        for server in started.values():
            server.stop()


def _present(url: str, method: str, path: str, schema_paths: dict[str, set[str]]) -> bool:
    """Whether the server has the route: from its OpenAPI schema, else by asking (routes outside the schema)."""
    if path in schema_paths:
        return method.lower() in schema_paths[path]
    if path == "/docs/assets/{name}":
        page = httpx.get(f"{url}/docs", timeout=10).text
        assets = re.findall(r'"(/docs/assets/[^"]+)"', page)
        assert assets, "the /docs page names no asset"
        path = assets[0]
    response = httpx.request(method, f"{url}{path}", timeout=10)
    return response.status_code != 404


@pytest.mark.slow
def test_every_route_of_the_real_servers_is_in_the_route_table(servers: dict[str, Any]) -> None:
    table = _route_table()
    compared = 0
    for name in ("renderer", "worker", "plain worker", "router"):
        url = servers[name].url
        schema = httpx.get(f"{url}/openapi.json", timeout=10).json()
        schema_paths = {path: set(ops) for path, ops in schema["paths"].items()}
        in_schema = {(method.upper(), path) for path, ops in schema_paths.items() for method in ops}
        assert in_schema - set(table) == set(), f"{name} has routes docs/api.md does not list"
        column = "worker" if name == "plain worker" else name
        for (method, path), cells in table.items():
            cell = cells[column]
            expected = cell != "—" and not (name == "plain worker" and RENDER_ENV in cell)
            assert _present(url, method, path, schema_paths) == expected, (name, method, path, cell)
            compared += 1
    assert compared == 4 * len(table)
    assert len(table) >= 26, sorted(table)


@pytest.mark.slow
def test_render_answer_fields_server_info_and_metrics_are_the_documented_ones(
    servers: dict[str, Any],
) -> None:
    api = _doc("api.md")
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    answer = httpx.post(f"{servers['renderer'].url}/v1/chat/completions/render", json=body, timeout=30).json()
    order = ", ".join(f"`{key}`" for key in answer)
    assert len(answer) == 9
    assert f"in this order: {order}." in api.replace("\n", " ")

    info_keys = set()
    for name in SERVERS:
        info = httpx.get(f"{servers[name].url}/server_info", timeout=10).json()
        assert info["role"] == name
        info_keys |= set(info)
    assert len(info_keys) >= 20
    assert [key for key in sorted(info_keys) if f"`{key}`" not in api] == []

    families = set()
    for name in SERVERS:
        text = httpx.get(f"{servers[name].url}/metrics", timeout=10).text
        families |= {
            m for m in re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE) if not m.endswith("_created")
        }
    metrics_doc = _section(api, "### `GET /metrics`")
    documented = set(re.findall(r"`(tokenfront_[a-z_]+)`", metrics_doc))
    assert len(families) >= 35, sorted(families)
    assert families - documented == set(), "metrics the servers export but docs/api.md does not list"
    assert documented - families == set(), "metrics docs/api.md lists but no server exports"


@pytest.mark.slow
def test_router_answer_headers_are_the_documented_ones(servers: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    response = httpx.post(
        f"{servers['router'].url}/v1/chat/completions",
        json=body,
        headers={"X-Request-Id": "docs-check-1"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-tokenfront-worker"] == servers["worker"].url
    assert response.headers["x-tokenfront-forwarded"] == "true"
    assert response.headers["x-request-id"] == "docs-check-1"
    api = _doc("api.md")
    assert all(
        f"`{name}`" in api for name in ("x-tokenfront-worker", "x-tokenfront-forwarded", "X-Request-Id")
    )
    assert json.loads(response.text)["object"] == "chat.completion"

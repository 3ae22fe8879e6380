"""`verify=probe`: a worker that publishes no fingerprint (vLLM) is checked by a render probe instead.

vLLM cannot run here, so its stand-in is a plain OpenAI server (no `/server_info`) whose `/tokenize` hands the
body to a real tokenfront renderer process on the same checkpoint as the router and answers what it said —
optionally with one probe case perturbed (its last id dropped), the fault the gate must catch. The router is a
real process too; the gate, the spec syntax, the prober and the pool are also tested in process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from scripted_server import Exchange, Server, answer

from conftest import (
    ADMIN,
    ADMIN_KEY,
    GATE_WARNING,
    Fleet,
    PlainOpenAIServer,
    log_lines,
    router_command,
    wait_until,
)
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import TokenizeRequest
from tokenfront.renderer.routes import tokenize_response
from tokenfront.router.check_client import CheckClient
from tokenfront.router.gate import ForwardingGate
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.probe import (
    NO_PROBER,
    PROBE_CASES,
    UNICODE_TEXT,
    ProbeCase,
    Prober,
    ProbeResult,
    ProbeUnreachable,
)
from tokenfront.router.worker_pool import PoolSettings, WorkerPool
from tokenfront.router.worker_report import WorkerReport
from tokenfront.router.worker_spec import WorkerSpec

PROBE_WARNING = "forwarding token ids to workers that publish no fingerprint"
CASE_NAMES = [case.name for case in PROBE_CASES]
Tokenize = Callable[[dict[str, Any]], tuple[int, Any]]


@pytest.fixture(scope="module")
def pipeline(qwen3: Path) -> RenderPipeline:
    """The router's rendering, in process: what the probe's expected ids are."""
    return RenderPipeline.load(RenderOptions(model=str(qwen3)))


@pytest.fixture(scope="module")
def renderer(fleet: Fleet, qwen3: Path) -> Any:
    """A real renderer on the router's checkpoint: the stand-ins' `/tokenize` is its answer."""
    return fleet.start("render", "--model", str(qwen3))


def _case(name: str) -> ProbeCase:
    return next(case for case in PROBE_CASES if case.name == name)


def _via_renderer(renderer_url: str, perturb: str | None = None) -> Tokenize:
    """A vLLM stand-in's `/tokenize`: the renderer's answer, with the last id dropped for the case `perturb`."""
    perturbed = _case(perturb).body if perturb is not None else None

    def tokenize(body: dict[str, Any]) -> tuple[int, Any]:
        response = httpx.post(f"{renderer_url}/tokenize", json=body, timeout=60.0)
        payload = response.json()
        if perturbed is not None and response.status_code == 200 and body == perturbed:
            payload = {**payload, "tokens": payload["tokens"][:-1], "count": payload["count"] - 1}
        return response.status_code, payload

    return tokenize


def _in_process(pipeline: RenderPipeline) -> Tokenize:
    """A `/tokenize` answered by `pipeline` in this process (the pool tests need no renderer process)."""

    def tokenize(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, tokenize_response(pipeline, TokenizeRequest.model_validate(body), 4096)

    return tokenize


def _listing(router: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    view = httpx.get(f"{router.url}/workers", timeout=60.0).json()
    return view["gate"], {item["url"]: item for item in view["workers"]}


def _checked_after(router: Any, url: str, moment: float) -> bool:
    """Whether the router checked the worker after `moment` (a time.monotonic() of this process)."""
    seconds = _listing(router)[1][url]["seconds_since_check"]
    return seconds is not None and time.monotonic() - seconds > moment + 0.05


# --- real processes --------------------------------------------------------------------------------------------


def test_router_forwards_to_a_worker_verified_by_probe(
    fleet: Fleet, qwen3: Path, renderer: Any, plain_servers: Any, pipeline: RenderPipeline
) -> None:
    expected = Prober(pipeline).expected()
    compared = len(PROBE_CASES) - len(expected.skipped)
    assert compared == 7 and expected.skipped == ()  # Qwen3's template renders every case: none skipped
    stand_in: PlainOpenAIServer = plain_servers(tokenize=_via_renderer(renderer.url))
    router = fleet.start(*router_command(qwen3, [f"{stand_in.url},protocol=generate,verify=probe"]))

    gate, listed = _listing(router)
    assert gate == {
        "forwarding": True,
        "router_reasons": [],
        "blocking_workers": {},
        "verified_by_probe": {stand_in.url: compared},
    }
    worker = listed[stand_in.url]
    assert worker["render_check"] == f"verified by probe, {compared} cases"
    assert worker["probe"] == {"compared": compared, "skipped": [], "difference": None}
    assert (worker["protocol"], worker["verify"]) == ("generate", "probe")
    assert worker["fingerprint_matches"] is False  # about the fingerprint alone: it has none
    assert worker["fingerprint_missing"] == "/server_info answered 404"
    assert worker["gate_reasons"] == []
    # The router asked the stand-in exactly its corpus, in order, and asks it again on every check.
    assert stand_in.tokenize_bodies[:compared] == [dict(case.body) for case in PROBE_CASES]
    assert wait_until(lambda: len(stand_in.tokenize_bodies) >= 3 * compared)

    # One warning, however many checks: it forwards on a probe, which is not a fingerprint.
    (warning,) = log_lines(router, PROBE_WARNING)
    assert "WARNING" in warning
    assert f"{stand_in.url} verified by probe, {compared} cases" in warning
    assert "a probe shows that these cases render alike, not that every request does" in warning
    assert "fingerprint match" not in router.log()
    assert log_lines(router, GATE_WARNING) == []


def test_router_blocks_a_worker_whose_probe_differs_in_one_case(
    fleet: Fleet, qwen3: Path, renderer: Any, plain_servers: Any, pipeline: RenderPipeline
) -> None:
    router_ids = len(Prober(pipeline).expected().ids["unicode"])
    stand_in: PlainOpenAIServer = plain_servers(tokenize=_via_renderer(renderer.url, perturb="unicode"))
    router = fleet.start(*router_command(qwen3, [f"{stand_in.url},protocol=generate,verify=probe"]))

    difference = (
        f"probe case 'unicode' differs: the worker's /tokenize gave {router_ids - 1} ids, the router "
        f"{router_ids}; first difference at id {router_ids - 1}"
    )
    gate, listed = _listing(router)
    assert gate == {
        "forwarding": False,
        "router_reasons": [],
        "blocking_workers": {stand_in.url: [difference]},
    }
    worker = listed[stand_in.url]
    assert worker["state"] == "healthy"  # still routed to: only the ids stay home
    assert worker["render_check"] is None and worker["gate_reasons"] == [difference]
    # The probe stops at the first difference: the cases before it were compared and matched.
    assert worker["probe"] == {
        "compared": CASE_NAMES.index("unicode"),
        "skipped": [],
        "difference": difference,
    }

    assert wait_until(lambda: len(stand_in.tokenize_bodies) >= 3 * (CASE_NAMES.index("unicode") + 1))
    (warning,) = log_lines(router, GATE_WARNING)  # once, though every check finds it again
    assert "WARNING" in warning and f"{stand_in.url}: {difference}" in warning
    assert "'unicode'" in warning
    assert log_lines(router, PROBE_WARNING) == []


def test_router_without_verify_probe_blocks_a_worker_with_no_fingerprint(
    fleet: Fleet, qwen3: Path, renderer: Any, plain_servers: Any
) -> None:
    stand_in: PlainOpenAIServer = plain_servers(tokenize=_via_renderer(renderer.url))
    router = fleet.start(*router_command(qwen3, [stand_in.url]))

    reason = "no fingerprint (/server_info answered 404)"
    gate, listed = _listing(router)
    assert gate == {"forwarding": False, "router_reasons": [], "blocking_workers": {stand_in.url: [reason]}}
    worker = listed[stand_in.url]
    assert (worker["protocol"], worker["verify"], worker["probe"], worker["render_check"]) == (
        "openai",
        None,
        None,
        None,
    )
    (warning,) = log_lines(router, GATE_WARNING)
    assert f"{stand_in.url}: {reason}" in warning
    since = time.monotonic()
    assert wait_until(lambda: _checked_after(router, stand_in.url, since))
    assert stand_in.tokenize_bodies == []  # checked again, and still no probe: there was no opt-in


def test_router_generate_worker_without_the_route_is_unusable(
    fleet: Fleet, qwen3: Path, renderer: Any, plain_servers: Any
) -> None:
    """A protocol=generate worker whose /inference/v1/generate is not there (vLLM without
    --enable-scale-out answers 403) is not used, and says what to do; one whose route is there is."""
    without: PlainOpenAIServer = plain_servers(tokenize=_via_renderer(renderer.url), generate_status=403)
    with_route: PlainOpenAIServer = plain_servers(tokenize=_via_renderer(renderer.url))
    workers = [
        f"{without.url},protocol=generate,verify=probe",
        f"{with_route.url},protocol=generate,verify=probe",
    ]
    router = fleet.start(*router_command(qwen3, workers))
    _, listed = _listing(router)
    missing = listed[without.url]
    assert (missing["state"], missing["unusable"]) == ("unusable", "no_generate_route")
    assert "answered 403" in missing["problem"] and "--enable-scale-out" in missing["problem"]
    assert listed[with_route.url]["state"] == "healthy"
    assert listed[with_route.url]["render_check"].startswith("verified by probe, ")
    (warning,) = log_lines(router, f"worker {without.url} cannot be used")
    assert "--enable-scale-out" in warning


def test_router_post_workers_takes_protocol_and_verify(
    fleet: Fleet, qwen3: Path, renderer: Any, plain_servers: Any, pipeline: RenderPipeline
) -> None:
    good: PlainOpenAIServer = plain_servers(tokenize=_via_renderer(renderer.url))
    bad: PlainOpenAIServer = plain_servers(tokenize=_via_renderer(renderer.url, perturb="tool_history"))
    router = fleet.start(*router_command(qwen3, [], "--admin-api-key", ADMIN_KEY))
    compared = len(PROBE_CASES) - len(Prober(pipeline).expected().skipped)

    with httpx.Client(base_url=router.url, timeout=60.0, headers=ADMIN) as client:
        added = client.post("/workers", json={"url": good.url, "protocol": "generate", "verify": "probe"})
        assert added.status_code == 201, added.text
        body = added.json()
        assert (body["protocol"], body["verify"], body["state"]) == ("generate", "probe", "healthy")
        assert body["render_check"] == f"verified by probe, {compared} cases"
        assert body["probe"] == {"compared": compared, "skipped": [], "difference": None}
        assert client.get("/workers").json()["gate"]["forwarding"] is True

        for field, value in (("protocol", "grpc"), ("verify", "bogus")):
            refused = client.post("/workers", json={"url": bad.url, field: value})
            assert refused.status_code == 400, refused.text
            message = refused.json()["error"]["message"]
            assert message.startswith(f"invalid request: {field}: Input should be"), message
        assert [item["url"] for item in client.get("/workers").json()["workers"]] == [good.url]

        refused = client.post("/workers", json={"url": bad.url, "verify": "probe"})
        assert refused.status_code == 400, refused.text
        assert "verify=probe needs protocol=generate" in refused.json()["error"]["message"]

        added = client.post("/workers", json={"url": bad.url, "verify": "probe", "protocol": "generate"})
        assert added.status_code == 201, added.text
        assert added.json()["protocol"] == "generate" and added.json()["render_check"] is None
        (reason,) = added.json()["gate_reasons"]
        assert reason.startswith("probe case 'tool_history' differs: ")
        assert added.json()["probe"]["compared"] == CASE_NAMES.index("tool_history")
        gate = client.get("/workers").json()["gate"]
        assert gate["forwarding"] is False and gate["blocking_workers"] == {bad.url: [reason]}

        assert client.delete("/workers", params={"url": bad.url}).status_code == 200
        gate = client.get("/workers").json()["gate"]
        assert gate["forwarding"] is True and gate["verified_by_probe"] == {good.url: compared}

    # Said when it began forwarding on a probe, and again when it resumed after the bad worker left.
    warnings = log_lines(router, PROBE_WARNING)
    assert len(warnings) == 2 and all(
        f"{good.url} verified by probe, {compared} cases" in w for w in warnings
    )
    (blocked,) = log_lines(router, GATE_WARNING)
    assert bad.url in blocked and "'tool_history'" in blocked


@pytest.mark.parametrize(
    ("option", "complaint"),
    [
        ("verify=bogus", "verify must be probe, not 'bogus'"),
        ("protocol=grpc", "protocol must be openai or generate"),
    ],
)
def test_router_refuses_a_bad_worker_option_at_start_up(option: str, complaint: str) -> None:
    command = [sys.executable, "-m", "tokenfront.cli", "route", "--worker", f"http://127.0.0.1:9,{option}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert complaint in error and "expected URL[,kv-events=" in error and "[,verify=probe]" in error


# --- in process ----------------------------------------------------------------------------------------------


def test_router_worker_spec_protocol_and_verify() -> None:
    assert WorkerSpec.parse("http://h:8000") == WorkerSpec("http://h:8000", protocol="openai", verify=None)
    assert WorkerSpec.parse("http://h:8000/,protocol=generate,verify=probe") == WorkerSpec(
        "http://h:8000", protocol="generate", verify="probe"
    )
    assert WorkerSpec.parse(
        "http://h:8000,kv-events=tcp://h:5557,verify=probe,protocol=generate"
    ) == WorkerSpec("http://h:8000", "tcp://h:5557", protocol="generate", verify="probe")
    for bad, complaint in (
        ("http://h:8000,protocol=grpc", "protocol must be openai or generate, not 'grpc'"),
        ("http://h:8000,verify=bogus", "verify must be probe, not 'bogus'"),
        ("http://h:8000,verify=", "verify must be probe, not ''"),
        ("http://h:8000,verify=probe,verify=probe", "verify given twice"),
        ("http://h:8000,probe", "unknown option 'probe'"),
    ):
        with pytest.raises(ValueError, match="expected URL") as raised:
            WorkerSpec.parse(bad)
        assert complaint in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="verify=probe needs protocol=generate") as raised:
        WorkerSpec.parse("http://h:8000,verify=probe")
    assert str(raised.value).startswith("'http://h:8000,verify=probe': ") and "\n" not in str(raised.value)


def test_router_gate_reads_probe_results(pipeline: RenderPipeline, caplog: pytest.LogCaptureFixture) -> None:
    gate = ForwardingGate(pipeline.fingerprint, has_model_path=True)
    caplog.set_level(logging.INFO, logger="tokenfront.router.gate")
    passed = ProbeResult(7)
    failed = ProbeResult(2, difference="probe case 'tools' differs: ...")
    no_fingerprint = WorkerReport(None, missing="/server_info answered 404")

    assert gate.worker_reasons(no_fingerprint) == ("no fingerprint (/server_info answered 404)",)
    assert gate.worker_reasons(dataclasses.replace(no_fingerprint, probe=passed)) == ()
    assert gate.worker_reasons(dataclasses.replace(no_fingerprint, probe=failed)) == (failed.difference,)
    matching = WorkerReport(pipeline.fingerprint)
    assert gate.worker_reasons(dataclasses.replace(matching, probe=passed)) == ()
    assert gate.worker_reasons(dataclasses.replace(matching, probe=failed)) == (failed.difference,)
    other = dataclasses.replace(
        pipeline.fingerprint, compared={**pipeline.fingerprint.compared, "model_type": "x"}
    )
    assert gate.worker_reasons(dataclasses.replace(WorkerReport(other), probe=failed)) == (
        "model type qwen3 vs x",
        failed.difference,
    )

    verified = dataclasses.replace(no_fingerprint, probe=passed)
    for _ in range(3):
        state = gate.evaluate({"http://a": matching, "http://v": verified})
    assert state.forwarding and dict(state.verified_by_probe) == {"http://v": 7}
    assert state.to_json()["verified_by_probe"] == {"http://v": 7}
    gate.evaluate({"http://a": matching, "http://v": dataclasses.replace(no_fingerprint, probe=failed)})
    gate.evaluate({"http://a": matching})  # the probed worker left: forwarding again on fingerprints alone
    assert "verified_by_probe" not in gate.state.to_json()
    messages = [r.getMessage() for r in caplog.records if r.name == "tokenfront.router.gate"]
    assert messages == [
        "forwarding token ids to workers that publish no fingerprint: http://v verified by probe, 7 cases (a "
        "probe shows that these cases render alike, not that every request does)",
        "not forwarding token ids: workers render each request themselves and the router's ids only choose the "
        f"worker. Blocked by http://v: {failed.difference}",
        "forwarding token ids again: every active worker matches the router's rendering fingerprint",
    ]


def test_router_prober_skips_what_the_router_refuses(pipeline: RenderPipeline) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    cases = (*PROBE_CASES[:2], ProbeCase("image", {"messages": [{"role": "user", "content": [image]}]}))
    tokenize = _in_process(pipeline)
    asked: list[dict[str, Any]] = []

    async def handler(exchange: Exchange) -> None:
        assert exchange.head.startswith(b"POST /tokenize HTTP/1.1\r\n")
        asked.append(json.loads(exchange.body))
        status, payload = tokenize(asked[-1])
        await exchange.write(answer(json.dumps(payload).encode(), f"{status} OK"))

    async def probe(prober: Prober) -> ProbeResult:
        async with Server(handler) as server:
            return await prober.run(_check_client(server.url), 5.0)

    result = asyncio.run(probe(Prober(pipeline, cases)))
    assert result == ProbeResult(2, ("image",), None)
    assert len(asked) == 2  # a case the router cannot render is not asked of the worker
    only_refused = asyncio.run(probe(Prober(pipeline, cases[2:])))
    assert only_refused.compared == 0 and only_refused.skipped == ("image",)
    assert only_refused.difference == "the router's own pipeline refused every probe case (image)"


def test_router_probe_corpus_covers_what_templates_branch_on() -> None:
    assert CASE_NAMES == [
        "system_user",
        "multi_turn",
        "tools",
        "tool_history",
        "unicode",
        "completion",
        "continue_final",
    ]
    roles = {case.name: [m["role"] for m in case.body.get("messages", ())] for case in PROBE_CASES}
    assert roles["system_user"] == ["system", "user"]
    assert roles["multi_turn"] == ["user", "assistant", "user"]
    assert roles["tool_history"] == ["user", "assistant", "tool"]
    (call,) = _case("tool_history").body["messages"][1]["tool_calls"]
    assert isinstance(call["function"]["arguments"], str)
    assert _case("tool_history").body["messages"][2]["tool_call_id"] == call["id"]
    (tool,) = _case("tools").body["tools"]
    assert tool["function"]["description"] and tool["function"]["parameters"]["type"] == "object"
    assert _case("completion").body == {
        "prompt": _case("completion").body["prompt"],
        "add_special_tokens": True,
    }
    final = _case("continue_final").body
    assert roles["continue_final"][-1] == "assistant"
    assert final["add_generation_prompt"] is False and final["continue_final_message"] is True
    text = _case("unicode").body["messages"][0]["content"]
    assert text == UNICODE_TEXT
    assert {unicodedata.bidirectional(c) for c in text} >= {"R", "AL"}  # Hebrew and Arabic
    assert any(unicodedata.combining(c) for c in text)  # combining accents
    assert any("CJK" in unicodedata.name(c, "") for c in text)
    assert any(unicodedata.category(c) == "So" and ord(c) > 0x1F000 for c in text)  # emoji


def test_router_pool_probes_on_each_check(pipeline: RenderPipeline, plain_servers: Any) -> None:
    answer = _in_process(pipeline)
    stand_in: PlainOpenAIServer = plain_servers(tokenize=answer)
    no_tokenize: PlainOpenAIServer = plain_servers()
    changes: list[int] = []

    def slow(body: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(1.0)
        return answer(body)

    async def main() -> None:
        settings = PoolSettings(health_interval=3600.0, health_timeout=0.5)
        pool = WorkerPool(KvIndex(), settings, prober=Prober(pipeline), on_change=lambda: changes.append(1))
        unprobed = WorkerPool(KvIndex(), settings)
        try:
            worker = await pool.add(WorkerSpec(stand_in.url, protocol="generate", verify="probe"))
            assert worker.report is not None and worker.report.probe == ProbeResult(7)
            assert worker.describe()["verify"] == "probe" and len(changes) == 1
            # A /tokenize too slow to answer says nothing new about a worker whose probe passed.
            stand_in.tokenize = slow
            await pool.check(worker)
            assert worker.report.probe == ProbeResult(7) and len(changes) == 1
            stand_in.tokenize = answer

            missing = await pool.add(WorkerSpec(no_tokenize.url, protocol="generate", verify="probe"))
            assert missing.report is not None and missing.report.probe == ProbeResult(
                0, (), "probe case 'system_user': /tokenize answered 404 (not found)"
            )
            plain = await unprobed.add(WorkerSpec(no_tokenize.url))
            assert plain.report is not None and plain.report.probe is None
            router_cannot = await unprobed.add(WorkerSpec(stand_in.url, protocol="generate", verify="probe"))
            assert router_cannot.report is not None and router_cannot.report.probe == ProbeResult(
                0, (), NO_PROBER
            )
        finally:
            await pool.stop()
            await unprobed.stop()

    asyncio.run(main())
    with pytest.raises(
        ProbeUnreachable, match=r"^probe case 'system_user': /tokenize unreachable \(ConnectError: "
    ):
        asyncio.run(_unreachable(pipeline))


async def _unreachable(pipeline: RenderPipeline) -> None:
    await Prober(pipeline).run(_check_client("http://127.0.0.1:9"), 1.0)


def _check_client(url: str) -> CheckClient:
    return CheckClient(
        url,
        connect_timeout=1.0,
        timeout=5.0,
        max_response_bytes=1 << 20,
        max_connections=1,
        keepalive_expiry=4.0,
    )

"""The forwarding gate and the worker spec, in process: what is decided, and what is logged when."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from tokenfront.core.reasoning import get_reasoning_parser
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.router.gate import NO_MODEL_PATH, ForwardingGate, never_forward_reason
from tokenfront.router.worker_report import WorkerReport
from tokenfront.router.worker_spec import WorkerSpec


@pytest.fixture(scope="module")
def pipeline(tiny_random: Path) -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(tiny_random)))


def _gate_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tokenfront.router.gate"]


def test_router_gate_logs_each_change_once(
    pipeline: RenderPipeline, caplog: pytest.LogCaptureFixture
) -> None:
    gate = ForwardingGate(pipeline.fingerprint, has_model_path=True)
    same = WorkerReport(pipeline.fingerprint)
    other = dataclasses.replace(
        pipeline.fingerprint, compared={**pipeline.fingerprint.compared, "model_type": "qwen3"}
    )
    caplog.set_level(logging.INFO, logger="tokenfront.router.gate")

    assert gate.evaluate({"http://a": same, "http://b": same}).forwarding
    assert _gate_warnings(caplog) == []  # forwarding from the start: nothing to say

    missing = WorkerReport(None, missing="/server_info answered 404")
    for _ in range(3):
        state = gate.evaluate({"http://a": same, "http://b": missing})
    assert not state.forwarding and dict(state.blocking) == {
        "http://b": ("no fingerprint (/server_info answered 404)",)
    }
    assert len(_gate_warnings(caplog)) == 1

    gate.evaluate({"http://a": same, "http://b": WorkerReport(other)})  # same worker, another reason
    assert len(_gate_warnings(caplog)) == 2
    assert "http://b: model type llama vs qwen3" in _gate_warnings(caplog)[-1]

    assert gate.evaluate({"http://a": same}).forwarding
    assert gate.evaluate({"http://a": same}).forwarding
    assert _gate_warnings(caplog)[2:] == [
        "forwarding token ids again: every active worker matches the router's rendering fingerprint"
    ]


def test_router_gate_without_a_model_path_or_a_complete_tokenizer(pipeline: RenderPipeline) -> None:
    gate = ForwardingGate(pipeline.fingerprint, has_model_path=False)
    state = gate.evaluate({"http://a": WorkerReport(pipeline.fingerprint)})
    assert not state.forwarding and state.router_reasons == (NO_MODEL_PATH,) and not state.blocking

    incomplete = dataclasses.replace(pipeline.fingerprint, complete=False, incomplete_reasons=["remote code"])
    gate = ForwardingGate(incomplete, has_model_path=True)
    state = gate.evaluate({"http://a": WorkerReport(pipeline.fingerprint)})
    assert state.router_reasons == ("the router's tokenizer is not fully identified: remote code",)
    assert not state.blocking  # said once for the router, not again for every worker
    state = gate.evaluate({"http://a": WorkerReport(incomplete)})
    assert state.blocking["http://a"] == ("worker's tokenizer is not fully identified: remote code",)


def test_router_never_forward_reasons() -> None:
    laguna = get_reasoning_parser("laguna")
    common = {"family_never_forwards": False, "family": "generic", "prompt_mode_parsers": [laguna]}
    assert (
        never_forward_reason(named_tool_choice=False, prompt_text="<|im_start|>assistant\n", **common) is None
    )
    assert never_forward_reason(named_tool_choice=True, prompt_text="x", **common) == "named_tool_choice"
    thinking = "<|im_start|>assistant\n<think>\n"
    assert never_forward_reason(named_tool_choice=False, prompt_text=thinking, **common) == "reasoning_mode"
    # A parser that does not read the prompt leaves the same prompt forwardable.
    qwen3 = {**common, "prompt_mode_parsers": []}
    assert never_forward_reason(named_tool_choice=False, prompt_text=thinking, **qwen3) is None
    kimi = {**common, "family_never_forwards": True, "family": "kimi_k3"}
    assert never_forward_reason(named_tool_choice=False, prompt_text="x", **kimi) == "model_family"


def test_router_worker_spec_syntax() -> None:
    assert WorkerSpec.parse("http://10.0.0.1:8000/") == WorkerSpec("http://10.0.0.1:8000")
    assert WorkerSpec.parse("http://h:8000,kv-events=tcp://h:5557,kv-replay=tcp://h:5558") == WorkerSpec(
        "http://h:8000", "tcp://h:5557", "tcp://h:5558"
    )
    for bad in ("h:8000", "ftp://h", "http://h:8000,events=tcp://h:1", "http://h:8000,kv-replay=tcp://h:1"):
        with pytest.raises(ValueError):
            WorkerSpec.parse(bad)

"""The worker reads gpt-oss and Mistral output with their families' parsers, streaming and not.

A worker app in process on the `tiny-gptoss` checkpoint (its tokenizer, Harmony rendering and
`--reasoning-parser openai_gptoss --tool-call-parser openai`) with a scripted engine that answers with canned
Harmony token ids: the answers, whole and streamed, must split the channels as vLLM does (the expected values
are vLLM 0.33's, as in tests/core/test_output_families.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest
from tokenfront.worker.app import create_worker_app
from tokenfront.worker.engine import Engine, EngineInfo, GenerationRequest, GenerationStream, TokenOutput

CHAT = "/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]
ANALYSIS_THEN_FINAL = (
    "<|channel|>analysis<|message|>User says hi. Respond.<|end|><|start|>assistant<|channel|>final"
    "<|message|>Hello! How can I help? 😀<|return|>"
)
TOOL_CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
    "Let me look that up.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
    '<|constrain|>json<|message|>{"location":"Tokyo"}<|call|>'
)


class ScriptedEngine(Engine):
    """Answers every request with the same token ids, the last one finishing the sequence."""

    def __init__(self, vocab_size: int) -> None:
        self.info = EngineInfo("scripted", 16, "none", 8, 0, "cpu")
        self.vocab_size = vocab_size
        self.max_context = 4096
        self.answer: list[int] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def submit(self, request: GenerationRequest) -> GenerationStream:
        answer = list(self.answer)

        async def outputs() -> AsyncIterator[TokenOutput]:
            for index, token_id in enumerate(answer):
                yield TokenOutput(token_id, finish_reason="stop" if index == len(answer) - 1 else None)

        return GenerationStream(request.request_id, len(request.prompt_token_ids), 0, outputs())

    def abort(self, request_id: str) -> None:
        pass

    def kv_events(self, after: int, limit: int = 1000, log_id: str | None = None) -> dict[str, Any]:
        return {"events": []}


@pytest.fixture(scope="module")
def tiny_gptoss(checkpoint: Callable[[str], Path]) -> Path:
    return checkpoint("tiny-gptoss")


@pytest.fixture(scope="module")
def pipeline(tiny_gptoss: Path) -> RenderPipeline:
    options = RenderOptions(
        model=str(tiny_gptoss), reasoning_parser="openai_gptoss", tool_call_parser="openai"
    )
    return RenderPipeline.load(options)


@pytest.fixture(scope="module")
def scripted(pipeline: RenderPipeline) -> Iterator[tuple[TestClient, ScriptedEngine]]:
    engine = ScriptedEngine(len(pipeline.tokenizer))
    # Not entered as a context manager: the lifespan (engine start, grammar index) is not needed here.
    client = TestClient(create_worker_app(pipeline, engine, enable_render_endpoints=False))
    yield client, engine
    client.close()


def _answer_with(engine: ScriptedEngine, pipeline: RenderPipeline, text: str) -> None:
    engine.answer = list(pipeline.tokenizer.encode(text, add_special_tokens=False))


def _chat(**extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "What is the weather in Tokyo?"}],
        "max_tokens": 64,
        **extra,
    }


def _streamed(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    """The streamed answer put together: reasoning, content, calls (name, arguments) and the finish reason."""
    reasoning, content, calls, finish = "", "", [], None
    with client.stream("POST", CHAT, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: ") :])["choices"][0]
            delta = choice["delta"]
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            calls += [
                (c["function"]["name"], c["function"]["arguments"]) for c in delta.get("tool_calls") or ()
            ]
            finish = choice["finish_reason"] or finish
    return {"reasoning": reasoning or None, "content": content or None, "calls": calls, "finish": finish}


def _whole(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    return {
        "reasoning": message["reasoning_content"],
        "content": message["content"],
        "calls": calls,
        "finish": choice["finish_reason"],
    }


def test_analysis_is_reasoning_and_final_is_content(
    scripted: tuple[TestClient, ScriptedEngine], pipeline: RenderPipeline
) -> None:
    client, engine = scripted
    _answer_with(engine, pipeline, ANALYSIS_THEN_FINAL)
    expected = {
        "reasoning": "User says hi. Respond.",
        "content": "Hello! How can I help? 😀",
        "calls": [],
        "finish": "stop",
    }
    assert _whole(client, _chat()) == expected
    assert _streamed(client, _chat()) == expected


def test_a_call_to_a_function_is_a_tool_call(
    scripted: tuple[TestClient, ScriptedEngine], pipeline: RenderPipeline
) -> None:
    client, engine = scripted
    _answer_with(engine, pipeline, TOOL_CALL)
    expected = {
        "reasoning": "Need the weather.",
        "content": "Let me look that up.",
        "calls": [("get_weather", '{"location": "Tokyo"}')],
        "finish": "tool_calls",
    }
    assert _whole(client, _chat(tools=TOOLS)) == expected
    assert _streamed(client, _chat(tools=TOOLS)) == expected


def test_a_call_is_dropped_when_the_request_takes_none(
    scripted: tuple[TestClient, ScriptedEngine], pipeline: RenderPipeline
) -> None:
    client, engine = scripted
    _answer_with(engine, pipeline, TOOL_CALL)
    expected = {
        "reasoning": "Need the weather.",
        "content": "Let me look that up.",
        "calls": [],
        "finish": "stop",
    }
    assert _whole(client, _chat(tools=TOOLS, tool_choice="none")) == expected
    assert _streamed(client, _chat()) == expected


def test_output_cut_off_inside_a_header_is_raw_content(
    scripted: tuple[TestClient, ScriptedEngine], pipeline: RenderPipeline
) -> None:
    client, engine = scripted
    _answer_with(engine, pipeline, "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin")
    expected = {
        "reasoning": "x",
        "content": "<|start|>assistant<|channel|>fin",
        "calls": [],
        "finish": "stop",
    }
    assert _whole(client, _chat()) == expected
    assert _streamed(client, _chat()) == expected


def test_named_tool_choice_forces_a_harmony_call(
    scripted: tuple[TestClient, ScriptedEngine], pipeline: RenderPipeline
) -> None:
    client, engine = scripted
    body = _chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    service = client.app.state.service  # type: ignore[attr-defined]
    prompt = service.prompts.chat(ChatCompletionRequest(**body), forced_tool="get_weather")
    # The prompt opens the call message; the model writes only its arguments, then stops.
    assert prompt.text.endswith(
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    )
    engine.answer = [
        *pipeline.tokenizer.encode('{"location": "Tokyo"}', add_special_tokens=False),
        pipeline.tokenizer.convert_tokens_to_ids("<|return|>"),
    ]
    expected = {"reasoning": None, "content": None, "calls": [("get_weather", '{"location": "Tokyo"}')]}
    whole = _whole(client, body)
    assert {key: whole[key] for key in expected} == expected


# --- Mistral (`tiny-mistral`: a v3 tekken tokenizer, whose calls are a JSON array) ------------------------------


@pytest.fixture(scope="module")
def mistral_pipeline(checkpoint: Callable[[str], Path]) -> RenderPipeline:
    options = RenderOptions(
        model=str(checkpoint("tiny-mistral")), tokenizer_mode="mistral", tool_call_parser="mistral"
    )
    return RenderPipeline.load(options)


@pytest.fixture(scope="module")
def mistral_scripted(mistral_pipeline: RenderPipeline) -> Iterator[tuple[TestClient, ScriptedEngine]]:
    engine = ScriptedEngine(len(mistral_pipeline.tokenizer))
    client = TestClient(create_worker_app(mistral_pipeline, engine, enable_render_endpoints=False))
    yield client, engine
    client.close()


def test_mistral_tool_calls_after_content(
    mistral_scripted: tuple[TestClient, ScriptedEngine], mistral_pipeline: RenderPipeline
) -> None:
    client, engine = mistral_scripted
    tokenizer = mistral_pipeline.tokenizer
    calls = ' [{"name": "get_weather", "arguments": {"location": "Tokyo"}}]'
    # [TOOL_CALLS] is a special token: text spelling it would encode as ordinary tokens.
    engine.answer = [
        *tokenizer.encode("Checking. ", add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("[TOOL_CALLS]"),
        *tokenizer.encode(calls, add_special_tokens=False),
        tokenizer.eos_token_id,
    ]
    expected = {
        "content": "Checking. ",
        "calls": [("get_weather", '{"location": "Tokyo"}')],
        "finish": "tool_calls",
    }
    whole = client.post(CHAT, json=_chat(tools=TOOLS)).json()
    message = whole["choices"][0]["message"]
    assert {
        "content": message["content"],
        "calls": [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]],
        "finish": whole["choices"][0]["finish_reason"],
    } == expected
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in message["tool_calls"])
    streamed = _streamed(client, _chat(tools=TOOLS))
    assert {key: streamed[key] for key in expected} == expected

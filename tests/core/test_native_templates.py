"""Native templates (core/native_templates): the same text as their Jinja source on generated conversations.

Each case goes through the whole chat render (validation, normalization, the tools' dump, the template, the
tokenizer) twice on one pipeline, once with the native template and once with it switched off (the Jinja
template, itself held to transformers by test_parity.py); text and ids must be equal, and a refusal must be the
same refusal. A sample is also rendered by transformers' own `apply_chat_template`.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from reference import reference_chat

from tokenfront import RenderOptions, RenderPipeline, fixtures
from tokenfront.core.errors import RenderError
from tokenfront.core.native_templates import DECLINE, native_template
from tokenfront.core.native_templates.qwen3 import render_qwen3
from tokenfront.core.templates import ChatTemplate, compile_template
from tokenfront.protocol import ChatCompletionRequest

CASES = 3000
REFERENCE_SAMPLE = 60

_TEXTS = [
    "",
    "hi",
    "What is 2+2?",
    "  padded  ",
    "\n\nleading newlines",
    "trailing newlines\n\n",
    "<think>\nplanning\n</think>\n\nThe answer is 4.",
    "<think>a</think>b</think>c",
    "</think>",
    "no open</think>\n\nafter",
    '<tool_response>\n{"ok": true}\n</tool_response>',
    "<tool_response>only the start",
    "only the end</tool_response>",
    "{{ not a template }} {% neither %}",
    "東京 データ é ü 🙂",
    "<|im_start|>user\ninjected<|im_end|>",
    "line one\nline two",
]
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": 'Suchen: 東京 "quoted"',
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "ä"}}},
            "strict": True,
        },
    },
]


def _content(rng: random.Random) -> Any:
    if rng.random() < 0.12:
        return [{"type": "text", "text": rng.choice(_TEXTS)} for _ in range(rng.randint(1, 3))]
    return rng.choice(_TEXTS)


def _tool_call(rng: random.Random, index: int) -> dict[str, Any]:
    arguments = rng.choice(['{"city": "Paris"}', "{}", '{"q": "東京", "n": [1, 2.5, null]}', "not json"])
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": rng.choice(["get_weather", "now"]), "arguments": arguments},
    }


def _message(rng: random.Random, role: str, index: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": _content(rng)}
    if role == "assistant":
        if rng.random() < 0.3:
            message["tool_calls"] = [_tool_call(rng, index * 10 + k) for k in range(rng.randint(1, 3))]
            if rng.random() < 0.5:
                message["content"] = None
        if rng.random() < 0.3:
            message[rng.choice(["reasoning_content", "reasoning"])] = rng.choice(_TEXTS)
    elif role == "tool":
        message["tool_call_id"] = f"call_{index}"
    return message


def _body(rng: random.Random) -> dict[str, Any]:
    messages = []
    if rng.random() < 0.5:
        messages.append(_message(rng, rng.choice(["system", "developer"]), 0))
    for index in range(rng.randint(1, 7)):
        role = rng.choices(["user", "assistant", "tool", "system"], weights=[4, 4, 2, 1])[0]
        messages.append(_message(rng, role, index + 1))
    body: dict[str, Any] = {"model": "qwen3", "messages": messages}
    if rng.random() < 0.4:
        body["tools"] = rng.sample(_TOOLS, rng.randint(1, len(_TOOLS)))
    if rng.random() < 0.4:
        body["chat_template_kwargs"] = rng.choice(
            [
                {"enable_thinking": False},
                {"enable_thinking": True},
                {"enable_thinking": None},
                {"enable_thinking": "false"},
                {"enable_thinking": 0},
                {"other": 1},
                {"namespace": "x"},
            ]
        )
    if messages[-1]["role"] == "assistant" and rng.random() < 0.3:
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
    elif rng.random() < 0.2:
        body["add_generation_prompt"] = False
    return body


@pytest.fixture(scope="module")
def pipeline() -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(fixtures.ensure_checkpoint("qwen3"))))


def _template(pipeline: RenderPipeline) -> ChatTemplate:
    """The checkpoint's template, the very object the pipeline renders with (compile_template keeps one per
    source)."""
    templates = pipeline.checkpoint.chat_templates
    assert templates is not None
    return compile_template(templates.templates["default"])


def _render(pipeline: RenderPipeline, body: dict[str, Any]) -> tuple[str, list[int]] | str:
    try:
        request = ChatCompletionRequest.model_validate(copy.deepcopy(body))
        rendered = pipeline.render_chat(request)
    except (RenderError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return rendered.prompt_text, rendered.token_ids


def test_the_qwen3_fixture_has_the_native_template(pipeline: RenderPipeline) -> None:
    template = _template(pipeline)
    assert template.native is render_qwen3
    assert native_template(template.source + " ") is None  # one character more: Jinja renders it


def test_native_qwen3_renders_what_its_jinja_source_renders(pipeline: RenderPipeline) -> None:
    template = _template(pipeline)
    calls = {"native": 0, "declined": 0}

    def counted(*args: Any) -> Any:
        text = render_qwen3(*args)
        calls["declined" if text is DECLINE else "native"] += 1
        return text

    rng = random.Random(20261206)
    compared = refused = 0
    for _ in range(CASES):
        body = _body(rng)
        template.native = counted
        native = _render(pipeline, body)
        template.native = None
        jinja = _render(pipeline, body)
        template.native = render_qwen3
        assert native == jinja, json.dumps(body, ensure_ascii=False)
        compared += 1
        refused += isinstance(jinja, str)
    assert compared == CASES
    # Most cases render (a few are refused by validation or by the template, both ways alike) ...
    assert refused < CASES // 4, refused
    # ... and most renders took the native path; the declines are the shapes left to Jinja (a `namespace`
    # variable, content parts of other kinds).
    assert calls["native"] > (CASES - refused) * 0.8, calls
    assert calls["declined"] > 0, calls


def test_native_qwen3_agrees_with_transformers(pipeline: RenderPipeline) -> None:
    rng = random.Random(7)
    folder = fixtures.ensure_checkpoint("qwen3")
    compared = 0
    for _ in range(REFERENCE_SAMPLE):
        body = _body(rng)
        body.pop("continue_final_message", None)
        ours = _render(pipeline, body)
        if isinstance(ours, str):
            continue
        if "tools" in body:  # what the template sees: vLLM's dump of each tool ("description": null and all)
            body["tools"] = ChatCompletionRequest.model_validate(copy.deepcopy(body)).tool_dicts()
        reference = reference_chat(folder, body)
        if reference.raised:
            continue
        assert ours[1] == reference.ids, json.dumps(body, ensure_ascii=False)
        compared += 1
    assert compared > REFERENCE_SAMPLE // 2, compared

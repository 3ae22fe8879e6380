"""`POST /v1/messages/render` (Anthropic Messages) and `POST /v1/responses/render` (OpenAI Responses), and the chat
normalization rules of vLLM's request models on `POST /v1/chat/completions/render` (docs/contract.md §2, §11; issue 9).

On real `tokenfront render` processes (Qwen3, `qwen3` reasoning parser). Expected ids are vLLM's own, pinned in
`data/vllm_protocol_pins.json`: written by `python -m benchmarks.compare_vllm_protocol --write-pins` from vLLM
0.33's render server on the same checkpoint with `--reasoning-parser qwen3 --enable-auto-tool-choice
--tool-call-parser hermes` (the script also compares both servers live). The envelope is tokenfront's (docs/contract.md §2).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from checks import RENDER_KEYS, assert_error, metric_value, raw_keys
from protocol_cases import ANTHROPIC_CASES, NORMALIZATION_CASES, NORMALIZATION_REFUSED, RESPONSES_CASES

PINS = json.loads((Path(__file__).parent / "data" / "vllm_protocol_pins.json").read_text(encoding="utf-8"))
MESSAGES, RESPONSES, CHAT = "/v1/messages/render", "/v1/responses/render", "/v1/chat/completions/render"
SERVED = "Qwen3-0.6B"  # the session renderer's name; the ids do not depend on it
CHAT_ID = re.compile(r"^chatcmpl-[0-9a-f]{32}$")
RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def client(qwen3_renderer: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=qwen3_renderer.url, timeout=60.0) as http:
        yield http


def _served(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "model": SERVED} if "model" in body else body


def _kwargs(rendered: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = rendered["reasoning_parser_kwargs"]["chat_template_kwargs"]
    return kwargs


# -- Anthropic Messages ---------------------------------------------------------------------------------------


def test_messages_render_vllms_ids_in_the_render_envelope(client: httpx.Client) -> None:
    compared = 0
    for name, body in ANTHROPIC_CASES:
        sent = json.dumps(_served(body))
        response = client.post(MESSAGES, content=sent, headers={"Content-Type": "application/json"})
        assert response.status_code == 200, (name, response.text)
        assert raw_keys(response.text) == RENDER_KEYS, name
        rendered = response.json()
        assert (rendered["schema_version"], rendered["kind"]) == (1, "messages"), name
        assert CHAT_ID.match(rendered["request_id"]), rendered["request_id"]
        assert rendered["token_ids"] == PINS["messages"][name]["token_ids"], name
        assert rendered["model"] == SERVED
        assert rendered["cache_salt"] is None
        assert json.dumps(rendered["request"]) == sent, name  # the Anthropic body, unchanged
        compared += 1
    assert compared == len(ANTHROPIC_CASES) == 7


def test_messages_thinking_and_effort_reach_the_template(client: httpx.Client) -> None:
    bodies = dict(ANTHROPIC_CASES)
    disabled = client.post(MESSAGES, json=_served(bodies["thinking_history_thinking_disabled"])).json()
    # Qwen3's template honours "none", so thinking "disabled" is reasoning_effort "none": an empty think block.
    assert _kwargs(disabled) == {"reasoning_effort": "none", "enable_thinking": False}
    assert disabled["reasoning_ended"] is True
    assert disabled["token_ids"][-4:] == [151667, 271, 151668, 271]  # <think>\n\n</think>\n\n
    effort = client.post(
        MESSAGES, json=_served(bodies["named_tool_choice_effort_and_assistant_tool_result"])
    ).json()
    assert _kwargs(effort) == {"reasoning_effort": "low", "enable_thinking": True}
    assert effort["reasoning_ended"] is None
    plain = client.post(MESSAGES, json=_served(bodies["system_and_text"] | {"cache_salt": "s1"})).json()
    assert _kwargs(plain) == {}
    assert plain["cache_salt"] == "s1"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": SERVED, "messages": [{"role": "user", "content": "Hi"}]}, 400, "max_tokens"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}, 400, "model"),
        ({"model": "other", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}, 404, "model"),
        ({"model": SERVED, "max_tokens": 8, "messages": []}, 400, "messages"),
        (
            {"model": SERVED, "max_tokens": 8, "messages": [{"role": "bot", "content": "Hi"}]},
            400,
            "messages[0].role",
        ),
        (
            {
                "model": SERVED,
                "max_tokens": 8,
                "tool_choice": {"type": "tool"},
                "messages": [{"role": "user", "content": "Hi"}],
            },
            400,
            "tool_choice",
        ),
        (
            {
                "model": SERVED,
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}],
                    }
                ],
            },
            400,
            "messages[0].content[0]",
        ),
    ],
)
def test_messages_refusals(client: httpx.Client, body: dict[str, Any], status: int, param: str) -> None:
    assert_error(client.post(MESSAGES, json=body), status, param=param)


# -- OpenAI Responses -----------------------------------------------------------------------------------------


def test_responses_render_vllms_ids_in_the_render_envelope(client: httpx.Client) -> None:
    compared = 0
    for name, body in RESPONSES_CASES:
        response = client.post(RESPONSES, json=body)
        assert response.status_code == 200, (name, response.text)
        assert raw_keys(response.text) == RENDER_KEYS, name
        rendered = response.json()
        assert (rendered["schema_version"], rendered["kind"]) == (1, "responses"), name
        assert RESPONSE_ID.match(rendered["request_id"]), rendered["request_id"]
        assert rendered["token_ids"] == PINS["responses"][name]["token_ids"], name
        assert rendered["request"] == body, name
        compared += 1
    assert compared == len(RESPONSES_CASES) == 6


def test_responses_request_id_effort_and_continuation(client: httpx.Client) -> None:
    bodies = dict(RESPONSES_CASES)
    own = client.post(RESPONSES, json={"input": "Hi", "request_id": "resp_mine", "model": SERVED}).json()
    assert (own["request_id"], own["model"]) == ("resp_mine", SERVED)
    effort = client.post(RESPONSES, json=bodies["reasoning_items_and_effort"]).json()
    assert _kwargs(effort) == {"reasoning_effort": "none", "enable_thinking": False}
    assert effort["reasoning_ended"] is True
    continued = client.post(RESPONSES, json=bodies["continue_in_progress_assistant"]).json()
    # The in-progress assistant message is left open: the prompt ends with its text, no <|im_end|>.
    text = client.post("/detokenize", json={"tokens": continued["token_ids"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n1, 2, 3,")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "Hi", "previous_response_id": "resp_1"}, 400, "previous_response_id"),
        ({"input": [{"type": "banana"}]}, 400, "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400, "input[0].call_id"),
        ({"input": []}, 400, "input"),
        ({"input": "Hi", "tool_choice": "required"}, 400, "tool_choice"),
        ({"input": "Hi", "model": "other"}, 404, "model"),
        ({"input": 5}, 400, "input"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/a.png"}]}
                ]
            },
            400,
            None,
        ),
    ],
)
def test_responses_refusals(
    client: httpx.Client, body: dict[str, Any], status: int, param: str | None
) -> None:
    assert_error(client.post(RESPONSES, json=body), status, param=param)


def test_rendered_prompts_are_counted_by_kind(client: httpx.Client) -> None:
    before = client.get("/metrics").text
    client.post(MESSAGES, json=_served(dict(ANTHROPIC_CASES)["system_and_text"]))
    client.post(RESPONSES, json={"input": "Hi"})
    after = client.get("/metrics").text
    for kind in ("messages", "responses"):
        labels = f'kind="{kind}"'
        assert metric_value(after, "tokenfront_rendered_prompts_total", labels) == (
            metric_value(before, "tokenfront_rendered_prompts_total", labels) + 1
        )


# -- chat normalization: what vLLM's request models fill in, drop or refuse ------------------------------------


def test_chat_normalization_renders_vllms_ids(client: httpx.Client) -> None:
    compared = 0
    for name, body in NORMALIZATION_CASES:
        response = client.post(CHAT, json=body)
        assert response.status_code == 200, (name, response.text)
        assert response.json()["token_ids"] == PINS["chat"][name]["token_ids"], name
        compared += 1
    assert compared == len(NORMALIZATION_CASES) == 16


def test_a_tool_without_description_renders_description_null(client: httpx.Client) -> None:
    rendered = client.post(CHAT, json=dict(NORMALIZATION_CASES)["tool_without_description"]).json()
    text = client.post("/detokenize", json={"tokens": rendered["token_ids"]}).json()["prompt"]
    assert (
        '{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}}}'
        in text
    )


def test_chat_normalization_refusals(client: httpx.Client) -> None:
    refused = 0
    for name, body in NORMALIZATION_REFUSED:
        error = assert_error(client.post(CHAT, json=body), 400)
        assert error["param"], (name, error)
        refused += 1
    assert refused == len(NORMALIZATION_REFUSED) == 14


# -- with the compare script's configuration ------------------------------------------------------------------


def test_same_ids_with_hermes_tool_calls_and_the_served_name_qwen3(
    server_factory: Callable[..., Any], qwen3: Path
) -> None:
    """The configuration the pins were written with (served name `qwen3`, `hermes` tools): same ids."""
    server = server_factory(
        "render",
        "--model",
        str(qwen3),
        "--served-model-name",
        "qwen3",
        "--reasoning-parser",
        "qwen3",
        "--tool-call-parser",
        "hermes",
    )
    with httpx.Client(base_url=server.url, timeout=60.0) as http:
        for name, body in ANTHROPIC_CASES:
            assert (
                http.post(MESSAGES, json=body).json()["token_ids"] == PINS["messages"][name]["token_ids"]
            ), name
        for name, body in RESPONSES_CASES:
            assert (
                http.post(RESPONSES, json=body).json()["token_ids"] == PINS["responses"][name]["token_ids"]
            ), name

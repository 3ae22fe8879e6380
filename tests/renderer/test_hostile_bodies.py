"""Never a 500 for anything a client can send: thousands of random, malformed and hostile bodies, seeded."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from protocol_cases import (
    ANTHROPIC_CASES,
    DETOKENIZE_CASES,
    NORMALIZATION_CASES,
    RESPONSES_CASES,
    TOKENIZE_CASES,
)
from starlette.testclient import TestClient

from tokenfront import RenderOptions, RenderPipeline
from tokenfront.renderer.app import create_renderer_app
from tokenfront.renderer.routes import RENDER_PATHS

KEYS = [
    "role",
    "content",
    "type",
    "text",
    "messages",
    "prompt",
    "tools",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "documents",
    "truncate_prompt_tokens",
    "model",
    "tool_choice",
    "parameters",
    "cache_salt",
    "n",
    "temperature",
]
SCALARS = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    10**30,
    "",
    "x",
    "<|im_end|>",
    "user",
    "assistant",
    "tool",
    "text",
    "image_url",
    "{{ 7 * 7 }}",
    "\u0000",
    [],
    {},
]


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.3:
        return rng.choice(SCALARS)
    if roll < 0.6:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _body(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "hi"}]} if rng.random() < 0.5 else {"prompt": "hi"}
    )
    for _ in range(rng.randint(1, 3)):
        body[rng.choice(KEYS[4:])] = _value(rng)
    if isinstance(body.get("messages"), list) and rng.random() < 0.7:
        body["messages"] = [
            {
                "role": rng.choice(["user", "assistant", "system", "tool", "developer", "bogus"]),
                "content": _value(rng),
                **({"tool_calls": _value(rng)} if rng.random() < 0.3 else {}),
            }
            for _ in range(rng.randint(1, 3))
        ]
    return body


@pytest.fixture(scope="module")
def client(qwen3: Path) -> TestClient:
    pipeline = RenderPipeline.load(RenderOptions(model=str(qwen3), reasoning_parser="qwen3"))
    return TestClient(create_renderer_app(pipeline), raise_server_exceptions=False)


def test_random_bodies_never_get_a_server_error(client: TestClient) -> None:
    rng = random.Random(20261130)
    statuses: dict[int, int] = {}
    for _ in range(2000):
        body = _body(rng)
        route = "/v1/chat/completions/render" if rng.random() < 0.6 else "/v1/completions/render"
        response = client.post(route, json=body)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (route, json.dumps(body)[:400], response.text[:400])
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    # The generator must reach both outcomes, or it tests nothing.
    assert statuses.get(200, 0) > 100 and statuses.get(400, 0) > 1000, statuses


@pytest.mark.parametrize(
    "raw",
    [b"", b"null", b"[]", b"42", b'"text"', b"{", b'{"messages": [}', b"\xff\xfe", b'{"prompt": "a"}' * 2],
)
def test_non_object_bodies_are_400(client: TestClient, raw: bytes) -> None:
    for route in RENDER_PATHS:
        response = client.post(route, content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 400, (route, raw, response.text)


# Valid bodies of the protocol routes, each to be mutated at one random place.
PROTOCOL_BODIES = [
    *(("/v1/messages/render", {**body, "model": "qwen3"}) for _, body in ANTHROPIC_CASES),
    *(("/v1/responses/render", body) for _, body in RESPONSES_CASES),
    *(("/tokenize", body) for _, body in TOKENIZE_CASES),
    *(("/detokenize", body) for _, body in DETOKENIZE_CASES),
    *(("/v1/chat/completions/render", body) for _, body in NORMALIZATION_CASES),
]
PROTOCOL_KEYS = [
    *KEYS,
    "input",
    "instructions",
    "system",
    "max_tokens",
    "thinking",
    "tool_use_id",
    "input_schema",
    "call_id",
    "output",
    "summary",
    "reasoning",
    "status",
    "tokens",
    "return_token_strs",
    "source",
    "tool",
]


def _mutate(rng: random.Random, value: Any) -> Any:
    """The value with one node (a dict entry, a list item, or the whole) replaced by a random one."""
    if rng.random() < 0.2 or not isinstance(value, (dict, list)) or not value:
        return (
            _value(rng)
            if rng.random() < 0.7
            else rng.choice([*SCALARS, {rng.choice(PROTOCOL_KEYS): _value(rng)}])
        )
    if isinstance(value, dict):
        key = rng.choice([*value, rng.choice(PROTOCOL_KEYS)])
        return {**value, key: _mutate(rng, value.get(key))}
    index = rng.randrange(len(value))
    return [*value[:index], _mutate(rng, value[index]), *value[index + 1 :]]


def test_protocol_routes_never_get_a_server_error(client: TestClient) -> None:
    rng = random.Random(20261201)
    statuses: dict[int, int] = {}
    for _ in range(3000):
        route, base = rng.choice(PROTOCOL_BODIES)
        body = _mutate(rng, base)
        response = client.post(route, json=body)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (route, json.dumps(body)[:600], response.text[:400])
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert statuses.get(200, 0) > 300 and statuses.get(400, 0) > 300, statuses

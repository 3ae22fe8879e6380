"""Requests whose ids are never forwarded, whatever the fingerprints say (docs/contract.md §8).

Each case is checked with the gate open (every worker matches), so that what keeps the ids back is the
request itself: a named tool_choice, a kimi_k3 model, a prompt carrying a reasoning mode with a laguna
worker. Next to each, a request that is forwarded by the same router shows the gate really was open.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import ADMIN, ADMIN_KEY, Fleet, chat, forwarded, metric, router_command

pytestmark = pytest.mark.slow  # real server processes

PARSERS = ("--reasoning-parser", "laguna", "--tool-call-parser", "hermes")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def laguna_router(fleet: Fleet, tiny_random: Path) -> Any:
    workers = fleet.start_many(*(["serve", "--model", str(tiny_random), *PARSERS] for _ in range(2)))
    return fleet.start(*router_command(tiny_random, [worker.url for worker in workers], *PARSERS))


@pytest.fixture(scope="module")
def client(laguna_router: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=laguna_router.url, timeout=120.0) as http:
        assert http.get("/workers").json()["gate"]["forwarding"] is True
        yield http


def _not_forwarded(router: Any, reason: str) -> float:
    return metric(router.url, "tokenfront_router_not_forwarded_total", reason=reason)


def test_router_never_forwards_a_named_tool_choice(client: httpx.Client, laguna_router: Any) -> None:
    assert forwarded(chat(client, [{"role": "user", "content": "What is the weather?"}], tools=[WEATHER]))
    response = chat(
        client,
        [{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=32,
    )
    assert not forwarded(response)
    # The worker rendered it and forced the call (with ids it would have answered 400).
    (call,) = response.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert _not_forwarded(laguna_router, "named_tool_choice") == 1


def test_router_never_forwards_a_prompt_carrying_a_reasoning_mode(
    client: httpx.Client, laguna_router: Any
) -> None:
    question = {"role": "user", "content": "Think about it."}
    assert forwarded(chat(client, [question]))
    for prefill in ("<think>", "<think>\nSome thought.\n</think>"):
        response = chat(
            client,
            [question, {"role": "assistant", "content": prefill}],
            add_generation_prompt=False,
            continue_final_message=True,
        )
        assert not forwarded(response), prefill
    plain = client.post("/v1/completions", json={"prompt": "Question: why?\nAnswer:", "max_tokens": 4})
    assert plain.status_code == 200 and forwarded(plain)
    thinking = client.post("/v1/completions", json={"prompt": "Question: why?\n<think>", "max_tokens": 4})
    assert thinking.status_code == 200 and not forwarded(thinking)
    assert _not_forwarded(laguna_router, "reasoning_mode") == 3


def _kimi_checkpoint(tiny_random: Path, folder: Path) -> Path:
    """The tiny checkpoint's tokenizer and template, as a kimi_k3 model (config only; no weights needed)."""
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(tiny_random / name, folder / name)
    config = json.loads((tiny_random / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "kimi_k3"}))
    return folder


@pytest.mark.parametrize("model_type", ["llama", "kimi_k3"])
def test_router_never_forwards_for_kimi_k3(
    model_type: str, fleet: Fleet, tiny_random: Path, plain_servers: Any, tmp_path: Path
) -> None:
    checkpoint = tiny_random if model_type == "llama" else _kimi_checkpoint(tiny_random, tmp_path / "kimi")
    router = fleet.start(*router_command(checkpoint, [], "--admin-api-key", ADMIN_KEY))
    # No kimi_k3 worker can run here (transformers has no such model), so a stand-in worker publishes the
    # router's own fingerprint: the gate opens, and only the model family can keep the ids back.
    fingerprint = httpx.get(f"{router.url}/server_info").json()["render_fingerprint"]
    stand_in = plain_servers({"role": "worker", "model": "stand-in", "render_fingerprint": fingerprint})
    with httpx.Client(base_url=router.url, timeout=120.0) as client:
        added = client.post("/workers", json={"url": stand_in.url}, headers=ADMIN)
        assert added.status_code == 201 and added.json()["fingerprint_matches"] is True
        assert client.get("/workers").json()["gate"]["forwarding"] is True

        response = chat(client, [{"role": "user", "content": "Hello"}])
        completion = client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 2})
    assert completion.status_code == 200
    chat_body, completion_body = stand_in.bodies
    if model_type == "kimi_k3":
        assert not forwarded(response) and not forwarded(completion)
        assert "prompt_token_ids" not in chat_body and completion_body["prompt"] == "Hello there"
        assert _not_forwarded(router, "model_family") == 2
    else:  # the same set-up with a llama model forwards: the stand-in does receive ids when allowed
        assert forwarded(response) and forwarded(completion)
        assert chat_body["prompt_token_ids"] and isinstance(completion_body["prompt"], list)

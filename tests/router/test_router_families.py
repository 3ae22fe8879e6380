"""gpt-oss (Harmony) and Mistral (mistral-common) end to end: renderer, worker and router on tiny random models.

For each family a renderer, a worker running the tiny random-weight model and a router in front of the worker
are real processes. The worker renders through the same pipeline as the renderer, so it publishes the same
fingerprint; it answers chat requests that carry the renderer's ids as `prompt_token_ids`; the router
renders, sees the worker match, and forwards its ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from conftest import Fleet, chat, forwarded, router_command
from tokenfront import fixtures

pytestmark = pytest.mark.slow

# family -> (checkpoint, extra rendering options, the chat format its fingerprint names)
FAMILIES = {
    "gpt-oss": ("tiny-gptoss", [], "harmony"),
    "mistral": ("tiny-mistral", ["--tokenizer-mode", "mistral"], "mistral-common"),
}
CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one, please — in French."},
]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, fleet: Fleet) -> Iterator[dict[str, Any]]:
    name = request.param
    checkpoint, options, chat_format = FAMILIES[name]
    folder = str(fixtures.ensure_checkpoint(checkpoint))
    renderer, worker = fleet.start_many(
        ["render", "--model", folder, *options], ["serve", "--model", folder, *options]
    )
    router = fleet.start(*router_command(None, [worker.url], "--model", folder, *options))
    yield {"name": name, "chat_format": chat_format, "renderer": renderer, "worker": worker, "router": router}


def _fingerprint(server: Any) -> dict[str, Any]:
    info = httpx.get(f"{server.url}/server_info", timeout=30).json()
    return dict(info["render_fingerprint"])


def test_worker_publishes_the_renderers_fingerprint(family: dict[str, Any]) -> None:
    renderer, worker, router = (_fingerprint(family[role]) for role in ("renderer", "worker", "router"))
    assert renderer["complete"] and worker["complete"], (renderer["incomplete_reasons"], worker)
    assert renderer["compared"]["chat_format"]["name"] == family["chat_format"]
    assert renderer["digest"] == worker["digest"] == router["digest"]


def test_worker_answers_the_renderers_ids(family: dict[str, Any]) -> None:
    body = {"messages": CONVERSATION, "max_tokens": 4, "temperature": 0}
    rendered = httpx.post(f"{family['renderer'].url}/v1/chat/completions/render", json=body, timeout=60)
    assert rendered.status_code == 200, rendered.text
    ids = rendered.json()["token_ids"]
    assert len(ids) > 20
    # The recipe of the render endpoints: the original request plus the ids.
    answer = httpx.post(
        f"{family['worker'].url}/v1/chat/completions",
        json={**rendered.json()["request"], "prompt_token_ids": ids},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == len(ids)
    # The worker renders the same request itself to the same ids.
    own = httpx.post(f"{family['worker'].url}/v1/chat/completions", json=body, timeout=120)
    assert own.status_code == 200, own.text
    assert own.json()["usage"]["prompt_tokens"] == len(ids)


def test_router_forwards_ids_to_the_worker(family: dict[str, Any]) -> None:
    with httpx.Client(base_url=family["router"].url, timeout=120) as client:
        rendered = client.post("/v1/chat/completions/render", json={"messages": CONVERSATION})
        assert rendered.status_code == 200, rendered.text
        response = chat(client, CONVERSATION, max_tokens=4)
        assert forwarded(response), family["router"].log()[-2000:]
        assert response.json()["usage"]["prompt_tokens"] == len(rendered.json()["token_ids"])
        completion = client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 3})
        assert completion.status_code == 200 and forwarded(completion), completion.text

"""Several models behind one router (issue 21, item 3), with real processes: `route --config` of two models on
different tokenizers (Qwen3 and Llama 3), a simulated worker for each (`serve --engine simulated`: tokenizer
files, no weights), one router for every assertion of the module.

Each request is rendered by its model's pipeline (the router's render route answers that model's own ids, and
the ids the worker stored in its prefix cache are those ids), it lands only on that model's workers, and an
unknown model is a 404. A third worker of the Qwen3 model whose chat template differs turns the Qwen3 model's
forwarding off while the Llama 3 model's stays on; a worker serving a name no model has gets no request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from conftest import (
    ADMIN,
    ADMIN_KEY,
    WORKER_HEADER,
    Fleet,
    PlainOpenAIServer,
    forwarded,
    log_lines,
    metric,
    wait_until,
)
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest

pytestmark = pytest.mark.slow  # real processes: a router and three simulated workers

QWEN, LLAMA = "qwen3-chat", "llama3-chat"
# Long enough for two full KV blocks (16 ids each) on either tokenizer: the worker's stored blocks show its ids.
MESSAGES = [
    {
        "role": "user",
        "content": "Name three rivers of Europe, say which seas they flow into, and how long each one is, "
        "in kilometres, as a short list.",
    }
]
# A template the router's Qwen3 model does not have: a worker started with it renders differently.
OTHER_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def models(
    fleet: Fleet, qwen3: Path, checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimpleNamespace]:
    llama3 = checkpoint("llama3")
    simulated = ["serve", "--engine", "simulated"]
    qwen_worker, llama_worker, other_template = fleet.start_many(
        [*simulated, "--model", str(qwen3), "--served-model-name", QWEN],
        [*simulated, "--model", str(llama3), "--served-model-name", LLAMA],
        [*simulated, "--model", str(qwen3), "--served-model-name", QWEN, "--chat-template", OTHER_TEMPLATE],
    )
    config = tmp_path_factory.mktemp("router-models") / "models.toml"
    # The Qwen3 model lists its worker; the Llama 3 worker comes by --worker and is placed by its name.
    config.write_text(
        f'[[models]]\nmodel = "{qwen3}"\nserved_model_name = ["{QWEN}"]\nworkers = ["{qwen_worker.url}"]\n\n'
        f'[[models]]\nmodel = "{llama3}"\nserved_model_name = "{LLAMA}"\n'
    )
    router = fleet.start(
        "route",
        "--config",
        str(config),
        "--worker",
        llama_worker.url,
        "--health-interval",
        "0.5",
        "--kv-events-interval",
        "0.2",
        "--admin-api-key",
        ADMIN_KEY,
        "--policy",
        "round_robin",
    )
    foreign = PlainOpenAIServer(models=["mystery-model"])
    pipelines = {
        QWEN: RenderPipeline.load(RenderOptions(model=str(qwen3), served_model_name=(QWEN,))),
        LLAMA: RenderPipeline.load(RenderOptions(model=str(llama3), served_model_name=(LLAMA,))),
    }
    try:
        with httpx.Client(base_url=router.url, timeout=60.0) as client:
            assert wait_until(lambda: _active(client) == 2, timeout=60.0), router.log()[-3000:]
            yield SimpleNamespace(
                router=router,
                client=client,
                workers={QWEN: qwen_worker, LLAMA: llama_worker},
                other_template=other_template,
                foreign=foreign,
                pipelines=pipelines,
            )
    finally:
        foreign.close()


def _active(client: httpx.Client) -> int:
    return sum(1 for item in client.get("/workers").json()["workers"] if item["state"] == "healthy")


def _models_info(client: httpx.Client) -> dict[str, dict[str, Any]]:
    return {item["model"]: item for item in client.get("/server_info").json()["models"]}


def _chat(client: httpx.Client, model: str) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 2, "temperature": 0}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def _own_ids(models: SimpleNamespace, model: str) -> list[int]:
    """The ids the model's own pipeline renders for MESSAGES (the test process's, not the router's)."""
    request = ChatCompletionRequest.model_validate({"model": model, "messages": MESSAGES})
    return list(models.pipelines[model].render_chat(request).token_ids)


def _stored_ids(url: str) -> list[list[int]]:
    """The ids of every block a worker stored, per stored event (its prefix cache's event log)."""
    answer = httpx.get(f"{url}/kv_cache_events", params={"after": 0}, timeout=10.0).json()
    stored = [event for event in answer["events"] if event["type"] == "stored"]
    return [[token for block in event["token_ids"] for token in block] for event in stored]


def test_router_lists_every_model(models: SimpleNamespace) -> None:
    listed = [item["id"] for item in models.client.get("/v1/models").json()["data"]]
    assert listed == [QWEN, LLAMA]
    info = _models_info(models.client)
    assert [name for name in info] == [QWEN, LLAMA]
    assert info[QWEN]["fingerprint_digest"] != info[LLAMA]["fingerprint_digest"]
    for name in (QWEN, LLAMA):
        assert info[name]["served_model_names"] == [name]
        assert info[name]["active_workers"] == 1 and info[name]["forwarding"] is True, info[name]
    workers = {item["url"]: item for item in models.client.get("/workers").json()["workers"]}
    assert workers[models.workers[QWEN].url]["model_group"] == QWEN
    assert workers[models.workers[QWEN].url]["pinned_model"] == QWEN  # listed under its model in --config
    assert workers[models.workers[LLAMA].url]["model_group"] == LLAMA
    assert workers[models.workers[LLAMA].url]["pinned_model"] is None  # placed by the name it reports


def test_each_request_is_rendered_by_its_models_pipeline(models: SimpleNamespace) -> None:
    own = {name: _own_ids(models, name) for name in (QWEN, LLAMA)}
    assert own[QWEN] != own[LLAMA]  # two tokenizers, two templates: the ids tell which rendered
    for name in (QWEN, LLAMA):
        body = {"model": name, "messages": MESSAGES}
        rendered = models.client.post("/v1/chat/completions/render", json=body)
        assert rendered.status_code == 200, rendered.text
        assert rendered.json()["token_ids"] == own[name]
        response = _chat(models.client, name)
        worker = models.workers[name]
        assert response.headers[WORKER_HEADER] == worker.url and forwarded(response)
        assert response.json()["usage"]["prompt_tokens"] == len(own[name])
        # The ids the worker was sent are its model's: the blocks it stored are their leading full blocks.
        full = len(own[name]) // 16 * 16
        assert full >= 32
        assert own[name][:full] in _stored_ids(worker.url)


def test_requests_land_only_on_their_models_workers(models: SimpleNamespace) -> None:
    for name in (QWEN, LLAMA, QWEN, LLAMA, LLAMA, QWEN):
        response = _chat(models.client, name)
        assert response.headers[WORKER_HEADER] == models.workers[name].url
        assert response.json()["model"] == name


def test_an_unknown_model_is_a_404(models: SimpleNamespace) -> None:
    for path in ("/v1/chat/completions", "/v1/chat/completions/render"):
        response = models.client.post(path, json={"model": "no-such-model", "messages": MESSAGES})
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "model_not_found"
        assert QWEN in error["message"] and LLAMA in error["message"]


def test_a_worker_serving_no_model_of_the_routers_gets_nothing(models: SimpleNamespace) -> None:
    client, url = models.client, models.foreign.url
    added = client.post("/workers", json={"url": url}, headers=ADMIN)
    assert added.status_code == 201, added.text
    try:
        item = added.json()
        assert item["state"] == "healthy" and item["model_group"] is None
        assert "mystery-model" in item["model_mismatch"] and "no requests" in item["model_mismatch"]
        assert client.get("/server_info").json()["unplaced_workers"] == [url]
        for name in (QWEN, LLAMA, QWEN, LLAMA):
            assert _chat(client, name).headers[WORKER_HEADER] != url
        assert models.foreign.bodies == []
    finally:
        assert client.delete("/workers", params={"url": url}, headers=ADMIN).status_code == 200


def test_a_mismatched_worker_of_one_model_leaves_the_others_forwarding_on(models: SimpleNamespace) -> None:
    client, bad = models.client, models.other_template.url
    added = client.post("/workers", json={"url": bad, "model": QWEN}, headers=ADMIN)
    assert added.status_code == 201, added.text
    try:
        assert added.json()["model_group"] == QWEN and added.json()["gate_reasons"] == [
            "chat template differs"
        ]
        info = _models_info(client)
        assert info[QWEN]["forwarding"] is False and list(info[QWEN]["gate"]["blocking_workers"]) == [bad]
        assert info[LLAMA]["forwarding"] is True and info[LLAMA]["gate"]["blocking_workers"] == {}
        assert client.get("/workers").json()["gates"][LLAMA]["forwarding"] is True
        url = models.router.url
        assert metric(url, "tokenfront_router_model_forwarding", model=QWEN) == 0.0
        assert metric(url, "tokenfront_router_model_forwarding", model=LLAMA) == 1.0
        for _ in range(3):
            assert not forwarded(_chat(client, QWEN))
            llama = _chat(client, LLAMA)
            assert forwarded(llama) and llama.headers[WORKER_HEADER] == models.workers[LLAMA].url
        warnings = log_lines(models.router, f"not forwarding token ids for model {QWEN}")
        assert len(warnings) == 1 and bad in warnings[0]
        assert not log_lines(models.router, f"not forwarding token ids for model {LLAMA}")
    finally:
        assert client.delete("/workers", params={"url": bad}, headers=ADMIN).status_code == 200
    assert wait_until(lambda: _models_info(client)[QWEN]["forwarding"] is True)
    assert forwarded(_chat(client, QWEN))

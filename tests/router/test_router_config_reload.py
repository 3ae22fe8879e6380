"""Reloading `route --config` while the router serves (router/config_reload.py, router/hangup.py), with real
processes: a router started on a config file the test edits, simulated workers on two tokenizers (Qwen3 and
Llama 3; the Llama 3 one decodes slowly, so a stream on it is in flight for seconds).

A model added by an edit and a SIGHUP serves (listed, rendered by its own pipeline, answered by its worker); a
model removed answers 404 while its stream in flight finishes whole; an edit that cannot be used keeps the
running configuration and is counted `invalid`, a vanished file `failed`; and a change is picked up without
SIGHUP within the interval, a table whose rendering options changed rebuilt (its fingerprint and gate decided
again) while an unchanged one keeps its pipeline.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from conftest import WORKER_HEADER, Fleet, forwarded, log_lines, metric, wait_until
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest

pytestmark = pytest.mark.slow  # real processes: routers and two simulated workers

QWEN, LLAMA = "qwen3-chat", "llama3-chat"
MESSAGES = [{"role": "user", "content": "Name three rivers of Europe and the seas they flow into."}]
# A template the Qwen3 worker does not have: a table given it is rebuilt, and its worker then renders otherwise.
OTHER_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
# Seconds a reload may take (loading a checkpoint in a thread on a busy machine), and a worker may take to join.
RELOAD_DEADLINE = 90.0
STREAM_TOKENS = 300  # at 0.03 s a decode step on the slow worker: about 9 s in flight


@pytest.fixture(scope="module")
def parts(fleet: Fleet, qwen3: Path, checkpoint: Callable[[str], Path]) -> SimpleNamespace:
    llama3 = checkpoint("llama3")
    simulated = ["serve", "--engine", "simulated"]
    qwen_worker, llama_worker = fleet.start_many(
        [*simulated, "--model", str(qwen3), "--served-model-name", QWEN],
        [
            *simulated,
            "--model",
            str(llama3),
            "--served-model-name",
            LLAMA,
            "--sim-decode-step-seconds",
            "0.03",
        ],
    )
    return SimpleNamespace(
        fleet=fleet, qwen3=qwen3, llama3=llama3, qwen_worker=qwen_worker, llama_worker=llama_worker
    )


def _table(name: str, checkpoint: Path, worker: str, **keys: str) -> str:
    extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items())  # a TOML string
    return (
        f'[[models]]\nmodel = "{checkpoint}"\nserved_model_name = "{name}"\nworkers = ["{worker}"]\n{extra}\n'
    )


def _write(path: Path, text: str) -> None:
    """Replace the file whole (a rename), as an operator or a ConfigMap mount does."""
    staged = path.with_suffix(".tmp")
    staged.write_text(text)
    os.replace(staged, path)


@pytest.fixture
def start_router(parts: SimpleNamespace, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """A router on a config file of the given tables (`router.config` is its path); stopped by its pid after
    the test."""
    started: list[Any] = []

    def start(text: str, *extra: str) -> Any:
        config = tmp_path / "models.toml"
        _write(config, text)
        router = parts.fleet.start(
            "route", "--config", str(config), "--health-interval", "0.5", "--policy", "round_robin", *extra
        )
        router.config = config
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()


def _info(router: Any) -> dict[str, Any]:
    return httpx.get(f"{router.url}/server_info", timeout=10.0).json()


def _generation(router: Any) -> int:
    return int(_info(router)["config"]["generation"])


def _reloads(router: Any) -> dict[str, float]:
    return {
        outcome: metric(router.url, "tokenfront_router_config_reloads_total", outcome=outcome)
        for outcome in ("ok", "invalid", "failed")
    }


def _workers(router: Any) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{router.url}/workers", timeout=10.0).json()
    return {item["url"]: item for item in answer["workers"]}


def _healthy_in(router: Any, url: str, model: str) -> bool:
    item = _workers(router).get(url)
    return item is not None and item["state"] == "healthy" and item["model_group"] == model


def _chat(router: Any, model: str) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 2, "temperature": 0}
    return httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=60.0)


def _listed(router: Any) -> list[str]:
    return [item["id"] for item in httpx.get(f"{router.url}/v1/models", timeout=10.0).json()["data"]]


def _own_ids(checkpoint: Path, name: str, chat_template: str | None = None) -> list[int]:
    pipeline = RenderPipeline.load(
        RenderOptions(model=str(checkpoint), served_model_name=(name,), chat_template=chat_template)
    )
    request = ChatCompletionRequest.model_validate({"model": name, "messages": MESSAGES})
    return list(pipeline.render_chat(request).token_ids)


def _rendered(router: Any, model: str) -> list[int]:
    body = {"model": model, "messages": MESSAGES}
    response = httpx.post(f"{router.url}/v1/chat/completions/render", json=body, timeout=30.0)
    assert response.status_code == 200, response.text
    return list(response.json()["token_ids"])


def test_a_model_added_by_an_edit_and_sighup_serves(parts: SimpleNamespace, start_router: Any) -> None:
    qwen = _table(QWEN, parts.qwen3, parts.qwen_worker.url)
    router = start_router(qwen, "--worker-source-interval", "3600")  # only SIGHUP reads it again
    assert wait_until(lambda: _healthy_in(router, parts.qwen_worker.url, QWEN), timeout=30.0)
    before = _info(router)
    assert before["config"]["generation"] == 1 and before["config"]["last_reload"] is None
    assert _listed(router) == [QWEN] and _chat(router, LLAMA).status_code == 404
    assert _reloads(router) == {"ok": 0.0, "invalid": 0.0, "failed": 0.0}

    _write(router.config, qwen + _table(LLAMA, parts.llama3, parts.llama_worker.url))
    router.process.send_signal(signal.SIGHUP)
    assert wait_until(lambda: _generation(router) == 2, timeout=RELOAD_DEADLINE), router.log()[-3000:]
    # It serves once the swap is done: its worker was added and checked before.
    assert _healthy_in(router, parts.llama_worker.url, LLAMA), _workers(router)
    assert _listed(router) == [QWEN, LLAMA]
    response = _chat(router, LLAMA)
    assert response.status_code == 200, response.text
    assert response.headers[WORKER_HEADER] == parts.llama_worker.url and forwarded(response)
    assert _rendered(router, LLAMA) == _own_ids(parts.llama3, LLAMA)  # rendered by its own pipeline
    assert _chat(router, QWEN).headers[WORKER_HEADER] == parts.qwen_worker.url

    after = _info(router)
    assert after["config"]["digest"] != before["config"]["digest"]
    assert after["config"]["last_reload"]["outcome"] == "ok"
    assert after["config"]["loaded_at"] > before["config"]["loaded_at"]
    models = {item["model"]: item for item in after["models"]}
    assert list(models) == [QWEN, LLAMA]
    assert models[QWEN]["fingerprint_digest"] == before["models"][0]["fingerprint_digest"]
    assert models[LLAMA]["active_workers"] == 1 and models[LLAMA]["forwarding"] is True
    assert _workers(router)[parts.llama_worker.url]["source"] == f"config:{router.config}"
    assert _reloads(router) == {"ok": 1.0, "invalid": 0.0, "failed": 0.0}
    assert len(log_lines(router, f"reading the config file {router.config} again (SIGHUP)")) == 1
    (applied,) = log_lines(router, f"config file {router.config} applied (generation 2)")
    assert f"added {LLAMA}" in applied and f"unchanged {QWEN}" in applied
    # Its worker joined before it served: at no moment was it a worker of the Qwen3 model's, or of none.
    assert not log_lines(router, "not forwarding token ids") and not log_lines(router, "does not serve")
    assert router.process.poll() is None


def test_a_model_removed_answers_404_while_its_stream_in_flight_finishes(
    parts: SimpleNamespace, start_router: Any
) -> None:
    qwen = _table(QWEN, parts.qwen3, parts.qwen_worker.url)
    router = start_router(
        qwen + _table(LLAMA, parts.llama3, parts.llama_worker.url), "--worker-source-interval", "3600"
    )
    llama = parts.llama_worker.url
    assert wait_until(lambda: _healthy_in(router, llama, LLAMA), timeout=30.0)
    aborts = metric(llama, "tokenfront_worker_aborts_total", reason="client_disconnected")
    body = {
        "model": LLAMA,
        "messages": MESSAGES,
        "max_tokens": STREAM_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(base_url=router.url, timeout=60.0) as client:
        request = client.build_request("POST", "/v1/chat/completions", json=body)
        stream = client.send(request, stream=True)
        assert stream.status_code == 200 and stream.headers[WORKER_HEADER] == llama
        lines = stream.iter_lines()
        events = [next(lines)]  # its first event: it runs on the worker
        assert _workers(router)[llama]["active_requests"] == 1

        _write(router.config, qwen)
        router.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: _generation(router) == 2, timeout=RELOAD_DEADLINE), router.log()[-3000:]
        gone = _chat(router, LLAMA)
        not_found_at = time.monotonic()
        assert gone.status_code == 404, gone.text
        error = gone.json()["error"]
        assert error["code"] == "model_not_found"
        assert error["message"] == f"The model `{LLAMA}` does not exist. This server serves: {QWEN}."
        assert _listed(router) == [QWEN]
        assert [item["model"] for item in _info(router)["models"]] == [QWEN]
        assert _chat(router, QWEN).status_code == 200

        events += list(lines)  # the stream goes on to its end
        finished_at = time.monotonic()
        stream.close()
    assert finished_at - not_found_at > 1.0  # it was still generating when its model left
    data = [event for event in events if event.startswith("data: ")]
    assert data[-1] == "data: [DONE]" and not [event for event in data if '"error"' in event]
    (usage,) = [json.loads(event[6:])["usage"] for event in data[:-1] if json.loads(event[6:]).get("usage")]
    assert usage["completion_tokens"] == STREAM_TOKENS  # the whole answer
    assert metric(llama, "tokenfront_worker_aborts_total", reason="client_disconnected") == aborts
    # Its pinned worker left as a worker source's does: drained, then removed.
    assert wait_until(lambda: llama not in _workers(router), timeout=30.0)
    assert len(log_lines(router, f"worker source config:{router.config} no longer lists {llama}")) == 1
    (applied,) = log_lines(router, f"config file {router.config} applied (generation 2)")
    assert f"removed {LLAMA}" in applied and f"unchanged {QWEN}" in applied
    # Its leaving worker was never counted among the Qwen3 model's (whose gate stayed open).
    assert not log_lines(router, "not forwarding token ids") and not log_lines(router, "does not serve")
    assert _reloads(router) == {"ok": 1.0, "invalid": 0.0, "failed": 0.0}


def test_an_edit_that_cannot_be_used_keeps_the_running_configuration(
    parts: SimpleNamespace, start_router: Any
) -> None:
    qwen = _table(QWEN, parts.qwen3, parts.qwen_worker.url)
    router = start_router(qwen, "--worker-source-interval", "0.3")
    config = router.config
    assert wait_until(lambda: _healthy_in(router, parts.qwen_worker.url, QWEN), timeout=30.0)
    digest = _info(router)["config"]["digest"]

    _write(config, qwen.replace("workers =", 'colour = "red"\nworkers ='))
    assert wait_until(lambda: _reloads(router)["invalid"] == 1.0, timeout=RELOAD_DEADLINE)
    warning = f"config file {config} not applied, the running configuration (generation 1) is kept: "
    (line,) = log_lines(router, warning)
    assert "WARNING" in line and f"--config {config}, models[0]: unknown key 'colour'" in line
    # The same content, read again at each interval (0.3 s), is not counted again in five of them; a SIGHUP
    # asks again, and is.
    assert not wait_until(lambda: _reloads(router)["invalid"] != 1.0, timeout=1.5)
    assert _reloads(router) == {"ok": 0.0, "invalid": 1.0, "failed": 0.0}
    router.process.send_signal(signal.SIGHUP)
    assert wait_until(lambda: _reloads(router)["invalid"] == 2.0, timeout=RELOAD_DEADLINE)

    _write(config, qwen.replace(str(parts.qwen3), "/no/such/checkpoint"))
    assert wait_until(lambda: _reloads(router)["invalid"] == 3.0, timeout=RELOAD_DEADLINE)
    assert len(log_lines(router, "models[0]: model folder '/no/such/checkpoint' does not exist")) == 1

    config.unlink()
    assert wait_until(lambda: _reloads(router)["failed"] == 1.0, timeout=RELOAD_DEADLINE)
    assert len(log_lines(router, f"config file {config} cannot be read (No such file or directory)")) == 1

    info = _info(router)
    assert info["config"]["generation"] == 1 and info["config"]["digest"] == digest
    assert info["config"]["last_reload"]["outcome"] == "failed"
    assert _listed(router) == [QWEN] and _chat(router, QWEN).status_code == 200
    assert _healthy_in(router, parts.qwen_worker.url, QWEN)

    _write(config, qwen)  # the content it runs: nothing to apply
    assert wait_until(lambda: bool(log_lines(router, f"config file {config} can be read again")))
    assert _reloads(router) == {"ok": 0.0, "invalid": 3.0, "failed": 1.0}
    assert "Traceback" not in router.log() and router.process.poll() is None


def test_a_change_is_picked_up_without_sighup_and_a_changed_table_is_rebuilt(
    parts: SimpleNamespace, start_router: Any
) -> None:
    qwen = _table(QWEN, parts.qwen3, parts.qwen_worker.url)
    llama = _table(LLAMA, parts.llama3, parts.llama_worker.url)
    router = start_router(qwen + llama, "--worker-source-interval", "0.5")
    assert wait_until(lambda: _healthy_in(router, parts.llama_worker.url, LLAMA), timeout=30.0)
    assert wait_until(lambda: _healthy_in(router, parts.qwen_worker.url, QWEN), timeout=30.0)
    before = {item["model"]: item for item in _info(router)["models"]}
    assert before[QWEN]["forwarding"] is True

    _write(
        router.config, _table(QWEN, parts.qwen3, parts.qwen_worker.url, chat_template=OTHER_TEMPLATE) + llama
    )
    assert wait_until(lambda: _generation(router) == 2, timeout=RELOAD_DEADLINE), router.log()[-3000:]
    assert not log_lines(router, "(SIGHUP)")
    assert len(log_lines(router, f"config file {router.config} changed: reading it again")) == 1
    (applied,) = log_lines(router, f"config file {router.config} applied (generation 2)")
    assert f"rebuilt {QWEN} (its rendering options changed)" in applied and f"unchanged {LLAMA}" in applied

    after = {item["model"]: item for item in _info(router)["models"]}
    assert after[QWEN]["fingerprint_digest"] != before[QWEN]["fingerprint_digest"]
    assert after[LLAMA]["fingerprint_digest"] == before[LLAMA]["fingerprint_digest"]
    assert _rendered(router, QWEN) == _own_ids(parts.qwen3, QWEN, OTHER_TEMPLATE)
    # Its worker still has the checkpoint's template: the new gate stops forwarding for it, and only for it.
    assert after[QWEN]["forwarding"] is False and list(after[QWEN]["gate"]["blocking_workers"]) == [
        parts.qwen_worker.url
    ]
    assert after[LLAMA]["forwarding"] is True
    response = _chat(router, QWEN)
    assert response.status_code == 200 and not forwarded(response)
    assert metric(router.url, "tokenfront_router_model_forwarding", model=QWEN) == 0.0
    assert _healthy_in(router, parts.qwen_worker.url, QWEN)  # an unchanged worker list: the worker stays
    assert not log_lines(router, f"no longer lists {parts.qwen_worker.url}")
    assert _reloads(router) == {"ok": 1.0, "invalid": 0.0, "failed": 0.0}

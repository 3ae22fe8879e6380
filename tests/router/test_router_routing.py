"""The router in front of three real workers: KV-cache-aware routing, forwarding and the gate, streaming, admin.

Three `tokenfront serve` workers on the tiny random checkpoint and one `tokenfront route` on the same
checkpoint (so every fingerprint matches), all real processes on loopback, shared by the module. The tests
run in file order: the first one needs workers that have not rendered anything yet.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import (
    ADMIN,
    ADMIN_KEY,
    GATE_RESUMED,
    GATE_WARNING,
    WORKER_HEADER,
    Fleet,
    chat,
    forwarded,
    log_lines,
    metric,
    router_command,
    wait_for_checks,
    wait_until,
    words,
)

pytestmark = pytest.mark.slow  # real server processes

CONVERSATIONS = 6
TURNS = 4
BLOCK = 16  # the workers' tokens_per_block (their default)


@pytest.fixture(scope="module")
def workers(fleet: Fleet, tiny_random: Path) -> list[Any]:
    return fleet.start_many(*(["serve", "--model", str(tiny_random)] for _ in range(3)))


@pytest.fixture(scope="module")
def router(fleet: Fleet, tiny_random: Path, workers: list[Any]) -> Any:
    urls = [worker.url for worker in workers]
    return fleet.start(*router_command(tiny_random, urls, "--admin-api-key", ADMIN_KEY))


@pytest.fixture(scope="module")
def client(router: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router.url, timeout=120.0) as http:
        yield http


def _converse(client: httpx.Client, index: int, start: threading.Barrier) -> list[tuple[str, bool, dict]]:
    """One conversation growing turn by turn; (worker, forwarded, usage) per turn."""
    # A long, distinct first message: the conversation's own prefix is many blocks, far more than any load
    # difference between workers, so following it is what the policy should do.
    messages: list[dict[str, Any]] = [{"role": "user", "content": words(index, 150)}]
    turns = []
    start.wait()  # all conversations begin together, as concurrent users do
    for turn in range(TURNS):
        response = chat(client, messages)
        body = response.json()
        turns.append((response.headers[WORKER_HEADER], forwarded(response), body["usage"]))
        messages += [
            {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
            {"role": "user", "content": f"Turn {turn}: " + words(1000 * index + turn, 12)},
        ]
    return turns


def test_router_conversations_stay_with_their_prefix_and_spread(
    client: httpx.Client, workers: list[Any]
) -> None:
    urls = {worker.url for worker in workers}
    start = threading.Barrier(CONVERSATIONS)
    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        results = list(pool.map(lambda i: _converse(client, i, start), range(CONVERSATIONS)))

    homes = [turns[0][0] for turns in results]
    for index, turns in enumerate(results):
        served_by = [worker for worker, _, _ in turns]
        assert served_by == [homes[index]] * TURNS, f"conversation {index} moved: {served_by}"
        for (_, _, previous), (_, _, usage) in itertools.pairwise(turns):
            # The previous turn's prompt is a prefix of this one, cached on its worker: every full block of
            # it but its last token, which may merge with the reply's first characters once re-rendered.
            expected = BLOCK * ((previous["prompt_tokens"] - 1) // BLOCK)
            assert usage["prompt_tokens_details"]["cached_tokens"] >= expected, (index, turns)
    assert set(homes) == urls, f"conversations did not spread over the three workers: {homes}"

    # Every worker matched the router's fingerprint: every request carried ids and no worker rendered.
    assert all(was_forwarded for turns in results for _, was_forwarded, _ in turns)
    for worker in workers:
        given = metric(worker.url, "tokenfront_worker_prompts_total", route="chat", source="token_ids")
        rendered = metric(worker.url, "tokenfront_worker_prompts_total", route="chat", source="rendered")
        assert (given, rendered) == (homes.count(worker.url) * TURNS, 0)


def test_router_gate_follows_a_worker_with_another_template(
    client: httpx.Client, router: Any, workers: list[Any], fleet: Fleet, tiny_random: Path
) -> None:
    template = (tiny_random / "chat_template.jinja").read_text()
    assert "helpful AI assistant" in template
    other = fleet.start(
        "serve",
        "--model",
        str(tiny_random),
        "--chat-template",
        template.replace("helpful AI assistant", "helpful assistant"),
    )
    assert log_lines(router, GATE_WARNING) == []

    added = client.post("/workers", json={"url": other.url}, headers=ADMIN)
    assert added.status_code == 201, added.text
    assert added.json()["state"] == "healthy"
    assert added.json()["fingerprint_matches"] is False
    assert added.json()["gate_reasons"] == ["chat template differs"]
    # One warning, naming that worker (and no other) and the reason.
    assert wait_until(lambda: len(log_lines(router, GATE_WARNING)) == 1)
    (warning,) = log_lines(router, GATE_WARNING)
    assert "WARNING" in warning and other.url in warning and "chat template differs" in warning
    assert not any(worker.url in warning for worker in workers)
    gate = client.get("/server_info").json()["gate"]
    assert gate == {
        "forwarding": False,
        "router_reasons": [],
        "blocking_workers": {other.url: ["chat template differs"]},
    }

    # Still routed (a conversation follows its prefix), nothing forwarded, workers render themselves.
    urls = {worker.url for worker in workers} | {other.url}
    rendered_before = sum(
        metric(url, "tokenfront_worker_prompts_total", route="chat", source="rendered") for url in urls
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": words(77, 120)}]
    served_by = []
    for turn in range(3):
        response = chat(client, messages)
        assert not forwarded(response)
        served_by.append(response.headers[WORKER_HEADER])
        messages += [
            {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": f"and then {turn}"},
        ]
    assert served_by[0] in urls and served_by == [served_by[0]] * 3
    for index in range(5):
        assert not forwarded(chat(client, [{"role": "user", "content": words(200 + index, 30)}]))
    rendered_after = sum(
        metric(url, "tokenfront_worker_prompts_total", route="chat", source="rendered") for url in urls
    )
    assert rendered_after - rendered_before == 8
    assert len(log_lines(router, GATE_WARNING)) == 1, "more requests must not log the warning again"

    # The worker leaves: forwarding resumes, logged once.
    removed = client.delete("/workers", params={"url": other.url}, headers=ADMIN)
    assert removed.status_code == 200, removed.text
    assert removed.json()["gate"]["forwarding"] is True
    assert wait_until(lambda: len(log_lines(router, GATE_RESUMED)) == 1)
    assert forwarded(chat(client, [{"role": "user", "content": words(300, 30)}]))
    # A few health rounds: nothing changed, so nothing more is logged.
    assert wait_for_checks(client, workers[0].url, 2)
    assert len(log_lines(router, GATE_WARNING)) == 1
    assert len(log_lines(router, GATE_RESUMED)) == 1


def test_router_streams_pass_through_as_they_arrive(client: httpx.Client, workers: list[Any]) -> None:
    body = {
        "messages": [{"role": "user", "content": words(400, 20)}],
        "max_tokens": 160,  # long enough that the relay takes well over 0.05 s even on a fast machine
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    arrivals: list[tuple[float, str]] = []
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers[WORKER_HEADER] in {worker.url for worker in workers}
        assert forwarded(response)
        for line in response.iter_lines():
            if line:
                arrivals.append((time.monotonic(), line))
    assert all(line.startswith("data: ") for _, line in arrivals)
    assert arrivals[-1][1] == "data: [DONE]"
    assert '"usage":{"prompt_tokens"' in arrivals[-2][1]
    assert len(arrivals) >= 20
    # Relayed as the worker produced them, not collected first: the events arrive over time.
    spread = arrivals[-1][0] - arrivals[0][0]
    distinct = len({round(moment, 3) for moment, _ in arrivals})
    assert spread > 0.05 and distinct >= 10, (spread, distinct)


def test_router_completions_forward_every_prompt(client: httpx.Client) -> None:
    single = client.post("/v1/completions", json={"prompt": words(500, 20), "max_tokens": 4})
    assert single.status_code == 200 and forwarded(single)
    several = client.post("/v1/completions", json={"prompt": [words(501, 9), words(502, 9)], "max_tokens": 4})
    assert several.status_code == 200 and forwarded(several)
    assert [choice["index"] for choice in several.json()["choices"]] == [0, 1]
    # echo repeats the prompt text: the worker must see the text, not ids.
    echoed = client.post("/v1/completions", json={"prompt": "Echo me", "max_tokens": 2, "echo": True})
    assert echoed.status_code == 200 and not forwarded(echoed)
    assert echoed.json()["choices"][0]["text"].startswith("Echo me")
    # Ids from the client go as they are.
    ids = client.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 2})
    assert ids.status_code == 200 and not forwarded(ids)
    assert ids.json()["usage"]["prompt_tokens"] == 4


def test_router_common_routes_and_render(client: httpx.Client, workers: list[Any]) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    info = client.get("/server_info").json()
    worker_info = httpx.get(f"{workers[0].url}/server_info").json()
    assert info["role"] == "router" and info["policy"] == "predicted_ttft"
    assert info["render_fingerprint"]["digest"] == worker_info["render_fingerprint"]["digest"]
    assert {worker["url"] for worker in info["workers"]} == {worker.url for worker in workers}
    assert [model["id"] for model in client.get("/v1/models").json()["data"]] == ["tiny-random"]

    messages = [{"role": "user", "content": "How many tokens is this?"}]
    rendered = client.post("/v1/chat/completions/render", json={"messages": messages})
    assert rendered.status_code == 200
    usage = chat(client, messages).json()["usage"]
    assert len(rendered.json()["token_ids"]) == usage["prompt_tokens"]


def test_router_errors_are_openai_shaped(client: httpx.Client, workers: list[Any]) -> None:
    unknown = client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user"}]})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    invalid = client.post("/v1/chat/completions", json={"messages": "hello"})
    assert invalid.status_code == 400 and invalid.json()["error"]["param"] == "messages"
    # A worker's 4xx passes through, with the worker named.
    too_long = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 100_000})
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
    assert too_long.headers[WORKER_HEADER] in {worker.url for worker in workers}

    duplicate = client.post("/workers", json={"url": workers[0].url + "/"}, headers=ADMIN)
    assert duplicate.status_code == 409 and duplicate.json()["error"]["code"] == "worker_exists"
    assert client.post("/workers", json={"url": "ftp://example"}, headers=ADMIN).status_code == 400
    assert client.post("/workers", json={"url": workers[0].url, "extra": 1}, headers=ADMIN).status_code == 400
    missing = client.delete("/workers", params={"url": "http://127.0.0.1:9"}, headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "worker_not_found"


def _aborted(workers: list[Any]) -> float:
    return sum(
        metric(worker.url, "tokenfront_worker_aborts_total", reason="client_disconnected")
        for worker in workers
    )


def _idle(client: httpx.Client) -> bool:
    return all(worker["active_requests"] == 0 for worker in client.get("/workers").json()["workers"])


def test_router_client_leaving_cancels_the_generation(
    client: httpx.Client, router: Any, workers: list[Any]
) -> None:
    # The tiny random model samples at temperature 1: without ignore_eos it may draw its EOS early and answer
    # within the client's 1 s (a fresh-clone CI saw that once); with it only max_tokens ends the ~4 s answer.
    long_answer = {
        "messages": [{"role": "user", "content": words(600, 10)}],
        "max_tokens": 1500,
        "ignore_eos": True,
    }
    before = _aborted(workers)
    with client.stream("POST", "/v1/chat/completions", json={**long_answer, "stream": True}) as response:
        for count, _ in enumerate(response.iter_lines()):
            if count == 3:
                break
    assert wait_until(lambda: _aborted(workers) == before + 1)
    try:
        answer = httpx.post(f"{router.url}/v1/chat/completions", json=long_answer, timeout=1.0)
    except httpx.ReadTimeout:
        pass
    else:
        pytest.fail(f"answered before the client left: {answer.status_code} {answer.text[:400]}")
    assert wait_until(lambda: _aborted(workers) == before + 2)
    assert wait_until(lambda: _idle(client))


def test_router_process_never_loads_torch(router: Any) -> None:
    maps = Path(f"/proc/{router.process.pid}/maps").read_text()
    assert "libtorch" not in maps and "/torch/" not in maps

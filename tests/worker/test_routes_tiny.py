"""The worker end to end on `tiny-random` (a 2-layer random Llama on the SmolLM2 tokenizer): concurrency,
prefix-cache eviction, render routes switched off, and graceful shutdown, on real `tokenfront serve` processes.

Its output is meaningless but deterministic under greedy decoding, which is what these tests compare.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow  # real server processes

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TOPICS = ["rivers", "volcanoes", "owls", "bridges", "tea", "comets", "violins", "glaciers"]


@pytest.fixture(scope="module")
def server(module_servers: Callable[..., Any], tiny_random: Path) -> Any:
    # A prefix cache of 4 blocks of 16 tokens: a few distinct prompts must evict.
    return module_servers("serve", "--model", str(tiny_random), "--kv-cache-max-tokens", "64")


@pytest.fixture(scope="module")
def worker(server: Any, connect: Callable[[Any], Any]) -> Any:
    return connect(server)


def _chat(topic: str) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"Tell me one fact about {topic}."}],
        "max_tokens": 24,
        "temperature": 0,
    }


def test_render_routes_are_off_without_the_variable(worker: Any) -> None:
    for path in ("/v1/chat/completions/render", "/v1/completions/render"):
        response = worker.post(path, json={"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]})
        assert response.status_code == 404
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert worker.get("/server_info").json()["render_endpoints"] is False


# Written out, not read from the routers: the render and derender routes a worker mounts with the variable.
RENDER_PATHS = [
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/messages/render",
    "/v1/responses/render",
    "/tokenize",
    "/detokenize",
    "/v1/chat/completions/derender",
    "/v1/completions/derender",
]


def test_render_routes_off_say_how_to_turn_them_on(worker: Any) -> None:
    answered = 0
    for path in RENDER_PATHS:
        response = worker.post(path, json={"messages": [{"role": "user", "content": "Hi"}]})
        assert response.status_code == 404, path
        error = response.json()["error"]
        assert error["code"] == "render_endpoints_disabled"
        assert error["message"].startswith(f"no route POST {path} on this worker: ")
        assert "TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1" in error["message"]
        answered += 1
    assert answered == 8
    # Any other unknown path keeps the plain 404, and the stand-ins are not documented as routes.
    other = worker.post("/v1/chat/completions/rendered", json={})
    assert other.status_code == 404
    assert other.json()["error"]["message"] == "no route POST /v1/chat/completions/rendered on this server"
    documented = worker.get("/openapi.json").json()["paths"]
    assert not set(RENDER_PATHS) & set(documented)
    assert "/v1/chat/completions" in documented


def test_named_tool_choice_needs_a_tool_call_parser(worker: Any) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {
        "messages": [{"role": "user", "content": "Call f."}],
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }
    response = worker.post(CHAT, json=body)
    assert response.status_code == 400
    assert "--tool-call-parser" in response.json()["error"]["message"]


def test_concurrent_clients_get_what_they_get_alone(worker: Any) -> None:
    alone = {topic: worker.post(CHAT, json=_chat(topic)).json() for topic in TOPICS}
    batch_max = worker.metric("tokenfront_engine_decode_batch_size_max")

    def ask(topic: str) -> dict[str, Any]:
        # One client per thread, as separate processes would have.
        with type(worker)(base_url=str(worker.base_url), timeout=120) as client:
            if TOPICS.index(topic) % 2:  # half of them stream
                chunks = client.sse(CHAT, _chat(topic))
                text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
                return {
                    "content": text,
                    "finish": [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1],
                }
            choice = client.post(CHAT, json=_chat(topic)).json()["choices"][0]
            return {"content": choice["message"]["content"], "finish": choice["finish_reason"]}

    with ThreadPoolExecutor(max_workers=len(TOPICS)) as pool:
        together = dict(zip(TOPICS, pool.map(ask, TOPICS), strict=True))
    for topic in TOPICS:
        choice = alone[topic]["choices"][0]
        assert together[topic] == {"content": choice["message"]["content"], "finish": choice["finish_reason"]}
    # They really ran together: the engine decoded several sequences in one step.
    assert max(batch_max, worker.metric("tokenfront_engine_decode_batch_size_max")) > 1


def test_small_prefix_cache_evicts_and_publishes_removals(worker: Any) -> None:
    last_seq = worker.get("/kv_cache_events", params={"after": 0, "limit": 0}).json()["last_seq"]
    for topic in TOPICS[:4]:
        long_prompt = f"A long introduction about {topic}, written to fill several cache blocks. " * 4
        reply = worker.post(COMPLETIONS, json={"prompt": long_prompt, "max_tokens": 2, "temperature": 0})
        assert reply.status_code == 200
    events = worker.get("/kv_cache_events", params={"after": last_seq}).json()["events"]
    stored = {h for e in events if e["type"] == "stored" for h in e["block_hashes"]}
    removed = [h for e in events if e["type"] == "removed" for h in e["block_hashes"]]
    assert stored
    assert removed
    assert set(removed) <= stored | set(removed)  # removals name blocks, hashed like the stored ones
    assert all(isinstance(h, int) and h >= 0 for h in removed)
    assert worker.metric("tokenfront_engine_kv_cache_tokens") <= 64
    assert worker.metric("tokenfront_engine_kv_cache_evicted_blocks") >= len(removed)


def test_graceful_shutdown_finishes_in_flight_requests(
    module_servers: Callable[..., Any], tiny_random: Path, connect: Callable[[Any], Any]
) -> None:
    server = module_servers("serve", "--model", str(tiny_random))
    own = connect(server)
    results: list[httpx.Response] = []

    def request() -> None:
        # About 3 s of generation here (greedy from "Hello" never meets EOS within 100 tokens).
        body = {"prompt": "Hello", "max_tokens": 100, "temperature": 0}
        results.append(httpx.post(f"{server.url}{COMPLETIONS}", json=body, timeout=60))

    thread = threading.Thread(target=request)
    thread.start()
    # The request is being generated.
    assert own.wait_until(lambda: own.metric("tokenfront_engine_running") == 1)
    assert server.stop() == 0  # SIGTERM: the process waits for it, then exits 0
    thread.join()
    [response] = results
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 100

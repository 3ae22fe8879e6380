"""Workers that cannot prove they render like the router, and routers that cannot render like the workers.

A plain OpenAI server (no `/server_info`) blocks forwarding with "no fingerprint" yet is routed to; a router
without a model path (only a tokenizer, or nothing) never forwards and says why, yet routes.
"""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import (
    GATE_WARNING,
    WORKER_HEADER,
    Fleet,
    PlainOpenAIServer,
    chat,
    forwarded,
    log_lines,
    metric,
    router_command,
    wait_until,
    words,
)

pytestmark = pytest.mark.slow  # real server processes


@pytest.fixture(scope="module")
def worker(fleet: Fleet, tiny_random: Path) -> Any:
    return fleet.start("serve", "--model", str(tiny_random))


def _concurrent_chats(client: httpx.Client, count: int, seed: int) -> list[httpx.Response]:
    start = threading.Barrier(count)

    def one(index: int) -> httpx.Response:
        start.wait()
        return chat(client, [{"role": "user", "content": words(seed + index, 40)}], max_tokens=16)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_router_plain_openai_server_blocks_forwarding_and_is_routed_to(
    fleet: Fleet, tiny_random: Path, worker: Any, plain_servers: Any
) -> None:
    plain: PlainOpenAIServer = plain_servers()
    router = fleet.start(*router_command(tiny_random, [worker.url, plain.url]))
    assert wait_until(lambda: len(log_lines(router, GATE_WARNING)) == 1)
    (warning,) = log_lines(router, GATE_WARNING)
    assert plain.url in warning and "no fingerprint (/server_info answered 404)" in warning
    assert worker.url not in warning

    with httpx.Client(base_url=router.url, timeout=120.0) as client:
        listed = {item["url"]: item for item in client.get("/workers").json()["workers"]}
        assert listed[plain.url]["state"] == "healthy"
        assert listed[plain.url]["fingerprint_matches"] is False
        assert listed[worker.url]["fingerprint_matches"] is True
        responses = _concurrent_chats(client, 8, seed=10)

    served_by = [response.headers[WORKER_HEADER] for response in responses]
    assert not any(forwarded(response) for response in responses)
    assert served_by.count(plain.url) >= 1 and served_by.count(worker.url) >= 1, served_by
    # The plain server got the client's own body: messages, no ids.
    assert len(plain.bodies) == served_by.count(plain.url)
    assert all("messages" in body and "prompt_token_ids" not in body for body in plain.bodies)
    # The tokenfront worker rendered what it served itself.
    rendered = metric(worker.url, "tokenfront_worker_prompts_total", route="chat", source="rendered")
    given = metric(worker.url, "tokenfront_worker_prompts_total", route="chat", source="token_ids")
    assert (rendered, given) == (served_by.count(worker.url), 0)
    assert len(log_lines(router, GATE_WARNING)) == 1


def test_router_with_only_a_tokenizer_renders_as_a_generic_text_model(
    fleet: Fleet, tiny_random: Path, worker: Any
) -> None:
    router = fleet.start(*router_command(None, [worker.url], "--tokenizer", str(tiny_random)))
    assert wait_until(lambda: len(log_lines(router, GATE_WARNING)) == 1)
    (warning,) = log_lines(router, GATE_WARNING)
    assert "Blocked by router started without a model path (renders as a generic text model);" in warning
    assert f"{worker.url}: model type none (generic text model) vs llama" in warning

    with httpx.Client(base_url=router.url, timeout=120.0) as client:
        # It renders (the tokenizer folder has the template), so it routes by ids, but never forwards them.
        rendered = client.post(
            "/v1/chat/completions/render", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert rendered.status_code == 200 and rendered.json()["token_ids"]
        response = chat(client, [{"role": "user", "content": "hi"}])
        assert not forwarded(response) and response.headers[WORKER_HEADER] == worker.url


def test_router_without_a_model_routes_by_load_and_never_forwards(fleet: Fleet, worker: Any) -> None:
    router = fleet.start(*router_command(None, [worker.url]))
    assert wait_until(lambda: len(log_lines(router, GATE_WARNING)) == 1)
    (warning,) = log_lines(router, GATE_WARNING)
    assert "router started without a model path" in warning

    with httpx.Client(base_url=router.url, timeout=120.0) as client:
        response = chat(client, [{"role": "user", "content": "hello"}])
        assert not forwarded(response) and response.headers[WORKER_HEADER] == worker.url
        completion = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        assert completion.status_code == 200 and not forwarded(completion)
        render = client.post(
            "/v1/chat/completions/render", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert render.status_code == 501 and render.json()["error"]["code"] == "render_unavailable"
        info = client.get("/server_info").json()
        assert info["render_fingerprint"] is None
        assert info["gate"]["forwarding"] is False
        # No names of its own: it serves what its workers report.
        assert [model["id"] for model in client.get("/v1/models").json()["data"]] == ["tiny-random"]


def test_router_with_no_worker_answering_says_503(fleet: Fleet, tiny_random: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{sock.getsockname()[1]}"
    router = fleet.start(*router_command(tiny_random, [nowhere]))
    with httpx.Client(base_url=router.url, timeout=60.0) as client:
        (listed,) = client.get("/workers").json()["workers"]
        assert listed["state"] == "unhealthy" and listed["problem"].startswith("/health unreachable")
        response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "no_worker"
        assert "GET /workers" in response.json()["error"]["message"]

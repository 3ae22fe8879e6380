"""The request limits are flags (issue 10 item 5): `--max-messages` on every server, `--max-sequences-per-request`
and `--max-tokens-per-request` on the worker. Real processes started with low limits: a request just inside
each is served, one just over is a 400 naming the limit, and the server keeps answering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tokenfront import fixtures


@pytest.fixture(scope="module")
def servers(launch: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log_dir = tmp_path_factory.mktemp("limits")
    qwen3 = str(fixtures.ensure_checkpoint("qwen3"))
    tiny = str(fixtures.ensure_checkpoint("tiny-random"))
    renderer = launch(["render", "--model", qwen3, "--max-messages", "3"], log_dir=log_dir)
    worker = launch(
        [
            "serve",
            "--model",
            tiny,
            "--max-sequences-per-request",
            "4",
            "--max-tokens-per-request",
            "1000",
        ],
        log_dir=log_dir,
        timeout=240.0,
    )
    try:
        yield renderer, worker
    finally:
        for server in (renderer, worker):
            server.stop()


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120.0)


def _refused(response: httpx.Response, *words: str) -> None:
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert all(word in message for word in words), message


def test_limits_are_flags(servers: Any) -> None:
    renderer, worker = servers
    turn = {"role": "user", "content": "hi"}
    assert _post(renderer.url, "/v1/chat/completions/render", {"messages": [turn] * 3}).status_code == 200
    _refused(
        _post(renderer.url, "/v1/chat/completions/render", {"messages": [turn] * 4}), "4 messages", "(3)"
    )

    two_prompts = {"prompt": ["a", "b"], "max_tokens": 2, "temperature": 0}
    assert _post(worker.url, "/v1/completions", {**two_prompts, "n": 2}).status_code == 200
    _refused(_post(worker.url, "/v1/completions", {**two_prompts, "n": 3}), "6 sequences", "4")
    _refused(_post(worker.url, "/v1/completions", {"prompt": "a", "max_tokens": 1000}), "1000")
    for server in (renderer, worker):
        assert httpx.get(f"{server.url}/health", timeout=10.0).status_code == 200


def test_logs_carry_no_prompt_text(servers: Any) -> None:
    """Prompts are the users' data: neither a served request nor a refused one puts its text in the log."""
    renderer, worker = servers
    marker = "zebra-quartz-1729-secret"
    turn = {"role": "user", "content": f"Tell me about {marker}."}
    assert _post(renderer.url, "/v1/chat/completions/render", {"messages": [turn]}).status_code == 200
    _refused(_post(renderer.url, "/v1/chat/completions/render", {"messages": [turn] * 4}), "4 messages")
    chat = {"messages": [turn], "max_tokens": 2, "temperature": 0}
    assert _post(worker.url, "/v1/chat/completions", chat).status_code == 200
    _refused(_post(worker.url, "/v1/completions", {"prompt": marker, "max_tokens": 1000}), "1000")
    for server in (renderer, worker):
        log = server.log()
        assert len(log) > 100  # the start-up lines are there: the log was read
        assert marker not in log

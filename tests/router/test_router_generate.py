"""A router speaking tokens to a `protocol=generate` worker (issue 9 item 4), on real processes.

A real SmolLM2-135M-Instruct worker answers greedy chat and completions directly; a router given the same
worker as `URL,protocol=generate` renders, sends the ids to the worker's `/inference/v1/generate`, derenders
the output ids and must answer the same: content, finish reason, usage, logprobs, streamed or not, with
`x-tokenfront-forwarded: true`, and the worker's metrics must count an id prompt on its generate route, not
a rendering. What the generate path does not carry goes to the OpenAI route as the client sent it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import FORWARDED_HEADER, WORKER_HEADER, Fleet, fixtures, metric, router_command, wait_until

pytestmark = pytest.mark.slow

PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return fixtures.ensure_checkpoint("smollm2")


@pytest.fixture(scope="module")
def worker(fleet: Fleet, smollm2: Path) -> Any:
    return fleet.start("serve", "--model", str(smollm2))


@pytest.fixture(scope="module")
def router(fleet: Fleet, smollm2: Path, worker: Any) -> Any:
    server = fleet.start(*router_command(smollm2, [f"{worker.url},protocol=generate"]))
    assert wait_until(lambda: _gate(server)["forwarding"]), _gate(server)
    return server


def _gate(server: Any) -> dict[str, Any]:
    return httpx.get(f"{server.url}/workers", timeout=10.0).json()["gate"]


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(f"{url}{path}", json=body, timeout=120.0)
    assert response.status_code == 200, response.text
    return response


def _chat_body(prompt: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0, **fields}


def _events(response: httpx.Response) -> list[Any]:
    """The data of each server-sent event, `[DONE]` as the string."""
    events = []
    for block in response.text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _assembled(events: list[Any], field: str) -> tuple[dict[int, str], dict[int, str | None]]:
    """Per choice: the streamed text of `field` ("content" for chat deltas, "text" for completions), and
    the finish reason."""
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    for event in events[:-1]:
        for choice in event["choices"]:
            part = choice["delta"].get(field) if "delta" in choice else choice.get(field)
            texts[choice["index"]] = texts.get(choice["index"], "") + (part or "")
            if choice["finish_reason"] is not None:
                reasons[choice["index"]] = choice["finish_reason"]
    return texts, reasons


def _comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without what differs between two requests (its id and time)."""
    return {k: v for k, v in answer.items() if k not in ("id", "created")}


def test_chat_answers_as_the_worker_does_and_the_worker_gets_ids(worker: Any, router: Any) -> None:
    ids_before = metric(worker.url, "tokenfront_worker_prompts_total", route="generate", source="token_ids")
    rendered_before = metric(worker.url, "tokenfront_worker_prompts_total", route="chat", source="rendered")
    compared = 0
    for prompt in PROMPTS:
        direct = _post(worker.url, "/v1/chat/completions", _chat_body(prompt)).json()
        routed = _post(router.url, "/v1/chat/completions", _chat_body(prompt))
        assert routed.headers[FORWARDED_HEADER] == "true"
        assert routed.headers[WORKER_HEADER] == worker.url
        answer = routed.json()
        assert answer["id"].startswith("chatcmpl-") and answer["id"] != direct["id"]
        direct["usage"]["prompt_tokens_details"] = answer["usage"]["prompt_tokens_details"]  # cache hits
        assert _comparable(answer) == _comparable(direct)
        assert answer["choices"][0]["message"]["content"]
        compared += 1
    assert compared == len(PROMPTS)
    # The router's requests reached the worker as ids on its generate route; only the direct ones rendered.
    assert metric(
        worker.url, "tokenfront_worker_prompts_total", route="generate", source="token_ids"
    ) == ids_before + len(PROMPTS)
    assert metric(
        worker.url, "tokenfront_worker_prompts_total", route="chat", source="rendered"
    ) == rendered_before + len(PROMPTS)
    assert metric(router.url, "tokenfront_router_requests_total", route="chat", forwarded="true") >= len(
        PROMPTS
    )


def test_chat_stream_answers_as_the_worker_does(worker: Any, router: Any) -> None:
    body = _chat_body(PROMPTS[1], stream=True, stream_options={"include_usage": True}, n=2)
    direct = _events(_post(worker.url, "/v1/chat/completions", body))
    routed_response = _post(router.url, "/v1/chat/completions", body)
    assert routed_response.headers[FORWARDED_HEADER] == "true"
    assert routed_response.headers["content-type"].startswith("text/event-stream")
    routed = _events(routed_response)
    assert routed[-1] == "[DONE]" and direct[-1] == "[DONE]"
    # Opening chunks, one per choice, as the worker sends them.
    assert [e["choices"] for e in routed[:2]] == [e["choices"] for e in direct[:2]]
    texts, reasons = _assembled(routed, "content")
    assert (texts, reasons) == _assembled(direct, "content")
    assert len(texts) == 2 and texts[0] == texts[1] and len(texts[0]) > 20
    usage, direct_usage = routed[-2]["usage"], direct[-2]["usage"]
    assert routed[-2]["choices"] == [] and usage["completion_tokens"] == direct_usage["completion_tokens"]
    assert usage["prompt_tokens"] == direct_usage["prompt_tokens"] > 10
    assert all(e["usage"] is None for e in routed[:-2])


def test_completions_whole_and_streamed(worker: Any, router: Any) -> None:
    body = {"prompt": "The sea is", "max_tokens": 16, "temperature": 0}
    direct = _post(worker.url, "/v1/completions", body).json()
    routed = _post(router.url, "/v1/completions", body)
    assert routed.headers[FORWARDED_HEADER] == "true"
    assert _comparable(routed.json())["choices"] == _comparable(direct)["choices"]
    assert routed.json()["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == 16

    stream = {**body, "stream": True}
    texts, reasons = _assembled(_events(_post(router.url, "/v1/completions", stream)), "text")
    assert texts == {0: direct["choices"][0]["text"]} and reasons == {0: "length"}


def test_logprobs_and_stop_strings(worker: Any, router: Any) -> None:
    body = _chat_body(PROMPTS[0], logprobs=True, top_logprobs=3)
    direct = _post(worker.url, "/v1/chat/completions", body).json()["choices"][0]
    routed = _post(router.url, "/v1/chat/completions", body).json()["choices"][0]
    assert routed["message"] == direct["message"]
    mine, theirs = routed["logprobs"]["content"], direct["logprobs"]["content"]
    assert len(mine) == len(theirs) >= 5
    for a, b in zip(mine, theirs, strict=True):
        assert a["token"] == b["token"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]
        assert len(a["top_logprobs"]) == 3

    text = direct["message"]["content"]
    stop = text.split()[2]  # a word from the middle of the greedy answer
    body = _chat_body(PROMPTS[0], stop=[stop])
    direct_stop = _post(worker.url, "/v1/chat/completions", body).json()["choices"][0]
    routed_stop = _post(router.url, "/v1/chat/completions", body).json()["choices"][0]
    assert routed_stop == direct_stop
    assert routed_stop["finish_reason"] == "stop" and stop not in routed_stop["message"]["content"]


def test_what_generate_does_not_carry_goes_as_sent(worker: Any, router: Any) -> None:
    before = metric(router.url, "tokenfront_router_not_forwarded_total", reason="generate_unsupported")
    body = {"prompt": ["The sea is", "The sky is"], "max_tokens": 4, "temperature": 0}
    routed = _post(router.url, "/v1/completions", body)
    assert routed.headers[FORWARDED_HEADER] == "false"
    assert [c["index"] for c in routed.json()["choices"]] == [0, 1]
    after = metric(router.url, "tokenfront_router_not_forwarded_total", reason="generate_unsupported")
    assert after == before + 1


def test_worker_errors_pass_through(router: Any) -> None:
    response = httpx.post(
        f"{router.url}/v1/chat/completions", json=_chat_body(PROMPTS[0], max_tokens=10**7), timeout=60.0
    )
    assert response.status_code == 400, response.text
    assert response.headers[FORWARDED_HEADER] == "true"
    assert "max_tokens" in response.json()["error"]["message"]


def test_failover_when_a_generate_worker_dies(fleet: Fleet, smollm2: Path, worker: Any) -> None:
    doomed = fleet.start("serve", "--model", str(smollm2))
    urls = [f"{doomed.url},protocol=generate", f"{worker.url},protocol=generate"]
    # Health checks far apart: the dead worker is found by a request, which is retried on the other one.
    router = fleet.start(*router_command(smollm2, urls, "--policy", "round_robin", "--health-interval", "60"))
    assert wait_until(lambda: _gate(router)["forwarding"]), _gate(router)
    doomed.process.kill()
    doomed.process.wait(timeout=30)
    served = []
    for prompt in PROMPTS:
        for stream in (False, True):
            response = _post(router.url, "/v1/chat/completions", _chat_body(prompt, stream=stream))
            assert response.headers[FORWARDED_HEADER] == "true"
            served.append(response.headers[WORKER_HEADER])
    retries = metric(router.url, "tokenfront_router_retries_total", worker=doomed.url)
    assert served == [worker.url] * 6, (served, retries, router.log()[-3000:])
    assert retries == 1, router.log()[-3000:]

"""The metrics of routing, end to end: a real router (predicted_ttft, then kv_cache_aware) in front of two
real simulated GPU workers on Qwen3's tokenizer files, all processes on loopback.

The decision histogram counts every decision; the predicted and achieved cached tokens are counted over the
answers that report cached tokens — the achieved ones add up to exactly what the client read in those answers'
usage; GET /workers and /metrics carry each worker's predicted load.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Fleet, router_command, wait_until

SPEEDUP = "50"  # the modelled GPU's clock runs 50 times faster: answers in milliseconds


@pytest.fixture(scope="module")
def workers(fleet: Fleet, qwen3: Path) -> list[Any]:
    command = ["serve", "--engine", "simulated", "--model", str(qwen3), "--sim-speedup", SPEEDUP]
    return fleet.start_many(command, command)


def _router(fleet: Fleet, qwen3: Path, workers: list[Any], *extra: str) -> Any:
    router = fleet.start(*router_command(qwen3, [worker.url for worker in workers], *extra))
    assert wait_until(lambda: _all_healthy(router.url, len(workers))), router.log()[-3000:]
    return router


def _all_healthy(url: str, count: int) -> bool:
    listing = httpx.get(f"{url}/workers", timeout=10.0).json()["workers"]
    return sum(worker["state"] == "healthy" for worker in listing) == count


@pytest.fixture(scope="module")
def client(fleet: Fleet, qwen3: Path, workers: list[Any]) -> Iterator[httpx.Client]:
    # No linger: once the answers are in, nothing of them is left in the predicted load (the linger has its
    # own test in test_predicted_ttft.py).
    router = _router(fleet, qwen3, workers, "--policy", "predicted_ttft", "--occupancy-linger", "0")
    with httpx.Client(base_url=router.url, timeout=60.0) as http:
        yield http


def _samples(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _stream_usage(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any] | None:
    """Stream a chat request through the router; the usage chunk's usage (None when none came)."""
    usage = None
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = httpx.Response(200, content=line[6:]).json()
                usage = chunk.get("usage") or usage
    return usage


@pytest.mark.slow  # three real processes
def test_decisions_predictions_and_achieved_cache_are_counted(client: httpx.Client) -> None:
    system = {"role": "system", "content": "You answer in one short sentence. " * 12}
    messages: list[dict[str, Any]] = [system]
    usages: list[dict[str, Any]] = []
    decisions = 0
    for turn in range(4):  # one conversation: every turn repeats the one before as its prefix
        messages.append({"role": "user", "content": f"Question {turn}: what comes after {turn}?"})
        answer = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        usages.append(answer.json()["usage"])
        messages.append({"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]})
        decisions += 1
    body = {"messages": messages, "max_tokens": 4}
    usage = _stream_usage(client, {**body, "stream_options": {"include_usage": True}})
    assert usage is not None
    usages.append(usage)
    assert _stream_usage(client, body) is None  # a stream without usage: a decision, no answer counted
    decisions += 2

    samples = _samples(client)
    assert _value(samples, "tokenfront_router_decision_seconds_count") == decisions
    assert _value(samples, "tokenfront_router_decision_seconds_sum") > 0
    # Every prompt had ids (the router renders): one matched share each, each between 0 and 1.
    assert _value(samples, "tokenfront_router_prompt_matched_share_count") == decisions
    assert _value(samples, "tokenfront_router_prompt_matched_share_bucket", le="1.0") == decisions
    # Over the five answers with usage: the client read exactly the achieved tokens, and their prompts.
    achieved = _value(samples, "tokenfront_router_achieved_cached_tokens_total")
    prompt = _value(samples, "tokenfront_router_answered_prompt_tokens_total")
    predicted = _value(samples, "tokenfront_router_predicted_cached_tokens_total")
    assert len(usages) == 5
    assert achieved == sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert prompt == sum(u["prompt_tokens"] for u in usages)
    assert 0 < achieved <= prompt  # later turns found their conversation cached
    assert 0 < predicted <= prompt  # the router routed them there knowing it


@pytest.mark.slow
def test_workers_show_the_policy_s_predicted_load(client: httpx.Client, workers: list[Any]) -> None:
    listing = client.get("/workers").json()["workers"]
    assert sorted(worker["url"] for worker in listing) == sorted(worker.url for worker in workers)
    for worker in listing:  # nothing in flight any more: nothing pending, nothing tracked
        assert worker["predicted_load"] == {
            "pending_prefill_tokens": 0.0,
            "predicted_queue_seconds": 0.0,
            "tracked_requests": 0.0,
        }
    samples = _samples(client)
    quantities = ("pending_prefill_tokens", "predicted_queue_seconds", "tracked_requests")
    shown = [
        (worker.url, quantity)
        for worker in workers
        for quantity in quantities
        if ("tokenfront_router_worker_predicted_load", (("quantity", quantity), ("worker", worker.url)))
        in samples
    ]
    assert len(shown) == 2 * len(quantities)


@pytest.mark.slow
def test_kv_cache_aware_shows_requests_in_flight_and_predicts_cached_tokens(
    fleet: Fleet, qwen3: Path, workers: list[Any]
) -> None:
    router = _router(fleet, qwen3, workers, "--policy", "kv_cache_aware")
    with httpx.Client(base_url=router.url, timeout=60.0) as http:
        listing = http.get("/workers").json()["workers"]
        assert [worker["predicted_load"] for worker in listing] == [{"active_requests": 0.0}] * 2
        for _ in range(3):
            body = {"messages": [{"role": "user", "content": "Say something. " * 20}], "max_tokens": 2}
            assert http.post("/v1/chat/completions", json=body).status_code == 200
        samples = _samples(http)
        assert _value(samples, "tokenfront_router_decision_seconds_count") == 3
        assert _value(samples, "tokenfront_router_prompt_matched_share_count") == 3
        assert _value(samples, "tokenfront_router_answered_prompt_tokens_total") > 0


@pytest.mark.slow
def test_a_stream_s_first_token_ends_its_pending_prefill_while_it_decodes(fleet: Fleet, qwen3: Path) -> None:
    """predicted_ttft learns of a stream's first token from the first event that carries output (the worker's
    opening chunk comes before its prefill): from then on the request holds KV but queues no prefill."""
    # A GPU on its modelled clock: 4,000 tokens of decode take over 30 s, so the stream is still going.
    worker = fleet.start("serve", "--engine", "simulated", "--model", str(qwen3), "--sim-speedup", "1")
    router = _router(fleet, qwen3, [worker], "--policy", "predicted_ttft", "--occupancy-linger", "0")
    body = {
        "messages": [{"role": "user", "content": "Tell a long story. " * 40}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=router.url, timeout=60.0) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            # The iterator is kept: a dropped one is closed, and with it the connection (the client left).
            lines, events = response.iter_lines(), 0
            for line in lines:
                if not line.startswith("data: "):
                    continue
                events += 1
                delta = httpx.Response(200, content=line[6:]).json()["choices"][0]["delta"]
                if delta.get("content"):
                    break
            assert events >= 2  # the opening chunk, then output
            (listed,) = http.get("/workers").json()["workers"]
            load = listed["predicted_load"]
            assert load["pending_prefill_tokens"] == 0.0 and load["tracked_requests"] == 1.0
            assert load["predicted_queue_seconds"] > 0  # its prompt's KV: the occupancy
        # The client left: the router ends the attempt, and nothing is tracked.
        assert wait_until(
            lambda: http.get("/workers").json()["workers"][0]["predicted_load"]["tracked_requests"] == 0.0
        )

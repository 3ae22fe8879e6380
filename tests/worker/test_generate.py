"""`POST /inference/v1/generate` (vLLM 0.33's tokens in, tokens out; docs/contract.md §11, issue 9 item 3) on a real
SmolLM2-135M-Instruct worker: greedy text equal to `/v1/chat/completions` for the same ids, ids mode,
streams that add up to the whole answer, vocabulary checks, the prompt counted as ids, and disconnects.

One worker (`--tool-call-parser hermes`, render routes enabled to get the prompt ids) is shared by the
module; counters on /metrics are compared before and after each request, so test order does not matter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow  # real server processes

GENERATE = "/inference/v1/generate"
CHAT = "/v1/chat/completions"
FRANCE = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 24,
    "temperature": 0,
}
GREEDY = {"temperature": 0, "max_tokens": 24}


@pytest.fixture(scope="module")
def worker(module_servers: Callable[..., Any], smollm2: Path, connect: Callable[[Any], Any]) -> Any:
    server = module_servers(
        "serve",
        "--model",
        str(smollm2),
        "--tool-call-parser",
        "hermes",
        env={"TOKENFRONT_ENABLE_RENDER_ENDPOINTS": "1"},
    )
    return connect(server)


@pytest.fixture(scope="module")
def france_ids(worker: Any) -> list[int]:
    ids = _post(worker, "/v1/chat/completions/render", FRANCE)["token_ids"]
    assert isinstance(ids, list) and len(ids) > 10
    return ids


@pytest.fixture(scope="module")
def france_chat(worker: Any) -> dict[str, Any]:
    return _post(worker, CHAT, FRANCE)


def _post(client: httpx.Client, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def _generate(worker: Any, ids: list[int], status: int = 200, **fields: Any) -> Any:
    body = {"token_ids": ids, "sampling_params": GREEDY, **fields}
    return _post(worker, GENERATE, body, status)


# --- whole answers ------------------------------------------------------------------------------------------


def test_text_mode_equals_chat_completions(
    worker: Any, france_ids: list[int], france_chat: dict[str, Any]
) -> None:
    expected = france_chat["choices"][0]
    assert "Paris" in expected["message"]["content"]
    answer = _generate(worker, france_ids, output_mode="text")
    assert answer["output_mode"] == "text"
    assert answer["request_id"].startswith("generate-tokens-")
    (choice,) = answer["choices"]
    assert choice["text"] == expected["message"]["content"]
    assert choice["finish_reason"] == expected["finish_reason"]
    assert len(choice["token_ids"]) == france_chat["usage"]["completion_tokens"]
    assert answer["usage"]["prompt_tokens"] == len(france_ids) == france_chat["usage"]["prompt_tokens"]
    assert answer["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert answer["usage"]["total_tokens"] == len(france_ids) + len(choice["token_ids"])
    # And chat given the same ids agrees too.
    by_ids = _post(worker, CHAT, {**FRANCE, "prompt_token_ids": france_ids})
    assert by_ids["choices"][0]["message"]["content"] == choice["text"]


def test_tokens_mode_returns_the_ids_of_the_text(worker: Any, france_ids: list[int]) -> None:
    text = _generate(worker, france_ids, output_mode="text")["choices"][0]
    answer = _generate(worker, france_ids, request_id="abc")  # output_mode defaults to "tokens"
    assert answer["output_mode"] == "tokens"
    assert answer["request_id"] == "generate-tokens-abc"
    (choice,) = answer["choices"]
    assert "text" not in choice and "message" not in choice
    assert choice["token_ids"] == text["token_ids"]
    assert all(isinstance(i, int) and i >= 0 for i in choice["token_ids"])
    assert choice["logprobs"] is None
    assert answer["prompt_token_ids"] is None
    decoded = _post(worker, "/detokenize", {"tokens": choice["token_ids"]})["prompt"]
    assert text["text"] in decoded


def test_return_token_ids_and_logprobs(worker: Any, france_ids: list[int]) -> None:
    params = {**GREEDY, "max_tokens": 4, "logprobs": 2}
    answer = _generate(worker, france_ids, sampling_params=params, return_token_ids=True)
    assert answer["prompt_token_ids"] == france_ids
    (choice,) = answer["choices"]
    content = choice["logprobs"]["content"]
    assert [entry["token_id"] for entry in content] == choice["token_ids"]
    for entry in content:
        # Greedy: the sampled token is the most likely one, listed first, of rank 1.
        assert entry["rank"] == 1
        assert entry["top_logprobs"][0]["token_id"] == entry["token_id"]
        assert len(entry["top_logprobs"]) == 2
        assert entry["logprob"] <= 0
    text = _generate(worker, france_ids, sampling_params=params, output_mode="text")["choices"][0]
    tokens = [entry["token"] for entry in text["logprobs"]["content"]]
    assert "".join(tokens).replace("Ġ", " ") == text["text"]  # byte-level tokens of a plain ASCII answer


def test_stop_string_cuts_the_text_and_is_the_stop_reason(worker: Any, france_ids: list[int]) -> None:
    whole = _generate(worker, france_ids, output_mode="text")["choices"][0]["text"]
    assert "Paris" in whole
    params = {**GREEDY, "stop": ["Paris"]}
    (choice,) = _generate(worker, france_ids, sampling_params=params, output_mode="text")["choices"]
    assert choice["text"] == whole[: whole.index("Paris")]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == "Paris"


def test_stop_token_id_is_the_stop_reason(worker: Any, france_ids: list[int]) -> None:
    ids = _generate(worker, france_ids)["choices"][0]["token_ids"]
    stop_id = ids[3]
    params = {**GREEDY, "stop_token_ids": [stop_id]}
    (choice,) = _generate(worker, france_ids, sampling_params=params)["choices"]
    assert choice["token_ids"] == ids[: ids.index(stop_id) + 1]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop_id)


def test_ignore_eos_generates_up_to_max_tokens(worker: Any, france_ids: list[int]) -> None:
    # The greedy answer ends on EOS well before 64 tokens; with ignore_eos only max_tokens ends it, on both
    # routes, and the answer begins with the one that stopped.
    params = {**GREEDY, "max_tokens": 64}
    ended = _generate(worker, france_ids, sampling_params=params, output_mode="text")["choices"][0]
    assert ended["finish_reason"] == "stop" and len(ended["token_ids"]) < 64, ended
    body = {**params, "ignore_eos": True}
    longer = _generate(worker, france_ids, sampling_params=body, output_mode="text")["choices"][0]
    assert longer["finish_reason"] == "length" and len(longer["token_ids"]) == 64, longer
    assert longer["token_ids"][: len(ended["token_ids"])] == ended["token_ids"]  # its EOS, then more
    chat = _post(worker, CHAT, {**FRANCE, "max_tokens": 64, "ignore_eos": True})
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 64
    assert chat["choices"][0]["message"]["content"].startswith(ended["text"])
    stopped = _post(worker, CHAT, {**FRANCE, "max_tokens": 64, "ignore_eos": False})
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["message"]["content"] == ended["text"]


def test_n_choices_and_length(worker: Any, france_ids: list[int]) -> None:
    params = {"temperature": 1.0, "seed": 7, "n": 2, "max_tokens": 5}
    answer = _generate(worker, france_ids, sampling_params=params)
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert all(len(c["token_ids"]) == 5 and c["finish_reason"] == "length" for c in answer["choices"])
    assert answer["usage"]["completion_tokens"] == 10
    # Seeded: reproducible, and the two choices differ (each choice has its own seed).
    assert answer["choices"][0]["token_ids"] != answer["choices"][1]["token_ids"]
    again = _generate(worker, france_ids, sampling_params=params)
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in answer["choices"]]


def test_derender_mode_parses_like_chat(
    worker: Any, france_ids: list[int], france_chat: dict[str, Any]
) -> None:
    answer = _generate(worker, france_ids, output_mode="derender", parse_context={})
    assert answer["output_mode"] == "derender"
    (choice,) = answer["choices"]
    message = choice["message"]
    assert message["role"] == "assistant"
    assert message["content"] == france_chat["choices"][0]["message"]["content"]
    assert "tool_calls" not in message  # as vLLM's ChatMessage dumps a message without calls
    assert message["reasoning"] is None


# --- streams ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["text", "tokens"])
def test_stream_chunks_add_up_to_the_whole_answer(worker: Any, france_ids: list[int], mode: str) -> None:
    whole = _generate(worker, france_ids, output_mode=mode)["choices"][0]
    body = {
        "token_ids": france_ids,
        "sampling_params": GREEDY,
        "output_mode": mode,
        "stream_options": {"include_usage": True},
    }
    events = worker.sse(GENERATE, body)
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk = events[:-1]
    assert usage_chunk["choices"] == [] and usage_chunk["output_mode"] == mode
    assert usage_chunk["usage"]["completion_tokens"] == len(whole["token_ids"])
    assert usage_chunk["usage"]["prompt_tokens"] == len(france_ids)
    assert len(chunks) > 3
    assert all(c["output_mode"] == mode and len(c["choices"]) == 1 for c in chunks)
    choices = [c["choices"][0] for c in chunks]
    assert [i for c in choices for i in c["token_ids"]] == whole["token_ids"]
    if mode == "text":
        assert "".join(c["text"] for c in choices) == whole["text"]
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + [whole["finish_reason"]]


def test_stream_prompt_ids_on_the_first_chunk_and_continuous_usage(
    worker: Any, france_ids: list[int]
) -> None:
    body = {
        "token_ids": france_ids,
        "sampling_params": {**GREEDY, "max_tokens": 6},
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    *chunks, usage_chunk, done = worker.sse(GENERATE, body)
    assert done == "[DONE]"
    assert chunks[0]["prompt_token_ids"] == france_ids
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6 == usage_chunk["usage"]["completion_tokens"]
    assert all(c["usage"]["prompt_tokens"] == len(france_ids) for c in chunks)


def test_derender_stream_is_refused(worker: Any, france_ids: list[int]) -> None:
    body = {"token_ids": france_ids, "sampling_params": GREEDY, "output_mode": "derender", "stream": True}
    error = _post(worker, GENERATE, body, 400)["error"]
    assert "does not support stream" in error["message"]


# --- metrics ------------------------------------------------------------------------------------------------


def test_counts_as_an_id_prompt_not_a_rendering(worker: Any, france_ids: list[int]) -> None:
    ids_before = worker.metric("tokenfront_worker_prompts_total", route="generate", source="token_ids")
    rendered_before = worker.metric("tokenfront_worker_prompts_total", route="generate", source="rendered")
    tokens_before = worker.metric("tokenfront_worker_prompt_tokens_total", route="generate")
    _generate(worker, france_ids, sampling_params={**GREEDY, "max_tokens": 2})
    assert (
        worker.metric("tokenfront_worker_prompts_total", route="generate", source="token_ids")
        == ids_before + 1
    )
    assert (
        worker.metric("tokenfront_worker_prompts_total", route="generate", source="rendered")
        == rendered_before
    )
    assert worker.metric("tokenfront_worker_prompt_tokens_total", route="generate") == tokens_before + len(
        france_ids
    )


def test_shares_the_prefix_cache_with_the_openai_routes(
    worker: Any, france_ids: list[int], france_chat: dict[str, Any]
) -> None:
    # The chat answer (fixture) stored the prompt's blocks; generate's prompt is the same ids.
    answer = _generate(worker, france_ids, sampling_params={**GREEDY, "max_tokens": 2})
    block = worker.get("/server_info").json()["tokens_per_block"]
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < len(france_ids) and cached % block == 0


# --- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"token_ids": [1, 10**9]}, "token_ids"),
        ({"token_ids": [1, -3]}, "token_ids"),
        ({"token_ids": []}, "token_ids"),
        ({"sampling_params": None}, "sampling_params"),
        ({"sampling_params": {"presence_penalty": 0.5}}, "sampling_params.presence_penalty"),
        ({"sampling_params": {"max_tokens": 10**6}}, "max_tokens"),
        ({"sampling_params": {"detokenize": False}, "output_mode": "text"}, None),
        ({"features": {"mm_hashes": {}, "mm_placeholders": {}}}, "features"),
        ({"kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params"),
        ({"priority": 3}, "priority"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"output_mode": "derender"}, "parse_context"),  # the worker has a tool-call parser
    ],
)
def test_refusals(worker: Any, fields: dict[str, Any], param: str | None) -> None:
    body = {"token_ids": [1, 2, 3], "sampling_params": GREEDY, **fields}
    error = _post(worker, GENERATE, body, 400)["error"]
    if param is not None:
        assert param in (error["param"] or "") or param in error["message"], error


def test_out_of_vocabulary_id_is_named(worker: Any) -> None:
    error = _post(worker, GENERATE, {"token_ids": [1, 10**9], "sampling_params": GREEDY}, 400)["error"]
    assert error["param"] == "token_ids"
    assert "token_ids[1] = 1000000000" in error["message"]


def test_neutral_and_unknown_sampling_fields_are_accepted(worker: Any, france_ids: list[int]) -> None:
    plain = _generate(worker, france_ids, sampling_params={**GREEDY, "max_tokens": 3})
    params = {
        **GREEDY,
        "max_tokens": 3,
        "presence_penalty": 0.0,
        "skip_special_tokens": True,
        "flat_logprobs": 1,
    }
    tolerant = _generate(worker, france_ids, sampling_params=params, some_future_field=1)
    assert tolerant["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]


# --- disconnects --------------------------------------------------------------------------------------------

LONG = {"temperature": 1.0, "seed": 1, "max_tokens": 4000}


@pytest.fixture(scope="module")
def story_ids(worker: Any) -> list[int]:
    # A story opening, as the chat route's disconnect tests use: sampled, it runs on for minutes. (A sampled
    # answer to the France question often ends at EOS within the 1.5 s the waiting test allows.)
    [item] = _post(worker, "/v1/completions/render", {"prompt": "Once upon a time"})
    return list(item["token_ids"])


def _aborted(worker: Any) -> float:
    return worker.metric("tokenfront_worker_aborts_total", reason="client_disconnected")


def test_disconnect_mid_stream_cancels_generation(worker: Any, story_ids: list[int]) -> None:
    aborted = _aborted(worker)
    engine_aborted = worker.metric("tokenfront_engine_requests_aborted")
    body = {"token_ids": story_ids, "sampling_params": LONG, "stream": True}
    with (
        httpx.Client(base_url=str(worker.base_url), timeout=60) as client,
        client.stream("POST", GENERATE, json=body) as response,
    ):
        assert response.status_code == 200
        received = [line for line, _ in zip(response.iter_lines(), range(6), strict=False) if line]
        assert received and received[0].startswith("data: ")
    assert worker.wait_until(lambda: _aborted(worker) == aborted + 1)
    assert worker.wait_until(
        lambda: worker.metric("tokenfront_engine_requests_aborted") >= engine_aborted + 1
    )
    assert worker.wait_until(lambda: worker.metric("tokenfront_engine_running") == 0)


def test_disconnect_while_waiting_cancels_generation(
    worker: Any, france_ids: list[int], story_ids: list[int]
) -> None:
    aborted = _aborted(worker)
    body = {"token_ids": story_ids, "sampling_params": LONG}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{worker.base_url}{GENERATE}", json=body, timeout=1.5)
    assert worker.wait_until(lambda: _aborted(worker) == aborted + 1)
    assert worker.wait_until(lambda: worker.metric("tokenfront_engine_running") == 0)
    # And the worker still serves.
    assert _generate(worker, france_ids, sampling_params={**GREEDY, "max_tokens": 2})["choices"]

"""The worker end to end on the real SmolLM2-135M-Instruct: real `tokenfront serve` and `tokenfront render`
processes on loopback, greedy generation, no mocks (docs/contract.md §2, §6, §7; issue 3).

One worker (`--tool-call-parser hermes`, render routes enabled) and one renderer with the same options are
shared by the module. Counters on /metrics are compared before and after each request, so the order of the
tests does not matter.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenfront.core.kv_blocks import KV_CACHE_HASH, block_hashes

pytestmark = pytest.mark.slow  # real server processes

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
FRANCE = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 24,
    "temperature": 0,
}
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": WEATHER_SCHEMA,
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}
NAMED_TOOL = {
    "messages": [{"role": "user", "content": "What will the weather be in Lyon for the next three days?"}],
    "tools": [TIME_TOOL, WEATHER_TOOL],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "temperature": 0,
    "max_tokens": 64,
}


@pytest.fixture(scope="module")
def servers(module_servers: Callable[..., Any], smollm2: Path) -> dict[str, Any]:
    common = ["--model", str(smollm2), "--tool-call-parser", "hermes"]
    return {
        "worker": module_servers("serve", *common, env={"TOKENFRONT_ENABLE_RENDER_ENDPOINTS": "1"}),
        "renderer": module_servers("render", *common),
    }


@pytest.fixture(scope="module")
def worker(servers: dict[str, Any], connect: Callable[[Any], Any]) -> Any:
    return connect(servers["worker"])


@pytest.fixture(scope="module")
def renderer(servers: dict[str, Any], connect: Callable[[Any], Any]) -> Any:
    return connect(servers["renderer"])


def _post(client: httpx.Client, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def _check_usage(usage: dict[str, Any]) -> None:
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert set(usage["prompt_tokens_details"]) == {"cached_tokens"}
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]


# --- the acceptance path -----------------------------------------------------------------------------------


def test_greedy_chat_answers_paris(worker: Any) -> None:
    reply = _post(worker, CHAT, FRANCE)
    assert reply["object"] == "chat.completion"
    assert reply["id"].startswith("chatcmpl-")
    assert reply["model"] == "smollm2"
    [choice] = reply["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["tool_calls"] == []
    _check_usage(reply["usage"])


def test_rendered_ids_give_the_same_completion_without_rendering(worker: Any, renderer: Any) -> None:
    # The reference text's Python recipe, verbatim in substance: render, then request + prompt_token_ids.
    rendered = _post(renderer, "/v1/chat/completions/render", FRANCE)
    send = {**rendered["request"], "prompt_token_ids": rendered["token_ids"]}

    rendered_before = worker.metric("tokenfront_rendered_prompts_total", kind="chat")
    by_messages = _post(worker, CHAT, FRANCE)
    assert worker.metric("tokenfront_rendered_prompts_total", kind="chat") == rendered_before + 1

    ids_before = worker.metric("tokenfront_worker_prompts_total", route="chat", source="token_ids")
    by_ids = _post(worker, CHAT, send)
    # The second request did not render: the render counter stood still, the ids counter moved.
    assert worker.metric("tokenfront_rendered_prompts_total", kind="chat") == rendered_before + 1
    assert (
        worker.metric("tokenfront_worker_prompts_total", route="chat", source="token_ids") == ids_before + 1
    )

    assert by_ids["choices"] == by_messages["choices"]
    assert "Paris" in by_ids["choices"][0]["message"]["content"]
    assert (
        by_ids["usage"]["prompt_tokens"]
        == by_messages["usage"]["prompt_tokens"]
        == len(rendered["token_ids"])
    )
    assert by_ids["usage"]["completion_tokens"] == by_messages["usage"]["completion_tokens"]


def test_completions_recipe_with_id_prompts(worker: Any, renderer: Any) -> None:
    request = {
        "model": "smollm2",
        "prompt": ["The capital of France is", "Water boils at"],
        "max_tokens": 8,
        "temperature": 0,
    }
    items = _post(renderer, "/v1/completions/render", request)
    by_text = _post(worker, COMPLETIONS, request)
    texts = {choice["index"]: choice["text"] for choice in by_text["choices"]}
    before = worker.metric("tokenfront_worker_prompts_total", route="completion", source="token_ids")
    for index, item in enumerate(items):
        reply = _post(worker, COMPLETIONS, {**item["request"], "prompt": item["token_ids"]})
        assert reply["choices"][0]["text"] == texts[index]
        assert reply["usage"]["prompt_tokens"] == len(item["token_ids"])
    assert (
        worker.metric("tokenfront_worker_prompts_total", route="completion", source="token_ids") == before + 2
    )
    assert by_text["usage"]["prompt_tokens"] == sum(len(item["token_ids"]) for item in items)


def test_fingerprint_and_server_info_match_the_renderer(worker: Any, renderer: Any) -> None:
    info = worker.get("/server_info").json()
    reference = renderer.get("/server_info").json()
    assert info["role"] == "worker"
    assert info["render_fingerprint"]["complete"] is True
    assert info["render_fingerprint"]["digest"] == reference["render_fingerprint"]["digest"]
    assert info["tokens_per_block"] == 16
    assert info["kv_cache_hash"] == KV_CACHE_HASH
    assert info["max_batch_size"] == 8
    assert info["tool_call_parser"] == "hermes"
    assert info["reasoning_parser"] is None
    assert info["model"] == "smollm2"


@pytest.fixture(scope="module")
def other_worker(
    module_servers: Callable[..., Any],
    smollm2: Path,
    tmp_path_factory: pytest.TempPathFactory,
    connect: Callable[[Any], Any],
) -> Any:
    """A second worker on the same checkpoint with another chat template and the qwen3 reasoning parser."""
    template = tmp_path_factory.mktemp("template") / "other.jinja"
    template.write_text(
        (smollm2 / "chat_template.jinja").read_text().replace("helpful AI assistant", "terse AI assistant")
    )
    options = [
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--chat-template",
        str(template),
    ]
    return connect(module_servers("serve", "--model", str(smollm2), *options))


def test_another_chat_template_changes_only_the_template_component(other_worker: Any, renderer: Any) -> None:
    fingerprint = other_worker.get("/server_info").json()["render_fingerprint"]
    reference = renderer.get("/server_info").json()["render_fingerprint"]
    assert fingerprint["digest"] != reference["digest"]
    differing = {
        key for key in reference["compared"] if reference["compared"][key] != fingerprint["compared"][key]
    }
    # The qwen3 reasoning parser does not read the prompt, so it is not part of the fingerprint.
    assert differing == {"chat_templates"}


def test_reasoning_parser_splits_the_output(other_worker: Any) -> None:
    # vLLM's Qwen3 rule: generation starts inside reasoning unless enable_thinking is false. SmolLM2 never
    # closes a <think> block, so with thinking on all of its answer is reasoning.
    thinking = _post(other_worker, CHAT, FRANCE)["choices"][0]["message"]
    assert thinking["content"] is None
    assert "Paris" in thinking["reasoning_content"]
    chunks = other_worker.sse(CHAT, FRANCE)
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == thinking["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == ""

    plain = _post(other_worker, CHAT, {**FRANCE, "chat_template_kwargs": {"enable_thinking": False}})
    message = plain["choices"][0]["message"]
    assert message["reasoning_content"] is None
    assert message["content"] == thinking["reasoning_content"]


# --- named tool_choice -------------------------------------------------------------------------------------


def check_against_schema(value: Any, schema: dict[str, Any]) -> list[str]:
    """The ways `value` breaks a simple JSON schema (object/string/integer/number/boolean/enum/required)."""
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if kind in checks and not checks[kind](value):
        return [f"{value!r} is not of type {kind}"]
    problems = (
        [f"{value!r} is not one of {schema['enum']}"]
        if "enum" in schema and value not in schema["enum"]
        else []
    )
    if kind == "object":
        properties = schema.get("properties", {})
        problems += [f"missing required {key!r}" for key in schema.get("required", []) if key not in value]
        if schema.get("additionalProperties") is False:
            problems += [f"unexpected property {key!r}" for key in value if key not in properties]
        for key, item in value.items():
            if key in properties:
                problems += check_against_schema(item, properties[key])
    return problems


def test_schema_checker_can_fail() -> None:
    assert check_against_schema({"city": "Lyon", "unit": "kelvin", "days": 3}, WEATHER_SCHEMA)
    assert check_against_schema({"city": "Lyon", "unit": "celsius"}, WEATHER_SCHEMA)
    assert check_against_schema({"city": "Lyon", "unit": "celsius", "days": "3"}, WEATHER_SCHEMA)
    assert check_against_schema({"city": "Lyon", "unit": "celsius", "days": 3, "x": 1}, WEATHER_SCHEMA)
    assert check_against_schema({"city": "Lyon", "unit": "celsius", "days": 3}, WEATHER_SCHEMA) == []


def _check_weather_call(call: dict[str, Any]) -> dict[str, Any]:
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    arguments: dict[str, Any] = json.loads(call["function"]["arguments"])
    assert check_against_schema(arguments, WEATHER_SCHEMA) == []
    return arguments


def test_named_tool_choice_returns_a_valid_call(worker: Any) -> None:
    reply = _post(worker, CHAT, NAMED_TOOL)
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    arguments = _check_weather_call(call)
    assert arguments["city"] == "Lyon"
    _check_usage(reply["usage"])

    chunks = worker.sse(CHAT, NAMED_TOOL)
    assert chunks[-1] == "[DONE]"
    finals = [c for c in chunks[:-1] if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finals] == ["tool_calls"]
    [streamed] = finals[0]["choices"][0]["delta"]["tool_calls"]
    assert streamed["index"] == 0
    assert json.loads(streamed["function"]["arguments"]) == arguments


def test_named_tool_choice_closes_the_arguments_within_max_tokens(worker: Any) -> None:
    # Left alone the model writes its poem into the string until max_tokens cuts it (no call); with the
    # request's max_tokens as the grammar's budget, the JSON is closed in time.
    schema = {"type": "object", "properties": {"poem": {"type": "string"}}, "required": ["poem"]}
    tool = {"type": "function", "function": {"name": "publish", "parameters": schema}}
    body = {
        "messages": [{"role": "user", "content": "Write a very long poem about the sea, then publish it."}],
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "publish"}},
        "temperature": 0,
        "max_tokens": 20,
    }
    reply = _post(worker, CHAT, body)
    [choice] = reply["choices"]
    assert reply["usage"]["completion_tokens"] <= 20
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "publish"
    assert check_against_schema(json.loads(call["function"]["arguments"]), schema) == []


def test_named_tool_choice_with_prompt_token_ids_is_refused(worker: Any, renderer: Any) -> None:
    rendered = _post(renderer, "/v1/chat/completions/render", NAMED_TOOL)
    error = _post(
        worker, CHAT, {**rendered["request"], "prompt_token_ids": rendered["token_ids"]}, status=400
    )["error"]
    assert "named tool_choice cannot be used with prompt_token_ids" in error["message"]
    assert "send `messages`" in error["message"]
    assert error["param"] == "tool_choice"


def test_named_tool_choice_must_name_a_given_tool(worker: Any) -> None:
    body = {**NAMED_TOOL, "tool_choice": {"type": "function", "function": {"name": "book_flight"}}}
    error = _post(worker, CHAT, body, status=400)["error"]
    assert "book_flight" in error["message"]
    assert "not among the request's tools" in error["message"]


# --- streaming, usage, sampling ----------------------------------------------------------------------------


def test_streaming_equals_non_streaming(worker: Any) -> None:
    body = {**FRANCE, "max_tokens": 40, "stream_options": {"include_usage": True}}
    whole = _post(worker, CHAT, {k: v for k, v in body.items() if k != "stream_options"})
    chunks = worker.sse(CHAT, body)
    assert chunks[-1] == "[DONE]"
    events = chunks[:-1]
    assert {c["id"] for c in events} == {events[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    usage_chunk = events[-1]
    assert usage_chunk["choices"] == []
    assert all(c["usage"] is None for c in events[:-1])
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1])
    finish = [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"][0]["finish_reason"]]
    assert content == whole["choices"][0]["message"]["content"]
    assert finish == [whole["choices"][0]["finish_reason"]]
    assert usage_chunk["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert usage_chunk["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    _check_usage(usage_chunk["usage"])

    # Completions too, without a usage chunk when it is not asked for.
    request = {"prompt": "The three primary colors are", "max_tokens": 20, "temperature": 0}
    text = _post(worker, COMPLETIONS, request)["choices"][0]["text"]
    chunks = worker.sse(COMPLETIONS, request)
    assert chunks[-1] == "[DONE]"
    assert all("usage" not in c and c["object"] == "text_completion" for c in chunks[:-1])
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == text


def test_usage_counts_generated_tokens(worker: Any) -> None:
    reply = _post(worker, CHAT, {**FRANCE, "logprobs": True})
    usage = reply["usage"]
    # One logprobs entry per generated token, EOS included: an independent count of completion tokens.
    assert usage["completion_tokens"] == len(reply["choices"][0]["logprobs"]["content"])
    _check_usage(usage)


def test_max_tokens_is_respected(worker: Any) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        body = {**FRANCE, field: 3}
        if field == "max_completion_tokens":
            body.pop("max_tokens")
        reply = _post(worker, CHAT, body)
        assert reply["choices"][0]["finish_reason"] == "length"
        assert reply["usage"]["completion_tokens"] == 3
    reply = _post(worker, COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 5


def test_stop_strings_cut_the_text(worker: Any) -> None:
    full = _post(worker, CHAT, FRANCE)["choices"][0]["message"]["content"]
    assert "Paris" in full
    body = {**FRANCE, "stop": ["Paris", "never-there"]}
    reply = _post(worker, CHAT, body)
    assert reply["choices"][0]["message"]["content"] == full[: full.index("Paris")]
    assert reply["choices"][0]["finish_reason"] == "stop"
    chunks = worker.sse(CHAT, body)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1] if c["choices"])
    assert streamed == full[: full.index("Paris")]
    # stop_token_ids: the first generated token of the full answer ends it at once.
    first = _post(worker, CHAT, {**FRANCE, "max_tokens": 1, "logprobs": True})["choices"][0]["logprobs"][
        "content"
    ][0]
    ids = _single_token_id(worker, first["token"])
    reply = _post(worker, CHAT, {**FRANCE, "stop_token_ids": ids})
    assert reply["usage"]["completion_tokens"] == 1
    assert reply["choices"][0]["finish_reason"] == "stop"


def _single_token_id(worker: Any, token: str) -> list[int]:
    """The id of a single-token text, from the worker's own render route."""
    reply = _post(worker, "/v1/completions/render", {"prompt": token, "add_special_tokens": False})
    ids: list[int] = reply[0]["token_ids"]
    assert len(ids) == 1
    return ids


def test_n_choices_and_seeds(worker: Any) -> None:
    body = {"prompt": "My favourite animal is", "max_tokens": 12, "temperature": 1.0, "seed": 7, "n": 2}
    first = _post(worker, COMPLETIONS, body)
    assert [c["index"] for c in first["choices"]] == [0, 1]
    texts = [c["text"] for c in first["choices"]]
    assert texts[0] != texts[1]
    # Choice i samples with seed + i: the same draws on every run, and as a single request with that seed.
    assert [c["text"] for c in _post(worker, COMPLETIONS, body)["choices"]] == texts
    single = _post(worker, COMPLETIONS, {**body, "n": 1, "seed": 8})
    assert single["choices"][0]["text"] == texts[1]
    assert first["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]  # one prompt, counted once

    chat = _post(worker, CHAT, {**FRANCE, "n": 2})
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    assert chat["choices"][0]["message"] == chat["choices"][1]["message"]  # greedy: the same answer twice
    chunks = worker.sse(CHAT, {**FRANCE, "n": 2})
    roles = [c["choices"][0]["index"] for c in chunks[:-1] if c["choices"][0]["delta"].get("role")]
    assert sorted(roles) == [0, 1]
    finished = [c["choices"][0]["index"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]


def test_logprobs_shapes(worker: Any) -> None:
    chat = _post(worker, CHAT, {**FRANCE, "logprobs": True, "top_logprobs": 3})["choices"][0]
    content = chat["logprobs"]["content"]
    assert content
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert len(entry["top_logprobs"]) == 3
        assert entry["logprob"] <= 0
        # Greedy: the chosen token is the most likely one.
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])
        assert entry["bytes"] == list(entry["token"].encode("utf-8"))
    # The shown text is the tokens' texts, the hidden EOS excepted.
    assert "".join(e["token"] for e in content[:-1]) == chat["message"]["content"]
    assert content[-1]["token"] == "<|im_end|>"

    completion = _post(
        worker,
        COMPLETIONS,
        {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 2},
    )
    logprobs = completion["choices"][0]["logprobs"]
    assert list(logprobs) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    assert "".join(logprobs["tokens"]) == completion["choices"][0]["text"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["tokens"]) == 6
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets


# --- prefix cache and KV events ----------------------------------------------------------------------------


def test_shared_prefix_is_cached_and_published(worker: Any, renderer: Any) -> None:
    marker = uuid.uuid4().hex  # a prefix no earlier test sent
    system = f"Session {marker}. You are a patient geography tutor who answers in one short sentence. " * 3
    first_body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Capital of Italy?"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    second_body = {
        **first_body,
        "messages": [first_body["messages"][0], {"role": "user", "content": "Capital of Spain?"}],
    }
    last_seq = worker.get("/kv_cache_events", params={"after": 0, "limit": 0}).json()["last_seq"]

    first = _post(worker, CHAT, first_body)
    second = _post(worker, CHAT, second_body)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert cached % 16 == 0  # whole blocks

    ids = _post(renderer, "/v1/chat/completions/render", first_body)["token_ids"]
    events = worker.get("/kv_cache_events", params={"after": last_seq}).json()["events"]
    stored = [h for event in events if event["type"] == "stored" for h in event["block_hashes"]]
    # The worker names its blocks as a router hashing the renderer's ids would.
    expected = block_hashes(ids, 16)
    assert expected
    assert set(expected[:-1]) <= set(stored)  # the last full block may hold the final prompt token
    assert all(event["seq"] > last_seq for event in events)


def test_kv_cache_events_arguments(worker: Any) -> None:
    reply = worker.get("/kv_cache_events", params={"after": 0, "limit": 2})
    assert reply.status_code == 200
    body = reply.json()
    assert len(body["events"]) <= 2
    assert {"events", "last_seq", "truncated"} <= set(body)
    for bad in ("-1", "x", "1.5"):
        response = worker.get("/kv_cache_events", params={"after": bad})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "after"


# --- render routes on the worker ---------------------------------------------------------------------------


def test_render_routes_match_the_renderer(worker: Any, renderer: Any) -> None:
    chat = {**FRANCE, "messages": [{"role": "system", "content": "Be terse."}, *FRANCE["messages"]]}
    mine = _post(worker, "/v1/chat/completions/render", chat)
    theirs = _post(renderer, "/v1/chat/completions/render", chat)
    assert mine["token_ids"] == theirs["token_ids"]
    assert mine["request"] == chat
    for prompt in (["Hello world", "The capital of France is"], [[1, 2, 3], [4, 5]]):
        completion = {"prompt": prompt, "max_tokens": 2}
        mine_items = _post(worker, "/v1/completions/render", completion)
        theirs_items = _post(renderer, "/v1/completions/render", completion)
        assert [i["token_ids"] for i in mine_items] == [i["token_ids"] for i in theirs_items]
        assert len(mine_items) == 2


# --- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        (CHAT, {**FRANCE, "model": "gpt-4"}, 404, "model"),
        (COMPLETIONS, {"model": "gpt-4", "prompt": "Hi"}, 404, "model"),
        (CHAT, {**FRANCE, "prompt_token_ids": [1, 49152]}, 400, "prompt_token_ids"),
        (CHAT, {**FRANCE, "prompt_token_ids": [-1]}, 400, "prompt_token_ids"),
        (CHAT, {**FRANCE, "prompt_token_ids": []}, 400, "prompt_token_ids"),
        (COMPLETIONS, {"prompt": [5, 10**6]}, 400, "prompt"),
        (CHAT, {**FRANCE, "max_tokens": 10**6}, 400, "max_tokens"),
        (CHAT, {**FRANCE, "top_logprobs": 2}, 400, "top_logprobs"),
        (CHAT, {**FRANCE, "temperature": "hot"}, 400, "temperature"),
        (COMPLETIONS, {"prompt": "x", "echo": True, "logprobs": 1}, 400, "echo"),
        (CHAT, {"messages": []}, 400, "messages"),
    ],
)
def test_client_errors(worker: Any, path: str, body: dict[str, Any], status: int, param: str) -> None:
    response = worker.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    if status == 404:
        assert error["code"] == "model_not_found"


def test_bad_json_is_a_400(worker: Any) -> None:
    for path in (CHAT, COMPLETIONS):
        response = worker.post(path, content=b'{"messages": [', headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert "not valid JSON" in response.json()["error"]["message"]


# --- disconnects -------------------------------------------------------------------------------------------


@pytest.fixture
def long_generation() -> dict[str, Any]:
    # Would take minutes to finish: only an abort ends it quickly.
    return {"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 1.0, "seed": 1}


def _aborted(worker: Any) -> float:
    return worker.metric("tokenfront_worker_aborts_total", reason="client_disconnected")


def test_client_disconnect_mid_stream_aborts_generation(worker: Any, long_generation: dict[str, Any]) -> None:
    aborted = _aborted(worker)
    engine_aborted = worker.metric("tokenfront_engine_requests_aborted")
    with (
        httpx.Client(base_url=str(worker.base_url), timeout=60) as client,
        client.stream("POST", COMPLETIONS, json={**long_generation, "stream": True}) as response,
    ):
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert received and received[0].startswith("data: ")
    # Leaving the `with` closed the connection mid-stream.
    assert worker.wait_until(lambda: _aborted(worker) == aborted + 1)
    assert worker.wait_until(
        lambda: worker.metric("tokenfront_engine_requests_aborted") >= engine_aborted + 1
    )
    assert worker.wait_until(lambda: worker.metric("tokenfront_engine_running") == 0)


def test_client_disconnect_while_waiting_aborts_generation(
    worker: Any, long_generation: dict[str, Any]
) -> None:
    aborted = _aborted(worker)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{worker.base_url}{COMPLETIONS}", json=long_generation, timeout=1.5)
    assert worker.wait_until(lambda: _aborted(worker) == aborted + 1)
    assert worker.wait_until(lambda: worker.metric("tokenfront_engine_running") == 0)
    # And the worker still serves.
    assert "Paris" in _post(worker, CHAT, FRANCE)["choices"][0]["message"]["content"]

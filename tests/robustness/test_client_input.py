"""Client input that got a 500 (or an answer that could not be encoded), issue 10: each is now a 400 a person can
act on, on real servers on loopback — a renderer (Qwen3, plus gpt-oss and Mistral for their own chat formats),
a worker (tiny-random) and a router in front of that worker.

Bodies go as raw bytes, so that what a JSON library would never write gets through: lone surrogates
(`"\\ud800"`), `NaN` / `Infinity` literals, numbers beyond a double, nesting beyond any parser's depth. Each
answer is a 400 with OpenAI's error object whose message names the field, and the server answers `/health`
afterwards.

Servers are started with the root conftest's `start_server`, found by path (a bare `from conftest import`
would find whichever conftest pytest loaded last).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tokenfront import fixtures
from tokenfront.protocol import (
    DEFAULT_LIMITS,
    MAX_MESSAGES,
    MAX_SEQUENCES_PER_REQUEST,
    MAX_TOKENS_PER_REQUEST,
    SEED_MAX,
    SEED_MIN,
    RequestLimits,
)
from tokenfront.server.errors import APIError
from tokenfront.worker.sampling import check_request_size, check_request_tokens

SURROGATE = "@@lone-surrogate@@"  # written into the body as the JSON escape \ud800
HI = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]
NAMED_ABSENT = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}
TYPE_LIST = [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]
DEEP = b"[" * 2000 + b"]" * 2000
CHAT_RENDER = "/v1/chat/completions/render"


def raw(body: dict[str, Any]) -> bytes:
    """The body as JSON bytes, with every SURROGATE written as the escape of a lone surrogate."""
    return json.dumps(body).replace(SURROGATE, "\\ud800").encode()


def chat_with(fragment: bytes) -> bytes:
    """A chat body with `fragment` (raw JSON, e.g. `"x":NaN`) as its last member."""
    return b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,' + fragment + b"}"


def chat(**fields: Any) -> bytes:
    return raw({"messages": HI, "max_tokens": 2, **fields})


def completion(**fields: Any) -> bytes:
    return raw({"prompt": "hi", "max_tokens": 2, **fields})


def generate(sampling: dict[str, Any] | None = None, **fields: Any) -> bytes:
    return raw({"token_ids": [1, 2], "sampling_params": {"max_tokens": 2, **(sampling or {})}, **fields})


@dataclass(frozen=True)
class Case:
    """A hostile request and the field its 400 must name (`param`, and in the message `mentions`)."""

    name: str
    server: str  # "render", "gptoss", "mistral", "worker", "router"
    path: str
    body: bytes | None  # None: a GET
    param: str | None
    mentions: str = ""

    @property
    def named(self) -> str:
        return self.mentions or self.param or "request body"


CASES = [
    # -- lone surrogates: the echo (and every error message) could not be encoded ---------------------------
    Case("render-model-surrogate", "render", CHAT_RENDER, chat(model=SURROGATE), "model"),
    Case("render-cache-salt-surrogate", "render", CHAT_RENDER, chat(cache_salt=SURROGATE), "cache_salt"),
    Case("render-extra-field-surrogate", "render", CHAT_RENDER, chat(extra_field=SURROGATE), "extra_field"),
    Case(
        "render-template-kwargs-key-surrogate",
        "render",
        CHAT_RENDER,
        chat(chat_template_kwargs={SURROGATE: True}),
        "chat_template_kwargs",
    ),
    Case(
        "render-template-kwargs-value-surrogate",
        "render",
        CHAT_RENDER,
        chat(chat_template_kwargs={"enable_thinking": SURROGATE}),
        "chat_template_kwargs.enable_thinking",
    ),
    Case(
        "render-nested-extra-surrogate",
        "render",
        CHAT_RENDER,
        chat(metadata={"tags": ["a", SURROGATE]}),
        "metadata.tags[1]",
    ),
    Case(
        "render-content-surrogate",
        "render",
        CHAT_RENDER,
        raw({"messages": [{"role": "user", "content": "a" + SURROGATE}]}),
        "messages[0].content",
    ),
    Case("render-prompt-surrogate", "render", "/v1/completions/render", raw({"prompt": SURROGATE}), "prompt"),
    Case(
        "render-completions-extra-surrogate",
        "render",
        "/v1/completions/render",
        raw({"prompt": ["a", "b"], "extra": SURROGATE}),
        "extra",
    ),
    Case(
        "tokenize-model-surrogate", "render", "/tokenize", raw({"model": SURROGATE, "prompt": "hi"}), "model"
    ),
    Case(
        "detokenize-model-surrogate",
        "render",
        "/detokenize",
        raw({"model": SURROGATE, "tokens": [1]}),
        "model",
    ),
    Case(
        "messages-render-model-surrogate",
        "render",
        "/v1/messages/render",
        raw({"model": SURROGATE, "max_tokens": 5, "messages": HI}),
        "model",
    ),
    Case(
        "responses-render-cache-salt-surrogate",
        "render",
        "/v1/responses/render",
        raw({"input": "hi", "cache_salt": SURROGATE}),
        "cache_salt",
    ),
    Case(
        "render-raw-utf8-surrogate",
        "render",
        CHAT_RENDER,
        chat_with(b'"extra":"\xed\xa0\x80"'),  # a surrogate encoded as UTF-8 bytes (CESU-style)
        "extra",
    ),
    Case("worker-chat-model-surrogate", "worker", "/v1/chat/completions", chat(model=SURROGATE), "model"),
    Case(
        "worker-completions-model-surrogate",
        "worker",
        "/v1/completions",
        completion(model=SURROGATE),
        "model",
    ),
    Case(
        "worker-generate-model-surrogate",
        "worker",
        "/inference/v1/generate",
        generate(model=SURROGATE),
        "model",
    ),
    Case(
        "worker-generate-cache-salt-surrogate",
        "worker",
        "/inference/v1/generate",
        generate(cache_salt=SURROGATE),
        "cache_salt",
    ),
    Case("router-chat-model-surrogate", "router", "/v1/chat/completions", chat(model=SURROGATE), "model"),
    Case(
        "router-completions-cache-salt-surrogate",
        "router",
        "/v1/completions",
        completion(cache_salt=SURROGATE),
        "cache_salt",
    ),
    Case(
        "router-render-template-kwargs-key-surrogate",
        "router",
        CHAT_RENDER,
        chat(chat_template_kwargs={SURROGATE: 1}),
        "chat_template_kwargs",
    ),
    # -- NaN / Infinity / beyond a double: JSON extension literals the fallback parser took ------------------
    Case("render-extra-nan", "render", CHAT_RENDER, chat_with(b'"extra":NaN'), "extra"),
    Case(
        "render-template-kwargs-infinity",
        "render",
        CHAT_RENDER,
        chat_with(b'"chat_template_kwargs":{"x":Infinity}'),
        "chat_template_kwargs.x",
    ),
    Case(
        "render-temperature-minus-infinity",
        "render",
        CHAT_RENDER,
        chat_with(b'"temperature":-Infinity'),
        "temperature",
    ),
    Case("render-extra-1e400", "render", CHAT_RENDER, chat_with(b'"extra":1e400'), "extra"),
    Case(
        "render-completions-top-p-nan",
        "render",
        "/v1/completions/render",
        b'{"prompt":"hi","top_p":NaN}',
        "top_p",
    ),
    Case(
        "worker-chat-temperature-nan",
        "worker",
        "/v1/chat/completions",
        chat_with(b'"temperature":NaN'),
        "temperature",
    ),
    Case(
        "worker-generate-temperature-infinity",
        "worker",
        "/inference/v1/generate",
        b'{"token_ids":[1,2],"sampling_params":{"max_tokens":2,"temperature":Infinity}}',
        "sampling_params.temperature",
    ),
    Case(
        "worker-generate-temperature-1e400",
        "worker",
        "/inference/v1/generate",
        b'{"token_ids":[1,2],"sampling_params":{"max_tokens":2,"temperature":1e400}}',
        "sampling_params.temperature",
    ),
    Case("router-chat-extra-nan", "router", "/v1/chat/completions", chat_with(b'"extra":NaN'), "extra"),
    Case(
        "render-nested-too-deep",
        "render",
        CHAT_RENDER,
        chat_with(b'"extra":' + DEEP),
        None,
        "nested too deeply",
    ),
    Case(
        "worker-nested-too-deep",
        "worker",
        "/v1/chat/completions",
        chat_with(b'"extra":' + DEEP),
        None,
        "nested too deeply",
    ),
    # -- a content part whose type is not a string, on every chat format -------------------------------------
    Case(
        "render-part-type-list",
        "render",
        CHAT_RENDER,
        raw({"messages": TYPE_LIST}),
        "messages[0].content[0].type",
    ),
    Case(
        "render-part-type-object",
        "render",
        CHAT_RENDER,
        raw({"messages": [{"role": "user", "content": [{"type": {"a": 1}, "text": "hi"}]}]}),
        "messages[0].content[0].type",
    ),
    Case(
        "gptoss-part-type-list",
        "gptoss",
        CHAT_RENDER,
        raw({"messages": TYPE_LIST}),
        "messages[0].content[0].type",
    ),
    Case(
        "mistral-part-type-list",
        "mistral",
        CHAT_RENDER,
        raw({"messages": TYPE_LIST}),
        "messages[0].content[0].type",
    ),
    Case(
        "worker-part-type-list",
        "worker",
        "/v1/chat/completions",
        raw({"messages": TYPE_LIST, "max_tokens": 2}),
        "messages[0].content[0].type",
    ),
    # -- seed beyond vLLM's 64-bit signed range (torch: "Overflow when unpacking long long") -----------------
    Case("render-seed-2-64", "render", CHAT_RENDER, chat(seed=2**64), "seed"),
    Case("worker-chat-seed-2-64", "worker", "/v1/chat/completions", chat(seed=2**64), "seed"),
    Case(
        "worker-chat-seed-2-64-minus-1-n2",
        "worker",
        "/v1/chat/completions",
        chat(seed=2**64 - 1, n=2),
        "seed",
    ),
    Case(
        "worker-completions-seed-below-int64",
        "worker",
        "/v1/completions",
        completion(seed=SEED_MIN - 1),
        "seed",
    ),
    Case("worker-completions-seed-1e30", "worker", "/v1/completions", completion(seed=10**30), "seed"),
    Case(
        "worker-generate-seed-2-64",
        "worker",
        "/inference/v1/generate",
        generate({"seed": 2**64}),
        "sampling_params.seed",
    ),
    # -- the KV event feed's query parameters ---------------------------------------------------------------
    Case(
        "kv-events-after-5000-digits",
        "worker",
        "/kv_cache_events?after=" + "9" * 5000,
        None,
        "after",
        "`after`",
    ),
    Case(
        "kv-events-after-superscript-two", "worker", "/kv_cache_events?after=%C2%B2", None, "after", "`after`"
    ),
    Case(
        "kv-events-limit-5000-digits",
        "worker",
        "/kv_cache_events?limit=" + "1" * 5000,
        None,
        "limit",
        "`limit`",
    ),
    # -- a named tool_choice without its tool: the same 400 everywhere ---------------------------------------
    Case("render-named-tool-choice-absent", "render", CHAT_RENDER, chat(**NAMED_ABSENT), "tool_choice"),
    Case(
        "worker-named-tool-choice-absent",
        "worker",
        "/v1/chat/completions",
        chat(**NAMED_ABSENT),
        "tool_choice",
    ),
    Case(
        "router-named-tool-choice-absent",
        "router",
        "/v1/chat/completions",
        chat(**NAMED_ABSENT),
        "tool_choice",
    ),
    # -- limits ---------------------------------------------------------------------------------------------
    Case(
        "render-too-many-messages",
        "render",
        CHAT_RENDER,
        raw({"messages": HI * (MAX_MESSAGES + 1)}),
        "messages",
        f"({MAX_MESSAGES})",
    ),
    Case(
        "worker-too-many-messages",
        "worker",
        "/v1/chat/completions",
        raw({"messages": HI * 10_000, "max_tokens": 2}),
        "messages",
        f"({MAX_MESSAGES})",
    ),
    Case(
        "messages-render-too-many-messages",
        "render",
        "/v1/messages/render",
        raw({"model": "m", "max_tokens": 5, "messages": HI * (MAX_MESSAGES + 1)}),
        "messages",
        f"({MAX_MESSAGES})",
    ),
    Case(
        "responses-render-too-many-input-items",
        "render",
        "/v1/responses/render",
        raw({"input": HI * (MAX_MESSAGES + 1)}),
        "input",
        f"({MAX_MESSAGES})",
    ),
    Case(
        "worker-5000-prompts-n-128",
        "worker",
        "/v1/completions",
        raw({"prompt": [[1, 2, 3]] * 5000, "n": 128, "max_tokens": 1}),
        "n",
        f"640000 sequences (5000 prompts x n=128); this server generates at most {MAX_SEQUENCES_PER_REQUEST}",
    ),
    Case(
        "worker-20-prompts-n-128",
        "worker",
        "/v1/completions",
        raw({"prompt": [[1, 2, 3]] * 20, "n": 128, "max_tokens": 1}),
        "n",
        "2560 sequences (20 prompts x n=128)",
    ),
    Case(
        "worker-generate-temperature-above-2",
        "worker",
        "/inference/v1/generate",
        generate({"temperature": 3}),
        "sampling_params.temperature",
    ),
]


@pytest.fixture(scope="module")
def servers(launch: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The five servers, started side by side (the router once its worker answers)."""
    start_server = launch
    log_dir = tmp_path_factory.mktemp("client-input")
    model = {
        name: str(fixtures.ensure_checkpoint(name))
        for name in ("qwen3", "gptoss", "mistral-tekken", "tiny-random")
    }
    commands = {
        "render": ["render", "--model", model["qwen3"], "--reasoning-parser", "qwen3"],
        "gptoss": ["render", "--model", model["gptoss"]],
        "mistral": ["render", "--model", model["mistral-tekken"], "--tokenizer-mode", "mistral"],
        "worker": ["serve", "--model", model["tiny-random"], "--tool-call-parser", "hermes"],
    }
    started: dict[str, Any] = {}
    try:
        with ThreadPoolExecutor(len(commands)) as pool:
            futures = {
                name: pool.submit(start_server, args, log_dir=log_dir, timeout=240.0)
                for name, args in commands.items()
            }
            for name, future in futures.items():
                started[name] = future.result()
        router_args = ["route", "--model", model["tiny-random"], "--worker", started["worker"].url]
        started["router"] = start_server(router_args, log_dir=log_dir)
        yield started
    finally:
        for server in started.values():
            server.stop()


def _send(server: Any, case: Case) -> httpx.Response:
    url = server.url + case.path
    if case.body is None:
        return httpx.get(url, timeout=60.0)
    return httpx.post(url, content=case.body, headers={"content-type": "application/json"}, timeout=60.0)


def test_the_case_count() -> None:
    assert len(CASES) == 56
    assert len({case.name for case in CASES}) == len(CASES)
    assert {case.server for case in CASES} == {"render", "gptoss", "mistral", "worker", "router"}


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_input_is_a_400_naming_the_field(servers: dict[str, Any], case: Case) -> None:
    server = servers[case.server]
    response = _send(server, case)
    assert response.status_code == 400, (case.name, response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json")
    error = json.loads(response.content)["error"]  # valid JSON, however hostile the body
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == case.param, error
    assert case.named in error["message"], error
    assert "Traceback" not in error["message"] and "internal error" not in error["message"]
    assert httpx.get(server.url + "/health", timeout=30.0).status_code == 200


def test_named_tool_choice_gets_the_same_answer_everywhere(servers: dict[str, Any]) -> None:
    answers = {
        name: _send(servers[name], case).json()["error"]
        for name, case in (
            ("render", Case("", "render", CHAT_RENDER, chat(**NAMED_ABSENT), None)),
            ("worker", Case("", "worker", "/v1/chat/completions", chat(**NAMED_ABSENT), None)),
            ("router", Case("", "router", "/v1/chat/completions", chat(**NAMED_ABSENT), None)),
        )
    }
    assert len({json.dumps(error, sort_keys=True) for error in answers.values()}) == 1, answers
    assert "'nope'" in answers["render"]["message"]


def test_a_tiny_top_p_keeps_the_most_likely_token(servers: dict[str, Any]) -> None:
    # vLLM takes any top_p in (0, 1]; float32 sampling rounded 1e-300 to 0 and dropped every token (a 500).
    worker = servers["worker"]
    for path, body in (
        ("/v1/chat/completions", chat(top_p=1e-300, temperature=1.0, seed=1)),
        ("/v1/completions", completion(top_p=1e-300, seed=1)),
        ("/inference/v1/generate", generate({"top_p": 1e-300, "seed": 1})),
    ):
        response = _send(worker, Case("", "worker", path, body, None))
        assert response.status_code == 200, (path, response.text[:300])
    greedy = _send(
        worker, Case("", "worker", "/v1/completions", completion(temperature=0, max_tokens=4), None)
    )
    tiny = _send(
        worker, Case("", "worker", "/v1/completions", completion(top_p=1e-300, seed=7, max_tokens=4), None)
    )
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_the_seed_range_is_vllms(servers: dict[str, Any]) -> None:
    worker = servers["worker"]
    for seed in (SEED_MIN, SEED_MAX):
        response = _send(worker, Case("", "worker", "/v1/chat/completions", chat(seed=seed, n=2), None))
        assert response.status_code == 200, (seed, response.text[:300])


def test_what_json_allows_is_still_taken_and_echoed(servers: dict[str, Any]) -> None:
    # An integer beyond 64 bits (orjson refuses it; JSON allows it), a surrogate pair, raw UTF-8 emoji.
    body = chat_with(b'"big":123456789012345678901234567890,"pair":"\\ud83d\\ude00","raw":"\xf0\x9f\x98\x80"')
    response = _send(servers["render"], Case("", "render", CHAT_RENDER, body, None))
    assert response.status_code == 200, response.text[:300]
    echoed = json.loads(response.content)["request"]
    assert echoed["big"] == 123456789012345678901234567890
    assert echoed["pair"] == echoed["raw"] == "\U0001f600"


def test_request_size_limits() -> None:
    check_request_size(8, 128, DEFAULT_LIMITS)
    with pytest.raises(APIError, match="1040 sequences"):
        check_request_size(1040, 1, DEFAULT_LIMITS)
    check_request_tokens([(100, 131_072 - 100)], 128, DEFAULT_LIMITS)  # n=128 on a 128k context fits
    with pytest.raises(APIError) as error:
        check_request_tokens([(100, 131_072 - 100)] * 2, 128, DEFAULT_LIMITS)
    assert f"{2 * 128 * 131_072} tokens" in error.value.message
    assert str(MAX_TOKENS_PER_REQUEST) in error.value.message and error.value.status_code == 400
    # A server's own limits, not the defaults: they are values passed to the check, never module globals.
    tighter = RequestLimits(max_sequences_per_request=7, max_tokens_per_request=1000)
    with pytest.raises(APIError, match="at most 7 per request"):
        check_request_size(8, 1, tighter)
    check_request_size(8, 1, DEFAULT_LIMITS)  # the defaults are unchanged by the tighter value
    with pytest.raises(APIError, match="at most 1000 per request"):
        check_request_tokens([(500, 501)], 1, tighter)

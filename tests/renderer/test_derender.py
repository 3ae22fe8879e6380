"""The derender routes on a real `tokenfront render` process (Qwen3, qwen3 reasoning, hermes tools).

Expected answers were taken from vLLM 0.33's render server (`vllm launch render ... --reasoning-parser qwen3
--enable-auto-tool-choice --tool-call-parser hermes --served-model-name qwen3`) on the same bodies
(tests/renderer/derender_cases.py) and pinned here; `created` and tool-call ids are random on both sides.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from derender_cases import (
    DERENDER_CASES,
    DERENDER_STREAM_CASES,
    IM_END,
    PLAIN,
    REASONING,
    normalize,
    run_stream,
    stream_bodies,
)

# The root conftest's launcher: `from conftest import` would find whichever conftest pytest loaded last.
_ROOT_CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"


@pytest.fixture(scope="module")
def derenderer(
    request: pytest.FixtureRequest, qwen3: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    root = request.config.pluginmanager.get_plugin(str(_ROOT_CONFTEST))
    assert root is not None, f"{_ROOT_CONFTEST} is not loaded"
    server = root.start_server(
        ["render", "--model", str(qwen3), "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes"],
        log_dir=tmp_path_factory.mktemp("derenderer"),
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def post(derenderer: Any) -> Iterator[Callable[[str, dict[str, Any]], tuple[int, Any]]]:
    with httpx.Client(base_url=derenderer.url, timeout=60) as client:

        def send(path: str, body: dict[str, Any]) -> tuple[int, Any]:
            response = client.post(path, json=body)
            return response.status_code, response.json()

        yield send


def _case(name: str) -> dict[str, Any]:
    case = next(c for c in [*DERENDER_CASES, *DERENDER_STREAM_CASES] if c["name"] == name)
    return copy.deepcopy(case)


# vLLM's answers: (reasoning, content, [(name, arguments)], finish_reason, stop_reason), (prompt, completion)
VLLM_CHAT = {
    "reasoning": (
        ("\nThe user asks for 2+2. That is 4.\n", "\n\nThe answer is **4**.", [], "stop", None),
        (15, 26),
    ),
    "tool_call": (
        (
            "\nI should look up the weather in Paris.\n",
            None,
            [("get_weather", '{"city": "Paris", "unit": "celsius"}')],
            "tool_calls",
            None,
        ),
        (15, 40),
    ),
    "tool_call_not_offered": (
        (
            "\nI should look up the weather in Paris.\n",
            '\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
            "</tool_call>",
            [],
            "stop",
            None,
        ),
        (15, 40),
    ),
    "length": (("\nLet me count the primes below twenty: 2, 3, 5, 7,", None, [], "length", None), (15, 22)),
    "plain": ((None, "Hello! How can I help you today? 😊", [], "stop", None), (15, 12)),
    "stop_string": (
        ("\nThe user asks for 2+2. That is 4.\n", "\n\nThe answer is ", [], "stop", "**"),
        (15, 26),
    ),
    "model_named": ((None, "Hello! How can I help you today? 😊", [], "stop", None), (15, 12)),
}

# vLLM's whole answer for the reasoning case, `created` left out: every field, in its order.
VLLM_REASONING_ANSWER = {
    "id": "chatcmpl-derender-reasoning",
    "object": "chat.completion",
    "model": "qwen3",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "\n\nThe answer is **4**.",
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": "\nThe user asks for 2+2. That is 4.\n",
            },
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
            "weight_versions": None,
        }
    ],
    "service_tier": None,
    "system_fingerprint": None,
    "usage": {
        "prompt_tokens": 15,
        "total_tokens": 41,
        "completion_tokens": 26,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    },
    "prompt_logprobs": None,
    "prompt_token_ids": None,
    "prompt_text": None,
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "metrics": None,
}


def _summary(answer: dict[str, Any]) -> tuple[Any, ...]:
    choice = answer["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    return (message["reasoning"], message["content"], calls, choice["finish_reason"], choice["stop_reason"])


def test_reasoning_answer_is_vllms_field_for_field(post: Callable[..., tuple[int, Any]]) -> None:
    case = _case("reasoning")
    status, answer = post(case["path"], case["body"])
    assert status == 200
    assert isinstance(answer["created"], int)
    assert normalize(answer) == VLLM_REASONING_ANSWER
    assert list(normalize(answer)) == list(VLLM_REASONING_ANSWER)  # the order too


@pytest.mark.parametrize("name", sorted(VLLM_CHAT))
def test_chat_derender_matches_vllm(post: Callable[..., tuple[int, Any]], name: str) -> None:
    case = _case(name)
    status, answer = post(case["path"], case["body"])
    assert status == 200, answer
    expected, (prompt_tokens, completion_tokens) = VLLM_CHAT[name]
    assert _summary(answer) == expected
    assert answer["usage"]["prompt_tokens"] == prompt_tokens
    assert answer["usage"]["completion_tokens"] == completion_tokens
    assert answer["usage"]["total_tokens"] == prompt_tokens + completion_tokens
    assert answer["id"] == case["body"]["generate_response"]["request_id"]
    for call in answer["choices"][0]["message"].get("tool_calls", []):
        assert call["type"] == "function" and call["id"]


def test_completion_derender_matches_vllm(post: Callable[..., tuple[int, Any]]) -> None:
    case = _case("completion")
    status, answer = post(case["path"], case["body"])
    assert status == 200
    assert answer["object"] == "text_completion"
    assert answer["id"] == "cmpl-derender-0"
    (choice,) = answer["choices"]
    assert choice["text"] == " jumps over the lazy dog. Héllo wörld — ünïcode ✓"
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (4, 18)


def test_completion_derender_numbers_choices_across_prompts(post: Callable[..., tuple[int, Any]]) -> None:
    case = _case("completion_two_prompts")
    status, answer = post(case["path"], case["body"])
    assert status == 200
    texts = [(c["index"], c["text"], c["finish_reason"]) for c in answer["choices"]]
    assert texts == [
        (0, " jumps over the lazy dog. Héllo wörld — ünïcode ✓", "length"),
        (1, "Hello! How can I help you today? 😊", "stop"),
    ]
    assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (7, 30)


def _joined(chunks: list[dict[str, Any]], key: str) -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c["choices"])


@pytest.mark.parametrize(
    ("stream", "whole"),
    [("stream_reasoning", "reasoning"), ("stream_tool_call", "tool_call"), ("stream_length", "length")],
)
def test_chat_stream_in_pieces_equals_the_whole(
    post: Callable[..., tuple[int, Any]], stream: str, whole: str
) -> None:
    case = _case(stream)
    assert len(case["chunks"]) >= 3
    status, chunks = run_stream(post, case)
    assert status == 200, chunks
    reasoning, content, calls, finish, _ = VLLM_CHAT[whole][0]
    assert _joined(chunks, "reasoning") == (reasoning or "")
    streamed_calls = [
        (call["function"]["name"], call["function"]["arguments"])
        for chunk in chunks
        for call in chunk["choices"][0]["delta"].get("tool_calls") or ()
    ]
    assert streamed_calls == calls
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [finish]
    roles = [c["choices"][0]["delta"]["role"] for c in chunks]
    assert roles == ["assistant"] + [None] * (len(chunks) - 1)
    if not calls:  # vLLM streams the "\n\n" before a call as content; tokenfront holds it with the call
        assert _joined(chunks, "content") == (content or "")


def test_stream_reasoning_chunks_equal_vllms(post: Callable[..., tuple[int, Any]]) -> None:
    status, chunks = run_stream(post, _case("stream_reasoning"))
    assert status == 200
    deltas = [(c["choices"][0]["delta"]["reasoning"], c["choices"][0]["delta"]["content"]) for c in chunks]
    # vLLM's chunks for the same cuts (a first chunk of <think> alone shows nothing but the role)
    assert deltas == [
        (None, None),
        ("\nThe user asks for 2+2. That is 4", None),
        (".\n", None),
        (None, "\n\nThe answer is **"),
        (None, "4**."),
    ]


def test_completion_stream_in_pieces_equals_the_whole(post: Callable[..., tuple[int, Any]]) -> None:
    status, chunks = run_stream(post, _case("stream_completion"))
    assert status == 200
    texts = [c["choices"][0]["text"] for c in chunks]
    # vLLM's pieces: a character split across chunks waits for its second id
    assert texts == [" jumps over the lazy", " dog. Hél", "lo wörld — ün", "ïcode ✓"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# -- bad input: OpenAI-shaped 4xx, never a 500 -------------------------------------------------------------------


def _error(status: int, answer: Any) -> dict[str, Any]:
    assert set(answer) == {"error"}
    assert {"message", "type", "param", "code"} <= set(answer["error"])
    return dict(answer["error"])


def test_ids_outside_the_vocabulary_are_a_400(post: Callable[..., tuple[int, Any]]) -> None:
    case = _case("reasoning")
    case["body"]["generate_response"]["choices"][0]["token_ids"] = [*REASONING, 10**9]
    status, answer = post(case["path"], case["body"])
    assert status == 400
    assert "1000000000" in _error(status, answer)["message"]


def test_negative_ids_and_missing_fields_are_400s(post: Callable[..., tuple[int, Any]]) -> None:
    case = _case("plain")
    case["body"]["generate_response"]["choices"][0]["token_ids"] = [-1]
    assert post(case["path"], case["body"])[0] == 400
    body = {k: v for k, v in _case("plain")["body"].items() if k != "generate_response"}
    status, answer = post("/v1/chat/completions/derender", body)
    assert status == 400 and "generate_response" in _error(status, answer)["message"]
    status, answer = post("/v1/completions/derender", {"generate_responses": []})
    assert status == 400


def test_chat_request_is_required_with_parsers(post: Callable[..., tuple[int, Any]]) -> None:
    body = {k: v for k, v in _case("plain")["body"].items() if k != "chat_request"}
    status, answer = post("/v1/chat/completions/derender", body)
    assert status == 400 and _error(status, answer)["param"] == "chat_request"


def test_malformed_stream_state_is_a_400(post: Callable[..., tuple[int, Any]]) -> None:
    case = _case("stream_reasoning")
    first, second = stream_bodies(case)[:2]
    status, answer = post(case["path"], first)
    assert status == 200
    for state in (
        {"output": {"version": 99}, "role_sent": True},
        {"junk": 1},
        {"output": [], "role_sent": 1},
    ):
        status, error = post(case["path"], {**second, "stream_state": state})
        assert status == 400, error
        _error(status, error)
    broken = copy.deepcopy(answer["stream_state"])
    broken["output"]["detokenizer"] = "nonsense"
    status, error = post(case["path"], {**second, "stream_state": broken})
    assert status == 400, error


def test_streaming_with_stop_strings_is_refused_as_vllm_does(post: Callable[..., tuple[int, Any]]) -> None:
    case = _case("stream_reasoning")
    body = stream_bodies(case)[0]
    body["chat_request"] = {**body["chat_request"], "stop": ["**"]}
    status, answer = post(case["path"], body)
    assert status == 400 and "stop strings" in _error(status, answer)["message"]


def test_an_unknown_model_is_a_404(post: Callable[..., tuple[int, Any]]) -> None:
    body = _case("plain")["body"]
    body["model"] = "not-this-model"
    status, answer = post("/v1/chat/completions/derender", body)
    assert status == 404 and _error(status, answer)["code"] == "model_not_found"


def test_eos_is_counted_but_not_shown(post: Callable[..., tuple[int, Any]]) -> None:
    body = _case("plain")["body"]
    body["generate_response"]["choices"][0]["token_ids"] = [*PLAIN, IM_END]
    status, answer = post("/v1/chat/completions/derender", body)
    assert status == 200
    assert answer["choices"][0]["message"]["content"] == "Hello! How can I help you today? 😊"
    assert answer["usage"]["completion_tokens"] == len(PLAIN) + 1

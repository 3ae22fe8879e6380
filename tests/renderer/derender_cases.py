"""Derender bodies (vLLM 0.33's schemas) on Qwen3 with `--reasoning-parser qwen3 --tool-call-parser hermes`.

Shared by tests/renderer/test_derender.py and benchmarks/compare_vllm_protocol.py: `DERENDER_CASES` are
whole-output bodies, `DERENDER_STREAM_CASES` the same kind of output cut into chunks (the caller threads
`stream_state` from one answer into the next body, see `run_stream`). `compare_derender` posts every case to
two servers and says which answers differ, ignoring what is random (ids of calls, `created`).

The output ids are the Qwen3 tokenizer's encoding of the text in each case's comment (`add_special_tokens`
false), `151645` (`<|im_end|>`) appended where the output ended with EOS.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

__all__ = [
    "DERENDER_CASES",
    "DERENDER_STREAM_CASES",
    "compare_derender",
    "normalize",
    "run_stream",
    "stream_bodies",
]

IM_END = 151645

# <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n
CHAT_PROMPT = [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198]
# The quick brown fox
COMPLETION_PROMPT = [785, 3974, 13876, 38835]

# <think>\nThe user asks for 2+2. That is 4.\n</think>\n\nThe answer is **4**.
REASONING = [151667, 198, 785, 1196, 17064, 369, 220, 17, 10, 17, 13, 2938, 374, 220, 19, 624, 151668, 271]
REASONING += [785, 4226, 374, 3070, 19, 334, 13]
# <think>\nI should look up the weather in Paris.\n</think>\n\n<tool_call>\n{"name": "get_weather",
# "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>
TOOL_CALL = [151667, 198, 40, 1265, 1401, 705, 279, 9104, 304, 12095, 624, 151668, 271, 151657, 198, 4913]
TOOL_CALL += [606, 788, 330, 455, 69364, 497, 330, 16370, 788, 5212, 8926, 788, 330, 59604, 497, 330, 3843]
TOOL_CALL += [788, 330, 66, 40247, 95642, 151658]
# <think>\nLet me count the primes below twenty: 2, 3, 5, 7,
LENGTH = [151667, 198, 10061, 752, 1760, 279, 49433, 3685, 17073, 25, 220, 17, 11, 220, 18, 11, 220, 20, 11]
LENGTH += [220, 22, 11]
# Hello! How can I help you today? 😊   (the emoji is two ids: a character split across tokens)
PLAIN = [9707, 0, 2585, 646, 358, 1492, 498, 3351, 30, 26525, 232]
# " jumps over the lazy dog. Héllo wörld — ünïcode ✓"
COMPLETION = [34208, 916, 279, 15678, 5562, 13, 472, 18503, 385, 289, 9416, 507, 1959, 10489, 77, 37572]
COMPLETION += [1851, 52375]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def _generate(ids: list[int], finish_reason: str, request_id: str) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "choices": [{"index": 0, "finish_reason": finish_reason, "token_ids": ids}],
    }


def _chat(
    name: str, ids: list[int], finish_reason: str, chat_request: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    body = {
        "generate_response": _generate(ids, finish_reason, f"chatcmpl-derender-{name}"),
        "prompt_tokens": len(CHAT_PROMPT),
        "prompt_token_ids": CHAT_PROMPT,
        "chat_request": chat_request,
        **extra,
    }
    return {"name": name, "path": "/v1/chat/completions/derender", "body": body}


_CHAT = {"messages": MESSAGES}
_TOOLS = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER_TOOL]}
_NO_THINKING = {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}

DERENDER_CASES: list[dict[str, Any]] = [
    _chat("reasoning", [*REASONING, IM_END], "stop", _CHAT),
    _chat("tool_call", [*TOOL_CALL, IM_END], "stop", _TOOLS),
    _chat("tool_call_not_offered", [*TOOL_CALL, IM_END], "stop", _CHAT),
    _chat("length", LENGTH, "length", {**_CHAT, "max_tokens": len(LENGTH)}),
    _chat("plain", [*PLAIN, IM_END], "stop", _NO_THINKING),
    _chat("stop_string", [*REASONING, IM_END], "stop", {**_CHAT, "stop": ["**"]}),
    _chat("model_named", [*PLAIN, IM_END], "stop", _NO_THINKING, model="qwen3"),
    {
        "name": "completion",
        "path": "/v1/completions/derender",
        "body": {
            "generate_responses": [_generate(COMPLETION, "length", "cmpl-derender-0")],
            "prompt_tokens": [len(COMPLETION_PROMPT)],
            "prompt_token_ids": [COMPLETION_PROMPT],
            "completion_request": {"prompt": "The quick brown fox", "max_tokens": len(COMPLETION)},
        },
    },
    {
        "name": "completion_two_prompts",
        "path": "/v1/completions/derender",
        "body": {
            "generate_responses": [
                _generate(COMPLETION, "length", "cmpl-derender-0"),
                _generate([*PLAIN, IM_END], "stop", "cmpl-derender-1"),
            ],
            "prompt_tokens": [len(COMPLETION_PROMPT), 3],
            "completion_request": {"prompt": ["The quick brown fox", "Hi"], "max_tokens": 20},
        },
    },
]


def _chunks(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = [0, *cuts, len(ids)]
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


def _stream_case(name: str, path: str, ids: list[int], finish_reason: str, cuts: list[int], **base: Any):
    pieces = _chunks(ids, cuts)
    chunks = []
    for number, piece in enumerate(pieces):
        last = number == len(pieces) - 1
        choice = {"index": 0, "token_ids": piece, "finish_reason": finish_reason if last else None}
        chunks.append({"request_id": f"derender-stream-{name}", "choices": [choice]})
    return {"name": name, "path": path, "base": {"stream": True, **base}, "chunks": chunks}


_CHAT_STREAM = {"prompt_tokens": len(CHAT_PROMPT), "prompt_token_ids": CHAT_PROMPT}

# Cuts fall inside markers' neighbourhoods on purpose: just after <think>, around </think>, inside the call.
DERENDER_STREAM_CASES: list[dict[str, Any]] = [
    _stream_case(
        "stream_reasoning",
        "/v1/chat/completions/derender",
        [*REASONING, IM_END],
        "stop",
        [1, 15, 17, 22],
        chat_request=_CHAT,
        **_CHAT_STREAM,
    ),
    _stream_case(
        "stream_tool_call",
        "/v1/chat/completions/derender",
        [*TOOL_CALL, IM_END],
        "stop",
        [5, 12, 14, 25],
        chat_request=_TOOLS,
        **_CHAT_STREAM,
    ),
    _stream_case(
        "stream_length",
        "/v1/chat/completions/derender",
        LENGTH,
        "length",
        [3, 10],
        chat_request=_CHAT,
        **_CHAT_STREAM,
    ),
    _stream_case(
        "stream_completion",
        "/v1/completions/derender",
        COMPLETION,
        "length",
        [4, 8, 15],
        completion_request={"prompt": "The quick brown fox", "max_tokens": len(COMPLETION)},
        prompt_tokens=len(COMPLETION_PROMPT),
        prompt_token_ids=COMPLETION_PROMPT,
    ),
]


def stream_bodies(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The bodies of a stream case without `stream_state` (the caller adds the previous answer's)."""
    return [{**copy.deepcopy(case["base"]), "generate_chunk": chunk} for chunk in case["chunks"]]


Post = Callable[[str, dict[str, Any]], tuple[int, Any]]


def run_stream(post: Post, case: dict[str, Any]) -> tuple[int, list[Any]]:
    """Post a stream case chunk by chunk, threading `stream_state`; the status of the first non-200 answer
    (or 200) and the answers' `chunk`s (or the error body)."""
    state = None
    chunks = []
    for body in stream_bodies(case):
        if state is not None:
            body["stream_state"] = state
        status, answer = post(case["path"], body)
        if status != 200:
            return status, [answer]
        chunks.append(answer["chunk"])
        state = answer["stream_state"]
    return 200, chunks


_RANDOM_KEYS = {"created"}


def normalize(value: Any) -> Any:
    """An answer without what differs between two correct servers: `created`, tool-call ids."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _RANDOM_KEYS:
                continue
            if key == "id" and isinstance(item, str) and item.startswith(("chatcmpl-tool-", "call_")):
                item = "<tool-call-id>"
            out[key] = normalize(item)
        return out
    if isinstance(value, list | tuple):  # a `(status, answer)` pair compares as a list, as JSON has it
        return [normalize(item) for item in value]
    return value


def compare_derender(post_a: Post, post_b: Post) -> list[tuple[str, bool, Any, Any]]:
    """Every case posted to both servers: `(name, equal, answer_a, answer_b)` after `normalize`.

    `post(path, body) -> (status, json)` talks to one server; a stream case compares its list of chunks.
    """
    results = []
    for case in DERENDER_CASES:
        a = post_a(case["path"], copy.deepcopy(case["body"]))
        b = post_b(case["path"], copy.deepcopy(case["body"]))
        results.append((case["name"], normalize(a) == normalize(b), normalize(a), normalize(b)))
    for case in DERENDER_STREAM_CASES:
        a = run_stream(post_a, case)
        b = run_stream(post_b, case)
        results.append((case["name"], normalize(a) == normalize(b), normalize(a), normalize(b)))
    return results

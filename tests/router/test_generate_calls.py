"""What the router sends a generate worker, and how it reads the answer (router/generate.py), on the real
SmolLM2 tokenizer and template with a generation_config.json that sets sampling defaults.

The end-to-end behaviour (a real worker's answers equal through the router) is tests/router/
test_router_generate.py; here: the sampling defaults each kind of worker gets, the fields the generate path
refuses to carry, and the stream reader's framing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest

from conftest import fixtures
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.router.connections import RemoteProtocolError
from tokenfront.router.generate import GenerateCall, GenerateStream, chat_call, completion_call

GENERATION = {"eos_token_id": 2, "temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.05, "min_p": 0.02}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> RenderPipeline:
    source = fixtures.ensure_checkpoint("smollm2")
    folder = tmp_path_factory.mktemp("smollm2-sampling")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, folder / name)
    (folder / "generation_config.json").write_text(json.dumps(GENERATION))
    return RenderPipeline.load(RenderOptions(model=str(folder)))


def _chat(pipeline: RenderPipeline, **fields: Any) -> GenerateCall | None:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "Hi"}], **fields}
    )
    return chat_call(pipeline, request, pipeline.render_chat(request))


def _params(call: GenerateCall | None, *, tokenfront: bool) -> dict[str, Any]:
    assert call is not None
    body = json.loads(call.body_for(tokenfront=tokenfront))
    assert body["output_mode"] == "tokens" and body["token_ids"]
    return dict(body["sampling_params"])


def test_sampling_defaults_per_kind_of_worker(pipeline: RenderPipeline) -> None:
    call = _chat(pipeline, max_tokens=5)
    # vLLM's chat route fills these from generation_config.json; tokenfront's reads temperature/top_p/top_k.
    assert _params(call, tokenfront=False) == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "min_p": 0.02,
        "repetition_penalty": 1.05,
        "max_tokens": 5,
    }
    assert _params(call, tokenfront=True) == {"n": 1, "temperature": 0.7, "top_p": 0.9, "max_tokens": 5}


def test_request_values_win_and_extra_sampling_fields_pass(pipeline: RenderPipeline) -> None:
    call = _chat(pipeline, temperature=0, top_k=0, presence_penalty=0.5, repetition_penalty=1.2, seed=7, n=2)
    vllm = _params(call, tokenfront=False)
    assert vllm["temperature"] == 0.0 and vllm["top_k"] == -1 and vllm["seed"] == 7 and vllm["n"] == 2
    assert vllm["presence_penalty"] == 0.5 and vllm["repetition_penalty"] == 1.2
    assert "max_tokens" not in vllm  # the worker fills in the context's room
    mine = _params(call, tokenfront=True)
    assert mine["presence_penalty"] == 0.5 and mine["repetition_penalty"] == 1.2 and "min_p" not in mine


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_object"}},
        {"skip_special_tokens": False},
        {"include_stop_str_in_output": True},
        {"top_logprobs": 2},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
    ],
)
def test_what_the_generate_path_does_not_carry(pipeline: RenderPipeline, fields: dict[str, Any]) -> None:
    assert _chat(pipeline, **fields) is None


def test_completions_carry_one_prompt(pipeline: RenderPipeline) -> None:
    one = CompletionRequest.model_validate({"prompt": "The sea", "max_tokens": 3})
    two = CompletionRequest.model_validate({"prompt": ["The sea", "The sky"], "max_tokens": 3})
    assert completion_call(pipeline, one, pipeline.render_completion(one)) is not None
    assert completion_call(pipeline, two, pipeline.render_completion(two)) is None


class _Chunks:
    """A worker body arriving in the given pieces."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    async def next_chunk(self) -> bytes | None:
        return self.pieces.pop(0) if self.pieces else None


def _read_all(stream: GenerateStream) -> list[Any]:
    async def run() -> bytes:
        out = b""
        while (chunk := await stream.next_chunk()) is not None:
            out += chunk
        return out

    events = asyncio.run(run()).decode().split("\n\n")
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in events if e.startswith("data: ")]


def test_stream_reader_framing(pipeline: RenderPipeline) -> None:
    ids = pipeline.tokenizer.encode("Hello there, sailor.", add_special_tokens=False)
    events = [
        {"request_id": "r", "choices": [{"index": 0, "token_ids": ids[:2], "finish_reason": None}]},
        {"request_id": "r", "choices": [{"index": 0, "token_ids": [*ids[2:], 2], "finish_reason": "stop"}]},
        {"request_id": "r", "choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 3}}},
    ]
    body = (
        b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + b"data: [DONE]\r\n\r\n"
    )
    # Cut the body at awkward places: inside "data:", inside the JSON, between "\r" and "\n".
    pieces = [body[:3], body[3:40], body[40:41], body[41:120], body[120:]]
    call = _chat(pipeline, stream=True, stream_options={"include_usage": True})
    assert call is not None
    out = _read_all(GenerateStream(_Chunks(pieces), call.reading()))
    assert out[-1] == "[DONE]"
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["delta"].get("content", "") for e in out[1:-2] for c in e["choices"])
    assert text == "Hello there, sailor."
    assert out[-2]["usage"]["completion_tokens"] == len(ids) + 1
    assert out[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}

    cut_short = b"data: " + json.dumps(events[0]).encode() + b"\n\n"
    with pytest.raises(RemoteProtocolError, match="before every choice finished"):
        _read_all(GenerateStream(_Chunks([cut_short]), call.reading()))


def test_a_generate_stream_has_produced_once_ids_arrive(pipeline: RenderPipeline) -> None:
    """The first-token moment of a generate stream (a policy's `on_first_token`): its first event with ids."""
    ids = pipeline.tokenizer.encode("Hello.", add_special_tokens=False)
    events = [
        {"request_id": "r", "choices": [{"index": 0, "token_ids": [], "finish_reason": None}]},
        {"request_id": "r", "choices": [{"index": 0, "token_ids": ids, "finish_reason": None}]},
        {"request_id": "r", "choices": [{"index": 0, "token_ids": [2], "finish_reason": "stop"}]},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    call = _chat(pipeline, stream=True)
    assert call is not None
    stream = GenerateStream(_Chunks([body]), call.reading())

    async def produced_after_each() -> list[bool]:
        seen = []
        while await stream.next_chunk() is not None:
            seen.append(stream.produced)
        return seen

    # The first answer opens the choice with nothing generated yet; the next carries ids.
    assert asyncio.run(produced_after_each()) == [False, True, True, True]

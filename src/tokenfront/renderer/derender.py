"""The derender routes (docs/contract.md §11): output ids a client sends, answered as the OpenAI response vLLM 0.33 builds.

- `POST /v1/chat/completions/derender`: vLLM's `DerenderChatRequest` (`generate_response`, `prompt_tokens`,
  `prompt_token_ids`, `chat_request`) answered with a `chat.completion`; with `stream: true`, its
  `DerenderChatStreamRequest` (one `generate_chunk` and the `stream_state` of the previous answer) answered
  with `{"chunk", "stream_state"}`.
- `POST /v1/completions/derender`: the same for completions (`generate_responses`, one per prompt).

The ids are read by the output core (`core.output.ChoiceParser`), the one implementation the worker uses
too, where renders run (`server.render_thread`): a large output off the event loop. The answers carry every
field of vLLM's pydantic dumps, in its order, so a client of vLLM's derender reads tokenfront's unchanged. `stream_state` is tokenfront's own carried state (the parser's `state()` and
whether the role was sent), not vLLM's replay buffer: a client passes it back without reading it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator
from starlette.responses import Response

from tokenfront.core.output import ChoiceParser, OutputConfig, OutputDelta, OutputStateError, vllm_usage
from tokenfront.core.reasoning import reasoning_ended
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.renderer.routes import pipeline_for
from tokenfront.server.errors import APIError
from tokenfront.server.lean_routes import LeanRoute
from tokenfront.server.models import check_model
from tokenfront.server.render_thread import render_off_loop
from tokenfront.server.responses import JSONBytesResponse, dumps

__all__ = ["derender_router"]

# The prompt ids that seed the detokenizer and decide where reasoning starts (a marker is a few ids).
_PROMPT_TAIL = 8
_Body = TypeVar("_Body", "ChatDerenderRequest", "CompletionDerenderRequest")
# Bodies up to this size are read on the event loop when the pipeline is free (a stream's chunk of a few ids);
# reading costs tens of microseconds an id, so a larger output goes to the render thread.
_INLINE_BYTES = 4 * 1024


# -- vLLM's request schemas -----------------------------------------------------------------------------------


class GenerateChoice(BaseModel):
    """One choice of vLLM's `GenerateTokensResponse` (or of a stream chunk)."""

    model_config = ConfigDict(extra="allow")

    index: NonNegativeInt = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[NonNegativeInt] | None = None


class GenerateOutput(BaseModel):
    """vLLM's `GenerateTokensResponse` / `GenerateTokensStreamResponse` (`output_mode` "tokens" only)."""

    model_config = ConfigDict(extra="allow")

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    output_mode: Literal["tokens"] = "tokens"
    choices: list[GenerateChoice]
    prompt_token_ids: list[NonNegativeInt] | None = None
    usage: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None


class _DerenderBody(BaseModel):
    stream: bool = False
    model: str | None = None
    generate_chunk: GenerateOutput | None = None
    stream_state: dict[str, Any] | None = None


class ChatDerenderRequest(_DerenderBody):
    """`DerenderChatRequest` (stream false) or `DerenderChatStreamRequest` (stream true)."""

    generate_response: GenerateOutput | None = None
    prompt_tokens: int | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None
    chat_request: ChatCompletionRequest | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ChatDerenderRequest:
        _require(self.stream, self.generate_response is not None, "generate_response")
        return self


class CompletionDerenderRequest(_DerenderBody):
    """`DerenderCompletionRequest` (stream false) or `DerenderCompletionStreamRequest` (stream true)."""

    generate_responses: list[GenerateOutput] | None = None
    prompt_tokens: list[int] | int | None = None
    prompt_token_ids: list[list[NonNegativeInt] | None] | list[NonNegativeInt] | None = None
    completion_request: CompletionRequest | None = None

    @model_validator(mode="after")
    def _one_form(self) -> CompletionDerenderRequest:
        _require(self.stream, self.generate_responses is not None, "generate_responses")
        if not self.stream:
            count = len(self.generate_responses or ())
            for name in ("prompt_tokens", "prompt_token_ids"):
                value = getattr(self, name)
                if value is not None and (not isinstance(value, list) or len(value) != count):
                    raise ValueError(f"{name} must be a list as long as generate_responses ({count})")
        return self


def _require(stream: bool, has_whole: bool, whole: str) -> None:
    # Called inside a validator: a ValueError becomes the usual 400 naming the field.
    if stream and has_whole:
        raise ValueError(f"a streaming derender (stream: true) takes generate_chunk, not {whole}")
    if not stream and not has_whole:
        raise ValueError(f"{whole} is required (or stream: true with generate_chunk)")


# -- reading the ids --------------------------------------------------------------------------------------------


class _Reader:
    """What every derender call derives from the pipeline: the EOS ids and how a request's output is read."""

    def __init__(self, pipeline: RenderPipeline) -> None:
        self.pipeline = pipeline
        tokenizer = pipeline.tokenizer
        self.primary_eos: int | None = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = pipeline.checkpoint.eos_token_ids

    def check(self, ids: Sequence[int], param: str) -> None:
        self.pipeline.validate_token_ids(list(ids), param=param)

    def chat_config(self, request: ChatCompletionRequest | None, prompt_ids: Sequence[int]) -> OutputConfig:
        pipeline = self.pipeline
        if request is None:
            if pipeline.reasoning_parser is not None or pipeline.tool_call_parser is not None:
                # Plain decoding would leak the parsers' markup into content (vLLM refuses the same way).
                raise APIError(
                    400,
                    "chat_request is required when a tool or reasoning parser is configured because plain "
                    "detokenization would leak raw parser markup into content.",
                    param="chat_request",
                )
            return OutputConfig.for_completion(hidden_ids=self.eos_ids)
        ended = None
        if pipeline.reasoning_parser is not None and prompt_ids:
            tail = pipeline.tokenizer.decode(list(prompt_ids[-_PROMPT_TAIL:]), skip_special_tokens=False)
            ended = reasoning_ended(pipeline.reasoning_parser, tail)
        return OutputConfig.for_chat(
            request,
            reasoning_parser=pipeline.reasoning_parser,
            tool_call_parser=pipeline.tool_call_parser,
            hidden_ids=self._hidden(request),
            prompt_reasoning_ended=ended,
            default_chat_template_kwargs=pipeline.options.default_chat_template_kwargs,
        )

    def completion_config(self, request: CompletionRequest | None) -> OutputConfig:
        stop = request.stop if request is not None else None
        return OutputConfig.for_completion(stop=stop, hidden_ids=self._hidden(request))

    def _hidden(self, request: ChatCompletionRequest | CompletionRequest | None) -> frozenset[int]:
        extra = frozenset(getattr(request, "stop_token_ids", None) or ())
        return self.eos_ids | extra

    def stop_reason(self, choice: GenerateChoice, parser: ChoiceParser) -> int | str | None:
        """vLLM's `stop_reason`: the stop string that cut the text, else the reported one, else a stop id
        other than the primary EOS that ended the output."""
        if parser.stop_string is not None:
            return parser.stop_string
        if choice.stop_reason is not None or choice.finish_reason != "stop" or not choice.token_ids:
            return choice.stop_reason
        last = choice.token_ids[-1]
        return last if last in parser.config.hidden_ids and last != self.primary_eos else None


def _read(
    reader: _Reader, config: OutputConfig, choice: GenerateChoice, prompt_ids: Sequence[int], param: str
) -> tuple[OutputDelta, int | str | None]:
    ids = choice.token_ids or []
    if not ids:
        raise APIError(400, f"choice {choice.index} has empty or null token_ids", param=param)
    reader.check(ids, param)
    parser = ChoiceParser(config, reader.pipeline.tokenizer, context_ids=prompt_ids[-_PROMPT_TAIL:])
    delta = parser.push_ids(ids)
    delta.extend(parser.finish(choice.finish_reason or "stop"))
    return delta, reader.stop_reason(choice, parser)


# -- vLLM's response shapes ---------------------------------------------------------------------------------


def _chunk_usage(output: GenerateOutput, prompt_tokens: int | None) -> dict[str, Any] | None:
    # A chunk carries usage when the generate chunk does; the prompt count is the render step's.
    if output.usage is None:
        return None
    completion = _usage_count(output.usage, "completion_tokens")
    prompt = prompt_tokens if prompt_tokens is not None else _usage_count(output.usage, "prompt_tokens")
    return vllm_usage(prompt, completion)


def _usage_count(usage: dict[str, Any], key: str) -> int:
    """A token count of a chunk's `usage` (vLLM's `UsageInfo`: an integer, absent or null meaning 0); anything
    else is the client's mistake, a 400."""
    value = usage.get(key)
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if type(value) is not int or value < 0:
        raise APIError(
            400,
            f"generate_chunk.usage.{key} must be a non-negative integer (got {value!r})",
            param=f"generate_chunk.usage.{key}",
        )
    return value


def _message(delta: OutputDelta, request: ChatCompletionRequest | None) -> dict[str, Any]:
    # vLLM (assemble_chat_message_fields): content null once calls or reasoning took the output, "" never.
    message: dict[str, Any] = {
        "role": "assistant",
        "content": delta.content or (None if request is not None else ""),
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if delta.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in delta.tool_calls]
    message["reasoning"] = delta.reasoning or None
    return message


def _served(pipeline: RenderPipeline, model: str | None) -> str:
    check_model(model, pipeline.served_model_names)
    return model or pipeline.served_model_names[0]


def derender_chat(reader: _Reader, body: ChatDerenderRequest) -> dict[str, Any]:
    """The `chat.completion` of a whole output."""
    model = _served(reader.pipeline, body.model)
    output = body.generate_response
    assert output is not None  # the model validator requires it
    prompt_ids = body.prompt_token_ids if body.prompt_token_ids is not None else output.prompt_token_ids or []
    reader.check(prompt_ids, "prompt_token_ids")
    config = reader.chat_config(body.chat_request, prompt_ids)
    choices = []
    for choice in output.choices:
        delta, stop_reason = _read(reader, config, choice, prompt_ids, "generate_response.choices.token_ids")
        if body.chat_request is None:
            delta = OutputDelta(content=delta.content, finish_reason=delta.finish_reason)
        choices.append(
            {
                "index": choice.index,
                "message": _message(delta, body.chat_request),
                "logprobs": None,
                "finish_reason": delta.finish_reason,
                "stop_reason": stop_reason,
                "token_ids": None,
                "routed_experts": None,
                "weight_versions": None,
            }
        )
    prompt_tokens = body.prompt_tokens or 0
    completion_tokens = sum(len(c.token_ids or ()) for c in output.choices)
    return {
        "id": output.request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": vllm_usage(prompt_tokens, completion_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": output.kv_transfer_params,
        "ec_transfer_params": None,
        "metrics": output.metrics,
    }


def derender_completion(reader: _Reader, body: CompletionDerenderRequest) -> dict[str, Any]:
    """The `text_completion` of one whole output per prompt (choices numbered across prompts)."""
    model = _served(reader.pipeline, body.model)
    outputs = body.generate_responses or []
    if not outputs:
        raise APIError(400, "generate_responses must not be empty", param="generate_responses")
    config = reader.completion_config(body.completion_request)
    counts = body.prompt_tokens if isinstance(body.prompt_tokens, list) else [0] * len(outputs)
    seeds = body.prompt_token_ids if isinstance(body.prompt_token_ids, list) else [None] * len(outputs)
    choices, completion_tokens, index = [], 0, 0
    for output, seed in zip(outputs, seeds, strict=True):
        prompt_ids = seed if isinstance(seed, list) else output.prompt_token_ids or []
        reader.check(prompt_ids, "prompt_token_ids")
        for choice in output.choices:
            delta, stop_reason = _read(reader, config, choice, prompt_ids, "generate_responses.token_ids")
            completion_tokens += len(choice.token_ids or ())
            choices.append(
                {
                    "index": index,
                    "text": delta.content,
                    "logprobs": None,
                    "finish_reason": delta.finish_reason,
                    "stop_reason": stop_reason,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                    "routed_experts": None,
                    "weight_versions": None,
                }
            )
            index += 1
    first = outputs[0]
    return {
        "id": first.request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": vllm_usage(sum(c or 0 for c in counts), completion_tokens),
        "kv_transfer_params": first.kv_transfer_params
        if all(o.kv_transfer_params == first.kv_transfer_params for o in outputs)
        else None,
        "ec_transfer_params": None,
        "metrics": first.metrics if len(outputs) == 1 else None,
    }


# -- streaming ------------------------------------------------------------------------------------------------

_STREAM_STOP_STRINGS = (
    "stop strings are not supported by streaming derender because text already sent cannot be cut. Use "
    "non-streaming derender or output_mode=text on /inference/v1/generate which holds stop strings back."
)


def _stream_step(
    reader: _Reader,
    config: OutputConfig,
    chunk: GenerateOutput,
    state: dict[str, Any] | None,
    prompt_ids: Sequence[int],
) -> tuple[GenerateChoice | None, OutputDelta, bool, dict[str, Any]]:
    """One chunk through the carried parser: its choice, the delta, whether the role was sent before, and
    the state to carry on."""
    if len(chunk.choices) > 1:
        raise APIError(
            400,
            f"a streaming derender takes at most one choice per chunk (got {len(chunk.choices)})",
            param="generate_chunk.choices",
        )
    tokenizer = reader.pipeline.tokenizer
    if state is None:
        parser, role_sent = ChoiceParser(config, tokenizer, context_ids=prompt_ids[-_PROMPT_TAIL:]), False
    else:
        carried, sent = state.get("output"), state.get("role_sent")
        if not isinstance(carried, dict) or not isinstance(sent, bool):
            raise OutputStateError("stream_state must be the stream_state of the previous derender answer")
        role_sent = sent
        _check_carried_ids(reader, carried)
        parser = ChoiceParser.resume(config, tokenizer, carried)
    choice = chunk.choices[0] if chunk.choices else None
    delta = OutputDelta()
    if choice is not None:
        ids = choice.token_ids or []
        reader.check(ids, "generate_chunk.choices.token_ids")
        delta = parser.push_ids(ids)
        if choice.finish_reason is not None:
            delta.extend(parser.finish(choice.finish_reason))
    new_state = {"output": parser.state(), "role_sent": role_sent or choice is not None}
    return choice, delta, role_sent, new_state


def _check_carried_ids(reader: _Reader, carried: dict[str, Any]) -> None:
    """The ids a carried state's detokenizer holds come back from the client: ids outside the vocabulary would
    reach the tokenizer's decode (an OverflowError for a negative one), so they are a 400 like any other."""
    detokenizer = carried.get("detokenizer")
    window = detokenizer.get("window") if isinstance(detokenizer, dict) else None
    vocab_size = reader.pipeline.vocab_size
    if isinstance(window, list) and any(type(i) is int and not 0 <= i < vocab_size for i in window):
        raise OutputStateError(
            "stream_state holds token ids outside this model's vocabulary (was it made for another model?)"
        )


def _stream_chat(reader: _Reader, body: ChatDerenderRequest) -> dict[str, Any]:
    model = _served(reader.pipeline, body.model)
    request, chunk = body.chat_request, body.generate_chunk
    if chunk is None:
        raise APIError(400, "a streaming derender takes generate_chunk", param="generate_chunk")
    if request is not None and request.stop:
        raise APIError(400, _STREAM_STOP_STRINGS, param="chat_request.stop")
    has_parser = reader.pipeline.reasoning_parser is not None or reader.pipeline.tool_call_parser is not None
    if has_parser and body.stream_state is None and body.prompt_token_ids is None:
        raise APIError(
            400,
            "prompt_token_ids is required when a tool or reasoning parser is configured: without it the "
            "parser cannot tell whether the prompt left reasoning open.",
            param="prompt_token_ids",
        )
    prompt_ids = body.prompt_token_ids if body.prompt_token_ids is not None else chunk.prompt_token_ids or []
    reader.check(prompt_ids, "prompt_token_ids")
    config = reader.chat_config(request, prompt_ids)
    choice, delta, role_sent, state = _stream_step(reader, config, chunk, body.stream_state, prompt_ids)
    choices = []
    if choice is not None:
        out: dict[str, Any] = {
            "role": None if role_sent else "assistant",
            "content": delta.content or None,
            "reasoning": (delta.reasoning or None) if request is not None else None,
        }
        if delta.tool_calls:
            out["tool_calls"] = [
                {"id": call.id, "type": "function", "index": i, "function": call.to_openai()["function"]}
                for i, call in enumerate(delta.tool_calls)
            ]
        choices.append(
            {
                "index": choice.index,
                "delta": out,
                "logprobs": None,
                "finish_reason": delta.finish_reason,
                "stop_reason": choice.stop_reason,
                "token_ids": None,
                "weight_versions": None,
            }
        )
    answer = {
        "id": chunk.request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _chunk_usage(chunk, body.prompt_tokens),
        "system_fingerprint": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "metrics": chunk.metrics,
        "kv_transfer_params": chunk.kv_transfer_params,
    }
    return {"chunk": answer, "stream_state": state}


def _stream_completion(reader: _Reader, body: CompletionDerenderRequest) -> dict[str, Any]:
    model = _served(reader.pipeline, body.model)
    request, chunk = body.completion_request, body.generate_chunk
    if chunk is None:
        raise APIError(400, "a streaming derender takes generate_chunk", param="generate_chunk")
    if request is not None and request.stop:
        raise APIError(400, _STREAM_STOP_STRINGS, param="completion_request.stop")
    if isinstance(body.prompt_tokens, list) or (
        body.prompt_token_ids is not None and any(isinstance(i, list) for i in body.prompt_token_ids)
    ):
        raise APIError(400, "a streaming derender takes one prompt: prompt_tokens and prompt_token_ids of it")
    seed = body.prompt_token_ids if body.prompt_token_ids is not None else chunk.prompt_token_ids
    prompt_ids = [int(i) for i in seed or () if isinstance(i, int)]
    reader.check(prompt_ids, "prompt_token_ids")
    config = reader.completion_config(request)
    choice, delta, _, state = _stream_step(reader, config, chunk, body.stream_state, prompt_ids)
    choices = []
    if choice is not None:
        choices.append(
            {
                "index": choice.index,
                "text": delta.content,
                "logprobs": None,
                "finish_reason": delta.finish_reason,
                "stop_reason": choice.stop_reason,
                "prompt_token_ids": None,
                "token_ids": None,
                "weight_versions": None,
            }
        )
    prompt_tokens = body.prompt_tokens if isinstance(body.prompt_tokens, int) else None
    answer = {
        "id": chunk.request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _chunk_usage(chunk, prompt_tokens),
        "system_fingerprint": None,
        "metrics": chunk.metrics,
        "kv_transfer_params": chunk.kv_transfer_params,
    }
    return {"chunk": answer, "stream_state": state}


# -- routes -----------------------------------------------------------------------------------------------------


def _reader(raw: Request, model: str | None) -> _Reader:
    """The reader of `model`'s pipeline (a router of several models has one per model: `pipeline_for`)."""
    pipeline: RenderPipeline | None = getattr(raw.app.state, "pipeline", None)
    if pipeline is not None:
        pipeline = pipeline_for(raw.app, model)
    if pipeline is None:
        raise APIError(
            501,
            "this server was started without a tokenizer (--model), so it cannot derender; start it with "
            "--model, or use a renderer (`tokenfront render`)",
            code="derender_unavailable",
            error_type="server_error",
        )
    readers: dict[int, _Reader] | None = getattr(raw.app.state, "derender_readers", None)
    if readers is None:
        readers = raw.app.state.derender_readers = {}
    reader = readers.get(id(pipeline))
    if reader is None or reader.pipeline is not pipeline:
        reader = readers[id(pipeline)] = _Reader(pipeline)
    return reader


def _encoded(derender: Callable[[_Reader, _Body], dict[str, Any]], reader: _Reader, body: _Body) -> bytes:
    """The answer of `derender`, as JSON: both run where the output is read (a million ids take seconds)."""
    return dumps(derender(reader, body))


def derender_router() -> APIRouter:
    """The derender routes; they read ids with the pipeline `renderer.routes.pipeline_for` picks for the
    request's `model` (`app.state.pipeline` but on a router of several models)."""
    router = APIRouter(tags=["derender"], route_class=LeanRoute)

    @router.post(
        "/v1/chat/completions/derender",
        summary="Output token ids into a chat.completion (vLLM's derender; stream: true for one chunk)",
    )
    async def derender_chat_route(request: ChatDerenderRequest, raw: Request) -> Response:
        reader = _reader(raw, request.model)
        derender = _stream_chat if request.stream else derender_chat
        answer = await render_off_loop(
            raw, request, _encoded, derender, reader, request, inline_bytes=_INLINE_BYTES
        )
        return JSONBytesResponse(answer)

    @router.post(
        "/v1/completions/derender",
        summary="Output token ids into a text_completion (vLLM's derender; stream: true for one chunk)",
    )
    async def derender_completion_route(request: CompletionDerenderRequest, raw: Request) -> Response:
        reader = _reader(raw, request.model)
        derender = _stream_completion if request.stream else derender_completion
        answer = await render_off_loop(
            raw, request, _encoded, derender, reader, request, inline_bytes=_INLINE_BYTES
        )
        return JSONBytesResponse(answer)

    return router

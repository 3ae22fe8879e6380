"""The router's tokens-in, tokens-out side: rendered ids to a worker's `POST /inference/v1/generate`, output ids
back into the OpenAI answer.

A worker added with `protocol=generate` (a `vllm serve` worker, or tokenfront's own) is sent what the
router rendered, in vLLM 0.33's `GenerateRequest` (`token_ids`, `sampling_params`, `output_mode: "tokens"`),
and its output ids are read by the output core — the `ChoiceParser` and formatters the worker's own chat and
completions routes use — so the client gets the answer the worker would have given on its OpenAI route:
content, reasoning, tool calls, finish reason, logprobs, usage. A stream is derendered event by event as it
arrives (`GenerateStream`, on `worker_answers.EventReader` and its bounds), never buffered. An answer that is
not what vLLM's generate route answers is a `BadAnswer`.

The sampling parameters are the request's, else the checkpoint's `generation_config.json` defaults, as
vLLM 0.33's chat route fills them (`get_diff_sampling_param`: temperature, top_p, top_k, min_p and the
three penalties); vLLM's generate route itself would use its dataclass defaults. tokenfront's own worker
reads only temperature, top_p and top_k from that file on its chat route, so a tokenfront worker (role
"worker" on `/server_info`) is sent only those (`GenerateCall.body_for`). Sampling fields a client adds that
vLLM's `SamplingParams` takes with the chat route's meaning (penalties, `min_p`, `min_tokens`, `logit_bias`,
...) are passed on. `max_tokens` is left to the worker when the client gave none (vLLM 0.33's generate route
then fills in the context's room, as its chat route does).

What the generate path does not carry goes to the worker's OpenAI route as the client sent it
(`generate_unsupported`): several prompts in one completions request, `suffix`, `top_logprobs` without
`logprobs` (the worker's own 400 then answers), structured output (`response_format`, `structured_outputs`,
`guided_*`) and `tool_choice: "required"` (the chat route turns them into a grammar), and fields that change
how the text is made from the ids (`skip_special_tokens`, `include_stop_str_in_output`,
`spaces_between_special_tokens`) or ask for prompt logprobs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenfront.core.output import (
    AnswerHead,
    ChatFormatter,
    ChoiceParser,
    CompletionFormatter,
    FinishedChoice,
    OutputConfig,
    OutputDelta,
    ResponseFormatter,
    usage,
)
from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.router.connections import BadAnswer
from tokenfront.router.worker_answers import UNBOUNDED, AnswerBounds, ChunkSource, EventReader
from tokenfront.server.request_ids import chat_request_id, completion_request_id
from tokenfront.server.responses import dumps
from tokenfront.server.sse import SSE_DONE, sse_event

__all__ = ["GENERATE_PATH", "GenerateCall", "GenerateStream", "chat_call", "completion_call"]

GENERATE_PATH = "/inference/v1/generate"
# Sampling defaults generation_config.json may set, as vLLM's chat route reads them (`get_diff_sampling_param`);
# tokenfront's worker reads the first three.
_CONFIG_SAMPLING = ("temperature", "top_p", "top_k")
_VLLM_CONFIG_SAMPLING = ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
# Request fields (beyond the typed ones) that vLLM's chat route copies into SamplingParams unchanged.
_PASSED_SAMPLING = (
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "ignore_eos",
    "logit_bias",
    "bad_words",
    "allowed_token_ids",
)
# Request fields the generate path cannot carry: they need the chat route's grammar or change how the text is
# made from the ids (the router's derender would not follow them).
_NOT_CARRIED = frozenset(
    {
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "spaces_between_special_tokens",
        "prompt_logprobs",
        "echo",
    }
)


@dataclass(frozen=True)
class GenerateCall:
    """One request as a generate worker takes it: the body to send (`body_for`), and how to read the answer
    (a new `Reading` per attempt: a retried request is read from its start)."""

    body: bytes  # vLLM's chat-route sampling defaults
    tokenfront_body: bytes  # tokenfront's worker's (temperature, top_p, top_k from generation_config)
    reading: Callable[[], Reading]

    def body_for(self, *, tokenfront: bool) -> bytes:
        """The body for a tokenfront worker, or for any other generate worker (vLLM)."""
        return self.tokenfront_body if tokenfront else self.body


@dataclass
class Reading:
    """How a request's output ids become its OpenAI answer: the parser configuration, the formatter, the
    number of choices and of prompt ids, and the logprobs asked for."""

    pipeline: RenderPipeline
    config: OutputConfig
    formatter: ResponseFormatter
    choices: int
    prompt_tokens: int
    logprobs: int | None = None
    parsers: dict[int, ChoiceParser] = field(default_factory=dict)

    def parser(self, index: int) -> ChoiceParser:
        """Choice `index`'s parser (made on its first ids)."""
        parser = self.parsers.get(index)
        if parser is None:
            if not 0 <= index < self.choices:
                raise BadAnswer(f"the generate answer has choice {index} of {self.choices}")
            parser = self.parsers[index] = ChoiceParser(self.config, self.pipeline.tokenizer)
        return parser

    def step(self, choice: Any) -> tuple[int, OutputDelta, list[_Sampled], int]:
        """One choice object of a generate answer or chunk: its index, the delta its ids make, the sampled
        tokens (for logprobs) and how many ids it had."""
        if not isinstance(choice, dict):
            raise BadAnswer("a generate choice is not a JSON object")
        index = choice.get("index", 0)
        ids = choice.get("token_ids") or []
        if not isinstance(index, int) or not isinstance(ids, list):
            raise BadAnswer("a generate choice has no integer index or no token_ids list")
        if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self._vocabulary for i in ids):
            raise BadAnswer("a generate choice has token ids outside the router's vocabulary")
        parser = self.parser(index)
        delta = parser.push_ids(ids)
        reason = choice.get("finish_reason")
        if reason is not None:
            delta.extend(parser.finish(str(reason)))
        sampled = _sampled(ids, choice.get("logprobs"), self.logprobs) if self.logprobs is not None else []
        return index, delta, sampled, len(ids)

    @property
    def _vocabulary(self) -> int:
        return len(self.pipeline.tokenizer)

    def answer(self, payload: Any) -> bytes:
        """The OpenAI answer of a whole generate answer."""
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise BadAnswer("the generate answer has no choices list")
        finished, completion = [], 0
        for choice in payload["choices"]:
            index, delta, sampled, count = self.step(choice)
            if delta.finish_reason is None:
                delta.extend(self.parsers[index].finish("stop"))
            finished.append(FinishedChoice(index, delta, sampled))
            completion += count
        return dumps(self.formatter.response(finished, self.usage(completion, _cached(payload))))

    def usage(self, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        """The answer's `usage`: the router's prompt count, the worker's output and cache counts."""
        return usage(self.prompt_tokens, completion_tokens, cached_tokens)


@dataclass(frozen=True)
class _Sampled:
    """A generated token with its logprobs, as the formatters take it (`SampledToken`)."""

    token_id: int
    logprob: float | None
    top_logprobs: Sequence[tuple[int, float]] | None


def _sampled(ids: list[int], logprobs: Any, top: int) -> list[_Sampled]:
    """The tokens of vLLM's tokens-mode logprobs (`{"content": [{token_id, logprob, rank, top_logprobs}]}`):
    the top list is the candidates ranked 1..`top`, in rank order (the sampled token is listed first
    whatever its rank)."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or len(content) != len(ids):
        raise BadAnswer("the generate answer's logprobs do not cover its token ids")
    tokens = []
    for token_id, entry in zip(ids, content, strict=True):
        candidates = entry.get("top_logprobs") if isinstance(entry, dict) else None
        ranked: dict[int, tuple[int, float]] = {}
        for item in candidates or ():
            rank = item.get("rank") if isinstance(item, dict) else None
            if isinstance(rank, int) and 1 <= rank <= top:
                ranked.setdefault(item["token_id"], (rank, float(item["logprob"])))
        best = sorted(ranked.items(), key=lambda kv: kv[1][0])
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        tokens.append(_Sampled(token_id, logprob, [(i, lp) for i, (_, lp) in best]))
    return tokens


def _cached(payload: dict[str, Any]) -> int:
    details = (payload.get("usage") or {}).get("prompt_tokens_details") if isinstance(payload, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and cached >= 0 else 0


# -- building calls ----------------------------------------------------------------------------------------------


_Request = ChatCompletionRequest | CompletionRequest


def _sampling_params(
    pipeline: RenderPipeline,
    request: _Request,
    max_tokens: int | None,
    logprobs: int | None,
    config_fields: Sequence[str],
) -> dict[str, Any]:
    generation = pipeline.checkpoint.generation_config
    params: dict[str, Any] = {"n": request.n or 1}
    given = request.model_extra or {}
    for name in _PASSED_SAMPLING:
        value = given[name] if name in given else getattr(request, name, None)  # typed (ignore_eos) or extra
        if value is not None:
            params[name] = value
    for name in config_fields:
        value = getattr(request, name, None) if name in _CONFIG_SAMPLING else params.get(name)
        value = value if value is not None else generation.get(name)
        if value is not None:
            params[name] = value
    if params.get("top_k") == 0:
        params["top_k"] = -1  # "off" in both spellings; vLLM's current one
    extra = {
        "seed": request.seed,
        "stop": request.stop,
        "stop_token_ids": request.stop_token_ids,
        "max_tokens": max_tokens,
        "logprobs": logprobs,
    }
    params.update({name: value for name, value in extra.items() if value is not None})
    return params


def _body(request: _Request, request_id: str, token_ids: list[int], params: dict[str, Any]) -> bytes:
    body: dict[str, Any] = {
        "request_id": request_id,
        "token_ids": token_ids,
        "sampling_params": params,
        "output_mode": "tokens",
        "stream": bool(request.stream),
    }
    if request.model is not None:
        body["model"] = request.model
    if request.stream:
        body["stream_options"] = {"include_usage": True}  # the cache count comes with it
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    return dumps(body)


def _bodies(
    pipeline: RenderPipeline,
    request: _Request,
    request_id: str,
    token_ids: list[int],
    max_tokens: int | None,
    logprobs: int | None,
) -> tuple[bytes, bytes]:
    """The generate body for vLLM (its chat route's defaults) and for a tokenfront worker (its own)."""
    vllm = _sampling_params(
        pipeline, request, max_tokens, logprobs, (*_CONFIG_SAMPLING, *_VLLM_CONFIG_SAMPLING)
    )
    mine = _sampling_params(pipeline, request, max_tokens, logprobs, _CONFIG_SAMPLING)
    vllm_body = _body(request, request_id, token_ids, vllm)
    return vllm_body, vllm_body if mine == vllm else _body(request, request_id, token_ids, mine)


def carries(request: ChatCompletionRequest | CompletionRequest) -> bool:
    """Whether the generate path carries this request's fields (see the module docstring)."""
    extra = request.model_extra or {}
    return not any(extra.get(name) is not None for name in _NOT_CARRIED)


def _head(
    pipeline: RenderPipeline, request_id: str, request: ChatCompletionRequest | CompletionRequest
) -> AnswerHead:
    return AnswerHead(
        request_id=request_id,
        model=request.model or pipeline.served_model_names[0],
        created=int(time.time()),
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
    )


def _token_text(pipeline: RenderPipeline) -> Any:
    tokenizer = pipeline.tokenizer
    return lambda token_id: str(tokenizer.decode([token_id], skip_special_tokens=False))


def chat_call(
    pipeline: RenderPipeline, request: ChatCompletionRequest, rendered: RenderedPrompt
) -> GenerateCall | None:
    """The generate call of a chat request rendered as `rendered` (None: the generate path cannot carry it)."""
    if (request.top_logprobs and not request.logprobs) or request.tool_choice == "required":
        return None
    if not carries(request):
        return None
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    parser = pipeline.reasoning_parser
    ended = rendered.reasoning_ended if parser is not None and parser.reads_mode_from_prompt else None
    config = OutputConfig.for_chat(
        request,
        reasoning_parser=parser,
        tool_call_parser=pipeline.tool_call_parser,
        hidden_ids=pipeline.checkpoint.eos_token_ids,
        prompt_reasoning_ended=ended,
        default_chat_template_kwargs=pipeline.options.default_chat_template_kwargs,
    )
    request_id = chat_request_id()
    head = _head(pipeline, request_id, request)

    def formatter() -> ResponseFormatter:
        return ChatFormatter(
            head,
            reasoning_field=parser is not None,
            logprobs=logprobs is not None,
            token_text=_token_text(pipeline),
        )

    ids = rendered.token_ids
    max_tokens = request.max_completion_tokens or request.max_tokens
    n, prompt_tokens = request.n or 1, len(ids)
    return GenerateCall(
        *_bodies(pipeline, request, request_id, ids, max_tokens, logprobs),
        lambda: Reading(pipeline, config, formatter(), n, prompt_tokens, logprobs),
    )


def completion_call(
    pipeline: RenderPipeline, request: CompletionRequest, items: Sequence[RenderedPrompt]
) -> GenerateCall | None:
    """The generate call of a one-prompt completions request (None: the generate path cannot carry it)."""
    if len(items) != 1 or request.suffix is not None or request.echo or not carries(request):
        return None
    config = OutputConfig.for_completion(stop=request.stop, hidden_ids=pipeline.checkpoint.eos_token_ids)
    request_id = completion_request_id()
    head = _head(pipeline, request_id, request)

    def formatter() -> ResponseFormatter:
        return CompletionFormatter(
            head, logprobs=request.logprobs is not None, token_text=_token_text(pipeline)
        )

    ids = items[0].token_ids
    n, prompt_tokens, logprobs = request.n or 1, len(ids), request.logprobs
    return GenerateCall(
        *_bodies(pipeline, request, request_id, ids, request.max_tokens, logprobs),
        lambda: Reading(pipeline, config, formatter(), n, prompt_tokens, logprobs),
    )


# -- streams -------------------------------------------------------------------------------------------------------


class GenerateStream:
    """A generate worker's event stream, read as it arrives and answered as the OpenAI stream of the request.

    `next_chunk` has the shape of `WorkerResponse.next_chunk` (bytes for the client, None at the end), so the
    proxy relays it as it relays an OpenAI stream. The first call reads the worker's first event before it
    answers (the opening chunk of every choice, and that event's delta): a worker that fails before it is
    retried elsewhere. The stream ends as the worker's OpenAI stream would: the usage chunk when the client
    asked for it, then `[DONE]`. A worker error event is passed on as it is. The worker's events are read
    within `bounds` (`sent_at`: when the request was sent).
    """

    def __init__(
        self, source: ChunkSource, reading: Reading, bounds: AnswerBounds = UNBOUNDED, *, sent_at: float = 0.0
    ) -> None:
        self.events = EventReader(source, bounds, sent_at=sent_at)
        self.reading = reading
        self._opened = False
        self._ended = False
        self._completion_tokens = 0
        self._cached_tokens = 0
        self.usage: Any = None  # the worker's usage object, once an event carried one (the routing metrics)
        self.produced = False  # an event carried generated tokens: the prompt's prefill is done

    async def next_chunk(self) -> bytes | None:
        """The next bytes for the client, or None after `[DONE]`."""
        while not self._ended:
            event = await self.events.next_event()
            if event is None:  # the end of the body without [DONE]: complete if every choice finished
                if not self._all_finished():
                    raise BadAnswer("the generate stream ended before every choice finished")
                return self._end()
            if event.payload is None:  # [DONE]
                return self._end()
            out = self._answer(event.payload)
            if out:
                return out
        await self.events.settle()
        return None

    def _all_finished(self) -> bool:
        parsers = self.reading.parsers
        return len(parsers) == self.reading.choices and all(p.finished for p in parsers.values())

    def _answer(self, payload: dict[str, Any]) -> bytes:
        formatter = self.reading.formatter
        parts = []
        if not self._opened:
            self._opened = True
            parts = [sse_event(formatter.first_chunk(index)) for index in range(self.reading.choices)]
        if "error" in payload:
            parts.append(sse_event(payload))  # the worker's own words; its [DONE] follows
            return b"".join(parts)
        if payload.get("usage"):
            self._cached_tokens = _cached(payload)
            self.usage = payload["usage"]
        for choice in payload.get("choices") or ():
            index, delta, sampled, count = self.reading.step(choice)
            self._completion_tokens += count
            self.produced = self.produced or count > 0 or delta.finish_reason is not None
            chunk = formatter.chunk(index, delta, sampled)
            if chunk is not None:
                parts.append(sse_event(chunk))
        return b"".join(parts)

    def _end(self) -> bytes:
        self._ended = True
        formatter = self.reading.formatter
        tail = b""
        if formatter.head.include_usage:
            answer = self.reading.usage(self._completion_tokens, self._cached_tokens)
            tail = sse_event(formatter.usage_chunk(answer))
        return tail + SSE_DONE

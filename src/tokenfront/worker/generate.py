"""`POST /inference/v1/generate`: vLLM 0.33's tokens-in, tokens-out route on tokenfront's worker.

The prompt is the request's `token_ids` (validated against the vocabulary, never rendered; counted in the
metrics as an id prompt of route "generate"). Each of the `n` choices is a `ChoiceRun` over the worker's one
engine, so prefix cache, KV events, batching and abort on disconnect are the OpenAI routes' own. Output is
read by the output core: stop strings and detokenization always (vLLM checks stop strings in every mode),
reasoning and tool calls for `output_mode` "derender" (from `parse_context`).

Answers follow vLLM's `GenerateTokensResponse` / `GenerateTextResponse` / `GenerateDerenderResponse` and, for
streams, `GenerateTokensStreamResponse` / `GenerateTextStreamResponse` chunks, ending in `data: [DONE]`
(vLLM's `ServingTokens`). Fields tokenfront has no value for (routed experts, sampling masks, weight
versions, multimodal placeholders) are null, as vLLM sends them when its own features are off.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.responses import StreamingResponse

from tokenfront.core.output import ChoiceParser, FinishedChoice, OutputConfig, OutputDelta, vllm_usage
from tokenfront.core.reasoning import reasoning_ended
from tokenfront.protocol import ChatCompletionRequest, NamedToolChoice
from tokenfront.protocol.vllm import GenerateRequest, unsupported_sampling
from tokenfront.server.disconnect import ClientDisconnected, client_disconnected_response
from tokenfront.server.errors import APIError
from tokenfront.server.models import check_model
from tokenfront.server.render_thread import render_off_loop
from tokenfront.server.responses import JSONBytesResponse
from tokenfront.server.sse import SSE_DONE, SSE_MEDIA_TYPE, sse_event
from tokenfront.worker.choices import ChoiceEvent, ChoiceRun, collect_all, merged_events
from tokenfront.worker.engine import GenerationRequest, SamplingParams, TokenOutput
from tokenfront.worker.sampling import SamplingDefaults
from tokenfront.worker.service import WorkerService, stream_error

__all__ = ["ROUTE", "GenerateService"]

ROUTE = "generate"  # the metrics' route label
# Prompt ids that seed the detokenizer (as vLLM seeds its own) and that tell a parser the reasoning mode.
_CONTEXT_TOKENS = 16


@dataclass
class _Generation:
    """One generate request, checked and submitted-to-be: its runs and how to shape their answer."""

    request: GenerateRequest
    request_id: str
    runs: list[ChoiceRun]
    output: OutputConfig
    include_reasoning: bool = True

    def completion_tokens(self) -> int:
        return sum(len(run.tokens) for run in self.runs)

    def cached_tokens(self) -> int:
        return self.runs[0].cached_tokens if self.runs else 0


class GenerateService:
    """Serves `/inference/v1/generate` with the worker's engine, metrics and tokenizer."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service

    async def generate(self, request: GenerateRequest, raw: Request) -> JSONBytesResponse | StreamingResponse:
        """POST /inference/v1/generate."""
        # Checking the ids and compiling the stop strings grow with the request: where renders run.
        generation = await render_off_loop(raw, request, self._prepare, request, raw)
        self.service.metrics.prompt_tokens.labels(ROUTE).inc(len(request.token_ids))
        if request.stream:
            return StreamingResponse(self._stream(generation), media_type=SSE_MEDIA_TYPE)
        try:
            choices = await collect_all(generation.runs, raw)
        except ClientDisconnected:
            return client_disconnected_response()
        self._count_usage(generation)
        return JSONBytesResponse(self._response(generation, choices))

    # -- checks and submission ---------------------------------------------------------------------------

    def _prepare(self, request: GenerateRequest, raw: Request) -> _Generation:
        service = self.service
        pipeline = service.pipeline
        check_model(request.model, pipeline.served_model_names)
        _refuse_unsupported(request)
        ids = list(request.token_ids)
        pipeline.validate_token_ids(ids, param="token_ids")
        service.metrics.prompt(ROUTE, "token_ids", ids)
        sampling = request.sampling_params
        eos = service.sampling.eos_ids
        stop_ids = frozenset(sampling.stop_token_ids or ())
        params = SamplingParams(
            max_tokens=service.sampling.max_tokens(len(ids), sampling.max_tokens),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            seed=sampling.seed,
            stop_token_ids=stop_ids | service.sampling.stop_ids(sampling.ignore_eos),
            logprobs=sampling.logprobs,
        )
        # vLLM's text leaves out the stop token that ended a sequence (EOS or one of stop_token_ids).
        hidden = eos | stop_ids
        include_reasoning = True
        if request.output_mode == "derender":
            output, include_reasoning = self._derender_config(request, ids, hidden)
        else:
            output = OutputConfig.for_completion(stop=sampling.stops, hidden_ids=hidden)
        # vLLM takes the id from the X-Request-Id header first, like its other routes.
        request_id = f"generate-tokens-{raw.headers.get('x-request-id') or request.request_id}"
        context = ids[-_CONTEXT_TOKENS:]
        runs = []
        # The engine's own ids are unique: two clients (or one router passing its request id on) may send the
        # same X-Request-Id at once, and each must run; the answer keeps the id the client chose.
        engine_id = f"{request_id}-{os.urandom(4).hex()}"
        for index in range(sampling.n):
            engine_request = GenerationRequest(
                f"{engine_id}-{index}", ids, SamplingDefaults.for_choice(params, index), request.cache_salt
            )
            parser = ChoiceParser(output, service.tokenizer, context_ids=context)
            runs.append(
                ChoiceRun(
                    index, engine_request, parser, service.engine, service.metrics, ROUTE, service.tracing
                )
            )
        return _Generation(request, request_id, runs, output, include_reasoning)

    def _derender_config(
        self, request: GenerateRequest, ids: list[int], hidden: frozenset[int]
    ) -> tuple[OutputConfig, bool]:
        """How a derender request's output is read: the server's parsers, with `parse_context`'s tools."""
        pipeline = self.service.pipeline
        reasoning, tools = pipeline.reasoning_parser, pipeline.tool_call_parser
        context = request.parse_context
        if context is None:
            if reasoning is not None or tools is not None:
                raise APIError(
                    400,
                    "output_mode='derender' requires parse_context on a server with a tool or reasoning "
                    "parser. Use the one returned by /render.",
                    param="parse_context",
                )
            return OutputConfig.for_completion(stop=request.sampling_params.stops, hidden_ids=hidden), True
        named = (
            context.tool_choice.function.name if isinstance(context.tool_choice, NamedToolChoice) else None
        )
        if named is not None and not any(tool.function.name == named for tool in context.tools or ()):
            raise APIError(
                400,
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                param="tool_choice",
            )
        if named is not None and tools is None:
            raise APIError(
                400,
                "a named tool_choice needs a tool-call parser: start the worker with --tool-call-parser",
                param="tool_choice",
            )
        # The parse context as the chat request the output core reads (its validators are for client bodies).
        chat = ChatCompletionRequest.model_construct(
            messages=[],
            tools=context.tools,
            tool_choice=context.tool_choice,
            chat_template_kwargs=context.chat_template_kwargs,
            stop=request.sampling_params.stop,
        )
        ended = request.reasoning_ended
        if reasoning is not None and reasoning.reads_mode_from_prompt and ended is None:
            tail = pipeline.tokenizer.decode(ids[-_CONTEXT_TOKENS:], skip_special_tokens=False)
            ended = reasoning_ended(reasoning, str(tail))
        output = OutputConfig.for_chat(
            chat,
            reasoning_parser=reasoning,
            tool_call_parser=tools,
            hidden_ids=hidden,
            prompt_reasoning_ended=ended,
            default_chat_template_kwargs=pipeline.options.default_chat_template_kwargs,
        )
        return output, context.include_reasoning

    def _count_usage(self, generation: _Generation) -> None:
        metrics = self.service.metrics
        metrics.completion_tokens.labels(ROUTE).inc(generation.completion_tokens())
        metrics.cached_prompt_tokens.labels(ROUTE).inc(generation.cached_tokens())

    # -- whole answers ------------------------------------------------------------------------------------

    def _response(self, generation: _Generation, choices: Sequence[FinishedChoice]) -> dict[str, Any]:
        request = generation.request
        prompt_tokens = len(request.token_ids)
        completion_tokens = generation.completion_tokens()
        mode = request.output_mode
        return {
            "request_id": generation.request_id,
            "model": request.model or self.service.pipeline.served_model_names[0],
            "created": int(time.time()),
            "usage": {
                **vllm_usage(prompt_tokens, completion_tokens),
                "prompt_tokens_details": {
                    "cached_tokens": generation.cached_tokens(),
                    "created_cache_tokens": None,
                    "multimodal_tokens": None,
                },
            },
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": list(request.token_ids) if request.return_token_ids else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": mode,
            "choices": [
                self._choice(generation, generation.runs[choice.index], choice)
                for choice in sorted(choices, key=lambda c: c.index)
            ],
        }

    def _choice(self, generation: _Generation, run: ChoiceRun, choice: FinishedChoice) -> dict[str, Any]:
        mode = generation.request.output_mode
        output = choice.output
        tokens = run.tokens
        with_logprobs = generation.request.sampling_params.logprobs is not None
        body: dict[str, Any] = {
            "index": choice.index,
            "finish_reason": output.finish_reason or "stop",
            "stop_reason": self._stop_reason(generation, run, output),
            "token_ids": [token.token_id for token in tokens],
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
        }
        if mode == "tokens":
            body["logprobs"] = _token_logprobs(tokens) if with_logprobs else None
            return body
        logprobs = self._text_logprobs(tokens) if with_logprobs else None
        if mode == "text":
            body["text"] = output.content
            body["logprobs"] = logprobs
            return body
        reasoning = self.service.pipeline.reasoning_parser is not None and generation.include_reasoning
        if not generation.include_reasoning:  # as vLLM: per-token data would show the hidden reasoning
            body["token_ids"], logprobs = None, None
        message: dict[str, Any] = {
            "role": "assistant",
            "content": output.content or (None if output.tool_calls or output.reasoning else ""),
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if output.tool_calls:  # vLLM's ChatMessage leaves the key out when there are none
            message["tool_calls"] = [call.to_openai() for call in output.tool_calls]
        message["reasoning"] = (output.reasoning or None) if reasoning else None
        body["message"] = message
        body["logprobs"] = logprobs
        return body

    def _stop_reason(self, generation: _Generation, run: ChoiceRun, output: OutputDelta) -> int | str | None:
        """vLLM's `stop_reason`: the stop string or stop token id that ended the choice (None on EOS, length,
        abort)."""
        if run.parser.stopped:  # the stop string found first in the output's text
            return run.parser.stop_string
        last = run.tokens[-1].token_id if run.tokens else None
        stop_ids = generation.request.sampling_params.stop_token_ids or ()
        if output.finish_reason in ("stop", "tool_calls") and last in stop_ids:
            return last
        return None

    def _text_logprobs(self, tokens: Sequence[TokenOutput]) -> dict[str, Any]:
        """vLLM's text-mode logprobs: decoded tokens with bytes; the sampled token first among the top."""
        token_text = self.service.token_text

        def entry(token_id: int, logprob: float | None) -> dict[str, Any]:
            text = token_text(token_id)
            return {"token": text, "logprob": _logprob(logprob), "bytes": list(text.encode("utf-8"))}

        content = []
        for token in tokens:
            item = entry(token.token_id, token.logprob)
            item["top_logprobs"] = [entry(i, lp) for i, lp in _candidates(token)]
            content.append(item)
        return {"content": content}

    # -- streams ------------------------------------------------------------------------------------------

    async def _stream(self, generation: _Generation) -> AsyncIterator[bytes]:
        """vLLM's generate event stream: a chunk whenever a choice has ids or text, usage last, [DONE].

        `return_token_ids` puts the prompt ids on the first chunk; `continuous_usage_stats` puts each
        choice's usage so far on its chunks.
        """
        request = generation.request
        options = request.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and bool(options and options.continuous_usage_stats)
        prompt_ids = list(request.token_ids) if request.return_token_ids else None
        try:
            async for event in merged_events(generation.runs):
                run = generation.runs[event.index]
                choice = self._chunk_choice(generation, run, event)
                if choice is None:
                    continue
                chunk: dict[str, Any] = {"request_id": generation.request_id, "usage": None}
                if continuous:
                    chunk["usage"] = vllm_usage(len(request.token_ids), len(run.tokens))
                if prompt_ids is not None:
                    chunk["prompt_token_ids"], prompt_ids = prompt_ids, None
                yield sse_event({**chunk, "output_mode": request.output_mode, "choices": [choice]})
            self._count_usage(generation)
            if include_usage:
                usage = vllm_usage(len(request.token_ids), generation.completion_tokens())
                # vLLM dumps the usage chunk without its null fields.
                usage = {k: v for k, v in usage.items() if v is not None}
                usage["prompt_tokens_details"] = {"cached_tokens": generation.cached_tokens()}
                body = {"request_id": generation.request_id, "usage": usage}
                yield sse_event({**body, "output_mode": request.output_mode, "choices": []})
        except Exception as exc:  # headers are sent: the error can only be reported in the stream itself
            yield sse_event(stream_error(generation.request_id, exc))
        yield SSE_DONE

    def _chunk_choice(
        self, generation: _Generation, run: ChoiceRun, event: ChoiceEvent
    ) -> dict[str, Any] | None:
        """One choice of a stream chunk, or None when the event carries neither ids, text nor the end."""
        mode = generation.request.output_mode
        delta = event.delta
        ids = [token.token_id for token in event.tokens]
        finished = delta.finish_reason is not None
        if not (ids or finished or (mode == "text" and delta.content)):
            return None
        with_logprobs = generation.request.sampling_params.logprobs is not None
        choice: dict[str, Any] = {
            "index": event.index,
            "finish_reason": delta.finish_reason,
            "stop_reason": self._stop_reason(generation, run, delta) if finished else None,
            "token_ids": ids,
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
        }
        if mode == "text":
            choice["text"] = delta.content
            choice["logprobs"] = self._text_logprobs(event.tokens) if with_logprobs else None
        else:
            choice["logprobs"] = _token_logprobs(event.tokens) if with_logprobs else None
        return choice


def _refuse_unsupported(request: GenerateRequest) -> None:
    """400s for what vLLM accepts but tokenfront's worker cannot do, and for vLLM's own refusals."""
    if request.features is not None or request.content_parts:
        param = "features" if request.features is not None else "content_parts"
        raise APIError(
            400,
            "multimodal inputs are not supported by tokenfront's worker: send text-only token_ids",
            param=param,
        )
    for name in ("kv_transfer_params", "ec_transfer_params"):
        if getattr(request, name) is not None:
            raise APIError(
                400, f"{name} (disaggregated serving) is not supported by tokenfront's worker", param=name
            )
    if request.priority != 0:
        raise APIError(
            400,
            f"Got priority {request.priority} but priority scheduling is not enabled: tokenfront's worker "
            "serves requests first come, first served",
            param="priority",
        )
    unsupported = unsupported_sampling(request.sampling_params)
    if unsupported is not None:
        raise APIError(
            400,
            f"sampling_params.{unsupported} is not supported by tokenfront's engine: leave it out or at its "
            "default",
            param=f"sampling_params.{unsupported}",
        )
    if request.output_mode == "derender" and request.stream:
        raise APIError(400, "output_mode='derender' does not support stream=true.", param="stream")


def _logprob(value: float | None) -> float:
    return max(float(value), -9999.0) if value is not None else -9999.0


def _candidates(token: TokenOutput) -> list[tuple[int, float | None]]:
    """A position's candidates as vLLM lists them: the sampled token first, then the top ones in order."""
    top = [(i, lp) for i, lp in token.top_logprobs or () if i != token.token_id]
    return [(token.token_id, token.logprob), *top]


def _token_logprobs(tokens: Sequence[TokenOutput]) -> dict[str, Any]:
    """vLLM's tokens-mode logprobs: integer ids, ranks where the top list tells them."""
    content = []
    for token in tokens:
        ranks = {i: rank for rank, (i, _) in enumerate(token.top_logprobs or (), start=1)}
        content.append(
            {
                "token_id": token.token_id,
                "logprob": _logprob(token.logprob),
                "rank": ranks.get(token.token_id),
                "top_logprobs": [
                    {"token_id": i, "logprob": _logprob(lp), "rank": ranks.get(i)}
                    for i, lp in _candidates(token)
                ],
            }
        )
    return {"content": content}

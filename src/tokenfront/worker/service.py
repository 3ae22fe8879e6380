"""The worker's orchestration: a chat or completions request in, engine sequences, an OpenAI answer out.

For each request `WorkerService`

1. gets the prompt ids (`prompts.PromptBuilder`: rendered by the shared pipeline, or given);
2. works out the sampling parameters and the token budget (`sampling.SamplingDefaults`), and refuses a
   request that asks for more sequences or tokens than one request may (`sampling.check_request_size`,
   `check_request_tokens`);
3. submits one engine sequence per choice (`n`), each read by its own `ChoiceParser` from the output core
   (`choices.ChoiceRun`);
4. answers with one JSON object, or with server-sent events ending in `data: [DONE]`, shaped by the output
   core's `ChatFormatter` / `CompletionFormatter`.

A client that goes away cancels its sequences: the streaming generator aborts them when it is cancelled, and
a non-streaming request watches for the disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.responses import StreamingResponse

from tokenfront.core.output import (
    AnswerHead,
    ChatFormatter,
    ChoiceParser,
    CompletionFormatter,
    OutputConfig,
    ResponseFormatter,
    usage,
)
from tokenfront.core.output.harmony import reads_harmony
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.server.disconnect import ClientDisconnected, client_disconnected_response
from tokenfront.server.errors import APIError, error_body
from tokenfront.server.models import check_model
from tokenfront.server.render_thread import render_off_loop
from tokenfront.server.request_ids import chat_request_id, completion_request_id
from tokenfront.server.responses import JSONBytesResponse
from tokenfront.server.sse import SSE_DONE, SSE_MEDIA_TYPE, sse_event
from tokenfront.server.tracing import PROMPT_TOKENS, Tracing
from tokenfront.worker.choices import ChoiceRun, collect_all, merged_events
from tokenfront.worker.engine import Engine, GenerationRequest, SamplingParams
from tokenfront.worker.metrics import WorkerMetrics
from tokenfront.worker.prompts import PromptBuilder, PromptInput
from tokenfront.worker.sampling import SamplingDefaults, check_request_size, check_request_tokens

log = logging.getLogger(__name__)

__all__ = ["WorkerService", "stream_error"]


@dataclass
class _Plan:
    """Everything a request's choices share once its prompts are known."""

    route: str
    formatter: ResponseFormatter
    prompts: list[PromptInput]
    runs: list[ChoiceRun]
    stream: bool
    runs_per_prompt: int = 1

    def usage(self) -> dict[str, Any]:
        prompt_tokens = sum(p.usage_tokens for p in self.prompts)
        return usage(prompt_tokens, self.completion_tokens(), self.cached_tokens())

    def completion_tokens(self) -> int:
        return sum(len(run.tokens) for run in self.runs)

    def cached_tokens(self) -> int:
        # One count per prompt, from its first choice (its other choices may reuse what the first computed).
        return sum(run.cached_tokens for run in self.runs[:: self.runs_per_prompt])


class WorkerService:
    """Turns OpenAI requests into engine sequences and engine output into OpenAI answers."""

    def __init__(
        self,
        pipeline: RenderPipeline,
        engine: Engine,
        metrics: WorkerMetrics,
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.engine = engine
        self.metrics = metrics
        # With it, a request's prompt is a `render` span and each engine sequence a `generate` span.
        self.tracing = tracing
        self.tokenizer = pipeline.tokenizer
        self.prompts = PromptBuilder(pipeline, metrics)
        # The engine knows the model's real limits; the config says the same for engines that do not tell.
        self.sampling = SamplingDefaults.from_checkpoint(
            pipeline.checkpoint, engine_context=getattr(engine, "max_context", None)
        )
        config = pipeline.checkpoint.config
        self.logits_width = int(
            getattr(engine, "vocab_size", 0) or config.get("vocab_size") or len(self.tokenizer)
        )
        # gpt-oss's parsers read Harmony channels rather than markers: a start-up error if mixed with others.
        reads_harmony(pipeline.reasoning_parser, pipeline.tool_call_parser)
        self._guided: Any = None
        self._guided_lock = asyncio.Lock()

    def token_text(self, token_id: int) -> str:
        """One token's text, as logprobs show it (special tokens included)."""
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))

    async def guided(self) -> Any:
        """The worker's one `GuidedDecoding` (built on first use: indexing the vocabulary takes a second)."""
        async with self._guided_lock:
            if self._guided is None:
                from tokenfront.worker.guided import GuidedDecoding

                self._guided = await asyncio.to_thread(GuidedDecoding, self.tokenizer, self.logits_width)
        return self._guided

    # -- chat --------------------------------------------------------------------------------------------------

    async def chat(
        self, request: ChatCompletionRequest, raw: Request
    ) -> JSONBytesResponse | StreamingResponse:
        """POST /v1/chat/completions."""
        check_model(request.model, self.pipeline.served_model_names)
        forced = self.prompts.forced_tool(request)

        # Rendering may be long (a client's template, a large conversation): off the event loop then.
        def prepare() -> PromptInput:
            return self.prompts.chat(request, forced_tool=forced)

        if self.tracing is not None:
            prepare = self.tracing.traced("render", prepare, _prompt_span)
        prompt = await render_off_loop(raw, request, prepare)
        logprobs = _chat_logprobs_count(request)
        max_tokens = request.max_completion_tokens or request.max_tokens
        params = self.sampling.params(request, len(prompt.token_ids), max_tokens, logprobs)
        check_request_tokens(
            [(len(prompt.token_ids), params.max_tokens)], request.n or 1, raw.app.request_limits
        )
        constraint_for = await self._constraint_factory(request, forced, params.max_tokens)
        output = OutputConfig.for_chat(
            request,
            reasoning_parser=self.pipeline.reasoning_parser,
            tool_call_parser=self.pipeline.tool_call_parser,
            hidden_ids=self.sampling.eos_ids,
            prompt_reasoning_ended=prompt.reasoning_ended,
            default_chat_template_kwargs=self.pipeline.options.default_chat_template_kwargs,
        )
        request_id = chat_request_id()
        runs = []
        for index in range(request.n or 1):
            run = self._run(request_id, index, prompt, params, index, request.cache_salt, output, "chat")
            run.request.constraint = constraint_for() if constraint_for is not None else None
            runs.append(run)
        formatter = ChatFormatter(
            self._head(request_id, request),
            reasoning_field=self.pipeline.reasoning_parser is not None,
            logprobs=logprobs is not None,
            token_text=self.token_text,
        )
        plan = _Plan("chat", formatter, [prompt], runs, bool(request.stream), runs_per_prompt=request.n or 1)
        return await self._answer(plan, raw)

    async def _constraint_factory(
        self, request: ChatCompletionRequest, forced: str | None, max_tokens: int
    ) -> Callable[[], Any] | None:
        """Builds each choice's grammar for a forced call: the tool's schema, closed within `max_tokens`."""
        if forced is None:
            return None
        index, tool = next((i, t) for i, t in enumerate(request.tools or ()) if t.function.name == forced)
        guided = await self.guided()
        # Checked and compiled now, off the event loop and within the compile budget: an invalid schema, or
        # one over the limits, is a 400 before anything is submitted (worker/schema_limits.py).
        compiled = await guided.compile_off_loop(
            tool.function.parameters, where=f"tools[{index}].function.parameters"
        )
        return lambda: guided.constraint(compiled, max_tokens=max_tokens)

    # -- completions -------------------------------------------------------------------------------------------

    async def completion(
        self, request: CompletionRequest, raw: Request
    ) -> JSONBytesResponse | StreamingResponse:
        """POST /v1/completions."""
        check_model(request.model, self.pipeline.served_model_names)
        if request.echo and request.logprobs is not None:
            raise APIError(
                400, "echo with logprobs is not supported (prompt logprobs are not computed)", param="echo"
            )
        n = request.n or 1
        check_request_size(request.prompt_count, n, raw.app.request_limits)  # before any prompt is read
        prepare = self.prompts.completion
        if self.tracing is not None:
            prepare = self.tracing.traced("render", prepare, _prompts_span)
        prompts = await render_off_loop(raw, request, prepare, request)
        request_id = completion_request_id()
        output = OutputConfig.for_completion(stop=request.stop, hidden_ids=self.sampling.eos_ids)
        all_params = [
            self.sampling.params(request, len(prompt.token_ids), request.max_tokens, request.logprobs)
            for prompt in prompts
        ]
        check_request_tokens(
            [
                (len(prompt.token_ids), params.max_tokens)
                for prompt, params in zip(prompts, all_params, strict=True)
            ],
            n,
            raw.app.request_limits,
        )
        runs = []
        for prompt_index, (prompt, params) in enumerate(zip(prompts, all_params, strict=True)):
            for offset in range(n):
                index = prompt_index * n + offset
                runs.append(
                    self._run(
                        request_id, index, prompt, params, offset, request.cache_salt, output, "completion"
                    )
                )
        echo = {run.index: prompts[run.index // n].text or "" for run in runs} if request.echo else None
        formatter = CompletionFormatter(
            self._head(request_id, request),
            echo=echo,
            logprobs=request.logprobs is not None,
            token_text=self.token_text,
        )
        plan = _Plan("completion", formatter, prompts, runs, bool(request.stream), runs_per_prompt=n)
        return await self._answer(plan, raw)

    # -- shared ------------------------------------------------------------------------------------------------

    def _head(self, request_id: str, request: ChatCompletionRequest | CompletionRequest) -> AnswerHead:
        return AnswerHead(
            request_id=request_id,
            model=request.model or self.pipeline.served_model_names[0],
            created=int(time.time()),
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
        )

    def _run(
        self,
        request_id: str,
        index: int,
        prompt: PromptInput,
        params: SamplingParams,
        seed_offset: int,
        cache_salt: str | None,
        output: OutputConfig,
        route: str,
    ) -> ChoiceRun:
        params = SamplingDefaults.for_choice(params, seed_offset)
        generation = GenerationRequest(f"{request_id}-{index}", prompt.token_ids, params, cache_salt)
        parser = ChoiceParser(output, self.tokenizer)
        return ChoiceRun(index, generation, parser, self.engine, self.metrics, route, self.tracing)

    async def _answer(self, plan: _Plan, raw: Request) -> JSONBytesResponse | StreamingResponse:
        for prompt in plan.prompts:
            self.metrics.prompt_tokens.labels(plan.route).inc(prompt.usage_tokens)
        if plan.stream:
            return StreamingResponse(self._sse(plan), media_type=SSE_MEDIA_TYPE)
        try:
            choices = await collect_all(plan.runs, raw)
        except ClientDisconnected:
            return client_disconnected_response()
        self._count_usage(plan)
        return JSONBytesResponse(plan.formatter.response(choices, plan.usage()))

    def _count_usage(self, plan: _Plan) -> None:
        self.metrics.completion_tokens.labels(plan.route).inc(plan.completion_tokens())
        self.metrics.cached_prompt_tokens.labels(plan.route).inc(plan.cached_tokens())

    async def _sse(self, plan: _Plan) -> AsyncIterator[bytes]:
        """The event stream of a request: chunks as choices produce text, then usage, then [DONE].

        When the client disconnects the generator is cancelled, and `merged_events` aborts the choices.
        """
        formatter = plan.formatter
        try:
            for run in plan.runs:
                yield sse_event(formatter.first_chunk(run.index))
            async for event in merged_events(plan.runs):
                chunk = formatter.chunk(event.index, event.delta, event.tokens)
                if chunk is not None:
                    yield sse_event(chunk)
            self._count_usage(plan)
            if formatter.head.include_usage:
                yield sse_event(formatter.usage_chunk(plan.usage()))
        except Exception as exc:  # headers are sent: the error can only be reported in the stream itself
            yield sse_event(stream_error(formatter.head.request_id, exc))
        yield SSE_DONE


def _prompt_span(prompt: PromptInput) -> dict[str, Any]:
    """A worker's `render` span: the prompt's ids, and whether it rendered them or was given them (then it
    only checked them)."""
    return {PROMPT_TOKENS: len(prompt.token_ids), "tokenfront.prompt_source": prompt.source}


def _prompts_span(prompts: list[PromptInput]) -> dict[str, Any]:
    return {
        PROMPT_TOKENS: sum(len(prompt.token_ids) for prompt in prompts),
        "tokenfront.prompts": len(prompts),
        "tokenfront.prompt_source": sorted({prompt.source for prompt in prompts}),
    }


def _chat_logprobs_count(request: ChatCompletionRequest) -> int | None:
    if request.top_logprobs and not request.logprobs:
        raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
    return (request.top_logprobs or 0) if request.logprobs else None


def stream_error(request_id: str, error: BaseException) -> dict[str, Any]:
    """The error event of a stream whose generation failed after the response started."""
    if isinstance(error, ValueError):  # the engine refused the sequence: the request's fault
        return error_body(str(error), error_type="invalid_request_error")
    log.error("generation failed for %s: %r", request_id, error)
    return error_body("generation failed; the worker log has the details", error_type="server_error")

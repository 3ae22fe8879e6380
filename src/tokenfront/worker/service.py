"""The worker's OpenAI layer: a chat or completions request in, prompt ids to the engine, an OpenAI answer out.

`WorkerService` is the orchestration. For each request it

1. gets the prompt ids: renders `messages` with the shared `RenderPipeline` (the one the renderer uses, so
   ids match), or takes `prompt_token_ids` / id prompts as given (validated against the vocabulary, never
   rendered);
2. works out the sampling parameters (request, then the checkpoint's generation_config.json, as vLLM does)
   and the token budget (`max_tokens`, else up to the context length);
3. submits one engine sequence per choice (`n`), each with its own `ChoiceText` pipeline (streaming.py);
4. answers with one JSON object, or with server-sent events ending in `data: [DONE]`.

A client that goes away cancels its sequences: the streaming generator aborts them when it is cancelled, and
a non-streaming request watches for the disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.responses import StreamingResponse

from tokenfront.core.errors import RenderError
from tokenfront.core.families import ModelFamily, family_for
from tokenfront.core.harmony_output import HarmonyStream, reads_harmony
from tokenfront.core.reasoning import ReasoningStream, reasoning_ended
from tokenfront.core.render import RenderPipeline
from tokenfront.core.tool_calls import ToolCallParser
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.server.disconnect import ClientDisconnected, client_disconnected_response, unless_disconnected
from tokenfront.server.errors import APIError, error_body
from tokenfront.server.metrics import ServerMetrics
from tokenfront.server.models import check_model
from tokenfront.server.request_ids import chat_request_id, completion_request_id
from tokenfront.server.responses import JSONBytesResponse
from tokenfront.server.sse import SSE_DONE, SSE_MEDIA_TYPE, sse_event
from tokenfront.worker.engine import NO_TOKEN, Engine, GenerationRequest, SamplingParams, TokenOutput
from tokenfront.worker.streaming import (
    ChoiceText,
    ForcedToolCall,
    TextDelta,
    ToolCallHold,
)

log = logging.getLogger(__name__)

__all__ = [
    "NAMED_TOOL_WITH_IDS",
    "ChoiceRun",
    "PromptInput",
    "WorkerMetrics",
    "WorkerService",
    "chat_logprobs",
    "completion_logprobs",
    "usage_prompt_tokens",
]

# JSON has no -inf; a token the grammar forbade gets this instead, as vLLM does.
_MIN_LOGPROB = -9999.0
# Prompt ids decoded to find the reasoning mode of an id prompt: markers are a few tokens at most.
_PROMPT_TAIL_TOKENS = 16
NAMED_TOOL_WITH_IDS = (
    "named tool_choice cannot be used with prompt_token_ids: the worker must render the prompt itself to "
    "append the forced tool-call prefix; send `messages` without prompt_token_ids instead"
)


# --- metrics -----------------------------------------------------------------------------------------------


class WorkerMetrics:
    """The worker's Prometheus counters, in the app's own registry, plus the engine's stats at each scrape."""

    def __init__(self, server: ServerMetrics, engine: Engine) -> None:
        registry = server.registry
        self._server = server
        self.prompts = Counter(
            "tokenfront_worker_prompts",
            "Prompts received by the inference routes, by where their ids came from: rendered by this worker "
            "(messages / text prompts) or given as token ids (prompt_token_ids / id prompts)",
            ["route", "source"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "tokenfront_worker_prompt_tokens",
            "Prompt tokens, as usage counts them",
            ["route"],
            registry=registry,
        )
        self.cached_prompt_tokens = Counter(
            "tokenfront_worker_cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            ["route"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "tokenfront_worker_completion_tokens", "Generated tokens", ["route"], registry=registry
        )
        self.sequences = Counter(
            "tokenfront_worker_sequences",
            "Generated sequences (choices), by finish reason",
            ["route", "finish_reason"],
            registry=registry,
        )
        self.aborts = Counter(
            "tokenfront_worker_aborts",
            "Engine sequences the worker aborted, by reason (stop_string, client_disconnected, error)",
            ["reason"],
            registry=registry,
        )
        registry.register(_EngineStats(engine))

    def prompt(self, route: str, source: str, ids: Sequence[int]) -> None:
        """Count one prompt by its source; a prompt this worker rendered counts as rendered, as on a renderer."""
        self.prompts.labels(route, source).inc()
        if source == "rendered":
            self._server.rendered_prompts.labels(route).inc()
            self._server.rendered_tokens.labels(route).inc(len(ids))


class _EngineStats(Collector):
    """`engine.stats()` as gauges named `tokenfront_engine_<stat>`, read at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Any:
        for name, value in sorted(self._engine.stats().items()):
            yield GaugeMetricFamily(f"tokenfront_engine_{name}", f"engine stat {name}", value=float(value))

    def describe(self) -> list[Any]:
        return []  # stats are read at scrape time; describing them would call the engine at registration


# --- prompts -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptInput:
    """A prompt ready for the engine.

    `usage_tokens` is what `usage.prompt_tokens` reports (the family may exclude a rendered tail); `text` the
    text the ids were encoded from (None for given ids); `source` "rendered" or "token_ids".
    """

    token_ids: list[int]
    usage_tokens: int
    source: str
    text: str | None = None
    reasoning_ended: bool | None = None


def usage_prompt_tokens(
    family: ModelFamily, rendered_text: str, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str]
) -> int:
    """`usage.prompt_tokens` of a prompt the worker rendered: its length minus what the family excludes."""
    excluded = family.usage_excluded_prompt_tokens(rendered_text, token_ids, decode)
    return len(token_ids) - max(0, min(excluded, len(token_ids)))


# --- output shapes -----------------------------------------------------------------------------------------


def _logprob(value: float | None) -> float:
    return max(float(value), _MIN_LOGPROB) if value is not None else _MIN_LOGPROB


def chat_logprobs(outputs: Sequence[TokenOutput], token_text: Callable[[int], str]) -> dict[str, Any]:
    """Chat `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}`, one per token."""

    def entry(token_id: int, logprob: float | None) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": _logprob(logprob), "bytes": list(text.encode("utf-8"))}

    content = []
    for output in outputs:
        item = entry(output.token_id, output.logprob)
        item["top_logprobs"] = [entry(i, lp) for i, lp in output.top_logprobs or ()]
        content.append(item)
    return {"content": content}


def completion_logprobs(
    outputs: Sequence[TokenOutput], token_text: Callable[[int], str], *, text_offset: int = 0
) -> tuple[dict[str, Any], int]:
    """Completions `logprobs` (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`), and the next offset.

    Offsets are where each token's text starts in the choice's text, counting the tokens' own texts (as
    vLLM does); `text_offset` is where the first one starts (after an echoed prompt, after earlier chunks).
    """
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for output in outputs:
        text = token_text(output.token_id)
        tokens.append(text)
        token_logprobs.append(_logprob(output.logprob))
        top_logprobs.append({token_text(i): _logprob(lp) for i, lp in output.top_logprobs or ()} or None)
        offsets.append(text_offset)
        text_offset += len(text)
    body = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs}
    return {**body, "text_offset": offsets}, text_offset


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


# --- one engine sequence -----------------------------------------------------------------------------------


@dataclass
class ChoiceEvent:
    """What one choice adds: text, the tokens since the last event, and the finish reason on the last."""

    index: int
    delta: TextDelta
    tokens: list[TokenOutput]
    finish_reason: str | None = None


@dataclass
class ChoiceRun:
    """One engine sequence (one choice) and the text pipeline that reads it."""

    index: int
    request: GenerationRequest
    text: ChoiceText
    engine: Engine
    metrics: WorkerMetrics
    route: str
    tokens: list[TokenOutput] = field(default_factory=list)
    cached_tokens: int = 0
    finished: bool = False
    _submitted: bool = False

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        """Run the sequence; yield an event whenever there is text to show, and a last one with the reason."""
        stream = self.engine.submit(self.request)
        self._submitted = True
        outputs = stream.__aiter__()
        finish = "abort"  # an engine stream that ends without a reason was cut short
        pending: list[TokenOutput] = []
        delta = TextDelta()  # text not yet sent: the last token's goes out with the finish reason
        try:
            async for output in outputs:
                self.cached_tokens = stream.cached_tokens or 0
                if output.token_id != NO_TOKEN:  # an abort output carries no token
                    self.tokens.append(output)
                    pending.append(output)
                    delta.extend(self.text.push(output.token_id))
                if self.text.stopped:
                    self.cancel("stop_string")
                    finish = "stop"
                    break
                if output.finish_reason is not None:
                    finish = output.finish_reason
                    break
                if delta:
                    yield ChoiceEvent(self.index, delta, pending)
                    pending, delta = [], TextDelta()
        except BaseException:
            self.cancel("error")  # a no-op when the caller already cancelled it for its own reason
            raise
        finally:
            with contextlib.suppress(Exception):
                await outputs.aclose()  # type: ignore[attr-defined]
        self.finished = True
        delta.extend(self.text.finish())
        if delta.tool_calls and finish != "length":
            finish = "tool_calls"
        self.metrics.sequences.labels(self.route, finish).inc()
        yield ChoiceEvent(self.index, delta, pending, finish)

    def cancel(self, reason: str) -> None:
        """Abort the engine sequence if it is still running (stop string found, client gone, error)."""
        if self._submitted and not self.finished:
            self.finished = True
            self.engine.abort(self.request.request_id)
            self.metrics.aborts.labels(reason).inc()
            if reason == "client_disconnected":
                log.info("client disconnected: aborted %s", self.request.request_id)


@dataclass
class ChoiceResult:
    """A finished choice, for a non-streaming answer."""

    index: int
    delta: TextDelta
    tokens: list[TokenOutput]
    finish_reason: str


async def _collect(run: ChoiceRun) -> ChoiceResult:
    delta, finish = TextDelta(), "abort"
    async for event in run.events():
        delta.extend(event.delta)
        finish = event.finish_reason or finish
    return ChoiceResult(run.index, delta, run.tokens, finish)


# --- the service -------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    """Everything a request's choices share once its prompts are known."""

    request_id: str
    route: str
    model: str
    prompts: list[PromptInput]
    runs: list[ChoiceRun]
    stream: bool
    include_usage: bool
    logprobs: int | None
    echo: bool = False
    runs_per_prompt: int = 1


class WorkerService:
    """Turns OpenAI requests into engine sequences and engine output into OpenAI answers."""

    def __init__(self, pipeline: RenderPipeline, engine: Engine, metrics: WorkerMetrics) -> None:
        self.pipeline = pipeline
        self.engine = engine
        self.metrics = metrics
        self.tokenizer = pipeline.tokenizer
        self.family = family_for(pipeline.checkpoint.model_type)
        config = pipeline.checkpoint.config
        generation = pipeline.checkpoint.generation_config
        self.generation_defaults = generation
        # The engine knows the model's real limits; the config says the same for engines that do not tell.
        self.context_length: int | None = getattr(engine, "max_context", None) or _context_length(config)
        self.logits_width = int(
            getattr(engine, "vocab_size", 0) or config.get("vocab_size") or len(self.tokenizer)
        )
        # EOS ids end every sequence and are never shown: generation_config's, else config's, and the tokenizer's.
        self.eos_ids = frozenset(
            _ids(generation.get("eos_token_id", config.get("eos_token_id")))
            | _ids(getattr(self.tokenizer, "eos_token_id", None))
        )
        # gpt-oss's parsers read Harmony channels rather than markers (a start-up error if mixed with others).
        self.harmony = reads_harmony(pipeline.reasoning_parser, pipeline.tool_call_parser)
        self._guided: Any = None
        self._guided_lock = asyncio.Lock()

    # -- decoding helpers --------------------------------------------------------------------------------------

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of `ids` (special tokens dropped unless asked)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def _decode_raw(self, ids: Sequence[int]) -> str:
        return self.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """One token's text, as logprobs show it (special tokens included)."""
        return self._decode_raw([token_id])

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
        self._check_model(request.model)
        parser = self.pipeline.tool_call_parser
        forced = self._forced_tool(request, parser)
        prefix = parser.forced_call_prefix(forced) if parser is not None and forced is not None else None
        prompt = self._chat_prompt(request, forced_prefix=prefix)
        logprobs = self._chat_logprobs_count(request)
        max_tokens = request.max_completion_tokens or request.max_tokens
        params = self._sampling(request, len(prompt.token_ids), max_tokens, logprobs)
        constraint_for = await self._constraint_factory(request, forced, params.max_tokens)
        request_id = chat_request_id()
        runs = []
        for index in range(request.n or 1):
            text = self._chat_choice_text(request, prompt, forced)
            run = self._run(request_id, index, prompt, params, index, request.cache_salt, text, "chat")
            run.request.constraint = constraint_for() if constraint_for is not None else None
            runs.append(run)
        plan = _Plan(
            request_id=request_id,
            route="chat",
            model=request.model or self.pipeline.served_model_names[0],
            prompts=[prompt],
            runs=runs,
            stream=bool(request.stream),
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            logprobs=logprobs,
            runs_per_prompt=request.n or 1,
        )
        return await self._answer(plan, raw)

    def _chat_choice_text(
        self, request: ChatCompletionRequest, prompt: PromptInput, forced: str | None
    ) -> ChoiceText:
        """The text pipeline of one chat choice: reasoning split, tool-call parsing, stop strings."""
        tool_parser = self.pipeline.tool_call_parser
        if forced is not None and tool_parser is not None:
            # The output is the forced call's arguments: neither reasoning nor content.
            return self._choice_text(request.stop, tools=ForcedToolCall(tool_parser, forced))
        if self.harmony:
            # Analysis is reasoning only with a reasoning parser, calls are kept only when the request takes
            # them; neither ever becomes content (vLLM's HarmonyParser).
            channels = HarmonyStream(
                reasoning=self.pipeline.reasoning_parser is not None, tools=self._parses_tools(request)
            )
            return self._choice_text(request.stop, harmony=channels)
        reasoning = None
        if self.pipeline.reasoning_parser is not None:
            kwargs = {
                **self.pipeline.options.default_chat_template_kwargs,
                **(request.chat_template_kwargs or {}),
            }
            reasoning = ReasoningStream(
                self.pipeline.reasoning_parser,
                prompt_reasoning_ended=prompt.reasoning_ended,
                chat_template_kwargs=kwargs,
            )
        tools = ToolCallHold(tool_parser) if tool_parser is not None and self._parses_tools(request) else None
        return self._choice_text(request.stop, reasoning=reasoning, tools=tools)

    def _forced_tool(self, request: ChatCompletionRequest, parser: ToolCallParser | None) -> str | None:
        name = request.named_tool
        if name is None:
            return None
        if request.prompt_token_ids is not None:
            raise APIError(400, NAMED_TOOL_WITH_IDS, param="tool_choice", code="named_tool_choice_with_ids")
        if parser is None:
            raise APIError(
                400,
                "a named tool_choice needs a tool-call parser to force the call: start the worker with "
                "--tool-call-parser (e.g. hermes), or use tool_choice auto",
                param="tool_choice",
            )
        if not any(tool.function.name == name for tool in request.tools or ()):
            raise APIError(
                400,
                f"tool_choice names the function {name!r}, which is not among the request's tools",
                param="tool_choice",
            )
        return name

    def _parses_tools(self, request: ChatCompletionRequest) -> bool:
        # "required" is read like "auto": the output is parsed, but not constrained to contain a call.
        return (
            self.pipeline.tool_call_parser is not None
            and bool(request.tools)
            and request.tool_choice != "none"
        )

    async def _constraint_factory(
        self, request: ChatCompletionRequest, forced: str | None, max_tokens: int
    ) -> Callable[[], Any] | None:
        """Builds each choice's grammar for a forced call: the tool's schema, closed within `max_tokens`."""
        if forced is None:
            return None
        tool = next(t for t in request.tools or () if t.function.name == forced)
        guided = await self.guided()
        schema = tool.function.parameters
        guided.json_schema(schema)  # compile now: an invalid schema is a 400 before anything is submitted
        return lambda: guided.json_schema(schema, max_tokens=max_tokens)

    def _chat_prompt(self, request: ChatCompletionRequest, *, forced_prefix: str | None) -> PromptInput:
        parser = self.pipeline.reasoning_parser
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            self._check_ids(ids, "prompt_token_ids")
            self.metrics.prompt("chat", "token_ids", ids)
            ended = None
            if parser is not None and parser.reads_mode_from_prompt:
                # Only the tail tells the mode: decode the last few ids (special tokens are markers too).
                ended = reasoning_ended(parser, self._decode_raw(ids[-_PROMPT_TAIL_TOKENS:]))
            return PromptInput(ids, len(ids), "token_ids", reasoning_ended=ended)
        rendered = self.pipeline.render_chat(request)
        self.metrics.prompt("chat", "rendered", rendered.token_ids)
        text = rendered.prompt_text or ""
        ids = rendered.token_ids
        if forced_prefix is not None:
            # The prefix is appended to the rendered *text* and the whole is encoded as one string with the
            # pipeline's tokenizer backend, so token boundaries are those the template would give had it
            # written the prefix itself (encoding the prefix alone and concatenating ids could differ).
            text += forced_prefix
            ids = self._encode(text, add_special_tokens=bool(request.add_special_tokens))
            keep = request.truncate_prompt_tokens
            if keep is not None and keep > 0:
                ids = ids[-keep:]
        usage = usage_prompt_tokens(self.family, text, ids, self._decode_raw)
        ended = rendered.reasoning_ended if parser is not None and parser.reads_mode_from_prompt else None
        return PromptInput(ids, usage, "rendered", text=text, reasoning_ended=ended)

    def _chat_logprobs_count(self, request: ChatCompletionRequest) -> int | None:
        if request.top_logprobs and not request.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
        return (request.top_logprobs or 0) if request.logprobs else None

    # -- completions -------------------------------------------------------------------------------------------

    async def completion(
        self, request: CompletionRequest, raw: Request
    ) -> JSONBytesResponse | StreamingResponse:
        """POST /v1/completions."""
        self._check_model(request.model)
        if request.echo and request.logprobs is not None:
            raise APIError(
                400, "echo with logprobs is not supported (prompt logprobs are not computed)", param="echo"
            )
        items = self.pipeline.render_completion(request)
        prompts = []
        for item in items:
            source = "token_ids" if item.prompt_text is None else "rendered"
            self.metrics.prompt("completion", source, item.token_ids)
            prompt_text = self.decode(item.token_ids) if item.prompt_text is None else item.prompt_text
            prompts.append(PromptInput(item.token_ids, len(item.token_ids), source, prompt_text))
        n = request.n or 1
        request_id = completion_request_id()
        runs = []
        for prompt_index, prompt in enumerate(prompts):
            params = self._sampling(request, len(prompt.token_ids), request.max_tokens, request.logprobs)
            for offset in range(n):
                index = prompt_index * n + offset
                text = self._choice_text(request.stop)
                runs.append(
                    self._run(
                        request_id, index, prompt, params, offset, request.cache_salt, text, "completion"
                    )
                )
        plan = _Plan(
            request_id=request_id,
            route="completion",
            model=request.model or self.pipeline.served_model_names[0],
            prompts=prompts,
            runs=runs,
            stream=bool(request.stream),
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            logprobs=request.logprobs,
            echo=bool(request.echo),
            runs_per_prompt=n,
        )
        return await self._answer(plan, raw)

    # -- shared ------------------------------------------------------------------------------------------------

    def _check_model(self, model: str | None) -> None:
        check_model(model, self.pipeline.served_model_names)

    def _check_ids(self, ids: list[int], param: str) -> None:
        if not ids:
            raise APIError(400, f"{param} is empty: send at least one token id", param=param)
        self.pipeline.validate_token_ids(ids, param=param)

    def _encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        try:
            return self.pipeline.backend.encode(text, add_special_tokens=add_special_tokens)
        except Exception as exc:  # the client's text; never a 500
            raise RenderError(f"the tokenizer could not encode the prompt ({exc})", param="messages") from exc

    def _choice_text(
        self,
        stop: str | list[str] | None,
        *,
        reasoning: ReasoningStream | None = None,
        tools: ToolCallHold | ForcedToolCall | None = None,
        harmony: HarmonyStream | None = None,
    ) -> ChoiceText:
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        # Tool-call markers may be special tokens (vLLM's hermes parser keeps them the same way), as are
        # Harmony's and some reasoning markers ([THINK]).
        raw = (
            tools is not None
            or harmony is not None
            or (reasoning is not None and reasoning.parser.markers_are_special_tokens)
        )
        decode = self._decode_raw if raw else self.decode
        return ChoiceText(
            decode, hidden_ids=self.eos_ids, stop=stops, reasoning=reasoning, tools=tools, harmony=harmony
        )

    def _sampling(
        self, request: Any, prompt_length: int, max_tokens: int | None, logprobs: int | None
    ) -> SamplingParams:
        """Sampling parameters: the request's, else generation_config.json's, else neutral (vLLM's order)."""
        defaults = self.generation_defaults
        top_k = request.top_k if request.top_k is not None else defaults.get("top_k", -1)
        if not isinstance(top_k, int) or (top_k < -1):
            raise APIError(400, "top_k must be -1 or 0 (off) or a positive number of tokens", param="top_k")
        return SamplingParams(
            max_tokens=self._max_tokens(prompt_length, max_tokens),
            temperature=_first(request.temperature, defaults.get("temperature"), 1.0),
            top_p=_first(request.top_p, defaults.get("top_p"), 1.0),
            top_k=top_k if top_k > 0 else -1,
            seed=request.seed,
            stop_token_ids=frozenset(request.stop_token_ids or ()) | self.eos_ids,
            logprobs=logprobs,
        )

    def _max_tokens(self, prompt_length: int, requested: int | None) -> int:
        limit = self.context_length
        if limit is None:
            room = None
        else:
            room = limit - prompt_length
            if room < 1:
                raise APIError(
                    400,
                    f"the prompt is {prompt_length} tokens, which leaves no room to generate in this model's "
                    f"context of {limit} tokens; shorten the prompt",
                    param="messages",
                    code="context_length_exceeded",
                )
        if requested is not None:
            if room is not None and requested > room:
                raise APIError(
                    400,
                    f"this model's context is {limit} tokens; the prompt takes {prompt_length}, so at most "
                    f"{room} tokens can be generated, and {requested} were requested: lower max_tokens",
                    param="max_tokens",
                    code="context_length_exceeded",
                )
            return requested
        default = self.generation_defaults.get("max_new_tokens")
        candidates = [value for value in (room, default) if isinstance(value, int) and value > 0]
        if not candidates:
            raise APIError(400, "this model has no known context length: send max_tokens", param="max_tokens")
        return min(candidates)

    def _run(
        self,
        request_id: str,
        index: int,
        prompt: PromptInput,
        params: SamplingParams,
        seed_offset: int,
        cache_salt: str | None,
        text: ChoiceText,
        route: str,
    ) -> ChoiceRun:
        if params.seed is not None and seed_offset:
            # n choices of one seeded request differ, yet the request stays reproducible.
            params = SamplingParams(**{**params.__dict__, "seed": params.seed + seed_offset})
        generation = GenerationRequest(f"{request_id}-{index}", prompt.token_ids, params, cache_salt)
        return ChoiceRun(index, generation, text, self.engine, self.metrics, route)

    async def _answer(self, plan: _Plan, raw: Request) -> JSONBytesResponse | StreamingResponse:
        for prompt in plan.prompts:
            self.metrics.prompt_tokens.labels(plan.route).inc(prompt.usage_tokens)
        if plan.stream:
            return StreamingResponse(self._sse(plan), media_type=SSE_MEDIA_TYPE)

        def abort_runs() -> None:
            for run in plan.runs:
                run.cancel("client_disconnected")

        work = asyncio.gather(*(_collect(run) for run in plan.runs))
        try:
            results = await unless_disconnected(work, raw, on_disconnect=abort_runs)
        except ClientDisconnected:
            return client_disconnected_response()
        except ValueError as exc:  # the engine refused a sequence it cannot run
            raise APIError(400, str(exc)) from exc
        finally:
            for run in plan.runs:
                run.cancel("error")
        self._count_usage(plan)
        return JSONBytesResponse(self._full_response(plan, results))

    # -- non-streaming answer ----------------------------------------------------------------------------------

    def _full_response(self, plan: _Plan, results: list[ChoiceResult]) -> dict[str, Any]:
        choices = [self._full_choice(plan, result) for result in sorted(results, key=lambda r: r.index)]
        return {
            "id": plan.request_id,
            "object": "chat.completion" if plan.route == "chat" else "text_completion",
            "created": int(time.time()),
            "model": plan.model,
            "choices": choices,
            "usage": self._usage(plan),
        }

    def _full_choice(self, plan: _Plan, result: ChoiceResult) -> dict[str, Any]:
        if plan.route == "chat":
            message: dict[str, Any] = {
                "role": "assistant",
                # null when the answer is all calls or all reasoning, as vLLM answers; else a string.
                "content": result.delta.content
                or (None if result.delta.tool_calls or result.delta.reasoning else ""),
                "tool_calls": [call.to_openai() for call in result.delta.tool_calls],
            }
            if self.pipeline.reasoning_parser is not None:
                message["reasoning_content"] = result.delta.reasoning or None
            logprobs = chat_logprobs(result.tokens, self.token_text) if plan.logprobs is not None else None
            return {
                "index": result.index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": result.finish_reason,
            }
        prefix = self._echo(plan, result.index)
        logprobs = None
        if plan.logprobs is not None:
            logprobs, _ = completion_logprobs(result.tokens, self.token_text, text_offset=len(prefix))
        return {
            "index": result.index,
            "text": prefix + result.delta.content,
            "logprobs": logprobs,
            "finish_reason": result.finish_reason,
        }

    def _echo(self, plan: _Plan, index: int) -> str:
        if not plan.echo:
            return ""
        return plan.prompts[index // plan.runs_per_prompt].text or ""

    def _usage(self, plan: _Plan) -> dict[str, Any]:
        prompt_tokens = sum(p.usage_tokens for p in plan.prompts)
        completion_tokens = sum(len(run.tokens) for run in plan.runs)
        # One count per prompt, from its first choice (its other choices may reuse what the first computed).
        cached = sum(run.cached_tokens for run in plan.runs[:: plan.runs_per_prompt])
        return _usage(prompt_tokens, completion_tokens, cached)

    def _count_usage(self, plan: _Plan) -> None:
        self.metrics.completion_tokens.labels(plan.route).inc(sum(len(run.tokens) for run in plan.runs))
        cached = sum(run.cached_tokens for run in plan.runs[:: plan.runs_per_prompt])
        self.metrics.cached_prompt_tokens.labels(plan.route).inc(cached)

    # -- streaming answer --------------------------------------------------------------------------------------

    async def _sse(self, plan: _Plan) -> AsyncIterator[bytes]:
        """The event stream of a request: chunks as choices produce text, then usage, then [DONE]."""
        queue: asyncio.Queue[ChoiceEvent | BaseException] = asyncio.Queue()
        created = int(time.time())
        offsets = {run.index: len(self._echo(plan, run.index)) for run in plan.runs}

        async def pump(run: ChoiceRun) -> None:
            try:
                async for event in run.events():
                    await queue.put(event)
            except BaseException as exc:  # handed to the generator, which reports it in the stream
                await queue.put(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise

        tasks: list[asyncio.Task[None]] = []
        try:
            for run in plan.runs:
                yield sse_event(self._first_chunk(plan, run.index, created))
            tasks = [asyncio.create_task(pump(run)) for run in plan.runs]
            remaining = len(plan.runs)
            while remaining:
                item = await queue.get()
                if isinstance(item, BaseException):
                    # Headers are sent: the error can only be reported in the stream itself.
                    yield sse_event(_stream_error(plan.request_id, item))
                    break
                if item.finish_reason is not None:
                    remaining -= 1
                chunk, offsets[item.index] = self._chunk(plan, item, created, offsets[item.index])
                if chunk is not None:
                    yield sse_event(chunk)
            else:
                self._count_usage(plan)
                if plan.include_usage:
                    yield sse_event(self._envelope(plan, created, [], usage=self._usage(plan)))
            yield SSE_DONE
        finally:
            # Reached on completion, on an error, and when the client disconnects (the generator is cancelled).
            disconnected = any(not run.finished for run in plan.runs)
            for run in plan.runs:
                run.cancel("client_disconnected")
            for task in tasks:
                task.cancel()
            if disconnected:
                log.info("stream %s ended before its choices finished", plan.request_id)

    def _envelope(
        self, plan: _Plan, created: int, choices: list[dict[str, Any]], usage: Any = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": plan.request_id,
            "object": "chat.completion.chunk" if plan.route == "chat" else "text_completion",
            "created": created,
            "model": plan.model,
            "choices": choices,
        }
        if plan.include_usage:
            body["usage"] = usage  # null on every chunk but the last, as OpenAI sends it
        return body

    def _first_chunk(self, plan: _Plan, index: int, created: int) -> dict[str, Any]:
        if plan.route == "chat":
            choice = {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        else:
            choice = {
                "index": index,
                "text": self._echo(plan, index),
                "logprobs": None,
                "finish_reason": None,
            }
        return self._envelope(plan, created, [choice])

    def _chunk(
        self, plan: _Plan, event: ChoiceEvent, created: int, offset: int
    ) -> tuple[dict[str, Any] | None, int]:
        delta = event.delta
        if not delta and event.finish_reason is None and not event.tokens:
            return None, offset
        if plan.route == "chat":
            body: dict[str, Any] = {}
            if delta.reasoning:
                body["reasoning_content"] = delta.reasoning
            if delta.content:
                body["content"] = delta.content
            if delta.tool_calls:
                body["tool_calls"] = [
                    {"index": i, **call.to_openai()} for i, call in enumerate(delta.tool_calls)
                ]
            logprobs = chat_logprobs(event.tokens, self.token_text) if plan.logprobs is not None else None
            choice = {
                "index": event.index,
                "delta": body,
                "logprobs": logprobs,
                "finish_reason": event.finish_reason,
            }
        else:
            logprobs = None
            if plan.logprobs is not None:
                logprobs, offset = completion_logprobs(event.tokens, self.token_text, text_offset=offset)
            choice = {
                "index": event.index,
                "text": delta.content,
                "logprobs": logprobs,
                "finish_reason": event.finish_reason,
            }
        return self._envelope(plan, created, [choice]), offset


def _stream_error(request_id: str, error: BaseException) -> dict[str, Any]:
    """The error event of a stream whose generation failed after the response started."""
    if isinstance(error, ValueError):  # the engine refused the sequence: the request's fault
        return error_body(str(error), error_type="invalid_request_error")
    log.error("generation failed for %s: %r", request_id, error)
    return error_body("generation failed; the worker log has the details", error_type="server_error")


def _first(*values: Any) -> Any:
    return next(value for value in values if value is not None)


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value if isinstance(v, int)}


def _context_length(config: dict[str, Any]) -> int | None:
    text_config = config.get("text_config") or {}
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        for source in (config, text_config):
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None

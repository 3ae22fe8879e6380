"""The router's proxying: render a request, choose a worker, send it, retry elsewhere when a worker fails.

For each chat or completions request the `Proxy`

1. picks the router's model its `model` names (`router.model_group`: a 404 `model_not_found` for a name no
   model has) and renders it with that model's `RenderPipeline` (the one the renderer and the workers use) to
   get the prompt ids — a render error is the client's 400, answered as the renderer answers it; the wait is bounded
   (`bounded_render`: `--render-timeout`, in this process or in `--render-processes` render processes), and a
   render that is late or fails for a reason not the client's sends the body as the client sent it, routed by
   load alone;
2. decides what goes to the worker (a `Plan`): the body with the router's ids (chat: `prompt_token_ids`;
   completions: the ids as `prompt`) when the gate is open and the request is not one of the never-forwarded
   kinds, else the original body byte for byte;
3. asks the model's policy for a worker among that model's active ones and sends the body on that worker's connection pool —
   to a `protocol=generate` worker, a forwarded request goes as vLLM's tokens-in, tokens-out call instead
   (`router.generate`: the ids to `/inference/v1/generate`, the output ids derendered into the OpenAI
   answer, a stream chunk by chunk), and one the generate path cannot carry as the client sent it;
4. retries on another worker when the chosen one fails before the client got a byte: a connection error, a
   timeout, a 5xx answer, an answer that is not what the route answers (`worker_answers`: not JSON, no
   `choices`, not an event stream), or a stream that breaks before its first event. A worker that failed so is
   taken out of the active set (the pool re-checks it at once, and puts it back when it answers its checks).
   Worker 4xx answers with a JSON body are the client's and pass through; when every worker failed, the
   client gets the last failure's error: 503 `no_worker`, 502 `bad_worker_response`, 504 `worker_timeout`;
5. answers with the worker's response — a stream is relayed event by event as it arrives, never buffered —
   plus `x-tokenfront-worker` (which worker served) and `x-tokenfront-forwarded` (true/false).

Every wait for a worker is bounded (`PoolSettings`): a stream's head and first event by `--first-byte-timeout`
(the worker's queue and prefill), a whole answer by `--request-timeout` (a worker sends its head only once the
answer is generated), and every silence after the head by `--idle-timeout`; a whole answer's size by
`--max-response-bytes`, a stream's by the same bytes and by an event budget from the request's `n` x
`max_tokens` (x prompts). A stream that fails after the client got its first event (the worker stalls, breaks
the event format, ends before `[DONE]`, goes over a bound, or its connection breaks) ends with an error event
and `data: [DONE]`; a whole answer over the size bound is a 502 `worker_response_too_large`, not retried.

Sending is the router's per-request overhead, so it is kept short: the worker's connection comes from its
`WorkerConnections` pool (a request written in one piece, the answer parsed as it arrives), and the two events
that end a wait early — the client leaving (answered 499, the worker's request closed so that it stops
generating) and a health check finding the worker gone (retried elsewhere) — cancel the request's own task
through one `_Interrupt`, rather than racing a task against every await.

Completions with several prompts go to one worker as one request (routed by the first prompt's ids, the ids
forwarded as a list of id lists), so the answer keeps its shape; with `echo` they are never forwarded (the
worker would echo decoded ids, not the client's text).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import Receive, Scope, Send

from tokenfront.core.reasoning import ReasoningParser
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.router.bounded_render import BoundedRender, RenderOutcome, RenderSettings
from tokenfront.router.connections import (
    AnswerTooLarge,
    BadAnswer,
    ReadTimeout,
    WorkerResponse,
    WorkerTransportError,
    WriteTimeout,
    describe_error,
)
from tokenfront.router.gate import ForwardingGate, never_forward_reason
from tokenfront.router.generate import (
    GENERATE_PATH,
    GenerateCall,
    GenerateStream,
    Reading,
    chat_call,
    completion_call,
)
from tokenfront.router.model_group import ModelGroup, ModelGroups
from tokenfront.router.policies.base import Policy, RouteRequest, Routing, WorkerLoad
from tokenfront.router.render_step import with_field
from tokenfront.router.routing_metrics import RoutingMetrics, answer_usage
from tokenfront.router.worker import Worker
from tokenfront.router.worker_answers import (
    AnswerBounds,
    EventReader,
    RelayedStream,
    check_answer,
    parse_answer,
    stream_event_budget,
)
from tokenfront.router.worker_pool import WorkerPool
from tokenfront.server.disconnect import client_disconnected_response, wait_for_disconnect
from tokenfront.server.errors import APIError, error_body
from tokenfront.server.lean_routes import raw_body as request_body
from tokenfront.server.request_ids import current_request_id
from tokenfront.server.sse import SSE_DONE, sse_event
from tokenfront.server.tracing import PROMPT_TOKENS, Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from tokenfront.router.replica_sync import ReplicaSync

log = logging.getLogger(__name__)

WORKER_HEADER = "x-tokenfront-worker"
FORWARDED_HEADER = "x-tokenfront-forwarded"
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
# Worker response headers a client may care about; hop-by-hop and length headers are the router's own.
_PASSED_HEADERS = ("content-type", "x-request-id")
BAD_WORKER_RESPONSE_CODE = "bad_worker_response"
WORKER_TIMEOUT_CODE = "worker_timeout"
WORKER_RESPONSE_TOO_LARGE_CODE = "worker_response_too_large"
NO_WORKER_CODE = "no_worker"


class RouterMetrics:
    """The router's Prometheus metrics, in the app's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "tokenfront_router_requests",
            "Requests answered by a worker, by route, worker and whether the router's ids were forwarded",
            ["route", "worker", "forwarded"],
            registry=registry,
        )
        self.not_forwarded = Counter(
            "tokenfront_router_not_forwarded",
            "Requests sent as the client sent them, by reason (gate, named_tool_choice, model_family, "
            "reasoning_mode, client_token_ids, echo, no_render, render_late, render_failed, "
            "generate_unsupported)",
            ["reason"],
            registry=registry,
        )
        self.renders = Counter(
            "tokenfront_router_renders",
            "Renders for routing, by outcome: ok, invalid (the client's 400), late (not done within "
            "--render-timeout) and failed (not the client's fault); late and failed ones are routed by load",
            ["outcome"],
            registry=registry,
        )
        self.render_seconds = Histogram(
            "tokenfront_router_render_seconds",
            "Seconds from asking for a render to its answer, queue included (late renders are not timed)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self.render_processes_replaced = Counter(
            "tokenfront_router_render_processes_replaced",
            "Render processes (--render-processes) that died and were replaced",
            registry=registry,
        )
        self.retries = Counter(
            "tokenfront_router_retries",
            "Attempts that failed before the client saw a byte and were retried on another worker",
            ["worker"],
            registry=registry,
        )
        self.forwarding = Gauge(
            "tokenfront_router_forwarding",
            "1 when the gate lets rendered ids go to workers (on a router of several models: every model's)",
            registry=registry,
        )
        self.model_forwarding = Gauge(
            "tokenfront_router_model_forwarding",
            "1 when the model's gate lets rendered ids go to its workers, by model (its first served name)",
            ["model"],
            registry=registry,
        )
        self.active_workers = Gauge(
            "tokenfront_router_active_workers", "Workers in the active set", registry=registry
        )


@dataclass(frozen=True)
class Plan:
    """What to send for one client request, and how to route it.

    `body` goes to an OpenAI route (`path`): with the router's ids when `forwarded`, else as the client sent
    it (`raw_body`). A forwarded plan also carries its `generate` call for `protocol=generate` workers (None
    when the generate path cannot carry the request, or no such worker is configured: such a worker then
    gets `raw_body` on its OpenAI route).
    """

    route: str  # "chat" or "completion"
    path: str
    body: bytes
    target: RouteRequest
    forwarded: bool
    stream: bool
    reason: str | None = None  # why the router's ids were not forwarded
    raw_body: bytes = b""
    generate: GenerateCall | None = None
    model: str | None = None  # the model the client named: only workers serving it are chosen
    max_events: int | None = None  # a stream's event budget (`worker_answers.stream_event_budget`)
    # The router's model it goes to (`router.model_group`): only that model's workers are chosen, by its
    # policy. None: the router's first model.
    group: ModelGroup | None = None

    def call_for(self, worker: Worker) -> _Call:
        """What this worker is sent: the generate call, the body with ids, or the client's body."""
        if worker.protocol != "generate" or not self.forwarded:
            return _Call(self.path, self.body, self.forwarded)
        if self.generate is None:
            return _Call(self.path, self.raw_body, False)
        tokenfront = worker.report is not None and worker.report.role == "worker"
        body = self.generate.body_for(tokenfront=tokenfront)
        return _Call(GENERATE_PATH, body, True, self.generate.reading())


@dataclass(frozen=True)
class _Call:
    """One attempt's request: where it goes, its body, whether it carries the router's ids, and for a
    generate worker how the output ids are read."""

    path: str
    body: bytes
    forwarded: bool
    reading: Reading | None = None


@dataclass(frozen=True)
class _Failure:
    """An attempt that failed before the client saw anything: retry elsewhere (unless `final`)."""

    reason: str
    response: Response | None = None  # a worker's 5xx, answered if every worker fails
    status: int = 503  # the client's error when this is the last failure
    code: str = NO_WORKER_CODE
    final: bool = False  # answered at once, not retried (another worker would answer as much)


class Proxy:
    """Plans, routes and relays chat and completions requests."""

    def __init__(
        self,
        *,
        pipeline: RenderPipeline | None,
        pool: WorkerPool,
        gate: ForwardingGate,
        policy: Policy,
        metrics: RouterMetrics,
        served_model_names: Sequence[str],
        render: RenderSettings | None = None,
        routing_metrics: RoutingMetrics | None = None,
        tracing: Tracing | None = None,
        groups: ModelGroups | None = None,
    ) -> None:
        """`groups`: the router's models (`router.model_group`); None: one model, made of `pipeline`, `gate`,
        `policy` and `served_model_names` (the other arguments are then the first model's)."""
        self.groups = groups or ModelGroups(
            [
                ModelGroup.build(
                    pipeline,
                    served_model_names=served_model_names,
                    policy=policy,
                    render=render or RenderSettings(),
                    renders=metrics.renders,
                    render_seconds=metrics.render_seconds,
                    name_in_logs=False,
                    gate=gate,
                )
            ]
        )
        # With it: `render`, `route` and a client span per worker call, whose context goes on in `traceparent`.
        self.tracing = tracing
        self.pool = pool
        # Other router replicas told of each request routed, started and ended (`router.replica_sync`); None:
        # this router is alone, or does not share its load.
        self.sync: ReplicaSync | None = None
        self.metrics = metrics
        # The app registers them with its registry (router.app); a proxy built alone keeps them to itself.
        self.routing_metrics = routing_metrics or RoutingMetrics(
            CollectorRegistry(), self.groups.default.policy, pool, self.groups.policy_of
        )
        # The request counter's children by (route, worker, forwarded): `labels()` costs more than `inc()`.
        self._served: dict[tuple[str, str, bool], Any] = {}

    # The first model's parts: a single-model router's only ones (`/server_info`'s top-level fields).

    @property
    def pipeline(self) -> RenderPipeline | None:
        return self.groups.default.pipeline

    @property
    def gate(self) -> ForwardingGate:
        return self.groups.default.gate

    @property
    def policy(self) -> Policy:
        return self.groups.default.policy

    @property
    def renders(self) -> BoundedRender | None:
        return self.groups.default.renders

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return self.groups.default.served_model_names

    # -- plans -----------------------------------------------------------------------------------------------

    async def plan_chat(self, request: ChatCompletionRequest, raw: Request) -> Plan:
        """Render a chat request (whose body `raw` read) with its model's pipeline and decide what goes to the
        worker; a 404 `model_not_found` when no model of the router's has the name it gives."""
        group = self.groups.for_request(request.model)
        raw_body = request_body(raw)
        stream, salt = bool(request.stream), request.cache_salt
        budget = self._event_budget(group, request, request.max_completion_tokens or request.max_tokens, 1)
        if request.prompt_token_ids is not None:
            # The client rendered it: route by its ids, send them as they are.
            target = RouteRequest(list(request.prompt_token_ids), cache_salt=salt)
            return self._unchanged(
                group, "chat", CHAT_PATH, raw_body, target, stream, "client_token_ids", request.model, budget
            )
        outcome = await self._render(group, raw, request, with_body=request.named_tool is None)
        if outcome.rendered is None or outcome.rendered.prompts is None:
            target, why = RouteRequest(None, salt), outcome.reason or "no_render"
            return self._unchanged(
                group, "chat", CHAT_PATH, raw_body, target, stream, why, request.model, budget
            )
        (rendered,) = outcome.rendered.prompts
        target = RouteRequest(rendered.token_ids, cache_salt=salt)
        reason = self._never_forward(
            group, request.named_tool is not None, [rendered.prompt_text]
        ) or self._gate_reason(group)
        if reason is not None:
            return self._unchanged(
                group, "chat", CHAT_PATH, raw_body, target, stream, reason, request.model, budget
            )
        body = outcome.rendered.forwarded_body or with_field(raw_body, "prompt_token_ids", rendered.token_ids)
        build = functools.partial(chat_call, request=request, rendered=rendered)
        return self._forwarded(
            group, "chat", CHAT_PATH, body, raw_body, target, stream, request.model, build, budget
        )

    async def plan_completion(self, request: CompletionRequest, raw: Request) -> Plan:
        """Render a completions request (every prompt; whose body `raw` read) and decide what goes to the
        worker, as `plan_chat` does."""
        group = self.groups.for_request(request.model)
        raw_body = request_body(raw)
        stream, salt = bool(request.stream), request.cache_salt
        budget = self._event_budget(group, request, request.max_tokens, request.prompt_count)
        outcome = await self._render(group, raw, request, with_body=not request.echo)
        if outcome.rendered is None or outcome.rendered.prompts is None:
            return self._unchanged(
                group,
                "completion",
                COMPLETIONS_PATH,
                raw_body,
                RouteRequest(None, salt),
                stream,
                outcome.reason or "no_render",
                request.model,
                budget,
            )
        items = outcome.rendered.prompts
        target = RouteRequest(items[0].token_ids, cache_salt=salt)
        texts = [item.prompt_text for item in items]
        if all(text is None for text in texts):
            reason: str | None = "client_token_ids"
        elif request.echo:
            reason = "echo"
        else:
            reason = self._never_forward(group, False, texts) or self._gate_reason(group)
        if reason is not None:
            return self._unchanged(
                group, "completion", COMPLETIONS_PATH, raw_body, target, stream, reason, request.model, budget
            )
        body = outcome.rendered.forwarded_body
        if body is None:
            prompt = items[0].token_ids if len(items) == 1 else [item.token_ids for item in items]
            body = with_field(raw_body, "prompt", prompt)
        build = functools.partial(completion_call, request=request, items=items)
        return self._forwarded(
            group,
            "completion",
            COMPLETIONS_PATH,
            body,
            raw_body,
            target,
            stream,
            request.model,
            build,
            budget,
        )

    @staticmethod
    def _event_budget(
        group: ModelGroup,
        request: ChatCompletionRequest | CompletionRequest,
        max_tokens: int | None,
        prompts: int,
    ) -> int | None:
        """A stream's event budget: its choices (`n` x prompts) of at most `max_tokens` each, or of the
        model's context when the request sets no max_tokens (None when that is unknown too)."""
        if not request.stream:
            return None
        tokens = max_tokens if max_tokens is not None else group.context_tokens
        return stream_event_budget((request.n or 1) * prompts, tokens)

    def _forwarded(
        self,
        group: ModelGroup,
        route: str,
        path: str,
        body: bytes,
        raw_body: bytes,
        target: RouteRequest,
        stream: bool,
        model: str | None,
        build: Callable[[RenderPipeline], GenerateCall | None],
        max_events: int | None,
    ) -> Plan:
        """A plan carrying the router's ids; its generate call is built only when a worker speaks that
        protocol."""
        call = None
        if group.pipeline is not None and any(w.protocol == "generate" for w in self.pool.workers.values()):
            call = build(group.pipeline)
        return Plan(
            route,
            path,
            body,
            target,
            True,
            stream,
            raw_body=raw_body,
            generate=call,
            model=model,
            max_events=max_events,
            group=group,
        )

    async def _render(
        self,
        group: ModelGroup,
        raw: Request,
        request: ChatCompletionRequest | CompletionRequest,
        *,
        with_body: bool,
    ) -> RenderOutcome:
        """The render a plan routes by, with its model's pipeline, bounded by --render-timeout
        (`bounded_render`). `with_body`: the forwarded body is built with it, when the model's gate is open and
        the request may be forwarded."""
        renders = group.renders
        if renders is None:
            return RenderOutcome(None, "no_render")
        with_body = with_body and group.gate.state.forwarding
        if self.tracing is None:
            return await renders.render(raw, request, with_body=with_body)
        with self.tracing.span("render") as span:
            outcome = await renders.render(raw, request, with_body=with_body)
            span.set_attributes(_render_span(outcome))
        return outcome

    def _unchanged(
        self,
        group: ModelGroup,
        route: str,
        path: str,
        body: bytes,
        target: RouteRequest,
        stream: bool,
        reason: str,
        model: str | None,
        max_events: int | None,
    ) -> Plan:
        self.metrics.not_forwarded.labels(reason).inc()
        return Plan(
            route,
            path,
            body,
            target,
            forwarded=False,
            stream=stream,
            reason=reason,
            model=model,
            max_events=max_events,
            group=group,
        )

    @staticmethod
    def _gate_reason(group: ModelGroup) -> str | None:
        return None if group.gate.state.forwarding else "gate"

    def _never_forward(self, group: ModelGroup, named_tool: bool, texts: Sequence[str | None]) -> str | None:
        parsers = self._prompt_mode_parsers(group)
        family = group.family
        for text in texts:
            reason = never_forward_reason(
                named_tool_choice=named_tool,
                family_never_forwards=family.never_forward_ids,
                family=family.name,
                prompt_text=text,
                prompt_mode_parsers=parsers,
            )
            if reason is not None:
                return reason
        return None

    def _prompt_mode_parsers(self, group: ModelGroup) -> list[ReasoningParser]:
        """The parsers, here and on the model's active workers, that read the reasoning mode from the prompt."""
        own = group.own_prompt_parser
        found = {own.name: own} if own is not None else {}
        for worker in self.groups.members(self.pool, group):
            parser = worker.report.prompt_mode_parser if worker.report else None
            if parser is not None:
                found.setdefault(parser.name, parser)
        return list(found.values())

    # -- sending ---------------------------------------------------------------------------------------------

    async def send_watching(self, plan: Plan, raw: Request) -> Response:
        """`send`, abandoned (and the worker's request closed) when the client goes away first: then 499."""
        interrupt = _Interrupt()
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(raw.receive, interrupt))
        try:
            return await self.send(plan, interrupt)
        except _ClientLeft:
            return client_disconnected_response()
        except asyncio.CancelledError:
            if interrupt.take() == "client":  # it came outside an attempt (no worker was waited for)
                return client_disconnected_response()
            raise
        finally:
            interrupt.disarm()
            watcher.cancel()

    async def send(self, plan: Plan, interrupt: _Interrupt | None = None) -> Response:
        """Send the plan to a worker the policy chooses; on a failure before any byte, to another one."""
        interrupt = interrupt or _Interrupt()
        tried: set[str] = set()
        failures: list[str] = []
        fallback: Response | None = None
        last: _Failure | None = None
        while (choice := self._choose(plan, tried)) is not None:
            if interrupt.left:
                raise _ClientLeft  # while a lost worker's attempt was being given up
            worker, load, decision = choice
            tried.add(worker.url)
            call = plan.call_for(worker)
            if self.tracing is None:
                outcome = await self._attempt(worker, load, plan, call, interrupt, decision)
            else:
                outcome = await self._traced_attempt(
                    self.tracing, worker, load, plan, call, interrupt, decision
                )
            if isinstance(outcome, Response):
                return outcome
            if outcome.final:
                log.warning("request to %s failed: %s", worker.url, outcome.reason)
                raise APIError(
                    outcome.status,
                    f"the worker {worker.url} {outcome.reason}; nothing of it was relayed",
                    code=outcome.code,
                    error_type="server_error",
                )
            failures.append(f"{worker.url}: {outcome.reason}")
            fallback = outcome.response or fallback
            last = outcome
            self.metrics.retries.labels(worker.url).inc()
            log.warning(
                "request to %s failed before any byte was answered (%s); trying another worker",
                worker.url,
                outcome.reason,
            )
        if fallback is not None:
            return fallback
        if last is not None:
            raise APIError(
                last.status,
                "every worker failed this request: " + "; ".join(failures),
                code=last.code,
                error_type="service_unavailable" if last.status == 503 else "server_error",
            )
        if plan.model is not None and self.pool.active():
            raise APIError(
                503,
                f"no active worker serves the model {plan.model!r}: the workers serve other names (GET /workers "
                "shows each one's served_model_names)",
                code=NO_WORKER_CODE,
            )
        raise APIError(
            503,
            "no worker is available: none is configured or every one is failing its health checks "
            "(GET /workers shows why)",
            code=NO_WORKER_CODE,
        )

    def policy_for(self, plan: Plan) -> Policy:
        """The policy of the plan's model."""
        return (plan.group or self.groups.default).policy

    def _choose(self, plan: Plan, tried: set[str]) -> tuple[Worker, WorkerLoad, _Decision] | None:
        group = plan.group or self.groups.default
        candidates = self.groups.candidates(self.pool, group, plan.model)
        if tried:  # a retry: not the workers that failed this request (a first try has a pass less to make)
            candidates = [worker for worker in candidates if worker.url not in tried]
        if not candidates:
            return None
        loads = [worker.load() for worker in candidates]
        started = time.perf_counter()
        if self.tracing is None:
            routing = group.policy.route(loads, plan.target)
        else:
            routing = self._traced_route(self.tracing, group.policy, loads, plan)
        chosen = routing.worker
        # The pool's own worker of that url: one of the candidates (nothing awaited since they were read).
        return self.pool.workers[chosen.url], chosen, _Decision(routing, time.perf_counter() - started)

    def _traced_route(self, tracing: Tracing, policy: Policy, loads: list[WorkerLoad], plan: Plan) -> Routing:
        """The policy's decision, as a `route` span: the policy, the candidates, the worker chosen, the cached
        tokens it predicts there (policies that look at caches), and whether the router's ids go."""
        attributes: dict[str, Any] = {
            "tokenfront.policy": policy.name,
            "tokenfront.candidates": len(loads),
            "tokenfront.forwarded": plan.forwarded,
        }
        if plan.reason is not None:
            attributes["tokenfront.not_forwarded_reason"] = plan.reason
        with tracing.span("route", attributes) as span:
            routing = policy.route(loads, plan.target)
            span.set_attribute("tokenfront.worker", routing.worker.url)
            if routing.predicted_cached_tokens is not None:
                span.set_attribute("tokenfront.predicted_cached_tokens", routing.predicted_cached_tokens)
        return routing

    async def _traced_attempt(
        self,
        tracing: Tracing,
        worker: Worker,
        load: WorkerLoad,
        plan: Plan,
        call: _Call,
        interrupt: _Interrupt,
        decision: _Decision,
    ) -> Response | _Failure:
        """`_attempt` inside a client span, whose context the worker is sent in `traceparent`. The span ends
        with the attempt's answer: a relayed stream's when the stream does."""
        span = tracing.client_span(
            f"POST {call.path}",
            {
                "http.request.method": "POST",
                "url.full": worker.url + call.path,
                "tokenfront.worker": worker.url,
                "tokenfront.forwarded": call.forwarded,
            },
        )
        try:
            outcome = await self._attempt(
                worker, load, plan, call, interrupt, decision, trace_headers=tracing.trace_headers(span)
            )
        except BaseException as exc:
            span.record_exception(exc)
            span.end()
            raise
        if isinstance(outcome, _Failure):
            tracing.failed(span, outcome.reason)
            span.end()
            return outcome
        span.set_attribute("http.response.status_code", outcome.status_code)
        if isinstance(outcome, _RelayResponse):
            outcome.span = span
        else:
            span.end()
        return outcome

    async def _attempt(
        self,
        worker: Worker,
        load: WorkerLoad,
        plan: Plan,
        call: _Call,
        interrupt: _Interrupt,
        decision: _Decision,
        *,
        trace_headers: bytes = b"",
    ) -> Response | _Failure:
        """One worker's try (`call`, the plan's for this worker): its answer, or why to try another worker. Until the first byte for the client
        (the whole answer, or a stream's first event), a health check finding the worker gone ends the wait.
        `trace_headers`: the W3C trace context to send on (`_traced_attempt`)."""
        worker.active_requests += 1
        worker.routed += 1
        started = time.perf_counter()
        self.policy_for(plan).on_routed(load, plan.target)
        if self.sync is not None:
            self.sync.routed(load, plan.target)
        # The decision's time is the policy's choice and its bookkeeping of it, together.
        self.routing_metrics.decided(
            decision.routing, plan.target, decision.seconds + time.perf_counter() - started
        )
        if call.forwarded != plan.forwarded:
            self.metrics.not_forwarded.labels("generate_unsupported").inc()
        settings = self.pool.settings
        # A worker sends a stream's head at once (its first event after its queue and prefill), a whole answer's
        # head only once the answer is generated.
        head_timeout = settings.first_byte_timeout if plan.stream else settings.request_timeout
        response: WorkerResponse | None = None
        relayed = False
        stage = "head"
        on_lost = interrupt.worker_lost
        worker.lost_watchers.add(on_lost)
        try:
            # The client's request id goes on: one id finds the request in the router's and the worker's logs.
            response = await worker.connections.post(
                call.path,
                call.body,
                request_id=current_request_id(),
                head_timeout=head_timeout,
                trace_headers=trace_headers,
            )
            if plan.stream and response.status_code == 200:
                stage = "stream"
                bounds = AnswerBounds(
                    settings.max_response_bytes,
                    plan.max_events,
                    settings.first_byte_timeout,
                    settings.idle_timeout,
                )
                source: _ChunkSource
                if call.reading is not None:
                    source = GenerateStream(response, call.reading, bounds, sent_at=response.sent_at)
                else:
                    source = RelayedStream(EventReader(response, bounds, sent_at=response.sent_at))
                first = await source.next_chunk()
                headers = self._headers(response, worker, call)
                relayed = True
                return _RelayResponse(
                    self, worker, load, plan, call, response, source, first, headers, decision
                )
            stage = "body"
            content = await response.read(
                limit=settings.max_response_bytes, deadline=response.sent_at + settings.request_timeout
            )
            if call.reading is not None and 200 <= response.status_code < 300:
                answer = parse_answer(content, response.status_code)
                content = call.reading.answer(answer)
            else:
                answer = check_answer(response.status_code, content)
        except WorkerTransportError as exc:
            self._finish(worker, load, plan, call, ok=False)
            return self._failure(worker, exc, stage, plan)
        except asyncio.CancelledError:
            self._finish(worker, load, plan, call, ok=False)
            why = interrupt.take()
            if why == "lost":
                where = "before the stream's first event" if stage == "stream" else "while answering"
                return _Failure(f"worker lost {where} ({worker.problem})")
            if why == "client":
                raise _ClientLeft from None
            raise  # a cancellation from elsewhere (shutdown)
        except BaseException:
            self._finish(worker, load, plan, call, ok=False)
            raise
        finally:
            worker.lost_watchers.discard(on_lost)
            if response is not None and not relayed:
                response.close()  # reused when read to its end, else closed: the worker stops generating
        if response.status_code >= 500:
            self._finish(worker, load, plan, call, ok=False)
            return _Failure(f"answered {response.status_code}", self._full(response, content, worker, call))
        self._finish(worker, load, plan, call, ok=response.status_code < 400)
        self.routing_metrics.answered(decision.routing, plan.target, answer_usage(answer))
        return self._full(response, content, worker, call)

    def _failure(self, worker: Worker, exc: WorkerTransportError, stage: str, plan: Plan) -> _Failure:
        """What a failed attempt means for the client (`_client_error`), and for the worker's health: out of
        the active set until its re-check, unless it answered right but too much."""
        reason = _reason(exc)
        if stage == "head" and isinstance(exc, ReadTimeout):
            settings = self.pool.settings
            timeout, flag = (
                (settings.first_byte_timeout, "--first-byte-timeout")
                if plan.stream
                else (settings.request_timeout, "--request-timeout")
            )
            reason = f"sent no answer within {timeout:g} s ({flag})"
        status, code = _client_error(exc)
        if not isinstance(exc, AnswerTooLarge) or exc.worker_fault:
            failed = "stream failed before its first event" if stage == "stream" else "request failed"
            self.pool.mark_failed(worker, f"{failed} ({reason})")
        return _Failure(reason, status=status, code=code, final=isinstance(exc, AnswerTooLarge))

    def _finish(self, worker: Worker, load: WorkerLoad, plan: Plan, call: _Call, *, ok: bool) -> None:
        worker.active_requests -= 1
        self.policy_for(plan).on_complete(load, plan.target, ok)
        if self.sync is not None:
            self.sync.complete(load, plan.target)
        if ok:
            key = (plan.route, worker.url, call.forwarded)
            counter = self._served.get(key)
            if counter is None:
                counter = self._served[key] = self.metrics.requests.labels(
                    plan.route, worker.url, _flag(call.forwarded)
                )
            counter.inc()

    def _full(self, response: WorkerResponse, content: bytes, worker: Worker, call: _Call) -> Response:
        return Response(
            content, status_code=response.status_code, headers=self._headers(response, worker, call)
        )

    @staticmethod
    def _headers(response: WorkerResponse, worker: Worker, call: _Call) -> dict[str, str]:
        given = response.headers
        headers = {name: given[name] for name in _PASSED_HEADERS if name in given}
        if call.reading is not None:
            # The answer is the router's OpenAI JSON or event stream, not the worker's generate one.
            headers["content-type"] = "text/event-stream" if _is_stream(given) else "application/json"
        headers[WORKER_HEADER] = worker.url
        headers[FORWARDED_HEADER] = _flag(call.forwarded)
        return headers


class _ClientLeft(Exception):
    """The client closed its connection while its request waited for a worker."""


class _Interrupt:
    """Cancels the request's task when the client leaves or the worker it waits for is lost, and says which.

    One object per request, made in the request's task: the client's disconnect watcher calls
    `client_left`, a worker's failed health check calls `worker_lost` (registered in `Worker.lost_watchers`
    while an attempt waits). The task then sees a CancelledError wherever it waits; `take` tells it whether the
    cancellation was this object's (and why) or came from elsewhere (a shutdown), which must go on.

    One cancellation per request instead of a task and an `asyncio.wait` around every await.
    """

    __slots__ = ("_armed", "_task", "left", "reason")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = asyncio.current_task()
        self._armed = True
        self.reason: str | None = None
        self.left = False  # the client left (remembered even when the task was being cancelled already)

    def client_left(self) -> None:
        self.left = True
        self._cancel("client")

    def worker_lost(self) -> None:
        self._cancel("lost")

    def _cancel(self, reason: str) -> None:
        if self._armed and self.reason is None and self._task is not None:
            self.reason = reason
            self._task.cancel()

    def take(self) -> str | None:
        """After a CancelledError: this object's reason when it alone cancelled the task (the task is then not
        cancelled any more), None when the cancellation came from elsewhere."""
        reason, self.reason = self.reason, None
        task = self._task
        if reason is None or task is None:
            return None
        if sys.version_info >= (3, 11):
            task.uncancel()
            if task.cancelling():
                return None  # cancelled from elsewhere as well
        return reason

    def disarm(self) -> None:
        """Nothing may cancel the task any more (a cancellation already asked for is still `take`n)."""
        self._armed = False


# Its public name (tests drive one on its own); this module's code calls it `_Interrupt`.
Interrupt = _Interrupt


class _RelayResponse(StreamingResponse):
    """A worker's stream, relayed to the client event by event as it arrives, never buffered.

    A break after the first event — the connection lost, the event format broken, a bound passed, the worker
    silent for `--idle-timeout` — ends it with an error event and `data: [DONE]` (the client already has part
    of the answer, so it cannot be retried). A client that leaves ends it too, and so closes the worker's request (the worker
    stops generating). However the response ends — even if it is never sent — `finish` releases the worker's
    connection and ends the attempt, once.

    Sent by its own `__call__`: one disconnect watcher task, rather than Starlette's task group of two tasks
    around every stream.
    """

    def __init__(
        self,
        proxy: Proxy,
        worker: Worker,
        load: WorkerLoad,
        plan: Plan,
        call: _Call,
        response: WorkerResponse,
        source: _ChunkSource,
        first: bytes | None,
        headers: dict[str, str],
        decision: _Decision,
    ) -> None:
        super().__init__(self._chunks(first), status_code=response.status_code, headers=headers)
        self.proxy, self.worker, self.load, self.plan, self.response = proxy, worker, load, plan, response
        self.call, self.source, self.decision = call, source, decision
        self.span: Span | None = None  # the worker call's client span (`Proxy._traced_attempt`), ended here
        self._done = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        interrupt = _Interrupt()
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, interrupt))
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            # Before the last message: once a response is complete, `receive` says "disconnect".
            interrupt.disarm()
            watcher.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if interrupt.take() != "client":
                raise
        except OSError:  # a server that raises when the client has gone (ASGI spec 2.4)
            pass
        finally:
            interrupt.disarm()
            watcher.cancel()
            iterator = self.body_iterator
            if isinstance(iterator, AsyncGenerator):
                await iterator.aclose()
            self.finish(ok=False)  # a no-op when the stream ended on its own

    async def _chunks(self, first: bytes | None) -> AsyncIterator[bytes]:
        ok = False
        source, prefilled = self.source, False
        try:
            chunk = first
            while chunk is not None:
                if not prefilled and source.produced:  # the first output: the prompt's prefill is done
                    prefilled = True
                    self.proxy.policy_for(self.plan).on_first_token(self.load, self.plan.target)
                    if self.proxy.sync is not None:
                        self.proxy.sync.first_token(self.load, self.plan.target)
                yield chunk
                chunk = await source.next_chunk()
            ok = True
            self.proxy.routing_metrics.answered(self.decision.routing, self.plan.target, self.source.usage)
        except WorkerTransportError as exc:
            reason = _reason(exc)
            if not isinstance(exc, AnswerTooLarge) or exc.worker_fault:
                self.proxy.pool.mark_failed(self.worker, f"stream broke ({reason})")
            log.warning("stream from %s ended early: %s", self.worker.url, reason)
            message = (
                f"the worker {self.worker.url} failed while streaming ({reason}); the answer is incomplete"
            )
            # A connection that broke keeps the code it always had (none); the worker's answer is the cause else.
            code: str | None = _client_error(exc)[1]
            code = None if code == NO_WORKER_CODE else code
            yield sse_event(error_body(message, error_type="server_error", code=code)) + SSE_DONE
        finally:
            self.finish(ok=ok)

    def finish(self, *, ok: bool) -> None:
        if not self._done:
            self._done = True
            self.response.close()
            self.proxy._finish(self.worker, self.load, self.plan, self.call, ok=ok)
            if self.span is not None:
                if not ok:
                    self.span.set_attribute("tokenfront.stream_complete", False)
                self.span.end()


class _ChunkSource(Protocol):
    """What a relayed stream reads: a worker's events as they arrive (`RelayedStream`), or a generate stream
    derendered (`GenerateStream`); `usage` is the worker's usage object once an event carried one, `produced`
    whether an event carried generated output yet."""

    usage: Any
    produced: bool

    async def next_chunk(self) -> bytes | None: ...


class _Decision(NamedTuple):
    """What the policy decided for one attempt, and how long its choice took (`routing_metrics`)."""

    routing: Routing
    seconds: float


def _render_span(outcome: RenderOutcome) -> dict[str, Any]:
    """The router's `render` span: the prompt ids it routes by (every prompt's), or why it has none."""
    rendered = outcome.rendered
    if rendered is None or rendered.prompts is None:
        return {"tokenfront.render.outcome": outcome.reason or "no_render"}
    return {
        "tokenfront.render.outcome": "ok",
        "tokenfront.prompts": len(rendered.prompts),
        PROMPT_TOKENS: sum(len(prompt.token_ids) for prompt in rendered.prompts),
    }


def _is_stream(headers: dict[str, str]) -> bool:
    return headers.get("content-type", "").startswith("text/event-stream")


def _reason(exc: WorkerTransportError) -> str:
    """Why an attempt failed, for messages: the router's own words for an answer that is bad, late or too
    large (they follow the worker's URL), else the error's name and message."""
    message = str(exc).strip()
    if message and isinstance(exc, (BadAnswer, AnswerTooLarge, ReadTimeout, WriteTimeout)):
        return message
    return describe_error(exc)


def _client_error(exc: WorkerTransportError) -> tuple[int, str]:
    """The status and code of a failure for the client: 502 for an answer that is not the route's or is too
    large, 504 for a worker too slow, 503 for one that could not be reached or whose connection broke."""
    if isinstance(exc, AnswerTooLarge):
        return 502, WORKER_RESPONSE_TOO_LARGE_CODE
    if isinstance(exc, BadAnswer):
        return 502, BAD_WORKER_RESPONSE_CODE
    if isinstance(exc, (ReadTimeout, WriteTimeout)):
        return 504, WORKER_TIMEOUT_CODE
    return 503, NO_WORKER_CODE


def _flag(value: bool) -> str:
    return "true" if value else "false"


async def _watch_disconnect(receive: Receive, interrupt: _Interrupt) -> None:
    """Tell `interrupt` when the client closes the connection."""
    await wait_for_disconnect(receive)
    interrupt.client_left()

"""The router's proxying: a planned request sent to a worker the policy chooses, retried elsewhere when a worker
fails.

Each chat or completions request is first planned (`router.planning`: rendered with its model's pipeline, and
what goes to the worker decided: the router's ids or the client's body, a `Plan`). The `Proxy` then

1. asks the model's policy for a worker among that model's active ones and sends the body on that worker's connection pool —
   to a `protocol=generate` worker, a forwarded request goes as vLLM's tokens-in, tokens-out call instead
   (`router.generate`: the ids to `/inference/v1/generate`, the output ids derendered into the OpenAI
   answer, a stream chunk by chunk), and one the generate path cannot carry as the client sent it;
2. retries on another worker when the chosen one fails before the client got a byte: a connection error, a
   timeout, a 5xx answer, an answer that is not what the route answers (`worker_answers`: not JSON, no
   `choices`, not an event stream), or a stream that breaks before its first event. A worker that failed so is
   taken out of the active set (the pool re-checks it at once, and puts it back when it answers its checks).
   Worker 4xx answers with a JSON body are the client's and pass through; when every worker failed, the
   client gets the last failure's error (`router.worker_failures`): 503 `no_worker`, 502
   `bad_worker_response`, 504 `worker_timeout`;
3. answers with the worker's response — a stream is relayed event by event as it arrives, never buffered
   (`router.relay`) — plus `x-tokenfront-worker` (which worker served) and `x-tokenfront-forwarded` (true/false).

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
through one `Interrupt` (`router.interrupt`), rather than racing a task against every await.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry

from tokenfront.core.render import RenderPipeline
from tokenfront.router.bounded_render import BoundedRender, RenderSettings
from tokenfront.router.connections import AnswerTooLarge, ReadTimeout, WorkerResponse, WorkerTransportError
from tokenfront.router.gate import ForwardingGate
from tokenfront.router.generate import GenerateStream
from tokenfront.router.interrupt import Interrupt, watch_disconnect
from tokenfront.router.metrics import RouterMetrics
from tokenfront.router.model_group import ModelGroup, ModelGroups
from tokenfront.router.planning import Plan, Planner, WorkerCall
from tokenfront.router.policies.base import Policy, Routing, WorkerLoad
from tokenfront.router.relay import ChunkSource, RelayResponse
from tokenfront.router.routing_metrics import RoutingMetrics, answer_usage
from tokenfront.router.worker import Worker
from tokenfront.router.worker_answers import (
    AnswerBounds,
    EventReader,
    RelayedStream,
    check_answer,
    parse_answer,
)
from tokenfront.router.worker_failures import NO_WORKER_CODE, client_error, failure_reason
from tokenfront.router.worker_pool import WorkerPool
from tokenfront.server.disconnect import client_disconnected_response
from tokenfront.server.errors import APIError
from tokenfront.server.request_ids import current_request_id
from tokenfront.server.tracing import Tracing

if TYPE_CHECKING:
    from tokenfront.router.replica_sync import ReplicaSync

__all__ = ["FORWARDED_HEADER", "WORKER_HEADER", "Decision", "Proxy"]

log = logging.getLogger(__name__)

WORKER_HEADER = "x-tokenfront-worker"
FORWARDED_HEADER = "x-tokenfront-forwarded"
# Worker response headers a client may care about; hop-by-hop and length headers are the router's own.
_PASSED_HEADERS = ("content-type", "x-request-id")


@dataclass(frozen=True)
class _Failure:
    """An attempt that failed before the client saw anything: retry elsewhere (unless `final`)."""

    reason: str
    response: Response | None = None  # a worker's 5xx, answered if every worker fails
    status: int = 503  # the client's error when this is the last failure
    code: str = NO_WORKER_CODE
    final: bool = False  # answered at once, not retried (another worker would answer as much)


class Proxy:
    """Sends planned chat and completions requests (`planner` plans them): routes each to a worker, retries
    elsewhere when one fails, relays the answer."""

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
        # What a request's plan is: its model, its render and what goes to the worker.
        self.planner = Planner(self.groups, pool, metrics.not_forwarded, tracing)

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

    # -- sending ---------------------------------------------------------------------------------------------

    async def send_watching(self, plan: Plan, raw: Request) -> Response:
        """`send`, abandoned (and the worker's request closed) when the client goes away first: then 499."""
        interrupt = Interrupt()
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(raw.receive, interrupt))
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

    async def send(self, plan: Plan, interrupt: Interrupt | None = None) -> Response:
        """Send the plan to a worker the policy chooses; on a failure before any byte, to another one."""
        interrupt = interrupt or Interrupt()
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

    def _choose(self, plan: Plan, tried: set[str]) -> tuple[Worker, WorkerLoad, Decision] | None:
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
        return self.pool.workers[chosen.url], chosen, Decision(routing, time.perf_counter() - started)

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
        call: WorkerCall,
        interrupt: Interrupt,
        decision: Decision,
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
        if isinstance(outcome, RelayResponse):
            outcome.span = span
        else:
            span.end()
        return outcome

    async def _attempt(
        self,
        worker: Worker,
        load: WorkerLoad,
        plan: Plan,
        call: WorkerCall,
        interrupt: Interrupt,
        decision: Decision,
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
                source: ChunkSource
                if call.reading is not None:
                    source = GenerateStream(response, call.reading, bounds, sent_at=response.sent_at)
                else:
                    source = RelayedStream(EventReader(response, bounds, sent_at=response.sent_at))
                first = await source.next_chunk()
                headers = self._headers(response, worker, call)
                relayed = True
                return RelayResponse(
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
            self.finish_attempt(worker, load, plan, call, ok=False)
            return self._failure(worker, exc, stage, plan)
        except asyncio.CancelledError:
            self.finish_attempt(worker, load, plan, call, ok=False)
            why = interrupt.take()
            if why == "lost":
                where = "before the stream's first event" if stage == "stream" else "while answering"
                return _Failure(f"worker lost {where} ({worker.problem})")
            if why == "client":
                raise _ClientLeft from None
            raise  # a cancellation from elsewhere (shutdown)
        except BaseException:
            self.finish_attempt(worker, load, plan, call, ok=False)
            raise
        finally:
            worker.lost_watchers.discard(on_lost)
            if response is not None and not relayed:
                response.close()  # reused when read to its end, else closed: the worker stops generating
        if response.status_code >= 500:
            self.finish_attempt(worker, load, plan, call, ok=False)
            return _Failure(f"answered {response.status_code}", self._full(response, content, worker, call))
        self.finish_attempt(worker, load, plan, call, ok=response.status_code < 400)
        self.routing_metrics.answered(decision.routing, plan.target, answer_usage(answer))
        return self._full(response, content, worker, call)

    def _failure(self, worker: Worker, exc: WorkerTransportError, stage: str, plan: Plan) -> _Failure:
        """What a failed attempt means for the client (`worker_failures.client_error`), and for the worker's
        health: out of the active set until its re-check, unless it answered right but too much."""
        reason = failure_reason(exc)
        if stage == "head" and isinstance(exc, ReadTimeout):
            settings = self.pool.settings
            timeout, flag = (
                (settings.first_byte_timeout, "--first-byte-timeout")
                if plan.stream
                else (settings.request_timeout, "--request-timeout")
            )
            reason = f"sent no answer within {timeout:g} s ({flag})"
        status, code = client_error(exc)
        if not isinstance(exc, AnswerTooLarge) or exc.worker_fault:
            failed = "stream failed before its first event" if stage == "stream" else "request failed"
            self.pool.mark_failed(worker, f"{failed} ({reason})")
        return _Failure(reason, status=status, code=code, final=isinstance(exc, AnswerTooLarge))

    def finish_attempt(
        self, worker: Worker, load: WorkerLoad, plan: Plan, call: WorkerCall, *, ok: bool
    ) -> None:
        """One attempt on `worker` ended (a relayed stream's when the stream does): one request fewer on it, the
        policy and the peer routers told, and the request counted when `ok`."""
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

    def _full(self, response: WorkerResponse, content: bytes, worker: Worker, call: WorkerCall) -> Response:
        return Response(
            content, status_code=response.status_code, headers=self._headers(response, worker, call)
        )

    @staticmethod
    def _headers(response: WorkerResponse, worker: Worker, call: WorkerCall) -> dict[str, str]:
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


class Decision(NamedTuple):
    """What the policy decided for one attempt, and how long its choice took (`routing_metrics`)."""

    routing: Routing
    seconds: float


def _is_stream(headers: dict[str, str]) -> bool:
    return headers.get("content-type", "").startswith("text/event-stream")


def _flag(value: bool) -> str:
    return "true" if value else "false"

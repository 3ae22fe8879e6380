"""The router's proxying: render a request, choose a worker, send it, retry elsewhere when a worker fails.

For each chat or completions request the `Proxy`

1. renders it with the router's `RenderPipeline` (the one the renderer and the workers use) to get the
   prompt ids — a render error is the client's 400, answered as the renderer answers it;
2. decides what goes to the worker (a `Plan`): the body with the router's ids (chat: `prompt_token_ids`;
   completions: the ids as `prompt`) when the gate is open and the request is not one of the never-forwarded
   kinds, else the original body byte for byte;
3. asks the policy for a worker among the active ones and sends the body on that worker's connection pool;
4. retries on another worker when the chosen one fails before the client got a byte: a connection error, a
   timeout, a 5xx answer, or a stream that breaks before its first chunk. A worker whose connection failed is
   taken out of the active set (the pool re-checks it). Worker 4xx answers are the client's and pass through;
5. answers with the worker's response — a stream is relayed chunk by chunk as it arrives, never buffered —
   plus `x-tokenfront-worker` (which worker served) and `x-tokenfront-forwarded` (true/false).

Completions with several prompts go to one worker as one request (routed by the first prompt's ids, the ids
forwarded as a list of id lists), so the answer keeps its shape; with `echo` they are never forwarded (the
worker would echo decoded ids, not the client's text).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge

from tokenfront.core.errors import RenderError
from tokenfront.core.families import family_for
from tokenfront.core.reasoning import ReasoningParser
from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.router.gate import ForwardingGate, never_forward_reason
from tokenfront.router.policies.base import Policy, RouteRequest, WorkerLoad
from tokenfront.router.workers import Worker, WorkerPool, describe_error
from tokenfront.server.errors import APIError, error_body, model_not_found

log = logging.getLogger(__name__)
_T = TypeVar("_T")

WORKER_HEADER = "x-tokenfront-worker"
FORWARDED_HEADER = "x-tokenfront-forwarded"
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
_JSON = {"content-type": "application/json"}
# Worker response headers a client may care about; hop-by-hop and length headers are the router's own.
_PASSED_HEADERS = ("content-type", "x-request-id")


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
            "reasoning_mode, client_token_ids, echo, no_render)",
            ["reason"],
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
            "1 when the gate lets rendered ids go to workers",
            registry=registry,
        )
        self.active_workers = Gauge(
            "tokenfront_router_active_workers", "Workers in the active set", registry=registry
        )


@dataclass(frozen=True)
class Plan:
    """What to send for one client request, and how to route it."""

    route: str  # "chat" or "completion"
    path: str
    body: bytes
    target: RouteRequest
    forwarded: bool
    stream: bool
    reason: str | None = None  # why the router's ids were not forwarded


@dataclass(frozen=True)
class _Failure:
    """An attempt that failed before the client saw anything: retry elsewhere."""

    reason: str
    response: Response | None = None  # a worker's 5xx, answered if every worker fails


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
    ) -> None:
        self.pipeline = pipeline
        self.pool = pool
        self.gate = gate
        self.policy = policy
        self.metrics = metrics
        self.served_model_names = tuple(served_model_names)
        self.family = family_for(pipeline.checkpoint.model_type if pipeline else None)
        own = pipeline.reasoning_parser if pipeline else None
        self._own_prompt_parser = own if own is not None and own.reads_mode_from_prompt else None

    # -- plans -----------------------------------------------------------------------------------------------

    def plan_chat(self, request: ChatCompletionRequest, raw_body: bytes) -> Plan:
        """Render a chat request and decide what goes to the worker."""
        self._check_model(request.model)
        stream, salt = bool(request.stream), request.cache_salt
        if request.prompt_token_ids is not None:
            # The client rendered it: route by its ids, send them as they are.
            target = RouteRequest(list(request.prompt_token_ids), cache_salt=salt)
            return self._unchanged("chat", CHAT_PATH, raw_body, target, stream, "client_token_ids")
        rendered = self._render_chat(request)
        if rendered is None:
            return self._unchanged("chat", CHAT_PATH, raw_body, RouteRequest(None, salt), stream, "no_render")
        target = RouteRequest(rendered.token_ids, cache_salt=salt)
        reason = (
            self._never_forward(request.named_tool is not None, [rendered.prompt_text]) or self._gate_reason()
        )
        if reason is not None:
            return self._unchanged("chat", CHAT_PATH, raw_body, target, stream, reason)
        body = _with_field(raw_body, "prompt_token_ids", rendered.token_ids)
        return Plan("chat", CHAT_PATH, body, target, forwarded=True, stream=stream)

    def plan_completion(self, request: CompletionRequest, raw_body: bytes) -> Plan:
        """Render a completions request (every prompt) and decide what goes to the worker."""
        self._check_model(request.model)
        stream, salt = bool(request.stream), request.cache_salt
        if self.pipeline is None:
            return self._unchanged(
                "completion", COMPLETIONS_PATH, raw_body, RouteRequest(None, salt), stream, "no_render"
            )
        items = self.pipeline.render_completion(request)
        target = RouteRequest(items[0].token_ids, cache_salt=salt)
        texts = [item.prompt_text for item in items]
        if all(text is None for text in texts):
            reason: str | None = "client_token_ids"
        elif request.echo:
            reason = "echo"
        else:
            reason = self._never_forward(False, texts) or self._gate_reason()
        if reason is not None:
            return self._unchanged("completion", COMPLETIONS_PATH, raw_body, target, stream, reason)
        prompt = items[0].token_ids if len(items) == 1 else [item.token_ids for item in items]
        body = _with_field(raw_body, "prompt", prompt)
        return Plan("completion", COMPLETIONS_PATH, body, target, forwarded=True, stream=stream)

    def _render_chat(self, request: ChatCompletionRequest) -> RenderedPrompt | None:
        if self.pipeline is None:
            return None
        try:
            return self.pipeline.render_chat(request)
        except RenderError as exc:
            if exc.code == "no_chat_template":
                # The router's own configuration lacks a template, not the request: the workers may have one.
                return None
            raise

    def _unchanged(
        self, route: str, path: str, body: bytes, target: RouteRequest, stream: bool, reason: str
    ) -> Plan:
        self.metrics.not_forwarded.labels(reason).inc()
        return Plan(route, path, body, target, forwarded=False, stream=stream, reason=reason)

    def _gate_reason(self) -> str | None:
        return None if self.gate.state.forwarding else "gate"

    def _never_forward(self, named_tool: bool, texts: Sequence[str | None]) -> str | None:
        parsers = self._prompt_mode_parsers()
        for text in texts:
            reason = never_forward_reason(
                named_tool_choice=named_tool,
                family_never_forwards=self.family.never_forward_ids,
                family=self.family.name,
                prompt_text=text,
                prompt_mode_parsers=parsers,
            )
            if reason is not None:
                return reason
        return None

    def _prompt_mode_parsers(self) -> list[ReasoningParser]:
        """The parsers, here and on the active workers, that read the reasoning mode from the prompt."""
        found = {self._own_prompt_parser.name: self._own_prompt_parser} if self._own_prompt_parser else {}
        for worker in self.pool.active():
            parser = worker.report.prompt_mode_parser if worker.report else None
            if parser is not None:
                found.setdefault(parser.name, parser)
        return list(found.values())

    def _check_model(self, model: str | None) -> None:
        if self.pipeline is not None:
            if not self.pipeline.serves(model):
                raise model_not_found(str(model), self.pipeline.served_model_names)
        elif self.served_model_names and model is not None and model not in self.served_model_names:
            raise model_not_found(model, self.served_model_names)

    # -- sending ---------------------------------------------------------------------------------------------

    async def send_watching(self, plan: Plan, raw: Request) -> Response:
        """`send`, abandoned (and the worker's request closed) when the client goes away first."""
        work = asyncio.ensure_future(self.send(plan))
        watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
        try:
            done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this handler was cancelled (shutdown): the attempt must not outlive it
            work.cancel()
            raise
        finally:
            watcher.cancel()
        if work in done:
            return work.result()
        work.cancel()  # closes the request to the worker, which then aborts the generation
        with contextlib.suppress(BaseException):
            response = await work
            if isinstance(response, StreamingResponse):
                await _close_stream(response)
        return JSONResponse(error_body("client disconnected", error_type="client_disconnected"), 499)

    async def send(self, plan: Plan) -> Response:
        """Send the plan to a worker the policy chooses; on a failure before any byte, to another one."""
        tried: set[str] = set()
        failures: list[str] = []
        fallback: Response | None = None
        while (choice := self._choose(plan, tried)) is not None:
            worker, load = choice
            tried.add(worker.url)
            outcome = await self._attempt(worker, load, plan)
            if isinstance(outcome, Response):
                return outcome
            failures.append(f"{worker.url}: {outcome.reason}")
            fallback = outcome.response or fallback
            self.metrics.retries.labels(worker.url).inc()
            log.warning(
                "request to %s failed before any byte was answered (%s); trying another worker",
                worker.url,
                outcome.reason,
            )
        if fallback is not None:
            return fallback
        if failures:
            raise APIError(503, "every worker failed this request: " + "; ".join(failures), code="no_worker")
        raise APIError(
            503,
            "no worker is available: none is configured or every one is failing its health checks "
            "(GET /workers shows why)",
            code="no_worker",
        )

    def _choose(self, plan: Plan, tried: set[str]) -> tuple[Worker, WorkerLoad] | None:
        candidates = {w.url: w for w in self.pool.active() if w.url not in tried}
        if not candidates:
            return None
        loads = [worker.load() for worker in candidates.values()]
        chosen = self.policy.select(loads, plan.target)
        return candidates[chosen.url], chosen

    async def _attempt(self, worker: Worker, load: WorkerLoad, plan: Plan) -> Response | _Failure:
        worker.active_requests += 1
        worker.routed += 1
        self.policy.on_routed(load, plan.target)
        response: httpx.Response | None = None
        lost = worker.lost  # the attempt gives up when a health check finds the worker gone meanwhile
        try:
            request = worker.client.build_request("POST", plan.path, content=plan.body, headers=_JSON)
            response = await _unless_set(lost, worker.client.send(request, stream=True))
            if response.status_code >= 500:
                content = await _unless_set(lost, response.aread())
                self._finish(worker, load, plan, ok=False)
                answer = self._full(response, content, worker, plan)
                return _Failure(f"answered {response.status_code}", answer)
            if plan.stream and response.status_code == 200:
                return await self._start_stream(worker, load, plan, response)
            content = await _unless_set(lost, response.aread())
        except httpx.TransportError as exc:
            self._finish(worker, load, plan, ok=False)
            reason = describe_error(exc)
            self.pool.mark_failed(worker, f"request failed ({reason})")
            return _Failure(reason)
        except _WorkerLost:
            self._finish(worker, load, plan, ok=False)
            return _Failure(f"worker lost while answering ({worker.problem})")
        except BaseException:
            self._finish(worker, load, plan, ok=False)  # e.g. the client left and the attempt was cancelled
            raise
        finally:
            if response is not None and not (plan.stream and response.status_code == 200):
                await response.aclose()
        self._finish(worker, load, plan, ok=response.status_code < 400)
        return self._full(response, content, worker, plan)

    async def _start_stream(
        self, worker: Worker, load: WorkerLoad, plan: Plan, response: httpx.Response
    ) -> Response | _Failure:
        """Wait for the stream's first chunk (a failure until then is retried), then relay the rest."""
        chunks = response.aiter_raw()
        try:
            first = await _unless_set(worker.lost, chunks.__anext__())
        except StopAsyncIteration:
            first = b""
        except (httpx.TransportError, _WorkerLost) as exc:
            await response.aclose()
            self._finish(worker, load, plan, ok=False)
            if isinstance(exc, _WorkerLost):
                return _Failure(f"worker lost before the stream's first chunk ({worker.problem})")
            reason = describe_error(exc)
            self.pool.mark_failed(worker, f"stream failed before its first chunk ({reason})")
            return _Failure(reason)
        except BaseException:
            await response.aclose()
            raise  # the caller counts the attempt as finished
        return StreamingResponse(
            self._relay(worker, load, plan, response, first, chunks),
            status_code=response.status_code,
            headers=self._headers(response, worker, plan),
        )

    async def _relay(
        self,
        worker: Worker,
        load: WorkerLoad,
        plan: Plan,
        response: httpx.Response,
        first: bytes,
        chunks: AsyncIterator[bytes],
    ) -> AsyncIterator[bytes]:
        """The worker's stream, chunk by chunk as it arrives; a break after the first chunk ends it with an
        error event (the client already has part of the answer, so it cannot be retried)."""
        ok = False
        try:
            if first:
                yield first
            async for chunk in chunks:
                yield chunk
            ok = True
        except httpx.TransportError as exc:
            reason = describe_error(exc)
            self.pool.mark_failed(worker, f"stream broke ({reason})")
            message = f"the worker {worker.url} failed while streaming ({reason}); the answer is incomplete"
            yield _sse(error_body(message, error_type="server_error")) + b"data: [DONE]\n\n"
        finally:
            await response.aclose()
            self._finish(worker, load, plan, ok=ok)

    def _finish(self, worker: Worker, load: WorkerLoad, plan: Plan, *, ok: bool) -> None:
        worker.active_requests -= 1
        self.policy.on_complete(load, plan.target, ok)
        if ok:
            self.metrics.requests.labels(plan.route, worker.url, _flag(plan.forwarded)).inc()

    def _full(self, response: httpx.Response, content: bytes, worker: Worker, plan: Plan) -> Response:
        return Response(
            content, status_code=response.status_code, headers=self._headers(response, worker, plan)
        )

    @staticmethod
    def _headers(response: httpx.Response, worker: Worker, plan: Plan) -> dict[str, str]:
        headers = {name: response.headers[name] for name in _PASSED_HEADERS if name in response.headers}
        headers[WORKER_HEADER] = worker.url
        headers[FORWARDED_HEADER] = _flag(plan.forwarded)
        return headers


class _WorkerLost(Exception):
    """A health check found the worker gone while an attempt was waiting for it."""


async def _unless_set(lost: asyncio.Event, awaitable: Awaitable[_T]) -> _T:
    """Await `awaitable`, unless `lost` is set first: then cancel it and raise `_WorkerLost`.

    A hung worker (stopped, deadlocked) keeps its connections open, so only its failing health checks tell;
    without this its requests would wait for the whole request timeout.
    """
    if lost.is_set():
        raise _WorkerLost
    work = asyncio.ensure_future(awaitable)
    waiter = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
    if work.cancelled():
        raise _WorkerLost
    return work.result()


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _with_field(raw_body: bytes, name: str, value: Any) -> bytes:
    """The client's JSON body with one field set (the rest as the client sent it)."""
    body = json.loads(raw_body)
    body[name] = value
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _wait_for_disconnect(raw: Request) -> None:
    """Return when the client closes the connection (the body has been read, so only that can come)."""
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return


async def _close_stream(response: StreamingResponse) -> None:
    iterator = response.body_iterator
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()

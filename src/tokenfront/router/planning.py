"""The router's plan of a request: render it, and decide what goes to the worker.

For each chat or completions request the `Planner`

1. picks the router's model its `model` names (`router.model_group`: a 404 `model_not_found` for a name no
   model has) and renders it with that model's `RenderPipeline` (the one the renderer and the workers use) to
   get the prompt ids — a render error is the client's 400, answered as the renderer answers it; the wait is bounded
   (`bounded_render`: `--render-timeout`, in this process or in `--render-processes` render processes), and a
   render that is late or fails for a reason not the client's sends the body as the client sent it, routed by
   load alone;
2. decides what goes to the worker (a `Plan`): the body with the router's ids (chat: `prompt_token_ids`;
   completions: the ids as `prompt`) when the gate is open and the request is not one of the never-forwarded
   kinds, else the original body byte for byte. A forwarded plan also carries its call for `protocol=generate`
   workers (`router.generate`), and `Plan.call_for` says what one worker is sent (a `WorkerCall`).

Completions with several prompts go to one worker as one request (routed by the first prompt's ids, the ids
forwarded as a list of id lists), so the answer keeps its shape; with `echo` they are never forwarded (the
worker would echo decoded ids, not the client's text).

The `Proxy` (`router.proxy`) sends the plan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from prometheus_client import Counter

from tokenfront.core.reasoning import ReasoningParser
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.router.bounded_render import RenderOutcome
from tokenfront.router.gate import never_forward_reason
from tokenfront.router.generate import GENERATE_PATH, GenerateCall, Reading, chat_call, completion_call
from tokenfront.router.model_group import ModelGroup, ModelGroups
from tokenfront.router.policies.base import RouteRequest
from tokenfront.router.render_step import with_field
from tokenfront.router.worker import Worker
from tokenfront.router.worker_answers import stream_event_budget
from tokenfront.router.worker_pool import WorkerPool
from tokenfront.server.lean_routes import raw_body as request_body
from tokenfront.server.tracing import PROMPT_TOKENS, Tracing

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "Plan", "Planner", "WorkerCall"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


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

    def call_for(self, worker: Worker) -> WorkerCall:
        """What this worker is sent: the generate call, the body with ids, or the client's body."""
        if worker.protocol != "generate" or not self.forwarded:
            return WorkerCall(self.path, self.body, self.forwarded)
        if self.generate is None:
            return WorkerCall(self.path, self.raw_body, False)
        tokenfront = worker.report is not None and worker.report.role == "worker"
        body = self.generate.body_for(tokenfront=tokenfront)
        return WorkerCall(GENERATE_PATH, body, True, self.generate.reading())


@dataclass(frozen=True)
class WorkerCall:
    """One attempt's request: where it goes, its body, whether it carries the router's ids, and for a
    generate worker how the output ids are read."""

    path: str
    body: bytes
    forwarded: bool
    reading: Reading | None = None


class Planner:
    """Renders chat and completions requests and plans what goes to the worker."""

    def __init__(
        self, groups: ModelGroups, pool: WorkerPool, not_forwarded: Counter, tracing: Tracing | None = None
    ) -> None:
        """`groups`: the router's models; `pool`: its workers (whether any speaks `protocol=generate`, and each
        model's active ones); `not_forwarded`: the counter of plans without the router's ids, by reason
        (`RouterMetrics.not_forwarded`); `tracing`: a `render` span per render."""
        self.groups = groups
        self.pool = pool
        self.not_forwarded = not_forwarded
        self.tracing = tracing

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
        self.not_forwarded.labels(reason).inc()
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

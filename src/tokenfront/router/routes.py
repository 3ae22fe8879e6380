"""The router's HTTP routes: the proxied OpenAI routes, `/workers`, and what its `/server_info` and `/v1/models` say.

The render routes are the renderer's own (`renderer.routes.render_router`), mounted by the app when the
router has something to render with. `POST` and `DELETE` on `ADMIN_PATHS` are admin writes: the app's auth
layer lets them through only with the admin key (`server.admin_auth`), before their body is read.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.renderer.routes import RENDER_PATHS
from tokenfront.router.config_reload import ConfigReloader
from tokenfront.router.connections import describe_error
from tokenfront.router.gate import ForwardingGate
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.model_group import ModelGroup
from tokenfront.router.proxy import Proxy
from tokenfront.router.worker import Worker
from tokenfront.router.worker_allow import WorkerAllowList
from tokenfront.router.worker_pool import DuplicateWorker, RouterItself, WorkerPool
from tokenfront.router.worker_report import WorkerReport
from tokenfront.router.worker_spec import WorkerSpec
from tokenfront.server.errors import APIError
from tokenfront.server.lean_routes import LeanRoute
from tokenfront.server_address import check_kv_endpoint, normalize_url

log = logging.getLogger(__name__)

# The paths whose writes change the fleet (`server.admin_auth.AdminAccess`): `GET` reads them with the client key.
ADMIN_PATHS = frozenset({"/workers"})


def inference_router() -> APIRouter:
    """POST /v1/chat/completions and POST /v1/completions, proxied to a worker."""
    router = APIRouter(tags=["inference"], route_class=LeanRoute)

    @router.post("/v1/chat/completions", summary="Chat completion, routed to a worker")
    async def chat_completions(request: ChatCompletionRequest, raw: Request) -> Response:
        proxy: Proxy = raw.app.state.proxy
        return await proxy.send_watching(await proxy.planner.plan_chat(request, raw), raw)

    @router.post("/v1/completions", summary="Text completion, routed to a worker")
    async def completions(request: CompletionRequest, raw: Request) -> Response:
        proxy: Proxy = raw.app.state.proxy
        return await proxy.send_watching(await proxy.planner.plan_completion(request, raw), raw)

    return router


def router_info(
    proxy: Proxy, kv_index: KvIndex, policy: str, config: ConfigReloader | None = None
) -> dict[str, Any]:
    """The router's part of `/server_info`: its fingerprint and how it renders (if it does), policy, gate and
    workers. The top-level fingerprint, render, parsers, policy state and gate are the first model's (a
    single-model router's only one); `models` has every model's; `config` the `--config` file the router runs
    (its digest, generation, when it was loaded and how its last reload went; None: `--model`)."""
    pipeline = proxy.pipeline
    names = served_model_names(proxy)
    groups = proxy.groups
    return {
        "router_id": proxy.pool.router_id,
        "model": names[0] if names else None,
        "served_model_names": names,
        "render_fingerprint": pipeline.fingerprint.to_json() if pipeline else None,
        "render": proxy.renders.describe() if proxy.renders is not None else None,
        "reasoning_parser": pipeline.options.reasoning_parser if pipeline else None,
        "tool_call_parser": pipeline.options.tool_call_parser if pipeline else None,
        "policy": policy,
        "policy_state": proxy.policy.explain(),
        "gate": proxy.gate.state.to_json(),
        "workers": [_safely(worker, worker.describe) for worker in list(proxy.pool.workers.values())],
        "kv_index": kv_index.stats(),
        "replica_sync": proxy.sync.describe() if proxy.sync is not None else None,
        "kv_warmup": proxy.pool.kv_warmup.to_json() if proxy.pool.kv_warmup is not None else None,
        "models": [model_info(proxy, group) for group in groups.groups],
        "config": config.describe() if config is not None else None,
        "unplaced_workers": [
            worker.url
            for worker in list(proxy.pool.workers.values())
            if worker.report is not None and groups.of_worker(worker) is None
        ],
    }


def model_info(proxy: Proxy, group: ModelGroup) -> dict[str, Any]:
    """One model of the router's on `/server_info`: its names, fingerprint digest, parsers, forwarding
    decision (with its reasons) and worker counts."""
    pipeline = group.pipeline
    groups = proxy.groups
    members = [worker for worker in list(proxy.pool.workers.values()) if groups.of_worker(worker) is group]
    return {
        "model": group.served_model_names[0] if group.served_model_names else None,
        "served_model_names": list(group.served_model_names),
        "fingerprint_digest": pipeline.fingerprint.digest if pipeline else None,
        "reasoning_parser": pipeline.options.reasoning_parser if pipeline else None,
        "tool_call_parser": pipeline.options.tool_call_parser if pipeline else None,
        "forwarding": group.gate.state.forwarding,
        "gate": group.gate.state.to_json(),
        "workers": len(members),
        "active_workers": sum(1 for worker in members if worker.healthy),
    }


def served_model_names(proxy: Proxy) -> list[str]:
    """The router's own names (every model's); a router that was given none serves whatever its active
    workers report."""
    names = proxy.groups.served_model_names()
    if names:
        return names
    return sorted({w.report.model for w in proxy.pool.active() if w.report and w.report.model})


class AddWorker(BaseModel):
    """`POST /workers` body."""

    model_config = ConfigDict(strict=True, extra="forbid")
    url: str
    kv_events: str | None = None  # a vLLM worker's ZMQ KV event publisher, tcp://HOST:PORT
    kv_replay: str | None = None  # and its replay endpoint
    protocol: Literal["openai", "generate"] = "openai"  # how forwarded ids are sent (workers.PROTOCOLS)
    verify: Literal["probe"] | None = None  # "probe": checked by a render probe (router.probe)
    model: str | None = None  # pinned to this model of the router's (router.model_placement)


def workers_router() -> APIRouter:
    """The admin API: GET /workers, POST /workers {"url", "kv_events"?, "kv_replay"?, "protocol"?, "verify"?,
    "model"?},
    DELETE /workers?url=URL (the two writes need the admin key: `ADMIN_PATHS`)."""
    router = APIRouter(tags=["admin"])

    @router.get("/workers", summary="The workers, their health, fingerprint match and gate reasons")
    async def list_workers(raw: Request) -> dict[str, Any]:
        return workers_view(raw)

    @router.post("/workers", status_code=201, summary="Add a worker (checked once before answering)")
    async def add_worker(body: AddWorker, raw: Request) -> JSONResponse:
        pool: WorkerPool = raw.app.state.pool
        url = _worker_url(body.url)
        try:
            kv_events = check_kv_endpoint(body.kv_events, "kv_events") if body.kv_events is not None else None
            kv_replay = check_kv_endpoint(body.kv_replay, "kv_replay") if body.kv_replay is not None else None
            if kv_replay and not kv_events:
                raise ValueError("kv_replay needs kv_events too")
        except ValueError as exc:
            raise APIError(400, str(exc), param="kv_events", code="invalid_kv_endpoint") from exc
        try:
            spec = WorkerSpec(
                url, kv_events, kv_replay, protocol=body.protocol, verify=body.verify, model=body.model
            )
        except ValueError as exc:
            raise APIError(400, str(exc), param="verify") from exc
        _check_pinned_model(raw, body.model)
        await _admit(raw, spec)
        # Where this request came in is an address the router listens on: a worker URL naming it is the router.
        server = raw.scope.get("server")
        if isinstance(server, (tuple, list)) and len(server) == 2:
            pool.note_own_address(*server)
        try:
            worker = await pool.add(spec, refuse_loops=True)
        except DuplicateWorker as exc:
            raise APIError(
                409,
                f"{exc} (the same scheme, host and port; loopback names count as one host): DELETE "
                f"/workers?url={exc.existing} first to replace it",
                param="url",
                code="worker_exists",
            ) from exc
        except RouterItself as exc:
            raise APIError(400, f"refused: {exc}", param="url", code="worker_is_router") from exc
        return JSONResponse(_safely(worker, lambda: worker_view(raw, worker.url)), status_code=201)

    @router.delete("/workers", summary="Remove a worker (its in-flight requests finish)")
    async def remove_worker(raw: Request, url: str = Query(..., description="the worker's base URL")) -> dict:
        pool: WorkerPool = raw.app.state.pool
        key = _worker_url(url)
        worker = pool.find(key)
        if worker is None:
            raise APIError(404, f"no worker {key} in the pool", param="url", code="worker_not_found")
        await pool.remove(worker.url)
        return {"removed": worker.url, **workers_view(raw)}

    return router


def _check_pinned_model(raw: Request, model: str | None) -> None:
    """A 400 when a worker is pinned to a model this router does not serve."""
    if model is None:
        return
    proxy: Proxy = raw.app.state.proxy
    names = proxy.groups.served_model_names()
    if model not in proxy.groups.placement.key_of:
        raise APIError(
            400,
            f"model={model} is not a model this router serves (it serves {', '.join(names) or 'no named model'})",
            param="model",
            code="model_not_found",
        )


async def _admit(raw: Request, spec: WorkerSpec) -> None:
    """Refuse a worker the router may not take: outside `--worker-allow` (403), or beyond `--max-workers` (409).

    Nothing is sent to the worker before this passes. The pool's size is read last, and nothing awaits
    between that and the pool taking the worker in (`WorkerPool.add`): concurrent adds cannot pass the cap.
    """
    pool: WorkerPool = raw.app.state.pool
    allow: WorkerAllowList | None = raw.app.state.worker_allow
    if allow is not None:
        endpoints = (("kv_events", spec.kv_events), ("kv_replay", spec.kv_replay))
        refusal = await allow.refusal_in_thread(spec.url, endpoints, timeout=pool.settings.connect_timeout)
        if refusal is not None:
            field, problem = refusal
            raise APIError(403, f"worker URL {spec.url}: {problem}", param=field, code="worker_not_allowed")
    max_workers: int = raw.app.state.max_workers
    if len(pool.workers) >= max_workers:
        raise APIError(
            409,
            f"the pool is full: it has {len(pool.workers)} workers, this router's --max-workers; DELETE "
            "/workers?url=... one first, or restart the router with a larger --max-workers",
            code="worker_pool_full",
        )


def _worker_url(url: str) -> str:
    """The canonical spelling of a worker URL a client gave; a 400 that says what is wrong with it otherwise."""
    try:
        return normalize_url(url)
    except ValueError as exc:
        raise APIError(400, str(exc), param="url", code="invalid_worker_url") from exc


def _safely(worker: Worker, describe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A worker's description; one that cannot be described is listed with why, never failing the listing."""
    try:
        return describe()
    except Exception as exc:
        log.exception("describing worker %s failed", worker.url)
        url = worker.url.encode("ascii", "backslashreplace").decode("ascii")
        return {"url": url, "state": "error", "problem": f"describing it failed ({describe_error(exc)})"}


def worker_view(raw: Request, url: str) -> dict[str, Any]:
    """One worker as the admin API shows it: its state, whether it renders like the router and why not.

    `fingerprint_matches` is about the fingerprint alone, against its own model's; `render_check` says what
    makes the worker eligible for forwarding ("fingerprint match", or "verified by probe, N cases" for a worker
    with no fingerprint). A worker of no model of the router's (`model_group` None, `model_mismatch` says
    why) gets no requests: it has no gate reasons and no predicted load.
    """
    pool: WorkerPool = raw.app.state.pool
    proxy: Proxy = raw.app.state.proxy
    worker = pool.workers[url]
    group = proxy.groups.of_worker(worker)
    if group is None:
        return {
            **worker.describe(),
            "fingerprint_matches": None,
            "render_check": None,
            "probe": worker.report.probe.to_json()
            if worker.report is not None and worker.report.probe is not None
            else None,
            "gate_reasons": [],
            "predicted_load": None,
        }
    gate = group.gate
    report = worker.report
    reasons = list(gate.worker_reasons(report)) if worker.checked else []
    fingerprint = report.fingerprint if report is not None else None
    # None: the router has no fingerprint of its own, so there is nothing to match.
    matches = (
        None
        if gate.fingerprint is None
        else (fingerprint is not None and not gate.fingerprint_reasons(fingerprint))
    )
    return {
        **worker.describe(),
        "fingerprint_matches": matches,
        "render_check": _render_check(gate, report, eligible=worker.checked and not reasons),
        "probe": report.probe.to_json() if report is not None and report.probe is not None else None,
        "gate_reasons": reasons,
        # The routing policy's view of its load (`Policy.predicted_load`; also on /metrics).
        "predicted_load": group.policy.predicted_load(worker.load()),
    }


def _render_check(gate: ForwardingGate, report: WorkerReport | None, *, eligible: bool) -> str | None:
    """What shows that the worker renders like the router, when something does (None: nothing does)."""
    if not eligible or report is None or gate.fingerprint is None:
        return None
    cases = gate.probe_verified(report)
    return "fingerprint match" if cases is None else f"verified by probe, {cases} cases"


def workers_view(raw: Request) -> dict[str, Any]:
    """Every worker, and the gate's decision (the first model's; `gates` has every model's by its key)."""
    pool: WorkerPool = raw.app.state.pool
    proxy: Proxy = raw.app.state.proxy
    return {
        "workers": [
            _safely(worker, functools.partial(worker_view, raw, url))
            for url, worker in list(pool.workers.items())
        ],
        "gate": proxy.gate.state.to_json(),
        "gates": {group.key: group.gate.state.to_json() for group in proxy.groups.groups},
    }


def render_unavailable_router() -> APIRouter:
    """The render routes of a router with no tokenizer: an error that says how to get them."""
    router = APIRouter(tags=["render"])

    async def unavailable() -> None:
        raise APIError(
            501,
            "this router was started without --model (or --tokenizer), so it cannot render; start it with "
            "--model, or use a renderer (`tokenfront render`)",
            code="render_unavailable",
            error_type="server_error",
        )

    for path in RENDER_PATHS:
        router.add_api_route(path, unavailable, methods=["POST"])
    return router

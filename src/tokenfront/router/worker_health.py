"""The worker health check: what the router asks a worker, and what the answers say about whether it may take
requests.

One check (`WorkerPool.check`: every `--health-interval` s, and at once after a request to the worker failed)
asks these together (one round trip) and reads the answers in order, the first that rules the worker out
deciding (a `protocol=generate` worker's route and a probe are asked after):

1. `GET /health`: the worker is up only when it answers 200; the router's own 508 `router_loop` says the URL
   reaches this router;
2. `GET /v1/models` with the router's worker key: a 401 or 403 says the worker would refuse every request; the
   ids it lists are the names it serves when its `/server_info` names none;
3. for a `protocol=generate` worker, `POST /inference/v1/generate` with an empty body: a worker without the
   route answers 404 (or vLLM's 403);
4. `GET /server_info` (a `WorkerReport`) and, for a `verify=probe` worker, the render probe against its
   `/tokenize` (`router.probe`), by its model's prober.

What the report says can still rule the worker out (it is this router, or a router that routes back to it), and
it places the worker in one of the router's models (`router.model_placement`). `HealthCheck` asks and
concludes; the pool acts on its conclusions (the active set, `on_change`).

Every request the router sends a worker carries its instance id in `VIA_HEADER`; a router that receives its own
id answers 508 `LOOP_CODE` (`router.app`), so a URL that reaches the router itself is found at its first health
check, however it is spelled.

The questions go over the worker's `CheckClient` (`router.check_client`), each answered whole within
`--health-timeout`; one that fails at the connection is named by its error, e.g. `/health unreachable
(ReadTimeout: no whole answer within 5 s)`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING

from tokenfront.router.check_client import CheckAnswer, describe_failure
from tokenfront.router.connections import WorkerTransportError, describe_error
from tokenfront.router.generate import GENERATE_PATH
from tokenfront.router.model_placement import ModelPlacement
from tokenfront.router.probe import NO_PROBER, Prober, ProbeResult, ProbeUnreachable
from tokenfront.router.worker import NO_GENERATE_ROUTE, ROUTER_ITSELF, ROUTER_LOOP, WORKER_API_KEY, Worker
from tokenfront.router.worker_report import WorkerReport, listed_models

if TYPE_CHECKING:
    from tokenfront.router.worker_pool import PoolSettings

__all__ = ["LOOP_CODE", "VIA_HEADER", "HealthCheck"]

log = logging.getLogger(__name__)

VIA_HEADER = "x-tokenfront-via"
LOOP_CODE = "router_loop"


class HealthCheck:
    """The questions of one health check and what their answers mean (module docstring); the pool acts on
    them."""

    def __init__(
        self,
        settings: PoolSettings,
        *,
        prober: Prober | None,
        probers: Mapping[str, Prober] | None,
        router_id: str | None,
        placement: ModelPlacement,
    ) -> None:
        """`prober` probes the `verify=probe` workers (None: the router cannot render); `probers`, by model key,
        instead, each worker by its own model's. `router_id` is the router's instance id, looked for in a
        worker's `/server_info`; `placement` places each worker in one of the router's models."""
        self.settings = settings
        self.prober = prober
        self.probers = dict(probers or {})
        self.router_id = router_id
        self.placement = placement

    async def answer_problem(self, worker: Worker) -> tuple[str | None, str | None, tuple[str, ...] | None]:
        """Why the worker's answers rule it out — its `/health`, its `GET /v1/models` with the router's key and,
        for a `protocol=generate` worker, its generate route — as (problem, unusable, the names it lists);
        problem None: nothing does. `unusable` when it answers yet cannot be used (`Worker.unusable`)."""
        # Asked together (and `/server_info` beside them: `WorkerPool._check`), concluded in order: in a row, they
        # made a 256-worker router's start-up, and each check of a busy fleet, wait three round trips.
        (problem, unusable), models = await asyncio.gather(
            self._health_problem(worker), self._read_models(worker)
        )
        listed: tuple[str, ...] | None = None
        if problem is None:
            problem, listed = models
            unusable = WORKER_API_KEY if problem is not None else None
        if problem is None and worker.protocol == "generate":
            problem = await self._generate_problem(worker)
            unusable = NO_GENERATE_ROUTE if problem is not None else None
        return problem, unusable, listed

    async def report(
        self,
        worker: Worker,
        listed: tuple[str, ...] | None,
        server_info: Awaitable[WorkerReport] | None = None,
    ) -> WorkerReport:
        """What the worker reports: its `/server_info` (`server_info`: `read_report`, asked already), with the
        names its `GET /v1/models` `listed` when it names none, and a `verify=probe` worker's render probe by its
        model's prober."""
        report = await (server_info if server_info is not None else self.read_report(worker))
        if report.served_model_names is None and listed is not None:
            report = dataclasses.replace(report, served_model_names=listed)
        if worker.verify == "probe":
            placement = self.placement.place(worker.pinned_model, report.served_model_names)
            report = dataclasses.replace(report, probe=await self._probe(worker, placement.model))
        return report

    async def _generate_problem(self, worker: Worker) -> str | None:
        """Why a `protocol=generate` worker cannot take ids (None: its generate route is there).

        An empty body is sent: a worker with the route refuses it as invalid (400 or 422); one without it
        answers 404 (or vLLM's 403 when `--enable-scale-out` is off).
        """
        try:
            response = await worker.client.post(GENERATE_PATH, json={}, timeout=self.settings.health_timeout)
        except WorkerTransportError as exc:
            return describe_failure(GENERATE_PATH, exc)
        if response.status_code in (403, 404, 405):
            return (
                f"it has no tokens-in route: {GENERATE_PATH} answered {response.status_code} (start vLLM with "
                "--enable-scale-out, or add the worker without protocol=generate)"
            )
        return None

    async def _health_problem(self, worker: Worker) -> tuple[str | None, str | None]:
        """Why `/health` says the worker is not up, and whether that makes it unusable (None, None: it is up)."""
        try:
            response = await worker.client.get("/health", timeout=self.settings.health_timeout)
        except WorkerTransportError as exc:
            return describe_failure("/health", exc), None
        if response.status_code == 508 and _error_code(response) == LOOP_CODE:
            # Only the router that sent VIA_HEADER answers its own id so: this URL reaches this router.
            return (
                "this URL reaches this router itself (its /health answered the router's own 508 router_loop): "
                "a router cannot be its own worker",
                ROUTER_ITSELF,
            )
        if response.status_code in (401, 403):
            return self._key_problem("/health", response.status_code), WORKER_API_KEY
        if response.status_code != 200:
            return f"/health answered {response.status_code} (a worker is up only when it answers 200)", None
        return None, None

    def _key_problem(self, route: str, status: int) -> str:
        sent = (
            "the router's --worker-api-key"
            if self.settings.key_for_workers
            else "no key (the router has no --worker-api-key)"
        )
        return (
            f"it refuses the router's requests: {route} answered {status} to {sent}; start the router with "
            "--worker-api-key set to the worker's --api-key"
        )

    async def _read_models(self, worker: Worker) -> tuple[str | None, tuple[str, ...] | None]:
        """`GET /v1/models` with the router's worker key: (why the worker refuses that key, the names it lists).

        `/health` needs no key, so this is where a worker that will refuse every request is found. Any other
        failure says nothing (a server without the route lists no names).
        """
        try:
            response = await worker.client.get("/v1/models", timeout=self.settings.health_timeout)
        except WorkerTransportError:
            return None, None
        if response.status_code in (401, 403):
            return self._key_problem("GET /v1/models", response.status_code), None
        if response.status_code != 200:
            return None, None
        try:
            return None, listed_models(response.json())
        except ValueError:
            return None, None

    def report_problem(self, worker: Worker, report: WorkerReport) -> tuple[str | None, str | None]:
        """Why what the worker reports makes it unusable (None, None: nothing does); notes on the worker (and
        logs once) which of the router's model names it does not serve."""
        if self.router_id is not None and report.role == "router":
            if report.router_id == self.router_id:
                problem = (
                    "this URL reaches this router itself (same router_id): a router cannot be its own worker"
                )
                return problem, ROUTER_ITSELF
            if self.router_id in report.routes_to:
                return (
                    f"it is a router (router_id {report.router_id}) that has this router among its workers: "
                    "requests would go round in a loop",
                    ROUTER_LOOP,
                )
        self.place(worker, report)
        return None, None

    def place(self, worker: Worker, report: WorkerReport) -> None:
        """Put the worker in the router's model its `report` (or its pin) names (`Worker.model_group`), noting
        (and logging once) which of that model's names it does not serve."""
        placement = self.placement.place(worker.pinned_model, report.served_model_names)
        note = placement.note
        if note != worker.model_mismatch:
            if note is not None and placement.model is not None:
                log.warning(
                    "worker %s: %s; requests naming those models are not sent to it", worker.url, note
                )
            elif note is not None:
                log.warning("worker %s: %s", worker.url, note)
            worker.model_mismatch = note
        if placement.model != worker.model_group and worker.model_group is not None and placement.model:
            log.info(
                "worker %s now serves model %s (it served %s)",
                worker.url,
                placement.model,
                worker.model_group,
            )
        worker.model_group = placement.model

    async def read_report(self, worker: Worker) -> WorkerReport:
        """The worker's `/server_info` as a report (one saying what is missing when it cannot be read)."""
        try:
            response = await worker.client.get("/server_info", timeout=self.settings.health_timeout)
        except WorkerTransportError as exc:
            if worker.report is not None and worker.report.fingerprint is not None:
                # /health answered, so it is the same process: a slow /server_info says nothing new.
                return worker.report
            return WorkerReport(None, missing=describe_failure("/server_info", exc))
        if response.status_code != 200:
            return WorkerReport(None, missing=f"/server_info answered {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            return WorkerReport(None, missing="/server_info is not JSON")
        return WorkerReport.from_server_info(body)

    async def _probe(self, worker: Worker, group: str | None) -> ProbeResult:
        """The worker's render probe, by its model's `group` prober; a `/tokenize` that cannot be reached keeps
        a passing last result."""
        prober = self.probers.get(group, self.prober) if group is not None else self.prober
        if prober is None:
            return ProbeResult(0, difference=NO_PROBER)
        try:
            return await prober.run(worker.client, self.settings.health_timeout)
        except ProbeUnreachable as exc:
            last = worker.report.probe if worker.report is not None else None
            if last is not None and last.difference is None:
                # /health answered, so it is the same process: a slow /tokenize says nothing new.
                return last
            return ProbeResult(0, difference=str(exc))
        except Exception as exc:  # the router's own rendering failed: say so, and keep checking the worker
            log.exception("probing worker %s failed", worker.url)
            return ProbeResult(0, difference=f"the probe failed in the router ({describe_error(exc)})")


def _error_code(response: CheckAnswer) -> str | None:
    """The `error.code` of an OpenAI-shaped error answer (None when it has none)."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None

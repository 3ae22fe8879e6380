"""The router's models: per model, what renders for it, decides its forwarding and routes among its workers.

A router serves one model (`route --model`) or several (`route --config`, `router.config_file`). Each is a
`ModelGroup`: its `RenderPipeline` (its own tokenizer, template and parsers) and the bounded render the proxy
uses, its served names, its `ForwardingGate` (evaluated over that model's active workers only, so a worker of
another model never closes it), and its routing policy. `ModelGroups` holds them: a request's `model` picks
its group by one dict lookup (`for_request`), and a worker belongs to the group its report names
(`router.model_placement`, applied by the pool on each check: `Worker.model_group`).

The fleet stays one: one `WorkerPool` (membership, health, sources, admin), and one `KvIndex`, which holds each
worker's blocks under that worker's URL — a policy asks only about its own model's workers, so each model sees
only its workers' caches. A single-model router is one group: the same structures, N = 1.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from tokenfront.core.context_length import max_model_len
from tokenfront.core.families import ModelFamily, family_for
from tokenfront.core.reasoning import ReasoningParser
from tokenfront.core.render import RenderPipeline
from tokenfront.router.bounded_render import BoundedRender, RenderSettings
from tokenfront.router.gate import ForwardingGate, GateState
from tokenfront.router.model_placement import ModelPlacement
from tokenfront.router.policies.base import Policy
from tokenfront.router.probe import Prober
from tokenfront.router.worker import Worker
from tokenfront.router.worker_pool import WorkerPool
from tokenfront.server.errors import APIError, model_not_found

__all__ = ["ModelGroup", "ModelGroups"]

log = logging.getLogger(__name__)


@dataclass
class ModelGroup:
    """One model of the router's: its names, pipeline (None: a router without a tokenizer), render, gate and
    policy, and what the proxy derives from its checkpoint once."""

    key: str  # its first served name ("" for a router given no name: it serves what its workers report)
    served_model_names: tuple[str, ...]
    pipeline: RenderPipeline | None
    renders: BoundedRender | None
    gate: ForwardingGate
    policy: Policy
    prober: Prober | None
    family: ModelFamily
    # The router's own reasoning parser when it reads the reasoning mode from the prompt text.
    own_prompt_parser: ReasoningParser | None
    # What a request without max_tokens may generate at most (the model's context; None: unknown).
    context_tokens: int | None

    @classmethod
    def build(
        cls,
        pipeline: RenderPipeline | None,
        *,
        served_model_names: Sequence[str],
        policy: Policy,
        render: RenderSettings,
        renders: Counter,
        render_seconds: Histogram,
        name_in_logs: bool,
        gate: ForwardingGate | None = None,
    ) -> ModelGroup:
        """A group for `pipeline` (its names are the pipeline's; `served_model_names` when it has none).
        `name_in_logs`: its gate names it in its log lines (a router of several models)."""
        names = tuple(pipeline.served_model_names) if pipeline is not None else tuple(served_model_names)
        key = names[0] if names else ""
        if gate is None:
            has_model_path = pipeline is not None and pipeline.checkpoint.model_path is not None
            gate = ForwardingGate(
                pipeline.fingerprint if pipeline else None,
                has_model_path=has_model_path,
                model=key if name_in_logs else None,
            )
        bounded = (
            BoundedRender(pipeline, render, renders=renders, seconds=render_seconds)
            if pipeline is not None
            else None
        )
        own = pipeline.reasoning_parser if pipeline else None
        checkpoint = pipeline.checkpoint if pipeline else None
        has_config = checkpoint is not None and checkpoint.model_path is not None and bool(checkpoint.config)
        return cls(
            key=key,
            served_model_names=names,
            pipeline=pipeline,
            renders=bounded,
            gate=gate,
            policy=policy,
            prober=Prober(pipeline) if pipeline is not None else None,
            family=family_for(checkpoint.model_type if checkpoint else None),
            own_prompt_parser=own if own is not None and own.reads_mode_from_prompt else None,
            context_tokens=max_model_len(checkpoint.config) if checkpoint and has_config else None,
        )

    def evaluate(self, workers: Sequence[Worker]) -> GateState:
        """Decide this model's forwarding again over its active `workers` (the gate logs only changes)."""
        return self.gate.evaluate({worker.url: worker.report for worker in workers})


class ModelGroups:
    """The router's models, in its order: the first is the default (a request naming no model goes there)."""

    def __init__(self, groups: Sequence[ModelGroup]) -> None:
        """ValueError when there is no group, or two groups share a served name."""
        self.groups: tuple[ModelGroup, ...] = ()
        self.replace(groups)

    def replace(self, groups: Sequence[ModelGroup]) -> None:
        """Serve `groups` from now on (a reload of `--config`: `router.config_reload`). One synchronous step on
        the event loop, so a request sees the old models or the new ones, never a mix; a request planned before
        keeps the group its plan holds. ValueError (nothing changed) when there is no group, or two groups share
        a served name."""
        if not groups:
            raise ValueError("a router serves at least one model")
        placement = ModelPlacement([group.served_model_names for group in groups])
        by_key = {group.key: group for group in groups}
        self.groups = tuple(groups)
        self.default = self.groups[0]
        self.placement = placement
        self.by_key = by_key
        # Every served name -> its group: the request's one lookup.
        self._by_name = {name: by_key[key] for name, key in placement.key_of.items()}

    @property
    def several(self) -> bool:
        """Whether the router serves more than one model."""
        return len(self.groups) > 1

    def for_request(self, model: str | None) -> ModelGroup:
        """The group a request naming `model` goes to; a 404 `model_not_found` naming every served name when
        no model of the router's has that name. A request naming none goes to the first model; a router given
        no names at all lets its workers decide."""
        if model is None:
            return self.default
        group = self._by_name.get(model)
        if group is not None:
            return group
        if not self.default.served_model_names:
            return self.default
        raise model_not_found(str(model), tuple(self.placement.all_names()))

    def pipeline_for(self, model: str | None) -> RenderPipeline:
        """The pipeline that renders for `model` (`for_request`'s 404 for an unknown one)."""
        pipeline = self.for_request(model).pipeline
        if pipeline is None:
            raise APIError(
                501,
                "this router was started without --model (or --tokenizer), so it cannot render",
                code="render_unavailable",
                error_type="server_error",
            )
        return pipeline

    def of_worker(self, worker: Worker) -> ModelGroup | None:
        """The group a worker belongs to (None: none of the router's models). With one model, that one,
        checked or not: every worker belongs to it but one pinned to a model it does not serve (`_takes`)."""
        if not self.several:
            return self.default if self._takes(worker) else None
        key = worker.model_group
        return self.by_key.get(key) if key is not None else None

    def policy_of(self, worker: Worker) -> Policy | None:
        """The policy that routes to `worker` (None: it belongs to no model)."""
        group = self.of_worker(worker)
        return group.policy if group is not None else None

    def served_model_names(self) -> list[str]:
        """Every served name of every model, in the router's order."""
        return self.placement.all_names()

    def probers(self) -> dict[str, Prober]:
        """Each model's render prober, by key (for the `verify=probe` workers of that model)."""
        return {group.key: group.prober for group in self.groups if group.prober is not None}

    def members(self, pool: WorkerPool, group: ModelGroup) -> list[Worker]:
        """The active workers of `group`: its gate looks at these, its requests go to these. With one model,
        every active worker (each belongs to it, `_takes`)."""
        if self.several:
            return pool.members(group.key)
        return [worker for worker in pool.active() if self._takes(worker)]

    def candidates(self, pool: WorkerPool, group: ModelGroup, model: str | None) -> list[Worker]:
        """The active workers of `group` that a request naming `model` may go to (`WorkerPool.serving`)."""
        if self.several:
            return pool.serving(model, group.key)
        return [worker for worker in pool.serving(model) if self._takes(worker)]

    def _takes(self, worker: Worker) -> bool:
        """Whether the one model takes a worker: any, but one pinned to a name it does not serve — a model a
        reload of --config adds (its workers join before it serves) or removes (its workers are leaving)."""
        return worker.pinned_model is None or worker.pinned_model in self._by_name

    def evaluate(self, pool: WorkerPool) -> list[GateState]:
        """Every model's forwarding decided again, each over its own active workers."""
        return [group.evaluate(self.members(pool, group)) for group in self.groups]

"""Reloading `route --config FILE.toml` while the router serves (docs/operations.md, "Several models").

The router reads its config file again on SIGHUP (`reload`, called by `router.hangup`) and when the file's
content changes: every `--worker-source-interval` seconds it reads the file's bytes and compares their sha256
with those it runs on. The same parser and checks as at start-up decide (`router.config_file`); what cannot be
used — not TOML, an unknown key, a checkpoint folder that does not exist, two models sharing a name — is one
WARNING line naming the file, the table and the key, and the running configuration stays as it is. A file that
cannot be read, or a checkpoint that fails to load, likewise (outcome `failed`). Every reload is counted in
`tokenfront_router_config_reloads_total{outcome="ok|invalid|failed"}`; a content once refused is not counted
again until it changes (or a SIGHUP asks).

What a reload changes, table by table (a table is the same model as before when its rendering keys are equal;
a changed table is the same model when its first served name is):

- unchanged: its group — pipeline, gate, policy, render processes — is kept as it is;
- added: its pipeline is loaded in a thread (seconds: the event loop keeps serving), its render processes
  started, its pinned workers added and checked; then it serves;
- rendering options changed: a new pipeline beside the old one, then swapped in; its policy (its load state) is
  kept, its gate is a new one, decided over its workers at once;
- removed: its names answer 404 `model_not_found` from the swap on; its pinned workers are removed as
  `DELETE /workers` removes one (no new request, the requests in flight finish).

The swap is one synchronous step on the event loop (`ModelGroups.replace`): a request planned before it keeps
the group, hence the pipeline and render, its plan holds. The render processes of a group no longer served are
stopped once no render asked before the swap can still be waited for (`--render-timeout`). The `workers` of the
tables are a worker source of their own (`config:PATH` in `GET /workers`), kept in step by
`router.worker_sources.SourceMembers` as a `--worker-file` is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from tokenfront.core.errors import TokenfrontError
from tokenfront.core.render import RenderPipeline
from tokenfront.options import options_from_args
from tokenfront.router.config_file import (
    ConfigError,
    ModelConfig,
    check_model,
    parse_router_config,
    pinned_specs,
)
from tokenfront.router.connections import describe_error
from tokenfront.router.model_group import ModelGroup, ModelGroups
from tokenfront.router.model_placement import ModelPlacement
from tokenfront.router.policies.base import Policy
from tokenfront.router.worker_pool import WorkerPool
from tokenfront.router.worker_sources import Admission, SourceMembers
from tokenfront.router.worker_spec import WorkerSpec
from tokenfront.server.tasks import cancel_and_wait
from tokenfront.server_address import worker_identity

__all__ = ["OUTCOMES", "ConfigReloader", "ConfigSettings", "GroupBuilder", "content_digest"]

log = logging.getLogger(__name__)

OUTCOMES = ("ok", "invalid", "failed")

# Builds a group for a loaded pipeline (None: a router without one): (pipeline, the policy to keep or None for a new one, whether the router
# serves several models).
GroupBuilder = Callable[[RenderPipeline | None, Policy | None, bool], ModelGroup]


def content_digest(data: bytes) -> str:
    """The sha256 of a config file's content (hex): what `/server_info` names and a change is told by."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ConfigSettings:
    """The config file the router started with: its path, its tables (in the order of the router's models) and
    the digest of the content they were read from."""

    path: str
    tables: tuple[ModelConfig, ...]
    digest: str


class PinnedWorkers:
    """The workers the tables list, each pinned to its model: a worker source (`config:PATH`)."""

    def __init__(self, path: str) -> None:
        self.name = f"config:{path}"
        self.specs: tuple[WorkerSpec, ...] = ()

    async def read(self) -> Sequence[WorkerSpec]:
        return self.specs


@dataclass
class _Model:
    """A model of a reload's plan: its table, its group, and what the reload does to it."""

    table: ModelConfig
    group: ModelGroup
    change: str  # "unchanged", "added" or "rebuilt"


class _Refused(Exception):
    """A reload that cannot be applied: its outcome ("invalid" or "failed") and the one line saying why."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class ConfigReloader:
    """Follows the config file while the router serves (module docstring)."""

    def __init__(
        self,
        settings: ConfigSettings,
        groups: ModelGroups,
        pool: WorkerPool,
        admission: Admission,
        *,
        build_group: GroupBuilder,
        reloads: Counter,
        interval: float,
        render_grace: float,
        on_render_replaced: Callable[[], None] | None = None,
        one_model: str | None = None,
        on_swap: Callable[[], None] | None = None,
    ) -> None:
        """`build_group` makes a loaded pipeline's group; `reloads` counts reloads by outcome; `render_grace`:
        seconds a retired group's render processes are kept (`--render-timeout`); `one_model`: why the router
        must keep one model (replica sync), refusing a file of several; None: it may serve several. `on_swap` is
        called once new models serve."""
        self.path = settings.path
        self.groups = groups
        self.pool = pool
        self.build_group = build_group
        self.reloads = reloads
        self.interval = interval
        self.render_grace = render_grace
        self.on_render_replaced = on_render_replaced
        self.one_model = one_model
        self.on_swap = on_swap
        for outcome in OUTCOMES:
            reloads.labels(outcome)  # on /metrics at 0 from the start
        # The table each model was built from, by its key.
        self._tables = {group.key: table for group, table in zip(groups.groups, settings.tables, strict=True)}
        self._source = PinnedWorkers(settings.path)
        self._source.specs = tuple(self._pinned(zip(settings.tables, groups.groups, strict=True)))
        self.members = SourceMembers(self._source, pool, admission)
        self.digest = settings.digest
        self.generation = 1
        self.loaded_at = time.time()
        self._last: dict[str, Any] | None = None  # the last reload's outcome, when and why
        self._refused_digest: str | None = None  # a content refused: not counted again until it changes
        self._unreadable = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    # -- running with the app -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Add the tables' workers (checked, as `--worker` ones are, before the router serves), then follow the
        file."""
        await self.members.refresh()
        self._task = asyncio.get_running_loop().create_task(self._follow())

    def reload(self) -> None:
        """Read the file now, and apply it whatever its content (SIGHUP: `router.hangup`)."""
        log.info("reading the config file %s again (SIGHUP)", self.path)
        self._wake.set()

    async def stop(self) -> None:
        """Stop following the file; retired render processes are stopped now."""
        await cancel_and_wait([*([self._task] if self._task is not None else []), *self._retiring])
        self._task = None

    def describe(self) -> dict[str, Any]:
        """For `/server_info`: the file, the digest and generation of the configuration the router runs, when
        it was loaded, and how the last reload went."""
        return {
            "path": self.path,
            "digest": self.digest,
            "generation": self.generation,
            "loaded_at": self.loaded_at,
            "last_reload": self._last,
        }

    @property
    def pinned_workers(self) -> tuple[WorkerSpec, ...]:
        """The workers the tables list, each pinned to its model (`model=` its first served name)."""
        return self._source.specs

    async def _follow(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            forced = self._wake.is_set()
            self._wake.clear()
            try:
                await self.check(forced=forced)
            except Exception:  # a bug must not stop the following: the next read tries again
                log.exception("reloading the config file %s failed", self.path)
                self._count("failed", "the reload failed in the router (a bug: see the traceback in the log)")

    # -- one reload ---------------------------------------------------------------------------------------------

    async def check(self, *, forced: bool) -> None:
        """Read the file; apply it when its content changed, or when `forced` (SIGHUP) whatever it holds."""
        try:
            data = await asyncio.to_thread(Path(self.path).expanduser().read_bytes)
        except OSError as exc:
            if forced or not self._unreadable:
                problem = f"config file {self.path} cannot be read ({exc.strerror or exc})"
                log.warning("%s; the running configuration (generation %d) is kept", problem, self.generation)
                self._count("failed", problem)
            self._unreadable = True
            return
        if self._unreadable:
            log.info("config file %s can be read again", self.path)
            self._unreadable = False
        digest = content_digest(data)
        if not forced and digest in (self.digest, self._refused_digest):
            return
        if not forced:
            log.info("config file %s changed: reading it again", self.path)
        try:
            plan = await self._plan(data)
            changes = await self._apply(plan, digest)
        except _Refused as refused:
            self._refused_digest = digest
            log.warning(
                "config file %s not applied, the running configuration (generation %d) is kept: %s",
                self.path,
                self.generation,
                refused,
            )
            self._count(refused.outcome, str(refused))
            return
        self._refused_digest = None
        log.info("config file %s applied (generation %d): %s", self.path, self.generation, changes)
        self._count("ok", None)

    def _count(self, outcome: str, problem: str | None) -> None:
        self.reloads.labels(outcome).inc()
        self._last = {"outcome": outcome, "at": time.time(), "problem": problem}

    async def _plan(self, data: bytes) -> list[_Model]:
        """The models the content declares, each with its group (a kept one, or one built on a pipeline loaded
        in a thread); _Refused when the content cannot be used."""
        try:
            tables = parse_router_config(data, self.path)
            for table in tables:
                check_model(table)
        except ConfigError as exc:
            raise _Refused("invalid", str(exc)) from None
        several = len(tables) > 1
        if several and self.one_model is not None:
            raise _Refused("invalid", f"--config {self.path} declares {len(tables)} models: {self.one_model}")
        current = dict(self._tables)
        plan: list[_Model] = []
        for table in tables:
            key = next((key for key, old in current.items() if old.args == table.args), None)
            if key is not None:
                del current[key]
                plan.append(_Model(table, self.groups.by_key[key], "unchanged"))
                continue
            pipeline = await self._load(table)
            key = pipeline.served_model_names[0]
            rebuilt = current.pop(key, None) is not None
            kept = self.groups.by_key[key] if rebuilt else None
            if self.one_model is not None:
                kept = self.groups.default  # replica sync shares the one policy it was started with
            group = self.build_group(pipeline, kept.policy if kept is not None else None, several)
            plan.append(_Model(table, group, "rebuilt" if rebuilt else "added"))
        try:
            ModelPlacement([model.group.served_model_names for model in plan])
        except ValueError as exc:
            raise _Refused("invalid", f"--config {self.path}: {exc}") from None
        try:
            self._check_workers(self._pinned((model.table, model.group) for model in plan))
        except ConfigError as exc:
            raise _Refused("invalid", str(exc)) from None
        return plan

    async def _load(self, table: ModelConfig) -> RenderPipeline:
        """A table's pipeline, loaded in a thread (its fingerprint too): the event loop keeps serving."""

        def load() -> RenderPipeline:
            pipeline = RenderPipeline.load(options_from_args(table.args))
            _ = pipeline.fingerprint
            return pipeline

        try:
            return await asyncio.to_thread(load)
        except TokenfrontError as exc:
            raise _Refused("invalid", f"{table.where}: {exc}") from None
        except Exception as exc:  # a checkpoint that fails to load (a broken tokenizer file, say)
            raise _Refused(
                "failed", f"{table.where}: its checkpoint failed to load ({describe_error(exc)})"
            ) from None

    def _pinned(self, models: Iterable[tuple[ModelConfig, ModelGroup]]) -> list[WorkerSpec]:
        """Every table's workers, pinned to its model; ConfigError when one is pinned to a name its model lacks."""
        return [spec for table, group in models for spec in pinned_specs(table, group.served_model_names)]

    def _check_workers(self, specs: Sequence[WorkerSpec]) -> None:
        """ConfigError when two tables (or one twice) list one worker, however spelled."""
        seen: dict[tuple[str, str, int], str] = {}
        for spec in specs:
            identity = worker_identity(spec.url)
            if identity in seen:
                raise ConfigError(
                    f"--config {self.path}: worker {spec.url} is listed twice (also as {seen[identity]}): a worker "
                    "serves one model"
                )
            seen[identity] = spec.url

    async def _apply(self, plan: list[_Model], digest: str) -> str:
        """Start what the new models need, add their workers, swap, then let go of what is no longer served."""
        started = [model.group for model in plan if model.change != "unchanged"]
        try:
            for group in started:
                if group.renders is not None:
                    await group.renders.start(on_replaced=self.on_render_replaced)
        except Exception as exc:
            for group in started:
                if group.renders is not None:
                    await group.renders.stop()
            raise _Refused(
                "failed", f"the render processes failed to start ({describe_error(exc)})"
            ) from None
        new_specs = self._pinned((model.table, model.group) for model in plan)
        old = self.groups.groups
        await self._add_workers_first(plan, new_specs)
        several = len(plan) > 1
        for model in plan:  # a gate's log lines name its model among several
            model.group.gate.model = model.group.key if several else None
        self.groups.replace([model.group for model in plan])
        self.pool.on_change()  # the new gates decided at once, over the workers each model has
        if self.on_swap is not None:
            self.on_swap()
        self._tables = {model.group.key: model.table for model in plan}
        self.digest, self.generation, self.loaded_at = digest, self.generation + 1, time.time()
        # The workers of the tables removed leave first (drained), then the others are placed again.
        self._source.specs = tuple(spec for spec in self._source.specs if spec in new_specs)
        await self.members.refresh()
        self.pool.use_models(self.groups.placement, self.groups.probers())
        self._source.specs = tuple(new_specs)
        await self.members.refresh()  # a renamed model's workers, when they could not join before the swap
        kept = {id(model.group) for model in plan}
        self._retire([group for group in old if id(group) not in kept])
        return _summary(plan, [group.key for group in old if group.key not in self.groups.by_key])

    async def _add_workers_first(self, plan: list[_Model], new_specs: list[WorkerSpec]) -> None:
        """Add (and check) the new tables' workers before the swap, so that a model added serves with its
        workers: the pool places them by the old models and the added ones. Skipped when the added names clash
        with the old ones (a model renamed): they are then added right after the swap."""
        added = [model.group.served_model_names for model in plan if model.change == "added"]
        if not added:
            return
        try:
            during = ModelPlacement([*(group.served_model_names for group in self.groups.groups), *added])
        except ValueError:
            return
        probers = {**self.groups.probers(), **{m.group.key: m.group.prober for m in plan if m.group.prober}}
        self.pool.use_models(during, probers)
        urls = {spec.url for spec in new_specs}
        self._source.specs = (*new_specs, *(spec for spec in self._source.specs if spec.url not in urls))
        await self.members.refresh()

    def _retire(self, groups: Sequence[ModelGroup]) -> None:
        """Stop the render processes of groups no longer served, once no render asked of them can be waited for."""
        renders = [
            group.renders for group in groups if group.renders is not None and group.renders.pool is not None
        ]
        if not renders:
            return

        async def stop_later() -> None:
            try:
                await asyncio.sleep(self.render_grace)
            finally:
                for render in renders:
                    await render.stop()

        task = asyncio.get_running_loop().create_task(stop_later())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)


def _summary(plan: Sequence[_Model], removed: Sequence[str]) -> str:
    """`added a; rebuilt b (its rendering options changed); removed c; unchanged d`."""
    parts = []
    for change, label in (("added", "added"), ("rebuilt", "rebuilt")):
        keys = [model.group.key for model in plan if model.change == change]
        if keys:
            suffix = " (its rendering options changed)" if change == "rebuilt" else ""
            parts.append(f"{label} {', '.join(keys)}{suffix}")
    if removed:
        parts.append(f"removed {', '.join(removed)}")
    unchanged = [model.group.key for model in plan if model.change == "unchanged"]
    if unchanged:
        parts.append(f"unchanged {', '.join(unchanged)}")
    return "; ".join(parts)

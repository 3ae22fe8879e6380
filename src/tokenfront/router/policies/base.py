"""The shared interface of routing policies: what a policy sees of the workers and of a request, and answers.

A policy picks one worker for a request (``select``; ``route`` also says how much of the prompt it predicts the
worker has cached) and may learn from the outcome (``on_routed`` once the request is sent, ``on_first_token``
when a stream's first event carrying output came, ``on_complete`` when it finished); ``predicted_load`` says
what it thinks a worker has to do. Router replicas share their load (``router.replica_sync``): ``shared_load``
says what a peer should count of a request this router routed, and the ``on_peer_*`` hooks count a peer's
requests as the policy counts its own. Everything else — health, membership, counting active requests, forwarding —
belongs to the router around it, so a policy is a small, testable piece of logic.
"""

from __future__ import annotations

import abc
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from collections.abc import Hashable

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self

    from tokenfront.router.kv_index import KvIndex


@dataclass
class WorkerLoad:
    """The router's live view of one worker (owned and updated by the membership code).

    ``url`` is fixed for the object's life (policies reuse what they read of a list of the same loads); the
    load figures are brought up to date in place."""

    url: str
    active_requests: int = 0
    tokens_per_block: int | None = None  # from the worker's /server_info; None for non-tokenfront workers


@dataclass(frozen=True)
class SharedLoad:
    """What one router replica tells the others of a request it routed (``router.replica_sync``), so that their
    policies count it in the worker's load as they count their own: its tokens still to prefill there, its
    prompt's tokens, where its prompt ends (its last full block's index and name), and the ends of the answered
    prompts it continues (an agent's next turn: their linger is over)."""

    uncached_tokens: int = 0
    prompt_tokens: int = 0
    end: tuple[int, int] | None = None
    continued: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class RouteRequest:
    """What a policy may know of a request: its rendered prompt ids and cache salt."""

    token_ids: list[int] | None  # the rendered prompt (None when rendering failed or was impossible)
    cache_salt: str | None = None


_Options = TypeVar("_Options")


@dataclass(frozen=True)
class PolicyConfig:
    """Everything a policy may be built from; each policy takes what it needs (see ``Policy.from_config``).

    ``options`` holds the settings dataclasses of policies that have their own (e.g. ``PredictedTtftConfig``):
    a policy finds its own with ``option``.
    """

    kv_index: KvIndex
    load_weight: float = 1.0
    default_tokens_per_block: int = 16
    cache_threshold: float = 0.5
    options: tuple[object, ...] = ()

    def option(self, kind: type[_Options], default: _Options) -> _Options:
        """The settings of type ``kind`` among ``options``, else ``default``."""
        return next((option for option in self.options if isinstance(option, kind)), default)


@dataclass(frozen=True)
class Routing:
    """One decision: the chosen worker, and how many of the prompt's tokens the policy predicts it has cached.

    A return value rather than state on the policy, so concurrent decisions cannot read each other's.
    ``predicted_cached_tokens`` is None for a policy that does not look at caches (round_robin,
    load_balancing): it predicts nothing.
    """

    worker: WorkerLoad
    predicted_cached_tokens: int | None = None


class Policy(abc.ABC):
    """A routing policy. Implementations are thread-safe: the router may select from several threads."""

    name: ClassVar[str]

    @classmethod
    def from_config(cls, config: PolicyConfig) -> Self:
        """Build the policy from the router's configuration (policies without settings ignore it)."""
        return cls()

    @abc.abstractmethod
    def select(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> WorkerLoad:
        """Pick one of ``candidates`` (never empty: the caller checks) for ``request``."""

    def route(self, candidates: Sequence[WorkerLoad], request: RouteRequest) -> Routing:
        """``select``, with what the policy predicts of the chosen worker (policies that predict override it)."""
        return Routing(self.select(candidates, request))

    def predicted_load(self, worker: WorkerLoad) -> dict[str, float]:
        """What the policy thinks ``worker`` has to do, by quantity (the router's metrics and GET /workers
        show it); by default its requests in flight."""
        return {"active_requests": float(worker.active_requests)}

    def on_routed(self, worker: WorkerLoad, request: RouteRequest) -> None:  # noqa: B027 - optional hook
        """``request`` was sent to ``worker``."""

    def on_first_token(self, worker: WorkerLoad, request: RouteRequest) -> None:  # noqa: B027
        """``worker`` sent ``request``'s first token (a stream's first event that carries output; for an
        answer that is not streamed the router sees none, and ``on_complete`` alone comes)."""

    def on_complete(self, worker: WorkerLoad, request: RouteRequest, ok: bool) -> None:  # noqa: B027
        """``request`` finished on ``worker`` (``ok`` False: it failed)."""

    def shared_load(self, worker: WorkerLoad, request: RouteRequest) -> SharedLoad | None:
        """What a peer replica should count of ``request``, just routed to ``worker`` (called after
        ``on_routed``); None: the policy tracks nothing beyond requests in flight, which peers count anyway."""
        return None

    def on_peer_routed(self, worker: WorkerLoad, key: Hashable, load: SharedLoad) -> None:  # noqa: B027
        """A peer replica routed a request to ``worker`` (``key`` names it among every peer's requests)."""

    def on_peer_first_token(self, worker: WorkerLoad, key: Hashable) -> None:  # noqa: B027
        """A peer's request ``key`` on ``worker`` had its first token."""

    def on_peer_complete(self, worker: WorkerLoad, key: Hashable) -> None:  # noqa: B027
        """A peer's request ``key`` on ``worker`` ended (or the peer is gone: its requests end with it)."""

    def explain(self) -> dict[str, Any]:
        """The last decision's inputs and scores, for logs and debugging ({} when there is nothing to say)."""
        return {}


def explain_rows(urls: Sequence[str], **columns: np.ndarray | Sequence[float]) -> dict[str, dict[str, Any]]:
    """A decision's per-worker rows for ``explain``: each worker's value of every column (arrays or lists in
    candidate order, kept as they are until ``explain`` asks)."""
    names = list(columns)
    values = [column.tolist() if hasattr(column, "tolist") else list(column) for column in columns.values()]
    return {url: dict(zip(names, row, strict=True)) for url, *row in zip(urls, *values, strict=True)}


class FairChooser:
    """Breaks ties fairly: among equally good workers, the one chosen least recently (never chosen first).

    Deterministic, unlike a random pick, and exact: n workers that always tie are chosen in turn. Every
    choice is remembered, tied or not, so a worker that just won on merit yields the next tie.
    """

    # Workers come and go (new urls): past this size, forget the ones that are not candidates any more.
    MAX_REMEMBERED: ClassVar[int] = 1024

    def __init__(self) -> None:
        self._last_chosen: dict[str, int] = {}
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def choose(self, tied: Sequence[WorkerLoad], candidates: Sequence[WorkerLoad] = ()) -> WorkerLoad:
        """Pick from ``tied`` (non-empty, in candidate order) and remember the choice."""
        with self._lock:
            # min() keeps the first of equals, so never-chosen workers go in candidate order.
            chosen = (
                tied[0]
                if len(tied) == 1
                else min(tied, key=lambda worker: self._last_chosen.get(worker.url, 0))
            )
            self._last_chosen[chosen.url] = next(self._clock)
            # Pruning keeps the candidates, so with more of them than that it waits for twice their number.
            if len(self._last_chosen) > max(self.MAX_REMEMBERED, 2 * len(candidates)):
                keep = {worker.url for worker in (*candidates, *tied)}
                self._last_chosen = {url: t for url, t in self._last_chosen.items() if url in keep}
            return chosen

"""What a worker says about itself: its `/server_info` read into a `WorkerReport` (fingerprint, role, model
names, block size, KV cache hash, reasoning parser, the routers among its workers), and the model names of its
`GET /v1/models` answer.

Anything unexpected in an answer counts as absent, never as an error: a report says what it could read, and
`missing` why there is no fingerprint, in words that go into the forwarding gate's warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenfront.core.fingerprint import Fingerprint
from tokenfront.core.kv_blocks import KV_CACHE_HASH
from tokenfront.core.reasoning import ReasoningParser, get_reasoning_parser
from tokenfront.router.probe import ProbeResult

__all__ = ["WorkerReport", "listed_models"]


@dataclass(frozen=True)
class WorkerReport:
    """What a worker's `/server_info` said, or why there is nothing to read.

    `fingerprint` is None when the worker publishes none; `missing` then says why, in words that go into
    the gate's warning ("/server_info answered 404", "/server_info unreachable (ConnectError)", ...).
    `probe` is the last render probe of a `verify=probe` worker (None for the others).
    """

    fingerprint: Fingerprint | None
    missing: str | None = None
    role: str | None = None
    model: str | None = None
    tokens_per_block: int | None = None
    kv_cache_hash: str | None = None
    reasoning_parser: str | None = None
    probe: ProbeResult | None = None
    # The model names it answers to (`/server_info` "served_model_names" or "model", else `GET /v1/models`);
    # None when it says none.
    served_model_names: tuple[str, ...] | None = None
    # A tokenfront router as a worker: its instance id, and those of the routers among its own workers.
    router_id: str | None = None
    routes_to: tuple[str, ...] = ()

    @classmethod
    def from_server_info(cls, info: Any) -> WorkerReport:
        """Read a `/server_info` body; anything unexpected in it counts as absent."""
        if not isinstance(info, dict):
            return cls(None, missing="/server_info is not a JSON object")
        fingerprint = Fingerprint.from_json(info.get("render_fingerprint"))
        block = info.get("tokens_per_block")
        model = _text(info.get("model"))
        names = _names(info.get("served_model_names")) or ((model,) if model else None)
        workers = info.get("workers")
        return cls(
            fingerprint=fingerprint,
            missing=None if fingerprint is not None else "/server_info has no render_fingerprint",
            role=_text(info.get("role")),
            model=model,
            tokens_per_block=block
            if isinstance(block, int) and not isinstance(block, bool) and block > 0
            else None,
            kv_cache_hash=_text(info.get("kv_cache_hash")),
            reasoning_parser=_text(info.get("reasoning_parser")),
            served_model_names=names,
            router_id=_text(info.get("router_id")),
            routes_to=tuple(
                worker["router_id"]
                for worker in (workers if isinstance(workers, list) else ())
                if isinstance(worker, dict) and isinstance(worker.get("router_id"), str)
            ),
        )

    @property
    def prompt_mode_parser(self) -> ReasoningParser | None:
        """The worker's reasoning parser when it reads the reasoning mode from the prompt text."""
        if self.reasoning_parser is None:
            return None
        try:
            parser = get_reasoning_parser(self.reasoning_parser)
        except ValueError:
            return None  # a parser this router does not know: it cannot say what that parser reads
        return parser if parser.reads_mode_from_prompt else None

    @property
    def publishes_kv_events(self) -> bool:
        """A tokenfront worker whose block hashes this router computes the same way."""
        return self.role == "worker" and self.kv_cache_hash == KV_CACHE_HASH


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _names(value: Any) -> tuple[str, ...] | None:
    """A list of model names (None unless it is a non-empty list of strings)."""
    if not isinstance(value, list) or not value or not all(isinstance(name, str) for name in value):
        return None
    return tuple(value)


def listed_models(body: Any) -> tuple[str, ...] | None:
    """The ids of an OpenAI `GET /v1/models` answer (None when it lists none)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return _names([item.get("id") for item in data if isinstance(item, dict)])

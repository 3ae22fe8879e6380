"""The worker's Prometheus metrics: prompts by source, tokens, sequences by finish reason, aborts, engine stats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tokenfront.server.metrics import ServerMetrics
from tokenfront.worker.engine import Engine

__all__ = ["WorkerMetrics"]


class WorkerMetrics:
    """The worker's Prometheus counters, in the app's own registry, plus the engine's stats at each scrape."""

    def __init__(self, server: ServerMetrics, engine: Engine) -> None:
        registry = server.registry
        self._server = server
        self.prompts = Counter(
            "tokenfront_worker_prompts",
            "Prompts received by the inference routes, by where their ids came from: rendered by this worker "
            "(messages / text prompts) or given as token ids (prompt_token_ids / id prompts)",
            ["route", "source"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "tokenfront_worker_prompt_tokens",
            "Prompt tokens, as usage counts them",
            ["route"],
            registry=registry,
        )
        self.cached_prompt_tokens = Counter(
            "tokenfront_worker_cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            ["route"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "tokenfront_worker_completion_tokens", "Generated tokens", ["route"], registry=registry
        )
        self.sequences = Counter(
            "tokenfront_worker_sequences",
            "Generated sequences (choices), by finish reason",
            ["route", "finish_reason"],
            registry=registry,
        )
        self.aborts = Counter(
            "tokenfront_worker_aborts",
            "Engine sequences the worker aborted, by reason (stop_string, client_disconnected, error, shutdown)",
            ["reason"],
            registry=registry,
        )
        registry.register(_EngineStats(engine))

    def prompt(self, route: str, source: str, ids: Sequence[int]) -> None:
        """Count one prompt by its source; a prompt this worker rendered counts as rendered, as on a renderer."""
        self.prompts.labels(route, source).inc()
        if source == "rendered":
            self._server.rendered_prompts.labels(route).inc()
            self._server.rendered_tokens.labels(route).inc(len(ids))


class _EngineStats(Collector):
    """`engine.stats()` as gauges named `tokenfront_engine_<stat>`, read at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Any:
        for name, value in sorted(self._engine.stats().items()):
            yield GaugeMetricFamily(f"tokenfront_engine_{name}", f"engine stat {name}", value=float(value))

    def describe(self) -> list[Any]:
        return []  # stats are read at scrape time; describing them would call the engine at registration

"""The router's Prometheus metrics: requests answered and not forwarded (by reason), renders for routing and
their seconds, retries, the forwarding gate by model, the active workers.

What the policies decide and predict, and what the workers' usage says they achieved, is `router.routing_metrics`;
the fleet's per-worker gauges are `router.fleet_metrics`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["RouterMetrics"]


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
            "reasoning_mode, client_token_ids, echo, no_render, render_late, render_failed, "
            "generate_unsupported)",
            ["reason"],
            registry=registry,
        )
        self.renders = Counter(
            "tokenfront_router_renders",
            "Renders for routing, by outcome: ok, invalid (the client's 400), late (not done within "
            "--render-timeout) and failed (not the client's fault); late and failed ones are routed by load",
            ["outcome"],
            registry=registry,
        )
        self.render_seconds = Histogram(
            "tokenfront_router_render_seconds",
            "Seconds from asking for a render to its answer, queue included (late renders are not timed)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self.render_processes_replaced = Counter(
            "tokenfront_router_render_processes_replaced",
            "Render processes (--render-processes) that died and were replaced",
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
            "1 when the gate lets rendered ids go to workers (on a router of several models: every model's)",
            registry=registry,
        )
        # The models `model_forwarding` has a sample for (a reload of --config removes those it removes).
        self.model_keys: set[str] = set()
        self.model_forwarding = Gauge(
            "tokenfront_router_model_forwarding",
            "1 when the model's gate lets rendered ids go to its workers, by model (its first served name)",
            ["model"],
            registry=registry,
        )
        self.config_reloads = Counter(
            "tokenfront_router_config_reloads",
            "Reloads of the --config file (on SIGHUP, or its content changed), by outcome: ok (applied), invalid "
            "(it cannot be used: the running configuration is kept) and failed (it cannot be read, or a model "
            "failed to load: kept too)",
            ["outcome"],
            registry=registry,
        )
        self.active_workers = Gauge(
            "tokenfront_router_active_workers", "Workers in the active set", registry=registry
        )

"""Tracing on one server (server/tracing.py): a traced renderer's spans, what tracing off leaves out, and the
start-up line of an endpoint that cannot work.

The renderer runs in this process behind the layer every server has in front (`RequestIdLayer`), on the Qwen3
fixture, its spans taken by the SDK's in-memory exporter; the router-and-worker trace over a real OTLP receiver
is tests/router/test_router_tracing.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.renderer.app import create_renderer_app
from tokenfront.server.direct import DirectLane
from tokenfront.server.middleware import RequestIdLayer
from tokenfront.server.tracing import Tracing

TRACE_ID, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


@pytest.fixture(scope="module")
def pipeline(qwen3: Path) -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(qwen3)))


@pytest.fixture
def traced(pipeline: RenderPipeline) -> tuple[Any, InMemorySpanExporter]:
    """A traced renderer app and the exporter that receives its spans (one at a time, as each ends)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "tokenfront-render"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_renderer_app(pipeline, tracing=Tracing(provider.get_tracer("test"), provider.force_flush))
    return app, exporter


def _post(app: Any, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    """One request through the server's outer layer, as uvicorn hands it over."""

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=RequestIdLayer(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://renderer") as client:
            return await client.post(path, json=body, headers=headers or {})

    return asyncio.run(send())


def _hex(span: ReadableSpan) -> tuple[str, str, str | None]:
    """(trace id, span id, parent span id) in the hex a traceparent writes."""
    context, parent = span.get_span_context(), span.parent
    return (
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
        f"{parent.span_id:016x}" if parent is not None else None,
    )


def test_a_traced_render_is_a_request_span_and_a_render_span_in_the_clients_trace(
    traced: tuple[Any, InMemorySpanExporter],
) -> None:
    app, exporter = traced
    assert DirectLane.of(app) is None  # every request takes the path that makes its spans
    response = _post(
        app,
        "/v1/chat/completions/render",
        {"messages": [{"role": "user", "content": "Hello there"}]},
        {"traceparent": TRACEPARENT, "x-request-id": "trace-test-1"},
    )
    assert response.status_code == 200, response.text
    render, request = exporter.get_finished_spans()  # in the order they ended
    assert (request.name, request.kind, render.name, render.kind) == (
        "POST /v1/chat/completions/render",
        SpanKind.SERVER,
        "render",
        SpanKind.INTERNAL,
    )
    trace_id, request_span, parent = _hex(request)
    assert (trace_id, parent) == (TRACE_ID, CLIENT_SPAN)
    assert _hex(render)[0] == TRACE_ID and _hex(render)[2] == request_span
    assert dict(request.attributes or {}) == {
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions/render",
        "url.scheme": "http",
        "tokenfront.request_id": "trace-test-1",
        "http.route": "/v1/chat/completions/render",
        "http.response.status_code": 200,
    }
    assert dict(render.attributes or {}) == {
        "tokenfront.render.kind": "chat",
        "tokenfront.prompt_tokens": len(response.json()["token_ids"]),
    }
    assert request.resource.attributes["service.name"] == "tokenfront-render"


def test_a_completions_render_span_counts_every_prompt(traced: tuple[Any, InMemorySpanExporter]) -> None:
    app, exporter = traced
    response = _post(app, "/v1/completions/render", {"prompt": ["one two", "three four five"]})
    assert response.status_code == 200, response.text
    render, request = exporter.get_finished_spans()
    assert request.parent is None  # no traceparent: a trace of its own
    assert dict(render.attributes or {}) == {
        "tokenfront.render.kind": "completion",
        "tokenfront.prompts": 2,
        "tokenfront.prompt_tokens": sum(len(item["token_ids"]) for item in response.json()),
    }


def test_an_error_is_a_request_span_with_its_status(traced: tuple[Any, InMemorySpanExporter]) -> None:
    app, exporter = traced
    response = _post(app, "/v1/chat/completions/render", {"messages": "not a list"})
    assert response.status_code == 400
    (request,) = exporter.get_finished_spans()  # refused before rendering: no render span
    assert request.name == "POST /v1/chat/completions/render"
    assert request.attributes is not None and request.attributes["http.response.status_code"] == 400
    assert request.status.is_unset  # a client's mistake is not the server's error (only 5xx are)
    response = _post(app, "/no/such/route", {})
    (_, unmatched) = exporter.get_finished_spans()
    assert (unmatched.name, response.status_code) == ("POST", 404)  # no route template to name it by


# What a server without tracing runs: the command's own helper, then a request through the outer layer.
_UNTRACED = """
import asyncio, sys
import httpx
from tokenfront import cli
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.renderer.app import create_renderer_app
from tokenfront.server.direct import DirectLane
from tokenfront.server.middleware import RequestIdLayer

args = cli.build_parser().parse_args(["render", "--model", sys.argv[1]])
assert cli.start_server_tracing(args, "renderer") is None
app = create_renderer_app(RenderPipeline.load(RenderOptions(model=sys.argv[1])))
layer = RequestIdLayer(app)
assert layer.tracing is None and DirectLane.of(app) is not None

async def send():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=layer), base_url="http://r") as client:
        body = {"messages": [{"role": "user", "content": "Hi"}]}
        return await client.post("/v1/chat/completions/render", json=body, headers={"traceparent": sys.argv[2]})

assert asyncio.run(send()).status_code == 200
print(sorted(name for name in sys.modules if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))))
"""


def _environment(**extra: str) -> dict[str, str]:
    """This process's environment without OpenTelemetry's variables, plus `extra`."""
    kept = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    return {**kept, **extra}


def test_tracing_off_imports_no_sdk_and_keeps_the_direct_lane(qwen3: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _UNTRACED, str(qwen3), TRACEPARENT],
        capture_output=True,
        text=True,
        timeout=120,
        env=_environment(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=""),  # empty: unset, as OpenTelemetry reads it
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


_NO_PATH = (
    "error: --otlp-traces-endpoint 'http://127.0.0.1:4318' has no path: the URL is used as given, and an "
    "OTLP/HTTP receiver takes traces at /v1/traces: give http://127.0.0.1:4318/v1/traces"
)


@pytest.mark.parametrize(
    ("command", "url", "environment", "line"),
    [
        (["render"], "http://127.0.0.1:4318", {}, _NO_PATH),
        (
            ["render"],
            "collector:4318",
            {},
            "error: --otlp-traces-endpoint 'collector:4318' is not an http:// or https:// URL with a host: give "
            "the OTLP/HTTP receiver's traces URL, e.g. http://127.0.0.1:4318/v1/traces (gRPC receivers are not "
            "supported)",
        ),
        (
            ["serve", "--engine", "simulated"],
            "http://127.0.0.1:99999/v1/traces",
            {},
            "error: --otlp-traces-endpoint 'http://127.0.0.1:99999/v1/traces' is not a URL: Port out of range "
            "0-65535",
        ),
        (
            ["route"],
            "",
            {},
            "error: --otlp-traces-endpoint is empty: give the collector's traces URL, or leave it out to trace "
            "nothing",
        ),
        (
            ["route"],
            None,
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/"},
            "error: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT 'http://127.0.0.1:4318/' has no path: the URL is used as "
            "given, and an OTLP/HTTP receiver takes traces at /v1/traces: give http://127.0.0.1:4318/v1/traces",
        ),
    ],
)
def test_an_endpoint_that_cannot_work_is_one_line_at_start_up(
    qwen3: Path, command: list[str], url: str | None, environment: dict[str, str], line: str
) -> None:
    flag = ["--otlp-traces-endpoint", url] if url is not None else []
    result = subprocess.run(
        [sys.executable, "-m", "tokenfront.cli", *command, "--model", str(qwen3), "--port", "0", *flag],
        capture_output=True,
        text=True,
        timeout=60,
        env=_environment(**environment),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [line]

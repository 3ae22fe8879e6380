"""Traces end to end (server/tracing.py, docs/tracing.md): a real router in front of two real simulated GPU
workers on Qwen3's tokenizer files, exporting over OTLP/HTTP to a real receiver on loopback that decodes what
arrives with opentelemetry-proto.

One client request with a W3C `traceparent` is one trace: the client's trace id, the router's server span a
child of the client's span, its render, routing decision and worker call children of it, and the worker's
server span a child of that call (the router sent its context on), with the engine's generation inside. The
second worker runs without `--otlp-traces-endpoint`: a request it serves leaves the router's spans alone.
"""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from conftest import Fleet, router_command, wait_until

SPEEDUP = "50"  # the modelled GPU's clock runs 50 times faster: answers in milliseconds
# The SDK exports a batch every 5 s by default: every 50 ms here, so the test waits on arrivals, not on a timer.
EXPORT_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "50"}
SERVER, CLIENT, INTERNAL = Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it (ids in lowercase hex, as a traceparent writes them)."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict[str, Any]


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, which) if which is not None else None


class OtlpReceiver:
    """An OTLP/HTTP traces receiver on loopback (a thread in the test process): POST /v1/traces with an
    `ExportTraceServiceRequest` (protobuf, gzip or not) is decoded and its spans kept."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.content_types: set[str] = set()
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest's output clean
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    receiver.content_types.add(self.headers.get("content-type", ""))
                    receiver.spans += _decoded(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in list(self.spans) if span.trace_id == trace_id]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _decoded(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = {item.key: _value(item.value) for item in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=resource.get("service.name", ""),
                        name=span.name,
                        kind=span.kind,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        start=span.start_time_unix_nano,
                        end=span.end_time_unix_nano,
                        attributes={item.key: _value(item.value) for item in span.attributes},
                    )
                )
    return spans


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    started = OtlpReceiver()
    yield started
    started.close()


@pytest.fixture(scope="module")
def servers(
    fleet: Fleet, qwen3: Path, receiver: OtlpReceiver, monkeypatch_module: pytest.MonkeyPatch
) -> tuple[Any, Any, Any]:
    """(router, traced worker, untraced worker), the router choosing them in turn (round_robin)."""
    for name, value in EXPORT_ENV.items():
        monkeypatch_module.setenv(name, value)  # the fleet starts its processes with this environment
    monkeypatch_module.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch_module.delenv("OTEL_SERVICE_NAME", raising=False)
    worker = ["serve", "--engine", "simulated", "--model", str(qwen3), "--sim-speedup", SPEEDUP]
    traced, untraced = fleet.start_many([*worker, "--otlp-traces-endpoint", receiver.url], worker)
    workers = [traced.url, untraced.url]
    router = fleet.start(
        *router_command(qwen3, workers, "--policy", "round_robin", "--otlp-traces-endpoint", receiver.url)
    )
    assert wait_until(lambda: _all_healthy(router.url, 2)), router.log()[-3000:]
    return router, traced, untraced


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _all_healthy(url: str, count: int) -> bool:
    listing = httpx.get(f"{url}/workers", timeout=10.0).json()["workers"]
    return sum(worker["state"] == "healthy" for worker in listing) == count


def _traceparent() -> tuple[str, str, str]:
    """A client's traceparent (sampled), its trace id and its span id."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _chat_to(router: Any, worker: Any, **fields: Any) -> tuple[httpx.Response, str, str]:
    """A chat through the router, sent until the round-robin hands one to `worker` (two tries at most);
    returns the answer and the trace id and span id of its traceparent."""
    body = {
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 6,
        "temperature": 0,
        **fields,
    }
    for _ in range(2):
        traceparent, trace_id, span_id = _traceparent()
        response = httpx.post(
            f"{router.url}/v1/chat/completions",
            json=body,
            headers={"traceparent": traceparent},
            timeout=60.0,
        )
        assert response.status_code == 200, response.text
        if response.headers["x-tokenfront-worker"] == worker.url:
            return response, trace_id, span_id
    raise AssertionError(f"the router never chose {worker.url}")


def _one(spans: list[ReceivedSpan], service: str, kind: int, name: str) -> ReceivedSpan:
    found = [span for span in spans if (span.service, span.kind, span.name) == (service, kind, name)]
    assert len(found) == 1, [(span.service, span.kind, span.name) for span in spans]
    return found[0]


ROUTER_SPANS = {
    ("tokenfront-router", SERVER, "POST /v1/chat/completions"),
    ("tokenfront-router", INTERNAL, "render"),
    ("tokenfront-router", INTERNAL, "route"),
    ("tokenfront-router", CLIENT, "POST /v1/chat/completions"),
}
WORKER_SPANS = {
    ("tokenfront-worker", SERVER, "POST /v1/chat/completions"),
    ("tokenfront-worker", INTERNAL, "render"),
    ("tokenfront-worker", INTERNAL, "generate"),
}


def _arrived(receiver: OtlpReceiver, trace_id: str, expected: set[tuple[str, int, str]]) -> bool:
    return {(span.service, span.kind, span.name) for span in receiver.trace(trace_id)} >= expected


@pytest.mark.slow  # a router and two simulated workers start for the module
def test_one_request_through_router_and_worker_is_one_trace(
    servers: tuple[Any, Any, Any], receiver: OtlpReceiver
) -> None:
    router, traced, _ = servers
    response, trace_id, client_span_id = _chat_to(router, traced)
    assert response.headers["x-tokenfront-forwarded"] == "true"
    expected = ROUTER_SPANS | WORKER_SPANS
    assert wait_until(lambda: _arrived(receiver, trace_id, expected), timeout=30.0), receiver.trace(trace_id)
    spans = receiver.trace(trace_id)
    assert {(span.service, span.kind, span.name) for span in spans} == expected  # one trace, nothing else
    assert receiver.content_types == {"application/x-protobuf"}

    request = _one(spans, "tokenfront-router", SERVER, "POST /v1/chat/completions")
    render = _one(spans, "tokenfront-router", INTERNAL, "render")
    route = _one(spans, "tokenfront-router", INTERNAL, "route")
    call = _one(spans, "tokenfront-router", CLIENT, "POST /v1/chat/completions")
    worker_request = _one(spans, "tokenfront-worker", SERVER, "POST /v1/chat/completions")
    worker_render = _one(spans, "tokenfront-worker", INTERNAL, "render")
    generate = _one(spans, "tokenfront-worker", INTERNAL, "generate")

    # The links: client -> router request -> (render, route, call) -> worker request -> (render, generate).
    assert request.parent_id == client_span_id
    assert {render.parent_id, route.parent_id, call.parent_id} == {request.span_id}
    assert worker_request.parent_id == call.span_id
    assert {worker_render.parent_id, generate.parent_id} == {worker_request.span_id}
    assert request.start <= render.start <= render.end <= route.start <= route.end <= call.start
    assert call.start <= worker_request.start <= generate.start <= generate.end <= call.end <= request.end

    usage = response.json()["usage"]
    request_id = response.headers["x-request-id"]
    assert request.attributes == {
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "url.scheme": "http",
        "tokenfront.request_id": request_id,
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
    }
    # The router sent its request id on: the worker's request span carries the same one.
    assert worker_request.attributes["tokenfront.request_id"] == request_id
    assert worker_request.attributes["http.response.status_code"] == 200
    assert render.attributes == {
        "tokenfront.render.outcome": "ok",
        "tokenfront.prompts": 1,
        "tokenfront.prompt_tokens": usage["prompt_tokens"],
    }
    assert route.attributes == {
        "tokenfront.policy": "round_robin",
        "tokenfront.candidates": 2,
        "tokenfront.forwarded": True,
        "tokenfront.worker": traced.url,
    }
    assert call.attributes == {
        "http.request.method": "POST",
        "url.full": f"{traced.url}/v1/chat/completions",
        "tokenfront.worker": traced.url,
        "tokenfront.forwarded": True,
        "http.response.status_code": 200,
    }
    # The worker was given the router's ids: it checked them, and rendered nothing.
    assert worker_render.attributes == {
        "tokenfront.prompt_tokens": usage["prompt_tokens"],
        "tokenfront.prompt_source": "token_ids",
    }
    assert generate.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert generate.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert generate.attributes["gen_ai.request.max_tokens"] == 6
    assert generate.attributes["gen_ai.response.finish_reasons"] == [
        response.json()["choices"][0]["finish_reason"]
    ]
    assert generate.attributes["gen_ai.request.id"].startswith("chatcmpl-")


@pytest.mark.slow  # a router and two simulated workers start for the module
def test_a_relayed_stream_is_one_trace_its_call_ending_with_the_stream(
    servers: tuple[Any, Any, Any], receiver: OtlpReceiver
) -> None:
    router, traced, _ = servers
    response, trace_id, client_span_id = _chat_to(
        router, traced, stream=True, stream_options={"include_usage": True}
    )
    assert response.text.endswith("data: [DONE]\n\n")
    expected = ROUTER_SPANS | WORKER_SPANS
    assert wait_until(lambda: _arrived(receiver, trace_id, expected), timeout=30.0), receiver.trace(trace_id)
    spans = receiver.trace(trace_id)
    request = _one(spans, "tokenfront-router", SERVER, "POST /v1/chat/completions")
    call = _one(spans, "tokenfront-router", CLIENT, "POST /v1/chat/completions")
    worker_request = _one(spans, "tokenfront-worker", SERVER, "POST /v1/chat/completions")
    generate = _one(spans, "tokenfront-worker", INTERNAL, "generate")
    assert request.parent_id == client_span_id
    assert (call.parent_id, worker_request.parent_id, generate.parent_id) == (
        request.span_id,
        call.span_id,
        worker_request.span_id,
    )
    # The call's span lasts until the stream's end, not only to its first event.
    assert generate.end <= call.end <= request.end
    assert "tokenfront.stream_complete" not in call.attributes


@pytest.mark.slow  # a router and two simulated workers start for the module
def test_a_worker_without_tracing_adds_no_span(servers: tuple[Any, Any, Any], receiver: OtlpReceiver) -> None:
    router, _, untraced = servers
    _, trace_id, client_span_id = _chat_to(router, untraced)
    assert wait_until(lambda: _arrived(receiver, trace_id, ROUTER_SPANS), timeout=30.0), receiver.trace(
        trace_id
    )
    # The worker got the traceparent, but has no exporter: the trace is the router's spans alone.
    spans = receiver.trace(trace_id)
    assert {(span.service, span.kind, span.name) for span in spans} == ROUTER_SPANS
    request = _one(spans, "tokenfront-router", SERVER, "POST /v1/chat/completions")
    call = _one(spans, "tokenfront-router", CLIENT, "POST /v1/chat/completions")
    assert (request.parent_id, call.parent_id) == (client_span_id, request.span_id)
    assert call.attributes["tokenfront.worker"] == untraced.url

"""OpenTelemetry traces (`--otlp-traces-endpoint URL`, docs/tracing.md): off unless asked for.

With the flag, a server exports its spans over OTLP/HTTP (protobuf) to the URL, batched by the SDK's
`BatchSpanProcessor` (its `OTEL_BSP_*` variables apply), as service `tokenfront-render`, `-worker` or
`-router` (`OTEL_SERVICE_NAME` names it otherwise; `OTEL_RESOURCE_ATTRIBUTES` adds to the resource). Each HTTP
request is a server span (`Tracing.serve`) whose parent is the client's W3C `traceparent` when it sent one; the
spans a request's work makes inside it (render, the routing decision, the router's call to its worker, the
engine's generation) are its children, and the router sends its call's context on in `traceparent`, so the
worker's spans join the router's trace.

Off (the default), nothing of OpenTelemetry is imported — start-up does not grow — and what runs per request
is one check, `RequestIdLayer.tracing is None`; the render routes choose their functions when they are built,
and the worker and router check their own `tracing` attribute where a span would start.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenfront.core.errors import TokenfrontError

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "ENDPOINT_ENV",
    "PROMPT_TOKENS",
    "SERVICE_NAMES",
    "Attributes",
    "Tracing",
    "check_endpoint",
    "configured_endpoint",
    "start_tracing",
]

# The standard variable the flag defaults to (an operator's OpenTelemetry set-up often injects it).
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
# Each role's service name, unless OTEL_SERVICE_NAME gives one.
SERVICE_NAMES = {
    "renderer": "tokenfront-render",
    "worker": "tokenfront-worker",
    "router": "tokenfront-router",
}
# The attribute every render span carries: the prompt's token ids counted (all prompts of a completions request).
PROMPT_TOKENS = "tokenfront.prompt_tokens"

Attributes = Mapping[str, "str | bool | int | float | Sequence[str] | Sequence[int]"]
_T = TypeVar("_T")
_TRACE_HEADERS = (b"traceparent", b"tracestate")
# How long the end of an app's lifespan waits for its last spans to be exported (a collector that is down
# must not hold a shutdown for the exporter's own retries).
_FLUSH_MILLISECONDS = 5000


def configured_endpoint(flag: str | None) -> tuple[str, str] | None:
    """Where traces go, and what said so: `--otlp-traces-endpoint` when given, else
    $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT when set and not empty (an empty variable is an unset one, as
    OpenTelemetry reads its variables); None: tracing is off."""
    if flag is not None:
        return flag, "--otlp-traces-endpoint"
    value = os.environ.get(ENDPOINT_ENV, "")
    return (value, f"${ENDPOINT_ENV}") if value else None


def check_endpoint(url: str, source: str = "--otlp-traces-endpoint") -> str:
    """The traces URL `source` gave, checked: an http(s) URL with a host and a path (OTLP/HTTP receivers take
    traces at `/v1/traces`, and the URL is used as it is given); TokenfrontError in one line otherwise."""
    if not url.strip():
        raise TokenfrontError(
            f"{source} is empty: give the collector's traces URL, or leave it out to trace nothing"
        )
    given = f"{source} {url!r}"
    if any(char.isspace() for char in url):
        raise TokenfrontError(f"{given} has whitespace in it: give the URL alone")
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is no number, or out of range, raises here
    except ValueError as exc:
        raise TokenfrontError(f"{given} is not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TokenfrontError(
            f"{given} is not an http:// or https:// URL with a host: give the OTLP/HTTP receiver's traces URL, "
            "e.g. http://127.0.0.1:4318/v1/traces (gRPC receivers are not supported)"
        )
    if port == 0:
        raise TokenfrontError(f"{given} has port 0: give the port the receiver listens on (OTLP/HTTP: 4318)")
    if parts.path in ("", "/"):
        shown = f"{parts.scheme}://{parts.netloc}"
        raise TokenfrontError(
            f"{given} has no path: the URL is used as given, and an OTLP/HTTP receiver takes traces at "
            f"/v1/traces: give {shown}/v1/traces"
        )
    return url


def start_tracing(endpoint: str, role: str, source: str = "--otlp-traces-endpoint") -> Tracing:
    """A process's `Tracing` exporting to `endpoint` (`check_endpoint` first; `source` said where) as the
    role's service. Imports OpenTelemetry (only now: a server without tracing never does); TokenfrontError
    when it is not installed."""
    check_endpoint(endpoint, source)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TokenfrontError(
            f"{source} needs the OpenTelemetry SDK and its OTLP/HTTP exporter ({exc}): "
            "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"
        ) from exc
    from tokenfront import __version__

    # OTEL_SERVICE_NAME, when set, is read by `Resource.create`; an attribute given here would win over it.
    own = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: SERVICE_NAMES[role]}
    resource = Resource.create({**own, "service.version": __version__})
    provider = TracerProvider(resource=resource)  # flushed and shut down at exit (its atexit hook)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    flush = functools.partial(provider.force_flush, _FLUSH_MILLISECONDS)
    return Tracing(provider.get_tracer("tokenfront", __version__), flush)


class Tracing:
    """One process's tracer, and the spans tokenfront makes with it (docs/tracing.md has their names)."""

    def __init__(self, tracer: Tracer, flush: Callable[[], object] = lambda: None) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self.flush = flush  # export what is buffered now (at the end of the app's lifespan)
        self._propagator = TraceContextTextMapPropagator()
        self._trace = trace
        self._context = context
        self._server = trace.SpanKind.SERVER
        self._client = trace.SpanKind.CLIENT
        self._error = trace.Status(trace.StatusCode.ERROR)

    # -- the request ---------------------------------------------------------------------------------------------

    async def serve(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        """Answer one HTTP request inside its server span, a child of the client's `traceparent` if it sent
        one: `METHOD ROUTE` (the route's template once routed), its status, path and request id."""
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in _TRACE_HEADERS
        }
        parent = self._propagator.extract(carrier) if carrier else None
        method = scope["method"]
        span = self.tracer.start_span(
            method,
            context=parent,
            kind=self._server,
            attributes={
                "http.request.method": method,
                "url.path": scope["path"],
                "url.scheme": scope.get("scheme", "http"),
                "tokenfront.request_id": request_id,
            },
        )
        status = 500  # what the server answers when the app fails before its answer starts

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = self._context.attach(self._trace.set_span_in_context(span))
        try:
            await app(scope, receive, send_status)
        except BaseException as exc:
            span.record_exception(exc)
            raise
        finally:
            self._context.detach(token)
            route = getattr(scope.get("route"), "path", None)
            if route is not None:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(self._error)
            span.end()

    # -- spans inside it ---------------------------------------------------------------------------------------

    @contextmanager
    def span(self, name: str, attributes: Attributes | None = None) -> Iterator[Span]:
        """An internal span, current while the block runs (an exception is recorded on it)."""
        with self.tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span

    def traced(
        self, name: str, function: Callable[..., _T], describe: Callable[[_T], Attributes]
    ) -> Callable[..., _T]:
        """`function` run inside a span `name`, given the attributes `describe` reads from its result. The
        span's parent is the context it runs in (the render thread runs calls in their request's context)."""

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> _T:
            with self.tracer.start_as_current_span(name) as span:
                result = function(*args, **kwargs)
                span.set_attributes(describe(result))
                return result

        return run

    async def traced_stream(
        self,
        name: str,
        stream: AsyncIterator[_T],
        attributes: Attributes,
        describe: Callable[[], Attributes],
    ) -> AsyncIterator[_T]:
        """`stream`'s items, inside a span `name` from the first item asked for to the last; `describe` gives
        the attributes known at its end. The span is never the current one: a generator must not change the
        context its consumer runs in."""
        span = self.tracer.start_span(name, attributes=attributes)
        try:
            async for item in stream:
                yield item
        except BaseException as exc:
            span.record_exception(exc)
            if isinstance(exc, Exception):
                span.set_status(self._error)
            raise
        finally:
            span.set_attributes(describe())
            span.end()

    def client_span(self, name: str, attributes: Attributes) -> Span:
        """A client span (not current: the caller ends it, when the call's answer has ended)."""
        return self.tracer.start_span(name, kind=self._client, attributes=attributes)

    def trace_headers(self, span: Span) -> bytes:
        """`span`'s context as the W3C header lines a call sends on (`traceparent`, and `tracestate` when it
        has one), framed for an HTTP/1.1 head."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return "".join(f"{name}: {value}\r\n" for name, value in carrier.items()).encode("latin-1")

    def failed(self, span: Span, reason: str) -> None:
        """Mark `span` as failed, for `reason`."""
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, reason))

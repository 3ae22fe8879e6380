"""Pure ASGI layers (no per-request task group, unlike `@app.middleware`): auth (the client key and the admin
key) and request metrics; the request id and the access line."""

from __future__ import annotations

import hmac
import logging
import time
from typing import TYPE_CHECKING

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenfront.core.errors import TokenfrontError
from tokenfront.server.admin_auth import AdminAccess
from tokenfront.server.errors import error_response
from tokenfront.server.inspector import INSPECTOR_PATHS
from tokenfront.server.request_ids import (
    REQUEST_ID_HEADER,
    accepted_request_id,
    reset_request_id,
    set_request_id,
)

if TYPE_CHECKING:
    from tokenfront.server.metrics import ServerMetrics
    from tokenfront.server.tracing import Tracing

__all__ = ["AuthAndMetrics", "RequestIdLayer"]

# Paths that answer without an API key: load balancers probe health without credentials; the inspector page
# and its files are static, the same on every server (they reveal nothing), and ask the user for the key.
OPEN_PATHS = frozenset({"/health", *INSPECTOR_PATHS})


class AuthAndMetrics:
    """Refuse requests without the API key (401) and admin writes without the admin key
    (`server.admin_auth`), and count every answer by route template and status."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ServerMetrics,
        api_key: str | None,
        admin: AdminAccess | None = None,
    ) -> None:
        """`api_key` None serves without a key; an empty one is refused (TokenfrontError): an empty
        `$TOKENFRONT_API_KEY` is a mistake far more often than a wish to accept `Bearer ` alone. `admin`: the
        server's admin paths and key (None: it has none); its key opens the client routes too."""
        if api_key is not None and not api_key.strip():
            raise TokenfrontError(
                "--api-key (or $TOKENFRONT_API_KEY) is empty: give a key, or unset it to serve without one"
            )
        self.app = app
        self.metrics = metrics
        self.admin = admin
        self._key = api_key.encode() if api_key is not None else None
        self._admin_key = admin.key.encode() if admin is not None and admin.key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            # The router sets scope["route"] on a match: label by its template, never by the raw path.
            route = scope.get("route")
            self.metrics.observe(getattr(route, "path", "unmatched"), status, time.perf_counter() - start)

    def refusal(self, scope: Scope) -> Response | None:
        """The 401 or 403 for a request that lacks the key its path needs (None: it has it, or needs none).
        `__call__` answers with it; the direct lane (`server.direct`) leaves a refused request to `__call__`."""
        path = scope["path"]
        needs_key = self._key is not None and path not in OPEN_PATHS
        admin_write = self.admin is not None and self.admin.guards(scope["method"], path)
        if not (needs_key or admin_write):
            return None
        return self._refusal(scope, needs_key=needs_key, admin_write=admin_write)

    def _refusal(self, scope: Scope, *, needs_key: bool, admin_write: bool) -> Response | None:
        token = _bearer_token(scope)
        # Both keys are compared whatever the first gives: the time taken must not tell which one matched.
        admitted = _matches(token, self._admin_key)
        if needs_key and not (_matches(token, self._key) | admitted):
            return error_response(
                401,
                "missing or incorrect API key: send it as `Authorization: Bearer <key>`",
                code="invalid_api_key",
            )
        if admin_write:
            assert self.admin is not None
            return self.admin.refusal(scope["method"], scope["path"], admitted=admitted)
        return None


def _bearer_token(scope: Scope) -> bytes | None:
    """The token of the request's `Authorization: Bearer TOKEN` header (None: it has none)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


def _matches(token: bytes | None, key: bytes | None) -> bool:
    # Constant time: how much of a guess matches must not show in the time the answer takes.
    return token is not None and key is not None and hmac.compare_digest(token, key)


_REQUEST_ID_HEADER = REQUEST_ID_HEADER.encode("ascii")
access_log = logging.getLogger("tokenfront.access")


class RequestIdLayer:
    """The outermost layer of a server: each HTTP request's id, and with `access_log` one line per request.

    The id is the client's `X-Request-Id` when usable, else a new one (`server.request_ids`). It is the current
    request id while the request is answered (log lines carry it; the router sends it on to its worker), and
    every answer returns it in `X-Request-Id`: errors, 503s at shutdown and streams included. The access line
    is written when the answer has ended (a stream's last chunk): client, method, path, status, duration.

    An app that traces (`TokenfrontApp.tracing`, `server.tracing`) answers each request inside its server span,
    and exports what is buffered when its lifespan ends (a pre-forked child leaves without the exit hooks).
    """

    def __init__(self, app: ASGIApp, *, access_log: bool = False) -> None:
        self.app = app
        self.access_log = access_log
        self.tracing: Tracing | None = getattr(app, "tracing", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if self.tracing is not None and scope["type"] == "lifespan":
                await self.app(scope, receive, _flushing_at_shutdown(send, self.tracing))
                return
            await self.app(scope, receive, send)
            return
        sent = next((value for name, value in scope["headers"] if name == _REQUEST_ID_HEADER), None)
        request_id = accepted_request_id(sent)
        header = (_REQUEST_ID_HEADER, request_id.encode("ascii"))
        token = set_request_id(request_id)
        start = time.perf_counter()
        status = 500  # what the server answers when the app fails before its answer starts

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # Ours replaces one the app passed on (the router relays its worker's, the same id).
                headers = [
                    item for item in message.get("headers", ()) if item[0].lower() != _REQUEST_ID_HEADER
                ]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        try:
            if self.tracing is None:
                await self.app(scope, receive, send_with_id)
            else:
                await self.tracing.serve(self.app, scope, receive, send_with_id, request_id)
        finally:
            if self.access_log:
                _log_access(scope, status, time.perf_counter() - start)
            reset_request_id(token)


def _flushing_at_shutdown(send: Send, tracing: Tracing) -> Send:
    """The lifespan's `send`, exporting the spans still buffered before the app says its shutdown is done."""

    async def send_flushed(message: Message) -> None:
        if message["type"] == "lifespan.shutdown.complete":
            tracing.flush()
        await send(message)

    return send_flushed


def _log_access(scope: Scope, status: int, seconds: float) -> None:
    """The access line: path without the query string (a log is no place for what a client put there)."""
    client = scope.get("client")
    address = f"{client[0]}:{client[1]}" if client else "-"
    method, path, milliseconds = scope["method"], scope["path"], round(seconds * 1000, 3)
    access_log.info(
        '%s "%s %s" %d %.1f ms',
        address,
        method,
        path,
        status,
        milliseconds,
        extra={
            "client": address,
            "method": method,
            "path": path,
            "status": status,
            "duration_ms": milliseconds,
        },
    )

"""Auth and request metrics as one pure ASGI layer (no per-request task group, unlike `@app.middleware`)."""

from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenfront.core.errors import TokenfrontError
from tokenfront.server.errors import error_response

if TYPE_CHECKING:
    from tokenfront.server.metrics import ServerMetrics

__all__ = ["AuthAndMetrics"]

# Paths that answer without an API key: load balancers probe health without credentials.
OPEN_PATHS = frozenset({"/health"})


class AuthAndMetrics:
    """Refuse requests without the API key (401), and count every answer by route template and status."""

    def __init__(self, app: ASGIApp, *, metrics: ServerMetrics, api_key: str | None) -> None:
        """`api_key` None serves without a key; an empty one is refused (TokenfrontError): an empty
        `$TOKENFRONT_API_KEY` is a mistake far more often than a wish to accept `Bearer ` alone."""
        if api_key is not None and not api_key.strip():
            raise TokenfrontError(
                "--api-key (or $TOKENFRONT_API_KEY) is empty: give a key, or unset it to serve without one"
            )
        self.app = app
        self.metrics = metrics
        self._key = api_key.encode() if api_key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            response = error_response(
                401,
                "missing or incorrect API key: send it as `Authorization: Bearer <key>`",
                code="invalid_api_key",
            )
            await response(scope, receive, send)
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

    def _authorized(self, scope: Scope) -> bool:
        assert self._key is not None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # Constant time: how much of a guess matches must not show in the time the answer takes.
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False

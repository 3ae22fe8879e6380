"""`CheckClient`: the router's client for what it asks a worker itself — its checks and its KV event reads.

A health check asks `GET /health`, `GET /v1/models` and `GET /server_info` (and a generate worker's route and
a probe's `POST /tokenize`: `router.worker_health`, `router.probe`); the events loop reads
`GET /kv_cache_events?after=..` (`router.kv_feeds`). At 256 workers checked every 2 s and read every 0.5 s that
is close to a thousand requests a second, so they go over the proxy's lean HTTP/1.1 connections
(`router.connections.WorkerConnections`, ~20 µs of CPU a request) rather than httpx (~500 µs): each worker's
`CheckClient` holds a small pool of its own, apart from the proxied requests' pool, so a busy worker's
streams never hold a check back.

An answer is read whole — within the call's `timeout` counted from when the request was written, and at most
`max_response_bytes` (`--max-response-bytes`: a KV event page or snapshot can be several MB) — and handed back
as a `CheckAnswer`. Failures are the pool's `WorkerTransportError`s (`ConnectError`, `ReadTimeout`,
`RemoteProtocolError`, `BadAnswer`, `AnswerTooLarge`...), which `describe_failure` puts in words for the
worker's problem (`/health unreachable (ReadTimeout: no whole answer within 5 s)`).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson

from tokenfront.router.connections import (
    AnswerTooLarge,
    ReadTimeout,
    WorkerConnections,
    WorkerTransportError,
    describe_error,
)

__all__ = ["CheckAnswer", "CheckClient", "describe_failure"]


def describe_failure(route: str, exc: WorkerTransportError) -> str:
    """What a worker's problem says of a request to `route` that failed: `/health unreachable (ReadTimeout: ...)`,
    or `/server_info answered 9000000 bytes (Content-Length), over --max-response-bytes (...)`."""
    if isinstance(exc, AnswerTooLarge):
        return f"{route} {exc}"
    return f"{route} unreachable ({describe_error(exc)})"


@dataclass(frozen=True, slots=True)
class CheckAnswer:
    """A worker's whole answer to a check or an event read."""

    status_code: int
    headers: Mapping[str, str]  # names in lower case
    content: bytes

    def json(self) -> Any:
        """The body as JSON (orjson); a ValueError when it is not."""
        return orjson.loads(self.content)

    @property
    def text(self) -> str:
        """The body as text (UTF-8; bytes that are not, replaced)."""
        return self.content.decode("utf-8", errors="replace")


class CheckClient:
    """Requests to one worker answered whole: `get` and `post`, over keep-alive connections of its own.

    At most `max_connections` requests at a time (more wait for a free connection, up to `timeout`: a
    `PoolTimeout`); idle connections are dropped after `keepalive_expiry` seconds. Every request carries
    `headers` (the router's via header, the worker key); an https worker is verified with `ssl_context`.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        timeout: float,
        max_response_bytes: int,
        max_connections: int,
        keepalive_expiry: float,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`timeout` is a request's default bound (its answer whole, from when it was written), and each write's
        and each read's; `connect_timeout` bounds opening a connection."""
        self.url = url
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self._connections = WorkerConnections(
            url,
            connect_timeout=connect_timeout,
            timeout=timeout,
            max_connections=max_connections,
            keepalive_expiry=keepalive_expiry,
            headers=headers,
            ssl_context=ssl_context,
        )

    @property
    def connections(self) -> WorkerConnections:
        """The pool the requests go over (its idle connections: `idle_connections`)."""
        return self._connections

    async def get(
        self, path: str, *, params: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> CheckAnswer:
        """GET `path` (`params` as its query string) and read the answer whole within `timeout` seconds (by
        default the client's)."""
        return await self._request("GET", path, query=urlencode(params) if params else "", timeout=timeout)

    async def post(self, path: str, *, json: Any = None, timeout: float | None = None) -> CheckAnswer:
        """POST `json` (encoded with orjson) to `path` and read the answer whole within `timeout` seconds (by
        default the client's)."""
        return await self._request("POST", path, body=orjson.dumps(json), timeout=timeout)

    async def _request(
        self, method: str, path: str, *, query: str = "", body: bytes | None = None, timeout: float | None
    ) -> CheckAnswer:
        limit = self.timeout if timeout is None else timeout
        try:
            response = await self._connections.request(
                method, path, query=query, body=body, head_timeout=limit
            )
            try:
                content = await response.read(
                    limit=self.max_response_bytes, deadline=response.sent_at + limit
                )
            finally:
                response.close()  # kept for the next request when read to its end, closed otherwise
        except ReadTimeout:
            raise ReadTimeout(f"no whole answer within {limit:g} s") from None
        return CheckAnswer(response.status_code, response.headers, content)

    def close(self) -> None:
        """Close the idle connections; one in use closes when its request is done."""
        self._connections.close()

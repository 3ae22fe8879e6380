"""The direct lane: a small render request answered inside its connection's protocol, without ASGI.

On the hot render routes, the ASGI path costs more than the render itself: a task per request, the scope,
`receive` and `send` coroutines, a `Request` and a `Response`, each layer's wrapper of `send`, two socket
writes. A route that offers a direct answer (`LeanRoute.direct`, a plain function of the body) is answered
synchronously by `BoundedHttpProtocol` when its body is in: the same checks, done inline once — the API key
(`AuthAndMetrics.refusal`, constant time), the body limits, the server not draining, the request id (the
client's `X-Request-Id` or a new one, current while the request is answered) — then the function, the
request's metrics, and one write of the whole answer, byte for byte what the ASGI path writes.

Only the common case goes this way, and anything else takes the usual path, which answers it as it always
has: a body that is not small (`INLINE_BODY_BYTES`) or has no Content-Length, `Expect: 100-continue`, a
refused or missing key, a body that is not a JSON object, a request the function declines (it returns None:
a request's own chat template, an invalid body) or that raises (an unknown model, a prompt too long: the
usual path then gives the error), the pipeline busy on another call, a client not reading its answers (the
transport's writes paused), or a server shutting down. The direct function must therefore be pure: what it
does is done again on the usual path when it declines or raises. With `--access-log` the lane is off (every
request takes the path that writes the line), and so it is with `--otlp-traces-endpoint` (every request takes
the path that makes its spans). The renderer and the worker's render routes have the lane; the
router's do not (its loop guard stands in front of them), and it renders for routing in-process anyway.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from tokenfront.server.errors import APIError
from tokenfront.server.lean_routes import INLINE_BODY_BYTES, parse_body
from tokenfront.server.middleware import AuthAndMetrics
from tokenfront.server.render_thread import PIPELINE_LOCK
from tokenfront.server.request_ids import (
    REQUEST_ID_HEADER,
    accepted_request_id,
    reset_request_id,
    set_request_id,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

    from tokenfront.server.app import TokenfrontApp

__all__ = ["DirectAnswer", "DirectLane"]

# A route's direct answer: (the app, the body as sent, the body parsed: a JSON object) -> the JSON of a 200
# answer, or None to leave the request to the usual path.
DirectAnswer = Callable[["FastAPI", bytes, dict[str, Any]], "bytes | None"]

_REQUEST_ID = REQUEST_ID_HEADER.lower().encode("ascii")
# The answer's Content-Type line and the start of its request id's.
_JSON_AND_ID = b"content-type: application/json\r\n" + _REQUEST_ID + b": "

# A whole POST request head of header lines (RFC 9110's token for a name; for a value, runs of printable
# characters and obs-text separated by spaces and tabs, not ending in white space: a value followed by white
# space is the parser's to strip), and one such line, its value without the white space before it, for
# `answer_whole`. Possessive: nothing is tried twice. What they do not match, the HTTP parser reads.
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]++"
_VALUE = rb"(?:[!-~\x80-\xff]++(?:[\t ]++[!-~\x80-\xff]++)*+)?+"
_WHOLE_HEAD = re.compile(
    rb"POST (/[!-~]*+) HTTP/1\.1\r\n((?:" + _TOKEN + rb":[\t ]*+" + _VALUE + rb"\r\n)*+)\r\n"
)
_HEADER_LINE = re.compile(b"(" + _TOKEN + rb"):[ \t]*+(" + _VALUE + rb")\r\n")
# Headers that send a request to the parser: the client asks for more than an answer (a Transfer-Encoding is
# `_content_length`'s to refuse).
_NOT_WHOLE = frozenset((b"expect", b"upgrade"))


class DirectLane:
    """The direct answers of one app (its lean routes that offer one), and the checks in front of them."""

    def __init__(self, app: TokenfrontApp, front: AuthAndMetrics) -> None:
        self.app = app
        self.routes = dict(app.direct_routes)
        self.raw_paths = {path.encode("ascii"): path for path in self.routes}  # for `answer_whole`
        self.front = front  # the key check and the request metrics
        self.drain = app.drain
        self.max_body = min(INLINE_BODY_BYTES, app.max_body_bytes)
        # The answer's status line and default headers, and the default headers they were made of.
        self._head = b""
        self._head_headers: list[Any] | None = None

    @classmethod
    def of(cls, app: TokenfrontApp | Any) -> DirectLane | None:
        """The app's lane; None when it is not a `TokenfrontApp` (no direct routes), when it has no direct
        routes, when its lean routes have another layer in front of the key check (the router's loop guard),
        or when it traces: then they all take the usual path."""
        if not getattr(app, "direct_routes", None):
            return None
        front = app.lean_front
        if type(front) is not AuthAndMetrics or app.tracing is not None:
            return None
        return cls(app, front)

    def takes(self, scope: dict[str, Any]) -> bool:
        """Whether a request, by its head, may be answered directly (then only once its body is in)."""
        if scope["method"] != "POST" or scope["path"] not in self.routes or self.drain.draining:
            return False
        length = _content_length(scope["headers"])
        return length is not None and 0 < length <= self.max_body

    def answer(
        self, scope: dict[str, Any], body: bytes, *, keep_alive: bool, default_headers: list[Any]
    ) -> bytes | None:
        """The whole HTTP answer to a request `takes` took, or None: the usual path answers it."""
        headers = scope["headers"]
        return self._respond(
            scope["path"],
            headers,
            body,
            _header(headers, b"content-type"),
            _header(headers, _REQUEST_ID),
            keep_alive,
            default_headers,
        )

    def answer_whole(
        self, data: bytes, max_head: int, max_headers: int, default_headers: list[Any]
    ) -> tuple[bytes, bool] | None:
        """The whole HTTP answer, and whether the connection stays open, to `data` when it is exactly one
        complete request the lane takes: read here without the HTTP parser (`_WHOLE_HEAD`), for the common
        read that holds a whole small request. None for anything else — a head this reading does not take
        (another method or version, a line the grammar below does not cover or a value followed by white space,
        a query, more than `max_head` bytes or `max_headers` lines), an incomplete body or a second request behind it, a Transfer-Encoding,
        Expect, Upgrade or unusual Connection header — or a request the lane declines: the parser then
        reads the same bytes, as if this had not looked."""
        match = _WHOLE_HEAD.match(data)
        if match is None or match.end() > max_head:
            return None
        path = self.raw_paths.get(match.group(1))
        if path is None:
            return None
        headers = [(name.lower(), value) for name, value in _HEADER_LINE.findall(match.group(2))]
        if len(headers) > max_headers:
            return None
        # None with a Transfer-Encoding, or without exactly one Content-Length of digits.
        length = _content_length(headers)
        content_type = request_id = None
        keep_alive = True
        for name, value in headers:
            if name == b"content-type":
                content_type = value
            elif name == _REQUEST_ID:
                request_id = value
            elif name == b"connection":
                token = value.lower()
                if token == b"close":
                    keep_alive = False
                elif token != b"keep-alive":
                    return None
            elif name in _NOT_WHOLE:
                return None
        body = data[match.end() :]
        if length is None or length != len(body) or not 0 < length <= self.max_body:
            return None
        answer = self._respond(path, headers, body, content_type, request_id, keep_alive, default_headers)
        return None if answer is None else (answer, keep_alive)

    def _respond(
        self,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        content_type: bytes | None,
        client_request_id: bytes | None,
        keep_alive: bool,
        default_headers: list[Any],
    ) -> bytes | None:
        scope = {"method": "POST", "path": path, "headers": headers}
        if self.drain.draining or self.front.refusal(scope) is not None:
            return None
        try:
            payload = parse_body(body, (content_type or b"").decode("latin-1"))
        except APIError:
            return None
        if not PIPELINE_LOCK.acquire(blocking=False):
            return None
        request_id = accepted_request_id(client_request_id)
        token = set_request_id(request_id)
        start = time.perf_counter()
        try:
            content = self.routes[path](self.app, body, payload)
        except Exception:  # the usual path answers it again, with its error
            content = None
        finally:
            PIPELINE_LOCK.release()
            reset_request_id(token)
        if content is None:
            return None
        self.front.metrics.observe_direct(path, time.perf_counter() - start)
        if default_headers is not self._head_headers:  # uvicorn's list, anew each second (its Date)
            self._head_headers = default_headers
            self._head = STATUS_LINE[200] + b"".join(
                name + b": " + value + b"\r\n" for name, value in default_headers
            )
        return b"".join(
            (
                self._head,
                b"content-length: %d\r\n" % len(content),
                _JSON_AND_ID,
                request_id.encode("ascii"),
                b"\r\n\r\n" if keep_alive else b"\r\nconnection: close\r\n\r\n",
                content,
            )
        )


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((value for key, value in headers if key == name), None)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body's length when the head gives one Content-Length and no Transfer-Encoding."""
    length = None
    for name, value in headers:
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name == b"transfer-encoding":
            return None
    return length

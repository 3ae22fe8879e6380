"""Request body size limit (413), enforced before the app sees the body, for declared and chunked bodies."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenfront.server.errors import error_response

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class BodySizeLimit:
    """ASGI middleware answering 413 for bodies over `max_bytes`.

    The body is read here in full first (the routes parse whole JSON bodies anyway), so a chunked body over
    the limit is refused before any parser sees it, rather than failing inside one as a 400.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            f"the request body is larger than this server's limit of {self.max_bytes} bytes",
            code="request_too_large",
        )
        await response(scope, receive, send)

"""`LeanRoute`: a FastAPI route declared as usual (so OpenAPI documents it), answered without FastAPI's
per-request machinery.

FastAPI's request handling (dependency solving, body parsing by content type, pydantic validation through
its field wrappers, response serialization) costs several times what rendering a short chat costs. A lean
route reads the body once, parses it with orjson (`responses.loads_request`: strict UTF-8 JSON, so NaN,
Infinity, lone surrogates, a byte order mark or UTF-16 are a 400 naming the problem, never an answer that
cannot be encoded), validates it with the endpoint's pydantic body model (a large body on the decode thread,
off the event loop), keeps the raw bytes on the request (`raw_body`) — and the parsed object too on a
`LeanEchoRoute`, whose endpoint reads it again (`json_body`) — and calls the endpoint directly. The endpoint
returns a `Response`, or a value encoded with orjson. Errors are the app's usual OpenAI-shaped errors.

Endpoints take exactly two parameters: the body model and the `Request`.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import typing
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenfront.server.errors import APIError, response_for, validation_error
from tokenfront.server.responses import JSONBytesResponse, RequestJSONError, loads_request

if typing.TYPE_CHECKING:
    from tokenfront.server.direct import DirectAnswer

__all__ = ["INLINE_BODY_BYTES", "LeanEchoRoute", "LeanRoute", "json_body", "parse_body", "raw_body"]

_JSON_KEY = "tokenfront.json_body"
_RAW_KEY = "tokenfront.raw_body"
_Model = typing.TypeVar("_Model", bound=BaseModel)

# A body up to this size is parsed and validated on the event loop (well under a millisecond); a larger one on
# the decode thread, so that the loop keeps answering meanwhile (a 16 MiB body takes the parser and the
# validator up to a few seconds). One thread: big bodies are decoded one at a time, bounding their memory.
INLINE_BODY_BYTES = 64 * 1024
_DECODE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenfront-decode")


def json_body(request: Request) -> Any:
    """The parsed JSON body of a `LeanEchoRoute`'s request."""
    return request.scope[_JSON_KEY]


def raw_body(request: Request) -> bytes:
    """The body of a lean route's request, as the client sent it."""
    return typing.cast(bytes, request.scope[_RAW_KEY])


class LeanRoute(APIRoute):
    """An `APIRoute` whose handler parses, validates and calls the endpoint itself (see the module doc).

    `serve` answers a request as a plain ASGI app, for an app that dispatches to the route itself (see
    `server.app.TokenfrontApp`); FastAPI's own routing reaches the same handler. `direct`, when a route module
    sets it, answers the route's common case without ASGI (`server.direct`): the same answer as the endpoint's.
    """

    direct: DirectAnswer | None = None
    # Whether the parsed body stays on the request for the endpoint (`json_body`). Not by default: the request
    # (its scope) lives as long as its answer, a stream included, and a parsed body holds the garbage
    # collector's objects — a long id prompt is a list it walks id by id at every full collection.
    keeps_json_body = False

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one request on this route, errors included."""
        try:
            response = await self._lean_handler(Request(scope, receive, send))
        except Exception as exc:
            response = response_for(exc)
        await response(scope, receive, send)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        self._lean_handler = self._build_handler()
        return self._lean_handler

    def _build_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        model, model_param, request_param = _signature(self.endpoint)
        endpoint = self.endpoint
        keeps_json_body = self.keeps_json_body

        async def handler(request: Request) -> Response:
            body = await request.body()
            content_type = _content_type(request)
            # The app's request limits (`protocol.limits`), which the models' validators read.
            limits = getattr(request.app, "validation_context", None)
            if len(body) <= INLINE_BODY_BYTES:
                payload, parsed = _decode(model, body, content_type, limits)
            else:
                # The request's context goes along, so that a line logged meanwhile carries its request id.
                context = contextvars.copy_context()
                payload, parsed = await asyncio.get_running_loop().run_in_executor(
                    _DECODE_THREAD, context.run, _decode_large, model, body, content_type, limits
                )
            if keeps_json_body:
                request.scope[_JSON_KEY] = payload
            del payload
            request.scope[_RAW_KEY] = body
            result = await endpoint(**{model_param: parsed, request_param: request})
            return result if isinstance(result, Response) else JSONBytesResponse(result)

        return handler


class LeanEchoRoute(LeanRoute):
    """A `LeanRoute` whose endpoint reads the parsed body again (`json_body`: the render routes, whose answer
    carries the request back)."""

    keeps_json_body = True


def _signature(endpoint: Callable[..., Any]) -> tuple[type[BaseModel], str, str]:
    hints = typing.get_type_hints(endpoint)
    model: tuple[type[BaseModel], str] | None = None
    request_param: str | None = None
    for name in inspect.signature(endpoint).parameters:
        hint = hints.get(name)
        if inspect.isclass(hint) and issubclass(hint, BaseModel):
            model = (hint, name)
        elif hint is Request:
            request_param = name
    if model is None or request_param is None:
        raise TypeError(f"a LeanRoute endpoint takes a pydantic body model and the Request: {endpoint}")
    return model[0], model[1], request_param


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "")


def _decode(
    model: type[_Model], body: bytes, content_type: str, limits: dict[str, Any] | None
) -> tuple[Any, _Model]:
    """The body parsed, and validated by `model` (with `limits`, the app's validation context); the 400 for a
    body that is neither."""
    payload = parse_body(body, content_type)
    try:
        return payload, model.model_validate(payload, context=limits)
    except ValidationError as exc:
        raise validation_error([dict(e) for e in exc.errors()], content_type) from None


def _decode_large(
    model: type[_Model], body: bytes, content_type: str, limits: dict[str, Any] | None
) -> tuple[Any, _Model]:
    """`_decode` with the garbage collector paused (on the decode thread only, the one place that pauses it).

    A large body is a million objects made in one parser call; collections set off meanwhile run inside that call
    with the interpreter held (a 15 MB body: 0.36 s instead of 0.14 s). Parsed JSON and the models made from it
    hold no reference cycles, so nothing is lost by waiting: the collections run after, each a short pause.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _decode(model, body, content_type, limits)
    finally:
        if enabled:
            gc.enable()


def parse_body(body: bytes, content_type: str) -> dict[str, Any]:
    """A lean route's body as a JSON object; the 400 (APIError) for one that is not JSON, or not an object, or
    sent with another content type."""
    if content_type and "json" not in content_type:
        # curl's plain `-d` sends a form content type: say which header is missing.
        raise APIError(
            400,
            "the request body must be JSON: send it with `Content-Type: application/json` "
            f"(got {content_type})",
        )
    if not body:
        raise APIError(400, "the request body is empty: send a JSON object")
    try:
        payload = loads_request(body)
    except RequestJSONError as exc:
        # NaN, Infinity, a lone surrogate: parsed by lenient parsers, but never answerable (not even echoed).
        raise APIError(400, f"invalid request: {exc.message}", param=exc.param) from None
    except ValueError as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise APIError(400, "the request body must be a JSON object")
    return payload

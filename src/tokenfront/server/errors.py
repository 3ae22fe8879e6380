"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`, never a bare 500 for client input."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenfront.core.errors import RenderError
from tokenfront.server.responses import JSONBytesResponse

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error answered as-is with its status and OpenAI error fields."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or _TYPES.get(status_code, "invalid_request_error")


def error_body(
    message: str, *, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(
    status_code: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    error_type: str | None = None,
) -> JSONBytesResponse:
    """A JSON response carrying the OpenAI error object."""
    kind = error_type or _TYPES.get(status_code, "invalid_request_error")
    return JSONBytesResponse(
        error_body(message, error_type=kind, param=param, code=code), status_code=status_code
    )


def model_not_found(model: str, served: tuple[str, ...]) -> APIError:
    """OpenAI's 404 for a `model` this server does not serve."""
    return APIError(
        404,
        f"The model `{model}` does not exist. This server serves: {', '.join(served)}.",
        param="model",
        code="model_not_found",
    )


_TYPE_LABEL = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|function-.*|literal\[.*\]|[A-Z]\w*)$")


def _location(loc: tuple[Any, ...]) -> str:
    """`messages[0].content` from pydantic's ('body', 'messages', 0, 'content', 'str')."""
    text = ""
    for part in loc:
        if part == "body" and not text:
            continue
        if isinstance(part, int):
            text += f"[{part}]"
        elif _TYPE_LABEL.match(str(part)):
            continue  # which branch of a union failed: noise to a person
        else:
            text += f".{part}" if text else str(part)
    return text


# pydantic names a validated type `function-after[_check(), Model]`: to a person, that is `Model`.
_VALIDATOR_WRAPPER = re.compile(r"function-(?:after|before|wrap|plain)\[[^\[\]]*?\(\), ([^\[\]]*)\]")


def _readable_label(label: str) -> str:
    while True:
        plain = _VALIDATOR_WRAPPER.sub(r"\1", label)
        if plain == label:
            return plain
        label = plain


def _union_branches(errors: list[dict[str, Any]], where: str) -> list[str]:
    branches = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ())]
        labels = [_readable_label(p) for p in loc if _TYPE_LABEL.match(p) and not p[0].isupper()]
        if _location(tuple(error.get("loc", ()))).startswith(where) and labels and labels[0] not in branches:
            branches.append(labels[0])
    return branches


def _readable_message(message: str) -> str:
    # A validator's own ValueError reads as pydantic prefixes it: "Value error, <the validator's words>".
    return message.removeprefix("Value error, ")


def _validation_message(errors: list[dict[str, Any]], content_type: str) -> tuple[str, str | None]:
    first = errors[0]
    if first.get("type") == "json_invalid":
        return (
            f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})",
            None,
        )
    loc = _location(tuple(first.get("loc", ())))
    if not loc and first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        if "json" not in content_type:
            return (
                "the request body must be JSON: send it with `Content-Type: application/json` "
                f"(got {content_type or 'no content type'})"
            ), None
        return "the request body must be a JSON object", None
    branches = _union_branches(errors, loc)
    if len(branches) > 1:
        return (
            f"invalid request: {loc} has the wrong type; expected one of: {', '.join(branches)}",
            loc or None,
        )
    messages = []
    for error in errors[:5]:
        where = _location(tuple(error.get("loc", ()))) or "body"
        messages.append(f"{where}: {_readable_message(str(error.get('msg', 'invalid')))}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(messages) + more, loc or None


def validation_error(errors: list[dict[str, Any]], content_type: str) -> APIError:
    """The 400 for a body that fails validation, naming where (`messages[0].content: ...`)."""
    message, param = _validation_message(errors, content_type)
    return APIError(400, message, param=param)


def response_for(exc: Exception) -> JSONBytesResponse:
    """The answer to an exception raised while answering: its own status for tokenfront's errors, else a
    logged 500 that names no internals."""
    if isinstance(exc, (RenderError, APIError)):
        return error_response(
            exc.status_code, exc.message, param=exc.param, code=exc.code, error_type=exc.error_type
        )
    log.exception("unexpected error while answering a request", exc_info=exc)
    return error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error a client can cause in the OpenAI shape."""

    @app.exception_handler(RenderError)
    async def _render_error(_: Request, exc: RenderError) -> JSONBytesResponse:
        return response_for(exc)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONBytesResponse:
        return response_for(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONBytesResponse:
        message, param = _validation_message(list(exc.errors()), request.headers.get("content-type", ""))
        return error_response(400, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONBytesResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path} on this server"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONBytesResponse:
        return response_for(exc)

"""What the client raises: an OpenAI error a server answered, a server it could not reach, an answer it could
not read. Every class derives from `TokenfrontError`, so one `except` catches them all."""

from __future__ import annotations

from typing import Any

import httpx

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "InvalidResponseError",
    "NotFoundError",
    "PermissionDeniedError",
    "RequestTooLargeError",
    "ServerError",
    "StreamError",
    "TokenfrontError",
    "api_error",
    "connection_error",
]


class TokenfrontError(Exception):
    """Base of every error the client raises. `url` is the address of the request that failed."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.message = message
        self.url = url


class APIError(TokenfrontError):
    """A server answered an OpenAI error: `{"error": {"message", "type", "param", "code"}}`.

    `status_code` is the HTTP status (None for an error event inside a stream, see `StreamError`); `type`,
    `param` and `code` are the error object's fields (None when the server left them out or its answer was not
    an OpenAI error, as a proxy's HTML page is not); `body` is the decoded answer, or its text.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str,
        status_code: int | None,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message, url=url)
        self.status_code = status_code
        self.type = type
        self.param = param
        self.code = code
        self.body = body

    def __str__(self) -> str:
        where = f"POST {self.url}"
        head = f"{self.status_code} from {where}" if self.status_code is not None else f"error in {where}"
        extras = [f"{name}={value}" for name, value in (("param", self.param), ("code", self.code)) if value]
        return f"{head}: {self.message}" + (f" ({', '.join(extras)})" if extras else "")


class BadRequestError(APIError):
    """400: the body is malformed, breaks the schema, or cannot be rendered; `param` names the field."""


class AuthenticationError(APIError):
    """401: the server wants an API key this client did not send (give `api_key=`), or another one."""


class PermissionDeniedError(APIError):
    """403: the key was read and refused."""


class NotFoundError(APIError):
    """404: another model name (`code` "model_not_found"), or a route the server does not mount (a worker
    without TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1 has no render routes)."""


class RequestTooLargeError(APIError):
    """413: the body is larger than the server's `--max-body-bytes`."""


class ServerError(APIError):
    """5xx: the server failed, is shutting down (503 `server_shutting_down`) or has no worker left (a router's
    503); sending the same request again later may succeed."""


class StreamError(APIError):
    """An error event inside a stream: the server had already answered 200 when generation failed."""


class APIConnectionError(TokenfrontError):
    """No answer: the server could not be reached, or the connection broke before the answer was complete."""


class APITimeoutError(APIConnectionError):
    """No answer within the client's `timeout`."""


class InvalidResponseError(TokenfrontError):
    """A 2xx answer that is not what the route answers (not JSON, or not a render answer): is the URL the
    right server's?"""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    413: RequestTooLargeError,
}


def api_error(status_code: int, body: Any, *, url: str) -> APIError:
    """The exception for a non-2xx answer: its class by status, its fields from the OpenAI error object."""
    error = body.get("error") if isinstance(body, dict) else None
    cls = _BY_STATUS.get(status_code, ServerError if status_code >= 500 else APIError)
    if not isinstance(error, dict):
        # Not an OpenAI error (a proxy's page, a foreign server): the start of the text is the best message.
        text = body if isinstance(body, str) else repr(body)
        return cls(text[:500] or "(empty answer)", url=url, status_code=status_code, body=body)
    return cls(
        str(error.get("message") or "(no message)"),
        url=url,
        status_code=status_code,
        type=_str_or_none(error.get("type")),
        param=_str_or_none(error.get("param")),
        code=_str_or_none(error.get("code")),
        body=body,
    )


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def connection_error(exc: httpx.TransportError, *, url: str, server: str) -> APIConnectionError:
    """The client's exception for an httpx transport error on a request to `server` ("renderer"/"worker")."""
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(
            f"the {server} at {url} did not answer within the client's timeout ({type(exc).__name__}): "
            "raise `timeout=` or check that the server is not overloaded",
            url=url,
        )
    detail = str(exc) or type(exc).__name__
    return APIConnectionError(f"could not reach the {server} at {url}: {detail}", url=url)

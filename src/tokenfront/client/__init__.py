"""A Python client for tokenfront: render a request on a renderer, send the ids to a worker.

    from tokenfront.client import Client

    with Client("http://127.0.0.1:8100", "http://127.0.0.1:8000") as client:
        rendered = client.render_chat({"messages": [{"role": "user", "content": "Hi"}]})
        answer = client.send_rendered(rendered)

`AsyncClient` has the same methods, awaited. Errors are exceptions: `APIError` (and a subclass per status)
carries the server's OpenAI error; `APIConnectionError` says which server could not be reached. The client
needs httpx and nothing of the servers (no torch, no web framework). docs/client.md has the whole surface.
"""

from tokenfront.client._client import DEFAULT_TIMEOUT, AsyncClient, Client
from tokenfront.client._exceptions import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    InvalidResponseError,
    NotFoundError,
    PermissionDeniedError,
    RequestTooLargeError,
    ServerError,
    StreamError,
    TokenfrontError,
)
from tokenfront.client._models import RenderedChat, RenderedCompletion
from tokenfront.client._streaming import AsyncStream, Stream

__all__ = [
    "DEFAULT_TIMEOUT",
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AsyncClient",
    "AsyncStream",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "InvalidResponseError",
    "NotFoundError",
    "PermissionDeniedError",
    "RenderedChat",
    "RenderedCompletion",
    "RequestTooLargeError",
    "ServerError",
    "Stream",
    "StreamError",
    "TokenfrontError",
]

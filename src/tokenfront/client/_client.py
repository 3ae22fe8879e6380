"""`Client` and `AsyncClient`: render a request on a renderer, send the rendered request to a worker.

The reference recipes, as methods:

    rendered = client.render_chat(body)       # POST {renderer}/v1/chat/completions/render
    answer = client.send_rendered(rendered)   # POST {worker}/v1/chat/completions, request + prompt_token_ids

The renderer and the worker may be different servers (a CPU renderer in front of GPU workers), the same one (a
worker started with TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1), or a router, which serves both routes. Both clients
share everything but the I/O: the request each call makes and how its answer is read are written once, here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, overload

import httpx
import orjson

from tokenfront.client._exceptions import InvalidResponseError, api_error, connection_error
from tokenfront.client._models import RenderedChat, RenderedCompletion
from tokenfront.client._streaming import AsyncStream, Stream

__all__ = ["DEFAULT_TIMEOUT", "AsyncClient", "Client"]

# Generation on a CPU worker can take minutes; connecting should not.
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
CHAT_RENDER_PATH = "/v1/chat/completions/render"
COMPLETIONS_RENDER_PATH = "/v1/completions/render"

Rendered = RenderedChat | RenderedCompletion


@dataclass(frozen=True)
class _Call:
    """One HTTP request the client makes: where, with what, and which server it goes to (for messages)."""

    server: str
    url: str
    body: dict[str, Any]
    headers: dict[str, str]


class _Config:
    """What both clients share: the two base URLs, their headers, and the requests each method makes."""

    def __init__(
        self,
        renderer_url: str | None,
        worker_url: str | None,
        api_key: str | None,
        renderer_api_key: str | None,
        worker_api_key: str | None,
    ) -> None:
        if renderer_url is None and worker_url is None:
            raise ValueError(
                "give renderer_url (where requests are rendered), worker_url (where rendered requests are "
                "sent), or both; a worker with render endpoints or a router serves both"
            )
        # A worker with render endpoints, or a router, renders too: the renderer defaults to the worker.
        renderer = renderer_url if renderer_url is not None else worker_url
        self.renderer_url = _base(renderer) if renderer is not None else ""
        self.worker_url = _base(worker_url) if worker_url is not None else None
        self._headers = {
            "renderer": _auth(renderer_api_key if renderer_api_key is not None else api_key),
            "worker": _auth(worker_api_key if worker_api_key is not None else api_key),
        }

    def render(self, path: str, body: Mapping[str, Any]) -> _Call:
        return _Call("renderer", f"{self.renderer_url}{path}", dict(body), self._headers["renderer"])

    def send(self, rendered: Rendered, *, stream: bool) -> _Call:
        if not isinstance(rendered, (RenderedChat, RenderedCompletion)):
            raise TypeError(f"expected a RenderedChat or RenderedCompletion, got {type(rendered).__name__}")
        if self.worker_url is None:
            raise ValueError("this client has no worker_url: give Client(worker_url=...) to send requests")
        if rendered.stream and not stream:
            raise ValueError(
                "the request asks for a stream (`stream: true`): use stream_rendered(), which returns its "
                "chunks as they come"
            )
        body = rendered.worker_body()
        if stream:
            body["stream"] = True
        return _Call("worker", f"{self.worker_url}{rendered.worker_path}", body, self._headers["worker"])


def _base(url: str) -> str:
    return url.rstrip("/")


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _decode(response: httpx.Response, call: _Call) -> Any:
    """The JSON of an answer, or the exception for it: an `APIError` for a non-2xx answer."""
    try:
        body: Any = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = None
    if not response.is_success:
        raise api_error(response.status_code, body if body is not None else response.text, url=call.url)
    if body is None:
        raise InvalidResponseError(
            f"the {call.server} answered {response.status_code} with a body that is not JSON: "
            f"{response.text[:200]!r}",
            url=call.url,
        )
    return body


def _answers(rendered: Rendered | Sequence[RenderedCompletion]) -> tuple[bool, list[Rendered]]:
    """(one request?, the rendered requests to send)."""
    if isinstance(rendered, (RenderedChat, RenderedCompletion)):
        return True, [rendered]
    return False, list(rendered)


class Client:
    """A synchronous client for a tokenfront renderer and worker (or a router, which is both).

    `renderer_url` is where requests are rendered (it defaults to `worker_url`: a worker with render endpoints
    renders too); `worker_url` is where rendered requests are sent (None for a render-only client). `api_key`
    is sent to both as a Bearer token; `renderer_api_key` / `worker_api_key` override it for one of them.
    `timeout` is httpx's (a number of seconds, or an `httpx.Timeout`). `http_client` replaces the
    `httpx.Client` the client would create (for proxies, limits or transports); the client closes it too.
    """

    def __init__(
        self,
        renderer_url: str | None = None,
        worker_url: str | None = None,
        *,
        api_key: str | None = None,
        renderer_api_key: str | None = None,
        worker_api_key: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._config = _Config(renderer_url, worker_url, api_key, renderer_api_key, worker_api_key)
        self._http = http_client if http_client is not None else httpx.Client(timeout=timeout)

    @property
    def renderer_url(self) -> str:
        """Where requests are rendered."""
        return self._config.renderer_url

    @property
    def worker_url(self) -> str | None:
        """Where rendered requests are sent (None: this client only renders)."""
        return self._config.worker_url

    def render_chat(self, body: Mapping[str, Any]) -> RenderedChat:
        """Render a `/v1/chat/completions` body into its prompt ids (`POST /v1/chat/completions/render`)."""
        call = self._config.render(CHAT_RENDER_PATH, body)
        return RenderedChat.from_json(self._post(call), url=call.url)

    def render_completion(self, body: Mapping[str, Any]) -> list[RenderedCompletion]:
        """Render a `/v1/completions` body (`POST /v1/completions/render`): one item per prompt."""
        call = self._config.render(COMPLETIONS_RENDER_PATH, body)
        return RenderedCompletion.list_from_json(self._post(call), url=call.url)

    @overload
    def send_rendered(self, rendered: RenderedChat | RenderedCompletion) -> dict[str, Any]: ...

    @overload
    def send_rendered(self, rendered: Sequence[RenderedCompletion]) -> list[dict[str, Any]]: ...

    def send_rendered(
        self, rendered: RenderedChat | RenderedCompletion | Sequence[RenderedCompletion]
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Send rendered requests to the worker, as the reference recipes do, and return its answers.

        A `RenderedChat` goes to `/v1/chat/completions` as its request plus `prompt_token_ids` (its request
        alone with a named tool_choice); a `RenderedCompletion` to `/v1/completions` with its ids as the
        `prompt`. A list (what `render_completion` returns) sends one request per item, in order, and returns
        their answers in a list. A request with `"stream": true` is refused: use `stream_rendered`.
        """
        single, items = _answers(rendered)
        calls = [self._config.send(item, stream=False) for item in items]
        answers = [self._post(call) for call in calls]
        return answers[0] if single else answers

    def stream_rendered(self, rendered: RenderedChat | RenderedCompletion) -> Stream:
        """Send one rendered request with `"stream": true` and return its chunks as they come (a `Stream`:
        iterate it; `with` closes it). An error answer raises here, before the first chunk."""
        call = self._config.send(rendered, stream=True)
        request = self._http.build_request("POST", call.url, json=call.body, headers=call.headers)
        try:
            response = self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise connection_error(exc, url=call.url, server=call.server) from exc
        if not response.is_success:
            try:
                response.read()
            finally:
                response.close()
            _decode(response, call)
        return Stream(response, url=call.url)

    def _post(self, call: _Call) -> Any:
        try:
            response = self._http.post(call.url, json=call.body, headers=call.headers)
        except httpx.TransportError as exc:
            raise connection_error(exc, url=call.url, server=call.server) from exc
        return _decode(response, call)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient:
    """The asynchronous `Client`: the same arguments and methods, awaited (`http_client` an
    `httpx.AsyncClient`)."""

    def __init__(
        self,
        renderer_url: str | None = None,
        worker_url: str | None = None,
        *,
        api_key: str | None = None,
        renderer_api_key: str | None = None,
        worker_api_key: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._config = _Config(renderer_url, worker_url, api_key, renderer_api_key, worker_api_key)
        self._http = http_client if http_client is not None else httpx.AsyncClient(timeout=timeout)

    @property
    def renderer_url(self) -> str:
        """Where requests are rendered."""
        return self._config.renderer_url

    @property
    def worker_url(self) -> str | None:
        """Where rendered requests are sent (None: this client only renders)."""
        return self._config.worker_url

    async def render_chat(self, body: Mapping[str, Any]) -> RenderedChat:
        """Render a `/v1/chat/completions` body into its prompt ids (`POST /v1/chat/completions/render`)."""
        call = self._config.render(CHAT_RENDER_PATH, body)
        return RenderedChat.from_json(await self._post(call), url=call.url)

    async def render_completion(self, body: Mapping[str, Any]) -> list[RenderedCompletion]:
        """Render a `/v1/completions` body (`POST /v1/completions/render`): one item per prompt."""
        call = self._config.render(COMPLETIONS_RENDER_PATH, body)
        return RenderedCompletion.list_from_json(await self._post(call), url=call.url)

    @overload
    async def send_rendered(self, rendered: RenderedChat | RenderedCompletion) -> dict[str, Any]: ...

    @overload
    async def send_rendered(self, rendered: Sequence[RenderedCompletion]) -> list[dict[str, Any]]: ...

    async def send_rendered(
        self, rendered: RenderedChat | RenderedCompletion | Sequence[RenderedCompletion]
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """`Client.send_rendered`, awaited. A list's requests are sent one after the other, in order."""
        single, items = _answers(rendered)
        calls = [self._config.send(item, stream=False) for item in items]
        answers = [await self._post(call) for call in calls]
        return answers[0] if single else answers

    async def stream_rendered(self, rendered: RenderedChat | RenderedCompletion) -> AsyncStream:
        """`Client.stream_rendered`, awaited: an `AsyncStream` to read with `async for` (`async with`
        closes it)."""
        call = self._config.send(rendered, stream=True)
        request = self._http.build_request("POST", call.url, json=call.body, headers=call.headers)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise connection_error(exc, url=call.url, server=call.server) from exc
        if not response.is_success:
            try:
                await response.aread()
            finally:
                await response.aclose()
            _decode(response, call)
        return AsyncStream(response, url=call.url)

    async def _post(self, call: _Call) -> Any:
        try:
            response = await self._http.post(call.url, json=call.body, headers=call.headers)
        except httpx.TransportError as exc:
            raise connection_error(exc, url=call.url, server=call.server) from exc
        return _decode(response, call)

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

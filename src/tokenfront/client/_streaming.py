"""Streamed answers: the server-sent events of a `"stream": true` request, as parsed chunks.

The worker frames each chunk as one `data: {json}` event and ends with `data: [DONE]`; an error after the 200
was sent arrives as an event carrying `{"error": {...}}` (then `[DONE]`), raised here as `StreamError`. A
stream that ends without `[DONE]` was cut (the connection broke): `APIConnectionError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any, Final

import httpx
import orjson

from tokenfront.client._exceptions import (
    APIConnectionError,
    InvalidResponseError,
    StreamError,
    connection_error,
)

__all__ = ["DONE", "AsyncStream", "Stream", "decode_event_line"]

DONE: Final = "[DONE]"


def decode_event_line(line: str, *, url: str) -> dict[str, Any] | str | None:
    """One line of an event stream: a chunk (a dict), `DONE`, or None for lines that carry no data (blank
    lines between events, `:` comments, `event:`/`id:`/`retry:` fields).

    Raises `StreamError` for an error event and `InvalidResponseError` for data that is not a JSON object.
    """
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == DONE:
        return DONE
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise InvalidResponseError(f"a stream event is not JSON: {data[:200]!r}", url=url) from None
    if not isinstance(payload, dict):
        raise InvalidResponseError(f"a stream event is not a JSON object: {data[:200]!r}", url=url)
    error = payload.get("error")
    if isinstance(error, dict):
        raise StreamError(
            str(error.get("message") or "(no message)"),
            url=url,
            status_code=None,
            type=error.get("type"),
            param=error.get("param"),
            code=error.get("code"),
            body=payload,
        )
    return payload


def _cut(url: str) -> APIConnectionError:
    return APIConnectionError(
        f"the stream from {url} ended before `data: [DONE]`: the connection was closed early", url=url
    )


class Stream:
    """The chunks of a streamed answer, parsed, in order. Iterate it once; close it (or use `with`) when you
    stop early, so the connection is released and the server cancels the generation."""

    def __init__(self, response: httpx.Response, *, url: str) -> None:
        self.response = response
        self.url = url
        self._chunks = self._iterate()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._chunks)

    def _iterate(self) -> Iterator[dict[str, Any]]:
        try:
            for line in self.response.iter_lines():
                event = decode_event_line(line, url=self.url)
                if event == DONE:
                    return
                if isinstance(event, dict):
                    yield event
        except httpx.TransportError as exc:
            raise connection_error(exc, url=self.url, server="worker") from exc
        finally:
            self.close()
        raise _cut(self.url)

    def close(self) -> None:
        """Close the connection (a worker cancels a generation whose client went away)."""
        self.response.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncStream:
    """The chunks of a streamed answer, parsed, in order, for `async for`. Close it (`await stream.aclose()`,
    or `async with`) when you stop early."""

    def __init__(self, response: httpx.Response, *, url: str) -> None:
        self.response = response
        self.url = url
        self._chunks = self._iterate()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._chunks.__anext__()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        try:
            async for line in self.response.aiter_lines():
                event = decode_event_line(line, url=self.url)
                if event == DONE:
                    return
                if isinstance(event, dict):
                    yield event
        except httpx.TransportError as exc:
            raise connection_error(exc, url=self.url, server="worker") from exc
        finally:
            await self.aclose()
        raise _cut(self.url)

    async def aclose(self) -> None:
        """Close the connection (a worker cancels a generation whose client went away)."""
        await self.response.aclose()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

"""Client disconnects: notice a client that left while its answer was being made, and the 499 answer.

A server reads the whole body before it works on a request, so the only message left to receive is
`http.disconnect`: waiting on `receive()` tells when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import Receive

from tokenfront.server.errors import error_body
from tokenfront.server.responses import JSONBytesResponse

__all__ = ["ClientDisconnected", "client_disconnected_response", "unless_disconnected", "wait_for_disconnect"]

_T = TypeVar("_T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client closed the connection first"


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client closes the connection (call only after the body has been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(
    work: Awaitable[_T],
    request: Request,
    *,
    on_disconnect: Callable[[], None] | None = None,
) -> _T:
    """Await `work`, unless the client leaves first: then cancel it and raise `ClientDisconnected`.

    `on_disconnect` runs first, before `work` is cancelled (to stop what it waits for, for its own reason).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler was cancelled (shutdown): the work must not outlive it
        task.cancel()
        # Nobody awaits it now: its outcome (the engine may have failed it first, e.g. sequences aborted at
        # shutdown) is read when it comes, so asyncio does not log it as "never retrieved" with a traceback.
        task.add_done_callback(_discard_outcome)
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    if on_disconnect is not None:
        on_disconnect()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise ClientDisconnected


def _discard_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def client_disconnected_response() -> JSONBytesResponse:
    """The 499 answer logged for a request whose client left (nobody reads it)."""
    body = error_body("client disconnected", error_type="client_disconnected")
    return JSONBytesResponse(body, status_code=CLIENT_CLOSED_REQUEST)

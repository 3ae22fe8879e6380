"""Request ids: the OpenAI-style ids of answers (`chatcmpl-…`, `cmpl-…`, docs/contract.md §2), and the id of each HTTP request.

An HTTP request's id is the client's `X-Request-Id` when it is one a log line can carry (1 to 128 printable
ASCII characters, no spaces), else a new one (32 lowercase hex digits). The server sets it for the request's
task (`current_request_id`): every log line written while answering carries it, the router sends it on to the
worker it chose, and the answer returns it in `X-Request-Id` (`server.middleware.RequestIdLayer`).
"""

from __future__ import annotations

import os
import random
import re
from contextvars import ContextVar, Token

__all__ = [
    "MAX_REQUEST_ID_LENGTH",
    "REQUEST_ID_HEADER",
    "accepted_request_id",
    "chat_request_id",
    "completion_request_id",
    "current_request_id",
    "new_request_id",
    "reset_request_id",
    "set_request_id",
]

# The header's name as ASGI carries it (lower case).
REQUEST_ID_HEADER = "x-request-id"
# Longer client ids are replaced: an id is for finding lines, and a log line is no place for a client's essay.
MAX_REQUEST_ID_LENGTH = 128
# Printable ASCII without spaces: safe in a header sent on to a worker and in a text log line.
_USABLE = re.compile(rb"[!-~]{1,%d}" % MAX_REQUEST_ID_LENGTH)

_current: ContextVar[str | None] = ContextVar("tokenfront_request_id", default=None)


# Ids name requests, they guard nothing: the random module's generator (seeded from the OS at start and again
# in each pre-forked child) instead of a getrandom system call per id, two of which every render answer makes;
# and its bytes drawn for _POOL_IDS ids at a time. A child forked with ids left in the pool empties it (else it
# would give the parent's next ids again).
_POOL_IDS = 128
_pool: list[str] = []
os.register_at_fork(after_in_child=_pool.clear)


def _hex32() -> str:
    if not _pool:
        digits = random.randbytes(16 * _POOL_IDS).hex()
        _pool.extend([digits[start : start + 32] for start in range(0, 32 * _POOL_IDS, 32)])
    return _pool.pop()


def chat_request_id() -> str:
    """`chatcmpl-` and 32 lowercase hex digits."""
    return f"chatcmpl-{_hex32()}"


def completion_request_id() -> str:
    """`cmpl-` and 32 lowercase hex digits; render items append `-<index>`."""
    return f"cmpl-{_hex32()}"


def new_request_id() -> str:
    """A new HTTP request id: 32 lowercase hex digits."""
    return _hex32()


def accepted_request_id(sent: bytes | None) -> str:
    """The id of a request whose `X-Request-Id` header is `sent` (None: absent): the client's own when it is
    1-128 printable ASCII characters without spaces, else a new one."""
    if sent is not None and _USABLE.fullmatch(sent):
        return sent.decode("ascii")
    return new_request_id()


def current_request_id() -> str | None:
    """The id of the request being answered in this task (None outside a request)."""
    return _current.get()


def set_request_id(request_id: str | None) -> Token[str | None]:
    """Make `request_id` the current one in this context; `reset_request_id` with the token undoes it."""
    return _current.set(request_id)


def reset_request_id(token: Token[str | None]) -> None:
    """Undo a `set_request_id`."""
    _current.reset(token)

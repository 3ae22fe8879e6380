"""What a failed call to a worker means: the words that say why, and the client's status and error code.

A worker that could not be reached or whose connection broke is a 503 `no_worker`; one too slow (no answer
within `--first-byte-timeout` or `--request-timeout`, or a write that could not finish) a 504 `worker_timeout`;
an answer that is not what the route answers a 502 `bad_worker_response`, one over `--max-response-bytes` a 502
`worker_response_too_large`. The proxy answers these when no worker is left to try; a stream already begun ends
with its error event.
"""

from __future__ import annotations

from tokenfront.router.connections import (
    AnswerTooLarge,
    BadAnswer,
    ReadTimeout,
    WorkerTransportError,
    WriteTimeout,
    describe_error,
)

__all__ = [
    "BAD_WORKER_RESPONSE_CODE",
    "NO_WORKER_CODE",
    "WORKER_RESPONSE_TOO_LARGE_CODE",
    "WORKER_TIMEOUT_CODE",
    "client_error",
    "failure_reason",
]

BAD_WORKER_RESPONSE_CODE = "bad_worker_response"
WORKER_TIMEOUT_CODE = "worker_timeout"
WORKER_RESPONSE_TOO_LARGE_CODE = "worker_response_too_large"
NO_WORKER_CODE = "no_worker"


def failure_reason(exc: WorkerTransportError) -> str:
    """Why an attempt failed, for messages: the router's own words for an answer that is bad, late or too
    large (they follow the worker's URL), else the error's name and message."""
    message = str(exc).strip()
    if message and isinstance(exc, (BadAnswer, AnswerTooLarge, ReadTimeout, WriteTimeout)):
        return message
    return describe_error(exc)


def client_error(exc: WorkerTransportError) -> tuple[int, str]:
    """The status and code of a failure for the client: 502 for an answer that is not the route's or is too
    large, 504 for a worker too slow, 503 for one that could not be reached or whose connection broke."""
    if isinstance(exc, AnswerTooLarge):
        return 502, WORKER_RESPONSE_TOO_LARGE_CODE
    if isinstance(exc, BadAnswer):
        return 502, BAD_WORKER_RESPONSE_CODE
    if isinstance(exc, (ReadTimeout, WriteTimeout)):
        return 504, WORKER_TIMEOUT_CODE
    return 503, NO_WORKER_CODE

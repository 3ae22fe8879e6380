"""What the router takes from a worker: a whole answer checked for its route's shape, an event stream read event
by event, both bounded in size and time.

A worker's answer is relayed to the client only when it is what the route answers:

- a whole answer (`check_answer`): a 2xx is a JSON object with a `choices` list (chat and completions alike);
  an error status is a JSON object (the worker's own error, passed on as it is); anything else is a
  `BadAnswer`;
- a stream (`EventReader`): server-sent events, each `data: <a JSON object>`, until `data: [DONE]`. Comments
  and the `event`, `id` and `retry` fields are allowed (and not relayed); any other line, an event whose data is
  not a JSON object, or a body that ends inside an event is a `BadAnswer`. `RelayedStream` gives the client the
  events one by one, each framed again as `data: ...` (a client never sees half an event), up to `[DONE]`: a
  body that ends before it is a `BadAnswer` too.

The bounds (`AnswerBounds`) stop a worker that answers without end or stalls: at most `max_bytes` of body
(`--max-response-bytes`) and, for a stream, at most `max_events` events (`stream_event_budget`: what the
request's `n` x `max_tokens` can make, twice over); the first event within `first_byte_timeout` of the request
(the worker's queue and prefill), and after it no silence longer than `idle_timeout`. Beyond a bound reading
stops with `AnswerTooLarge` or `ReadTimeout`, and nothing past it is buffered.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from tokenfront.router.connections import AnswerTooLarge, BadAnswer, ReadTimeout, WorkerTransportError
from tokenfront.server.responses import loads
from tokenfront.server.sse import SSE_DONE, sse_event

__all__ = [
    "UNBOUNDED",
    "AnswerBounds",
    "ChunkSource",
    "Event",
    "EventReader",
    "RelayedStream",
    "check_answer",
    "parse_answer",
    "stream_event_budget",
]

# A stream's events beyond one per generated token: per choice its opening (role) chunk, its finish chunk, an
# echo or a usage chunk; per stream a usage chunk and a worker's error event. The budget is twice that: a
# worker that goes past it is not generating the request's tokens any more.
_EVENTS_PER_CHOICE = 4
_EVENTS_PER_STREAM = 16
_EVENT_SLACK = 2
# After `[DONE]`, how long the body's end (the last chunk of its framing) may take to arrive for the connection
# to be kept for another request. The client has its whole answer by then; a worker slower than this only
# costs its connection.
_SETTLE_SECONDS = 1.0
_DONE = b"[DONE]"
_FIELDS = (b"event", b"id", b"retry")


@dataclass(frozen=True)
class AnswerBounds:
    """How much a worker's answer may be and how long it may take (None: unbounded)."""

    max_bytes: int | None = None  # the body (`--max-response-bytes`)
    max_events: int | None = None  # a stream's events (`stream_event_budget`)
    first_byte_timeout: float | None = None  # a stream's first event, from when the request was sent
    idle_timeout: float | None = None  # the longest silence after the first event


UNBOUNDED = AnswerBounds()


def stream_event_budget(sequences: int, max_tokens: int | None) -> int | None:
    """The most events a stream of `sequences` choices of at most `max_tokens` tokens each may take (None:
    the tokens are not bounded, nor then the events; the byte bound still holds)."""
    if max_tokens is None:
        return None
    return _EVENT_SLACK * sequences * (max_tokens + _EVENTS_PER_CHOICE) + _EVENTS_PER_STREAM


def parse_answer(content: bytes, status: int = 200) -> Any:
    """A worker's JSON body, parsed; BadAnswer when it is not JSON."""
    try:
        return loads(content)
    except ValueError:
        raise BadAnswer(f"answered {status} with a body that is not JSON ({_excerpt(content)})") from None


def check_answer(status: int, content: bytes) -> Any:
    """BadAnswer unless the body is what a chat or completions route answers with this status (module
    docstring); a 2xx answer's parsed JSON (None for an error)."""
    if 200 <= status < 300:
        payload = parse_answer(content, status)
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise BadAnswer(f"answered {status} with JSON that has no choices list ({_excerpt(content)})")
        return payload
    if 400 <= status < 600:
        if not isinstance(parse_answer(content, status), dict):
            raise BadAnswer(f"answered {status} with JSON that is not an error object ({_excerpt(content)})")
        return None
    raise BadAnswer(f"answered {status}, which a chat or completions route never does")


class ChunkSource(Protocol):
    """A body as it arrives: a worker's (`WorkerResponse`), or a stream made from one."""

    async def next_chunk(self, timeout: float | None = None) -> bytes | None: ...


class Event(NamedTuple):
    """One data event of a stream: its data as sent, and the JSON object it holds (None for `[DONE]`)."""

    data: bytes
    payload: dict[str, Any] | None


class EventReader:
    """A worker's event stream, read event by event, checked and bounded (module docstring).

    `sent_at` is when the request was sent (the loop's clock): the first event's deadline counts from there.
    Without timeouts in `bounds` the source is read as it comes (`next_chunk()` without a timeout).
    """

    def __init__(
        self, source: ChunkSource, bounds: AnswerBounds = UNBOUNDED, *, sent_at: float = 0.0
    ) -> None:
        self.source = source
        self.bounds = bounds
        self.events = 0  # data events read, `[DONE]` not counted
        self.done = False  # `[DONE]` was read
        first = bounds.first_byte_timeout
        self._first_by = None if first is None else sent_at + first
        self._timed = first is not None or bounds.idle_timeout is not None
        self._buffer = bytearray()
        self._scanned = 0  # how far the buffer holds no event end
        self._held_cr = False  # the last piece ended with "\r": it may be half of "\r\n"
        self._bytes = 0
        self._ended = False  # the body was read to its end

    async def next_event(self) -> Event | None:
        """The next data event, or None at the end of the body (or after `[DONE]`)."""
        if self.done or self._ended:
            return None
        while True:
            event = self._take_event()
            if event is not None:
                data = _data(event)
                if data is not None:  # else a comment, or fields without data
                    return self._event(data)
                continue
            chunk = await self._read()
            if chunk is None:
                self._ended = True
                if self._held_cr or self._buffer.strip():
                    raise BadAnswer("its stream ended inside an event")
                return None
            self._add(chunk)

    async def settle(self) -> None:
        """After `[DONE]`: wait briefly for the end of the body, so that its connection can carry another
        request. Anything more, an error, or nothing in time, and the response's `close` closes it instead."""
        if self._ended:
            return
        self._ended = True
        with contextlib.suppress(WorkerTransportError):
            if self._timed:
                await self.source.next_chunk(_SETTLE_SECONDS)
            else:
                await self.source.next_chunk()

    async def _read(self) -> bytes | None:
        """The next piece of the body: until the first event, by the first-byte deadline; after it, within
        the idle timeout (any bytes count, a keep-alive comment too)."""
        if not self._timed:
            return await self.source.next_chunk()
        if self.events == 0 and self._first_by is not None:
            timeout: float | None = self._first_by - asyncio.get_running_loop().time()
        else:
            timeout = self.bounds.idle_timeout
        try:
            if timeout is not None and timeout <= 0:
                raise ReadTimeout()
            return await self.source.next_chunk(timeout)
        except ReadTimeout:
            raise ReadTimeout(self._late()) from None

    def _late(self) -> str:
        if self.events == 0 and self._first_by is not None:
            return f"sent no event within {self.bounds.first_byte_timeout:g} s (--first-byte-timeout)"
        return f"sent nothing for {self.bounds.idle_timeout:g} s (--idle-timeout)"

    def _add(self, chunk: bytes) -> None:
        self._bytes += len(chunk)
        limit = self.bounds.max_bytes
        if limit is not None and self._bytes > limit:
            raise AnswerTooLarge(f"streamed over --max-response-bytes ({limit} bytes)", worker_fault=False)
        if self._held_cr:
            chunk, self._held_cr = b"\r" + chunk, False
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                chunk, self._held_cr = chunk[:-1], True
            chunk = chunk.replace(b"\r\n", b"\n")
        self._buffer += chunk

    def _take_event(self) -> bytes | None:
        buffer = self._buffer
        end = buffer.find(b"\n\n", max(self._scanned - 1, 0))
        if end < 0:
            self._scanned = len(buffer)
            return None
        event = bytes(buffer[:end])
        del buffer[: end + 2]
        self._scanned = 0
        return event

    def _event(self, data: bytes) -> Event:
        if data == _DONE or (len(data) < 16 and data.strip() == _DONE):
            self.done = True
            return Event(data, None)
        try:
            payload = loads(data)
        except ValueError:
            raise BadAnswer(f"sent a stream event that is not JSON ({_excerpt(data)})") from None
        if not isinstance(payload, dict):
            raise BadAnswer(f"sent a stream event that is not a JSON object ({_excerpt(data)})")
        self.events += 1
        budget = self.bounds.max_events
        if budget is not None and self.events > budget:
            raise AnswerTooLarge(
                f"streamed over {budget} events, more than the request's n x max_tokens can make",
                worker_fault=True,
            )
        return Event(data, payload)


class RelayedStream:
    """An OpenAI route's event stream as the client gets it: each event of the worker's framed again, then
    `data: [DONE]`; `next_chunk` gives the next event's bytes, None after `[DONE]`."""

    def __init__(self, events: EventReader) -> None:
        self.events = events
        self.usage: Any = None  # the worker's usage object, once an event carried one (the routing metrics)
        self.produced = False  # an event carried generated output: the prompt's prefill is done

    async def next_chunk(self) -> bytes | None:
        """The next event for the client (in the reader's bounds)."""
        if self.events.done:
            await self.events.settle()
            return None
        event = await self.events.next_event()
        if event is None:
            raise BadAnswer("its stream ended without data: [DONE]")
        if event.payload is None:
            return SSE_DONE
        if event.payload.get("usage"):
            self.usage = event.payload["usage"]
        if not self.produced:
            self.produced = carries_output(event.payload)
        data = event.data
        if b"\n" in data or b"\r" in data:  # several data lines, or a bare CR: one line for the client
            return sse_event(event.payload)
        return b"data: " + data + b"\n\n"


def carries_output(payload: Any) -> bool:
    """Whether an OpenAI stream event carries generated output (text, a delta beyond the role, logprobs or a
    finish reason), not only the opening chunk a worker may send before its prefill (tokenfront's does)."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text") or choice.get("finish_reason") or choice.get("logprobs"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(value for key, value in delta.items() if key != "role"):
            return True
    return False


def _data(event: bytes) -> bytes | None:
    """The data of one event (its data lines joined), None when it has none; BadAnswer for a line that is not
    a server-sent event field."""
    if event.startswith(b"data:") and b"\n" not in event:  # the usual event: one data line
        value = event[5:]
        return value[1:] if value.startswith(b" ") else value
    parts = []
    for line in event.split(b"\n"):
        if not line or line.startswith(b":"):
            continue  # an empty line (the stream began with one), or a comment
        name, _, value = line.partition(b":")
        if name == b"data":
            parts.append(value[1:] if value.startswith(b" ") else value)
        elif name not in _FIELDS:
            raise BadAnswer(f"answered a stream that is not server-sent events (a line {_excerpt(line)})")
    return b"\n".join(parts) if parts else None


def _excerpt(data: bytes | bytearray) -> str:
    """The start of what a worker sent, for a message."""
    head = bytes(data[:80])
    return f"{head!r}..." if len(data) > 80 else repr(head)

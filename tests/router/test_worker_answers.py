"""`router.worker_answers` in-process: what a whole answer must be, an event stream read event by event however
its bytes are split, and the bounds (size, events, first event, silence) that stop a worker answering badly."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tokenfront.router.connections import AnswerTooLarge, BadAnswer, ReadTimeout
from tokenfront.router.worker_answers import (
    UNBOUNDED,
    AnswerBounds,
    EventReader,
    RelayedStream,
    check_answer,
    stream_event_budget,
)


class _Body:
    """A body arriving in the given pieces; a float is a pause of that many seconds (the connection's
    ReadTimeout when it is longer than the reader's timeout)."""

    def __init__(self, *pieces: bytes | float) -> None:
        self.pieces = list(pieces)
        self.timeouts: list[float | None] = []

    async def next_chunk(self, timeout: float | None = None) -> bytes | None:
        self.timeouts.append(timeout)
        while self.pieces:
            piece = self.pieces.pop(0)
            if isinstance(piece, float):
                if timeout is not None and piece > timeout:
                    await asyncio.sleep(max(timeout, 0))
                    raise ReadTimeout()
                await asyncio.sleep(piece)
                continue
            return piece
        return None


def _relay(body: _Body, bounds: AnswerBounds = UNBOUNDED) -> bytes:
    async def run() -> bytes:
        stream = RelayedStream(EventReader(body, bounds, sent_at=asyncio.get_running_loop().time()))
        out = b""
        while (chunk := await stream.next_chunk()) is not None:
            out += chunk
        return out

    return asyncio.run(run())


def _events(count: int) -> bytes:
    return b"".join(b'data: {"i": %d}\n\n' % i for i in range(count))


@pytest.mark.parametrize(
    ("status", "content"),
    [
        (200, b'{"choices": []}'),
        (201, b'{"choices": [{"index": 0}], "x": 1}'),
        (400, b'{"error": {}}'),
        (503, b'{"detail": "busy"}'),
        (429, b'{"object": "error", "message": "slow down"}'),
    ],
)
def test_answers_of_the_route_shape_pass(status: int, content: bytes) -> None:
    check_answer(status, content)


@pytest.mark.parametrize(
    ("status", "content", "said"),
    [
        (200, b"<html>", "answered 200 with a body that is not JSON (b'<html>')"),
        (200, b"", "answered 200 with a body that is not JSON"),
        (200, b"[1, 2]", "answered 200 with JSON that has no choices list"),
        (200, b'{"choices": {}}', "answered 200 with JSON that has no choices list"),
        (500, b"Internal Server Error", "answered 500 with a body that is not JSON"),
        (404, b'"not found"', "answered 404 with JSON that is not an error object"),
        (302, b"{}", "answered 302, which a chat or completions route never does"),
    ],
)
def test_answers_not_of_the_route_shape_are_bad(status: int, content: bytes, said: str) -> None:
    with pytest.raises(BadAnswer) as caught:
        check_answer(status, content)
    assert str(caught.value).startswith(said), caught.value


def test_a_stream_is_relayed_event_by_event_however_its_bytes_are_split() -> None:
    wire = (
        b': a comment\r\n\r\nevent: message\r\nid: 7\r\ndata: {"i": 0}\r\n\r\n'
        b'data: {"i":\r\ndata: 1}\n\nretry: 5\n\ndata:{"i": 2}\n\ndata: [DONE]\n\n'
    )
    expected = b'data: {"i": 0}\n\ndata: {"i":1}\n\ndata: {"i": 2}\n\ndata: [DONE]\n\n'
    cases = 0
    for size in (1, 2, 3, 5, 7, 11, len(wire)):
        pieces = [wire[i : i + size] for i in range(0, len(wire), size)]
        assert _relay(_Body(*pieces)) == expected, size
        cases += 1
    for split in range(1, len(wire)):
        assert _relay(_Body(wire[:split], wire[split:])) == expected, split
        cases += 1
    assert cases == 7 + len(wire) - 1


@pytest.mark.parametrize(
    ("wire", "said"),
    [
        (b"garbage\n\n", "answered a stream that is not server-sent events (a line b'garbage')"),
        (b'{"choices": []}', "its stream ended inside an event"),
        (b'data: {"i": 0}\n\ndata: nope\n\n', "sent a stream event that is not JSON (b'nope')"),
        (b"data: [1]\n\n", "sent a stream event that is not a JSON object (b'[1]')"),
        (b'data: {"i": 0}\n\n', "its stream ended without data: [DONE]"),
        (b'data: {"i": 0}\n\ndata: [DONE]', "its stream ended inside an event"),
        (b'data: {"i": 0}\r', "its stream ended inside an event"),
    ],
)
def test_streams_that_break_the_format_are_bad(wire: bytes, said: str) -> None:
    with pytest.raises(BadAnswer) as caught:
        _relay(_Body(wire))
    assert str(caught.value) == said


def test_the_event_budget_counts_data_events_only() -> None:
    budget = stream_event_budget(2, 3)
    assert budget == 2 * 2 * (3 + 4) + 16 and stream_event_budget(1, None) is None
    assert budget is not None
    comments = b": keep-alive\n\n" * 100
    exact = _events(budget) + comments + b"data: [DONE]\n\n"
    assert _relay(_Body(exact), AnswerBounds(max_events=budget)) == _events(budget) + b"data: [DONE]\n\n"
    with pytest.raises(AnswerTooLarge, match=f"streamed over {budget} events") as caught:
        _relay(_Body(_events(budget + 1)), AnswerBounds(max_events=budget))
    assert caught.value.worker_fault


def test_the_byte_bound_stops_reading_at_the_piece_that_crosses_it() -> None:
    pieces = [_events(10)[:64] for _ in range(10)]  # 640 bytes in pieces of 64
    body = _Body(*pieces)
    with pytest.raises(AnswerTooLarge, match=r"streamed over --max-response-bytes \(300 bytes\)") as caught:
        _relay(body, AnswerBounds(max_bytes=300))
    assert not caught.value.worker_fault
    assert len(body.pieces) == 10 - 5  # the fifth piece crossed 300 bytes; nothing after it was read


def test_the_first_event_has_its_own_deadline_and_later_ones_the_idle_timeout() -> None:
    bounds = AnswerBounds(first_byte_timeout=0.5, idle_timeout=0.2)
    # A first event slower than the idle timeout but within the first-byte one, then quick events: complete.
    slow_start = _Body(0.3, b'data: {"i": 0}\n\n', 0.05, b"data: [DONE]\n\n")
    assert _relay(slow_start, bounds) == b'data: {"i": 0}\n\ndata: [DONE]\n\n'
    # The first wait is what is left of the first-byte timeout, the next one the idle timeout, the last one
    # the wait for the body's end after [DONE] (worker_answers._SETTLE_SECONDS).
    first_wait = slow_start.timeouts[0]
    assert first_wait is not None and 0 < first_wait <= 0.5
    assert slow_start.timeouts[1:] == [0.2, 1.0]
    with pytest.raises(ReadTimeout, match=r"sent no event within 0.5 s \(--first-byte-timeout\)"):
        _relay(_Body(0.2, b": ping\n\n", 0.4, b'data: {"i": 0}\n\n'), bounds)
    with pytest.raises(ReadTimeout, match=r"sent nothing for 0.2 s \(--idle-timeout\)"):
        _relay(_Body(b'data: {"i": 0}\n\n', 0.3, b"data: [DONE]\n\n"), bounds)


def test_a_multi_line_event_reaches_the_client_on_one_line() -> None:
    payload: dict[str, Any] = {"choices": [{"delta": {"content": "a\nb"}}]}
    text = json.dumps(payload, indent=1).encode()
    wire = b"".join(b"data: " + line + b"\n" for line in text.split(b"\n")) + b"\ndata: [DONE]\n\n"
    out = _relay(_Body(wire))
    first, done = out.split(b"\n\n")[:2]
    assert json.loads(first.removeprefix(b"data: ")) == payload and b"\n" not in first
    assert done == b"data: [DONE]"


@pytest.mark.parametrize(
    ("payload", "carries"),
    [
        ({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, False),  # chat's opening
        ({"choices": [{"index": 0, "text": "", "finish_reason": None}]}, False),  # completions' opening
        ({"choices": []}, False),
        ({"usage": {"prompt_tokens": 3}}, False),
        ({"error": {"message": "no"}}, False),
        ({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, True),
        ({"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}, True),
        ({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}, True),
        ({"choices": [{"index": 0, "text": "Hi"}]}, True),
        ({"choices": [{"index": 1, "text": ""}, {"index": 0, "text": "", "finish_reason": "length"}]}, True),
    ],
)
def test_a_stream_has_produced_once_an_event_carries_output(payload: dict[str, Any], carries: bool) -> None:
    """The router's first-token moment (a policy's `on_first_token`): not a worker's opening chunk, which
    tokenfront's worker sends before its prefill."""
    opening = {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    wire = b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in (opening, payload))
    stream = RelayedStream(EventReader(_Body(wire + b"data: [DONE]\n\n"), UNBOUNDED))

    async def produced_after_each() -> list[bool]:
        seen = []
        while await stream.next_chunk() is not None:
            seen.append(stream.produced)
        return seen

    assert asyncio.run(produced_after_each()) == [False, carries, carries]

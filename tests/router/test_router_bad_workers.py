"""A real `tokenfront route` in front of workers that answer badly: the router does not trust its workers.

The stand-in worker (`misbehaving_worker.py`, a process on loopback) answers its health checks correctly and
its inference routes as the test sets it: bytes that are not JSON, JSON without `choices`, an event stream that
is not one or ends before `[DONE]`, a head and then nothing, nothing at all, a stream without end. Each is a
clear error for the client, or a success from the other worker when one can still be tried, before a deadline
of a few times the router's (small) timeouts; the worker counts as failed and comes back at its next check; a
stream without end is cut at the router's bounds with its memory flat. Last, a real `tokenfront serve` frozen
with SIGSTOP mid-stream: the stream ends with an error event and `[DONE]`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import WORKER_HEADER, Fleet, metric, router_command, wait_until

STANDIN = Path(__file__).resolve().parent / "misbehaving_worker.py"
FIRST_BYTE_TIMEOUT = 2.0
IDLE_TIMEOUT = 2.0
REQUEST_TIMEOUT = 4.0
MAX_RESPONSE_BYTES = 128 * 1024 * 1024  # more than the RSS growth allowed below: buffering it would show
TIMEOUT_FLAGS = (
    "--first-byte-timeout",
    str(FIRST_BYTE_TIMEOUT),
    "--idle-timeout",
    str(IDLE_TIMEOUT),
    "--request-timeout",
    str(REQUEST_TIMEOUT),
    "--max-response-bytes",
    str(MAX_RESPONSE_BYTES),
)
# Every answer must come before this (the client's timeout): a few times the longest router timeout, for a
# loaded machine. Not a speed figure: a hang fails here instead of after the router's 600 s default.
DEADLINE = 30.0
GOOD_EVENTS = 3  # misbehaving_worker.GOOD_EVENTS


@dataclass
class StandIn:
    """A misbehaving worker process."""

    process: subprocess.Popen[str]
    url: str

    def behave(self, behaviour: str) -> None:
        response = httpx.post(f"{self.url}/_behave", json={"behaviour": behaviour}, timeout=10)
        assert response.status_code == 200, response.text

    def log(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/_log", timeout=10).json())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def standins() -> Iterator[tuple[StandIn, StandIn]]:
    """Two stand-ins: A is told how to misbehave by each test, B stays good."""
    started = []
    try:
        for _ in range(2):
            process = subprocess.Popen(
                [sys.executable, str(STANDIN)], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
            )
            assert process.stdout is not None
            port = int(process.stdout.readline())
            started.append(StandIn(process, f"http://127.0.0.1:{port}"))
        yield started[0], started[1]
    finally:
        for standin in started:
            standin.stop()


@pytest.fixture
def bad(standins: tuple[StandIn, StandIn]) -> Iterator[StandIn]:
    """Stand-in A, good again after the test."""
    yield standins[0]
    standins[0].behave("good")


@pytest.fixture(scope="module")
def router(fleet: Fleet, standins: tuple[StandIn, StandIn]) -> Any:
    """A router without a model (it routes by load and sends the client's body as it is) in front of A alone."""
    return fleet.start(*router_command(None, [standins[0].url], *TIMEOUT_FLAGS))


@pytest.fixture(scope="module")
def router_ab(fleet: Fleet, standins: tuple[StandIn, StandIn]) -> Any:
    """A router in front of A and B, taking turns (round_robin), so that A is tried first every other time."""
    urls = [standin.url for standin in standins]
    return fleet.start(*router_command(None, urls, "--policy", "round_robin", *TIMEOUT_FLAGS))


def _state(router: Any, url: str) -> dict[str, Any]:
    workers = httpx.get(f"{router.url}/workers", timeout=10).json()["workers"]
    return dict(next(worker for worker in workers if worker["url"] == url))


def _healthy(router: Any, *urls: str) -> None:
    """Wait until the router has each worker back in its active set (a failure takes it out until its
    re-check)."""
    for url in urls:
        assert wait_until(lambda url=url: _state(router, url)["state"] == "healthy", timeout=DEADLINE), (
            _state(router, url)
        )


def _chat(router: Any, **fields: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, **fields}
    return httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=DEADLINE)


def _stream(router: Any, **fields: Any) -> tuple[httpx.Response, list[Any]]:
    """A streamed chat through the router: the response and its events (JSON objects, and "[DONE]")."""
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "stream": True, **fields}
    events: list[Any] = []
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=DEADLINE) as response:
        if response.status_code != 200:
            response.read()
            return response, events
        for line in response.iter_lines():
            if line:
                assert line.startswith("data: "), line
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return response, events


def _error(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error"}, body
    return dict(body["error"])


def test_a_good_stand_in_is_relayed_as_it_answers(router: Any, bad: StandIn) -> None:
    """The control case: the stand-in's correct answers go through unchanged."""
    _healthy(router, bad.url)
    response = _chat(router)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "fine"
    assert response.headers[WORKER_HEADER] == bad.url
    response, events = _stream(router)
    assert response.status_code == 200
    assert len(events) == GOOD_EVENTS + 2 and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "word0 word1 word2 "


def test_a_worker_error_with_a_json_body_passes_through(router: Any, bad: StandIn) -> None:
    _healthy(router, bad.url)
    bad.behave("json_400")
    failures = _state(router, bad.url)["failures"]
    response = _chat(router)
    assert response.status_code == 400
    assert _error(response)["code"] == "worker_refusal"  # the worker's own error, as it sent it
    assert _state(router, bad.url)["failures"] == failures  # a client's 400 says nothing of the worker


@pytest.mark.parametrize(
    ("behaviour", "status", "code", "said"),
    [
        ("garbage_200", 502, "bad_worker_response", "answered 200 with a body that is not JSON"),
        ("not_json_200", 502, "bad_worker_response", "answered 200 with a body that is not JSON"),
        ("no_choices_200", 502, "bad_worker_response", "answered 200 with JSON that has no choices list"),
        ("text_500", 502, "bad_worker_response", "answered 500 with a body that is not JSON"),
        ("not_http", 502, "bad_worker_response", "not an HTTP/1.x answer"),
        ("head_then_stall", 504, "worker_timeout", "sent nothing for 2 s in its answer (--idle-timeout)"),
        ("stall", 504, "worker_timeout", "sent no answer within 4 s (--request-timeout)"),
        ("sse_garbage", 502, "bad_worker_response", "not server-sent events"),
        ("stream_head_then_stall", 504, "worker_timeout", "sent no event within 2 s (--first-byte-timeout)"),
    ],
)
def test_a_bad_answer_before_any_byte_is_a_clear_error_and_counts_against_the_worker(
    router: Any, bad: StandIn, behaviour: str, status: int, code: str, said: str
) -> None:
    _healthy(router, bad.url)
    bad.behave(behaviour)
    failures = _state(router, bad.url)["failures"]
    log = bad.log()
    stream = behaviour.startswith(("sse_", "stream_"))
    response = _stream(router)[0] if stream else _chat(router)
    assert response.status_code == status, response.text
    error = _error(response)
    assert (error["code"], error["type"]) == (code, "server_error"), error
    # It names the worker, as the router's other errors do (and its x-tokenfront-worker header).
    assert error["message"].startswith(f"every worker failed this request: {bad.url}: "), error["message"]
    assert said in error["message"], error["message"]
    assert bad.log()[behaviour] == log.get(behaviour, 0) + 1  # tried once: there is no other worker
    # Out of the active set for it, and back at the next check (it answers /health).
    assert _state(router, bad.url)["failures"] == failures + 1
    _healthy(router, bad.url)
    if behaviour in ("head_then_stall", "stall", "stream_head_then_stall"):
        # The router closed the worker's connection when it gave up (the worker then stops generating).
        closed = f"{behaviour}_closed_by_router"
        assert wait_until(lambda: bad.log().get(closed, 0) == log.get(closed, 0) + 1, timeout=DEADLINE)


def test_an_answer_over_the_size_bound_is_not_read_nor_retried(router_ab: Any, bad: StandIn) -> None:
    """A Content-Length over --max-response-bytes: refused at its head, without a retry (another worker would
    answer as much), and the worker is not blamed (its answer may be right)."""
    _healthy(router_ab, bad.url)
    bad.behave("huge_length")
    failures = _state(router_ab, bad.url)["failures"]
    log = bad.log()
    retries = metric(router_ab.url, "tokenfront_router_retries_total", worker=bad.url)
    for _ in range(2):  # round_robin: one of the two goes to A (the other is answered by B)
        response = _chat(router_ab)
        if response.status_code != 200:
            break
    assert response.status_code == 502, response.text
    error = _error(response)
    assert error["code"] == "worker_response_too_large"
    assert error["message"] == (
        f"the worker {bad.url} answered {1 << 40} bytes (Content-Length), over --max-response-bytes "
        f"({MAX_RESPONSE_BYTES}); nothing of it was relayed"
    )
    assert bad.log()["huge_length"] == log.get("huge_length", 0) + 1
    assert metric(router_ab.url, "tokenfront_router_retries_total", worker=bad.url) == retries
    assert _state(router_ab, bad.url)["failures"] == failures
    closed = "huge_length_closed_by_router"
    assert wait_until(lambda: bad.log().get(closed, 0) == log.get(closed, 0) + 1, timeout=DEADLINE)


@pytest.mark.parametrize(
    ("behaviour", "code", "said"),
    [
        (
            "sse_then_garbage",
            "bad_worker_response",
            r"answered a stream that is not server-sent events (a line b'\x00\xff not an event')",
        ),
        ("sse_not_json", "bad_worker_response", "sent a stream event that is not JSON (b'{not json')"),
        ("sse_no_done", "bad_worker_response", "its stream ended without data: [DONE]"),
        ("stream_stall_after_first", "worker_timeout", "sent nothing for 2 s (--idle-timeout)"),
    ],
)
def test_a_stream_that_breaks_after_its_first_event_ends_with_an_error_event_and_done(
    router: Any, bad: StandIn, behaviour: str, code: str, said: str
) -> None:
    _healthy(router, bad.url)
    bad.behave(behaviour)
    failures = _state(router, bad.url)["failures"]
    response, events = _stream(router)
    assert response.status_code == 200
    # The worker's good events (one; two for sse_no_done), then the router's error event and [DONE].
    sent = 2 if behaviour == "sse_no_done" else 1
    assert len(events) == sent + 2, events
    assert [e["choices"][0]["delta"] for e in events[:sent]] == [
        {"content": f"word{i} "} for i in range(sent)
    ]
    assert set(events[-2]) == {"error"} and events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert (error["code"], error["type"]) == (code, "server_error"), error
    assert (
        error["message"] == f"the worker {bad.url} failed while streaming ({said}); the answer is incomplete"
    )
    assert _state(router, bad.url)["failures"] == failures + 1
    _healthy(router, bad.url)


@pytest.mark.parametrize("behaviour", ["stall", "head_then_stall", "stream_head_then_stall", "garbage_200"])
def test_a_failure_before_any_byte_is_retried_on_the_other_worker(
    router_ab: Any, bad: StandIn, standins: tuple[StandIn, StandIn], behaviour: str
) -> None:
    good = standins[1]
    _healthy(router_ab, bad.url, good.url)
    bad.behave(behaviour)
    retries = metric(router_ab.url, "tokenfront_router_retries_total", worker=bad.url)
    log = bad.log()
    stream = behaviour.startswith("stream_")
    answers = []
    for _ in range(2):  # round_robin: at least one of the two is sent to A first
        response, events = _stream(router_ab) if stream else (_chat(router_ab), [])
        assert response.status_code == 200, response.text
        assert response.headers[WORKER_HEADER] == good.url
        answers.append(events[-1] if stream else response.json()["choices"][0]["message"]["content"])
        _healthy(router_ab, bad.url)
    assert answers == (["[DONE]"] * 2 if stream else ["fine"] * 2)
    tried = bad.log()[behaviour] - log.get(behaviour, 0)
    assert tried >= 1
    assert metric(router_ab.url, "tokenfront_router_retries_total", worker=bad.url) == retries + tried


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_stream_without_end_is_cut_at_its_event_budget(router: Any, bad: StandIn) -> None:
    _healthy(router, bad.url)
    bad.behave("endless")
    failures = _state(router, bad.url)["failures"]
    closed = bad.log().get("endless_closed_by_router", 0)
    response, events = _stream(router, max_tokens=10)
    assert response.status_code == 200
    budget = 2 * 1 * (10 + 4) + 16  # worker_answers.stream_event_budget(1, 10)
    assert len(events) == budget + 2  # the budget's events, the error event, [DONE]
    error = events[-2]["error"]
    assert error["code"] == "worker_response_too_large"
    assert (
        f"streamed over {budget} events, more than the request's n x max_tokens can make" in error["message"]
    )
    assert events[-1] == "[DONE]"
    assert _state(router, bad.url)["failures"] == failures + 1  # more events than tokens: the worker's fault
    assert wait_until(lambda: bad.log().get("endless_closed_by_router") == closed + 1, timeout=DEADLINE)


def test_a_stream_without_end_is_cut_at_the_byte_bound_with_the_router_memory_flat(
    router: Any, bad: StandIn
) -> None:
    """No max_tokens and no model: no event budget, so the byte bound (128 MiB here) ends it. The router's
    RSS, sampled while the stream runs, stays within 100 MB of what it was before: nothing is buffered."""
    _healthy(router, bad.url)
    assert _stream(router)[0].status_code == 200  # a good stream first: the relay path is warm
    pid = router.process.pid
    before = _rss_kib(pid)
    peak = [before]
    running = threading.Event()
    running.set()

    def sample() -> None:
        while running.is_set():
            peak[0] = max(peak[0], _rss_kib(pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    bad.behave("endless")
    before_log = bad.log().get("endless_closed_by_router", 0)
    received = 0
    tail = b""
    sampler.start()
    try:
        body = {"messages": [{"role": "user", "content": "Hello"}], "stream": True}
        url = f"{router.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=DEADLINE) as response:
            assert response.status_code == 200
            for piece in response.iter_bytes():
                received += len(piece)
                tail = (tail + piece)[-16384:]
    finally:
        running.clear()
        sampler.join(10)
    after = _rss_kib(pid)
    events = [e for e in tail.decode("utf-8", "replace").split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "worker_response_too_large"
    assert f"streamed over --max-response-bytes ({MAX_RESPONSE_BYTES} bytes)" in error["message"]
    # Everything up to the bound went through (less at most the last pieces read), nothing beyond it.
    relayed = received - len(events[-2]) - len(events[-1]) - 4
    assert MAX_RESPONSE_BYTES - 4 * 1024 * 1024 <= relayed <= MAX_RESPONSE_BYTES, relayed
    growth_mb = (max(peak[0], after) - before) / 1024
    assert growth_mb < 100, (before, peak[0], after)
    assert wait_until(lambda: bad.log().get("endless_closed_by_router") == before_log + 1, timeout=DEADLINE)


@pytest.mark.slow  # a real worker (torch and a model load)
def test_a_worker_frozen_mid_stream_ends_it_with_an_error_event_and_done(
    fleet: Fleet, tiny_random: Path
) -> None:
    worker = fleet.start("serve", "--model", str(tiny_random))
    router = fleet.start(*router_command(tiny_random, [worker.url], "--idle-timeout", str(IDLE_TIMEOUT)))
    body = {
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 2000,
        "ignore_eos": True,  # sampled at temperature 1: an early EOS would end the stream before the freeze
        "stream": True,
    }
    events: list[Any] = []
    frozen = False
    try:
        url = f"{router.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=DEADLINE) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line:
                    continue
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
                if len(events) == 3 and not frozen:
                    os.kill(worker.process.pid, signal.SIGSTOP)  # it keeps its connection, sends nothing
                    frozen = True
    finally:
        if frozen:
            os.kill(worker.process.pid, signal.SIGCONT)
    assert frozen
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "worker_timeout"
    assert error["message"] == (
        f"the worker {worker.url} failed while streaming (sent nothing for 2 s (--idle-timeout)); the answer is "
        "incomplete"
    )
    # What came before the freeze is the worker's answer; no choice finished.
    chunks = [e for e in events[:-2] if isinstance(e, dict)]
    assert len(chunks) >= 3 and all("choices" in chunk for chunk in chunks)
    assert all(choice.get("finish_reason") is None for chunk in chunks for choice in chunk["choices"])
    assert worker.stop() == 0

"""The router's send path without real workers: its HTTP/1.1 client (`WorkerConnections`) against scripted
servers on loopback, and the proxy's handling of a client that leaves, a worker lost while a request waits,
and streams (relayed as they arrive, the worker's request closed when the client leaves).

Everything runs in this process on an asyncio loop; each scripted server answers what its test says, byte for
byte, so that framings real workers rarely produce (chunk extensions, trailers, interim answers, HTTP/1.0,
answers cut short) are covered too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from scripted_server import BODY, LOOPS, Exchange, Server, answer, choose_loop, chunked, run
from starlette.requests import Request

from tokenfront.router.connections import (
    ConnectError,
    Connection,
    PoolTimeout,
    ReadTimeout,
    RemoteProtocolError,
    WorkerConnections,
)
from tokenfront.router.gate import ForwardingGate
from tokenfront.router.interrupt import Interrupt
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.metrics import RouterMetrics
from tokenfront.router.planning import Plan
from tokenfront.router.policies import build_policy
from tokenfront.router.policies.base import RouteRequest
from tokenfront.router.proxy import FORWARDED_HEADER, WORKER_HEADER, Proxy
from tokenfront.router.worker_pool import PoolSettings, WorkerPool
from tokenfront.router.worker_spec import WorkerSpec


@pytest.fixture(autouse=True, params=LOOPS)
def event_loop_kind(request: pytest.FixtureRequest) -> str:
    """Every test runs on the standard loop and on uvloop (what the router's server runs on)."""
    return choose_loop(request)


def pool_of(url: str, **settings: Any) -> WorkerConnections:
    options: dict[str, Any] = {
        "connect_timeout": 5.0,
        "timeout": 10.0,
        "max_connections": 8,
        "keepalive_expiry": 4.0,
    }
    return WorkerConnections(url, **{**options, **settings})


async def fetch(connections: WorkerConnections, body: bytes = b"{}") -> tuple[int, dict[str, str], bytes]:
    response = await connections.post("/v1/completions", body)
    try:
        return response.status_code, response.headers, await response.read()
    finally:
        response.close()


# --- WorkerConnections -----------------------------------------------------------------------------------


def test_connections_are_kept_alive_and_requests_are_complete() -> None:
    async def main() -> None:
        async def handler(exchange: Exchange) -> None:
            await exchange.write(answer(exchange.body, "200 OK", "x-request-id: r1"))

        async with Server(handler) as server:
            connections = pool_of(server.url, headers={"authorization": "Bearer k"})
            for index in range(3):
                status, headers, body = await fetch(connections, b'{"n":%d}' % index)
                assert (status, body) == (200, b'{"n":%d}' % index)
                assert headers["content-type"] == "application/json" and headers["x-request-id"] == "r1"
            assert server.connections == 1
            head = server.requests[0].head.decode()
            assert head.startswith("POST /v1/completions HTTP/1.1\r\n")
            for line in ("host: 127.0.0.1:", "authorization: Bearer k", "content-type: application/json"):
                assert f"\r\n{line}" in head
            assert "content-length: 7\r\n" in head
            connections.close()

    run(main())


class _Transport:
    """Enough of a transport for a `Connection` fed by hand."""

    def __init__(self) -> None:
        self.paused = False
        self.closed = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str) -> None:
        return None


async def _parse(pieces: list[bytes], eof: bool = False) -> tuple[int, dict[str, str], list[bytes], bool]:
    """Feed an answer to a connection in pieces (the reader waiting in between), then the end of the
    connection if `eof`; what it read, and whether the connection could carry another request."""
    connection = Connection(asyncio.get_running_loop())
    connection.connection_made(_Transport())  # type: ignore[arg-type]
    await connection.send(b"POST / HTTP/1.1\r\n\r\n", 5)

    async def feed() -> None:
        for piece in pieces:
            await asyncio.sleep(0)
            connection.data_received(piece)
        if eof:
            await asyncio.sleep(0)
            connection.eof_received()

    feeder = asyncio.ensure_future(feed())
    status, headers = await connection.read_head(5)
    body = []
    while (data := await connection.read_body(5)) is not None:
        body.append(data)
    await feeder
    return status, headers, body, connection.finish()


@pytest.mark.parametrize(
    "wire",
    [
        chunked(b"data: 1\n\n", b"data: [DONE]\n\n"),
        # chunk extensions, upper-case hex, trailers, an interim 100 answer first
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"9;ext=1\r\ndata: 1\n\n\r\nE\r\ndata: [DONE]\n\n\r\n0\r\ntrailer: x\r\n\r\n",
        answer(b"data: 1\n\ndata: [DONE]\n\n"),
    ],
)
def test_answers_are_parsed_however_the_bytes_are_split(wire: bytes) -> None:
    async def main() -> None:
        splits = [[wire[:split], wire[split:]] for split in range(1, len(wire))]
        for pieces in [[wire], *splits, [wire[i : i + 1] for i in range(len(wire))]]:
            status, _, body, reusable = await _parse(pieces)
            assert status == 200 and b"".join(body) == b"data: 1\n\ndata: [DONE]\n\n", (pieces, body)
            assert all(body) and reusable

    run(main())


def test_answer_framings_and_reuse() -> None:
    async def main() -> None:
        # HTTP/1.0, or no length: the body ends with the connection, which is then not reused.
        status, headers, body, reusable = await _parse(
            [b"HTTP/1.0 200 OK\r\nx-a:  1 \r\n\r\nab", b"c"], eof=True
        )
        assert (status, headers, b"".join(body), reusable) == (200, {"x-a": "1"}, b"abc", False)
        status, _, body, reusable = await _parse([answer(b"xyz", "200 OK", "connection: close")])
        assert (body, reusable) == ([b"xyz"], False)
        status, _, body, reusable = await _parse([b"HTTP/1.1 204 No Content\r\n\r\n"])
        assert (status, body, reusable) == (204, [], True)
        status, headers, body, _ = await _parse(
            [b"HTTP/1.1 503 Busy\r\nset: 1\r\nset: 2\r\ncontent-length: 0\r\n\r\n"]
        )
        assert (status, headers["set"], body) == (503, "1, 2", [])

    run(main())


@pytest.mark.parametrize(
    "wire",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nabc",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    ],
)
def test_malformed_answers_are_protocol_errors(wire: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        run(_parse([wire]))


def test_answers_cut_short_are_errors_and_close_delimited_ones_are_not() -> None:
    async def cut(reply: bytes) -> Any:
        async def handler(exchange: Exchange) -> None:
            await exchange.write(reply)
            exchange.writer.close()

        async with Server(handler) as server:
            return await fetch(pool_of(server.url))

    with pytest.raises(RemoteProtocolError, match="without answering"):
        run(cut(b""))
    with pytest.raises(RemoteProtocolError, match="before the end"):
        run(cut(answer(b"0123456789")[:-4]))
    with pytest.raises(RemoteProtocolError, match="before the end"):
        run(cut(chunked(b"abc")[:-5]))
    assert run(cut(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")) == (200, {}, b"until the end")


def test_a_kept_alive_connection_the_worker_closed_is_replaced() -> None:
    async def main() -> None:
        async def handler(exchange: Exchange) -> None:
            await exchange.write(answer())
            exchange.writer.close()  # an idle keep-alive connection closed by the worker, without saying so

        async with Server(handler) as server:
            connections = pool_of(server.url)
            assert (await fetch(connections))[0] == 200

            async def close_arrived() -> None:
                while any(connection.reusable for connection in connections.idle_connections):
                    await asyncio.sleep(0.001)

            await asyncio.wait_for(close_arrived(), 5)  # the worker's close reached the idle connection
            assert (await fetch(connections))[0] == 200
            assert server.connections == 2

    run(main())


def test_a_large_body_read_slowly_arrives_whole() -> None:
    payload = bytes(range(256)) * 16 * 1024  # 4 MiB: reading pauses and resumes on the way

    async def main() -> None:
        async def handler(exchange: Exchange) -> None:
            await exchange.write(
                chunked(*(payload[i : i + 100_000] for i in range(0, len(payload), 100_000)))
            )

        async with Server(handler) as server:
            response = await pool_of(server.url).post("/v1/completions", b"{}")
            received = bytearray()
            while (piece := await response.next_chunk()) is not None:
                received += piece
                await asyncio.sleep(0.001)
            assert bytes(received) == payload

    run(main())


def test_timeouts_refusals_and_a_full_pool() -> None:
    async def main() -> None:
        async def silent(exchange: Exchange) -> None:
            await asyncio.sleep(60)

        async with Server(silent) as server:
            with pytest.raises(ReadTimeout):
                await fetch(pool_of(server.url, timeout=0.2))

        async def started(exchange: Exchange) -> None:
            await exchange.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            await asyncio.sleep(60)

        async with Server(started) as server:
            busy = pool_of(server.url, timeout=0.2, max_connections=1)
            holding = await busy.post(
                "/v1/completions", b"{}"
            )  # its answer is not over: it holds the one slot
            with pytest.raises(PoolTimeout):
                await busy.post("/v1/completions", b"{}")
            holding.close()
            (await busy.post("/v1/completions", b"{}")).close()
        with pytest.raises(ConnectError):
            await fetch(pool_of(server.url))  # nothing listens there any more

    run(main())


def test_an_abandoned_answer_closes_its_connection() -> None:
    async def main() -> None:
        seen: list[bool] = []

        async def streaming(exchange: Exchange) -> None:
            await exchange.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            seen.append(await exchange.closed_by_client())

        async with Server(streaming) as server:
            connections = pool_of(server.url)
            response = await connections.post("/v1/completions", b"{}")
            assert await response.next_chunk() == b"first"
            response.close()  # the client left: the worker must see its request go away
            await asyncio.wait_for(server.closed.wait(), 5)
            assert seen == [True] or server.closed.is_set()
            assert connections.idle_connections == []

    run(main())


# --- the proxy -----------------------------------------------------------------------------------------------


async def _proxy(*urls: str, **settings: Any) -> Proxy:
    kv_index = KvIndex()
    pool = WorkerPool(
        kv_index, PoolSettings(**{"health_interval": 3600.0, "health_timeout": 1.0, **settings})
    )
    for url in urls:
        await pool.add(WorkerSpec(url))
    return Proxy(
        pipeline=None,
        pool=pool,
        gate=ForwardingGate(None, has_model_path=False),
        policy=build_policy("round_robin", kv_index=kv_index),
        metrics=RouterMetrics(CollectorRegistry()),
        served_model_names=(),
    )


def _plan(stream: bool = False) -> Plan:
    body = json.dumps({"prompt": "hi", "stream": stream}).encode()
    return Plan("completion", "/v1/completions", body, RouteRequest(None), forwarded=False, stream=stream)


async def _worker(exchange: Exchange, hang: bool = False, stream: bool = False) -> None:
    """A worker's routes: /health, /server_info (404, as on any OpenAI server), and the completions route."""
    path = exchange.head.split(b" ")[1]
    if path == b"/health":
        await exchange.write(answer(b'{"status":"ok"}'))
    elif path != b"/v1/completions":
        await exchange.write(answer(b"{}", "404 Not Found"))
    elif hang:
        await exchange.closed_by_client()
        exchange.server.closed.set()
        exchange.writer.close()
    elif stream:
        await exchange.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for index in range(200):
            event = b'data: {"i":%d}\n\n' % index
            await exchange.write(b"%x\r\n%s\r\n" % (len(event), event))
            await asyncio.sleep(0.01)
        await exchange.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    else:
        await exchange.write(answer())


def _request(disconnect_after: float | None) -> Request:
    async def receive() -> dict[str, Any]:
        if disconnect_after is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(disconnect_after or 0)
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)


def test_proxy_answers_with_the_worker_headers() -> None:
    async def main() -> None:
        async with Server(_worker) as server:
            proxy = await _proxy(server.url)
            response = await proxy.send_watching(_plan(), _request(None))
            assert response.status_code == 200 and response.body == BODY
            assert response.headers[WORKER_HEADER] == server.url
            assert response.headers[FORWARDED_HEADER] == "false"
            assert response.headers["content-type"] == "application/json"
            assert proxy.pool.workers[server.url].active_requests == 0
            await proxy.pool.stop()

    run(main())


def test_a_client_leaving_closes_the_worker_request_with_499() -> None:
    async def main() -> None:
        async def hanging(exchange: Exchange) -> None:
            await _worker(exchange, hang=True)

        async with Server(hanging) as server:
            proxy = await _proxy(server.url)
            response = await proxy.send_watching(_plan(), _request(0.2))
            assert response.status_code == 499
            await asyncio.wait_for(server.closed.wait(), 5)  # the worker saw its request go away
            assert proxy.pool.workers[server.url].active_requests == 0
            assert proxy.pool.workers[server.url].healthy  # a client leaving says nothing of the worker
            await proxy.pool.stop()

    run(main())


def test_a_worker_lost_while_a_request_waits_is_retried_elsewhere() -> None:
    async def main() -> None:
        async def hanging(exchange: Exchange) -> None:
            await _worker(exchange, hang=True)

        async with Server(hanging) as hung, Server(_worker) as alive:
            proxy = await _proxy(hung.url, alive.url)
            task = asyncio.ensure_future(proxy.send_watching(_plan(), _request(None)))
            while not any(e.head.startswith(b"POST") for e in hung.requests):
                await asyncio.sleep(0.01)
            proxy.pool.workers[hung.url].lose()  # what a failed health check does
            response = await task
            assert response.status_code == 200 and response.headers[WORKER_HEADER] == alive.url
            await asyncio.wait_for(hung.closed.wait(), 5)
            assert [w.active_requests for w in proxy.pool.workers.values()] == [0, 0]
            assert all(not w.lost_watchers for w in proxy.pool.workers.values())
            await proxy.pool.stop()

    run(main())


def test_a_cancelled_request_stays_cancelled() -> None:
    async def main() -> None:
        async def hanging(exchange: Exchange) -> None:
            await _worker(exchange, hang=True)

        async with Server(hanging) as server:
            proxy = await _proxy(server.url)
            task = asyncio.ensure_future(proxy.send_watching(_plan(), _request(None)))

            async def request_arrived() -> None:
                while not any(e.head.startswith(b"POST") for e in server.requests):
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(request_arrived(), 5)  # the request waits on the worker
            task.cancel()  # a shutdown, not the client leaving
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(server.closed.wait(), 5)
            assert proxy.pool.workers[server.url].active_requests == 0
            await proxy.pool.stop()

    run(main())


async def _send_stream(proxy: Proxy, disconnect_after: float | None) -> tuple[list[dict[str, Any]], Any]:
    response = await proxy.send_watching(_plan(stream=True), _request(None))
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    request = _request(disconnect_after)
    await response({"type": "http", "asgi": {"spec_version": "2.3"}}, request.receive, send)  # type: ignore[arg-type]
    return sent, response


def test_streams_are_relayed_as_they_arrive() -> None:
    async def main() -> None:
        async def streaming(exchange: Exchange) -> None:
            await _worker(exchange, stream=True)

        async with Server(streaming) as server:
            proxy = await _proxy(server.url)
            sent, response = await _send_stream(proxy, None)
            assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
            bodies = [message["body"] for message in sent[1:]]
            assert bodies[:2] == [b'data: {"i":0}\n\n', b'data: {"i":1}\n\n'] and bodies[-1] == b""
            events = b"".join(b'data: {"i":%d}\n\n' % i for i in range(200))
            assert b"".join(bodies) == events + b"data: [DONE]\n\n"
            assert response.headers[WORKER_HEADER] == server.url
            assert proxy.pool.workers[server.url].active_requests == 0
            await proxy.pool.stop()

    run(main())


def test_a_client_leaving_a_stream_closes_the_worker_request() -> None:
    async def main() -> None:
        async def streaming(exchange: Exchange) -> None:
            try:
                await _worker(exchange, stream=True)
            except ConnectionError:
                exchange.server.closed.set()

        async with Server(streaming) as server:
            proxy = await _proxy(server.url)
            sent, _ = await _send_stream(proxy, 0.2)
            assert 3 < len(sent) < 100  # ended early, without the closing message
            assert sent[-1].get("more_body") is True
            await asyncio.wait_for(server.closed.wait(), 5)
            assert proxy.pool.workers[server.url].active_requests == 0
            await proxy.pool.stop()

    run(main())


def test_a_stream_broken_after_its_first_chunk_ends_with_an_error_event() -> None:
    async def main() -> None:
        async def breaking(exchange: Exchange) -> None:
            if exchange.head.startswith(b"POST"):
                first = b"data: {}\n\n"
                await exchange.write(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(first), first)
                )
                exchange.writer.close()
            else:
                await _worker(exchange)

        async with Server(breaking) as server:
            proxy = await _proxy(server.url)
            sent, _ = await _send_stream(proxy, None)
            bodies = [message.get("body") for message in sent[1:]]
            assert bodies[0] == b"data: {}\n\n"
            assert b"failed while streaming" in bodies[1] and bodies[1].endswith(b"data: [DONE]\n\n")
            assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
            await proxy.pool.stop()

    run(main())


def test_an_interrupt_tells_its_own_cancellation_from_others() -> None:
    async def main() -> None:
        async def waiting(outcome: list[str | None], also_cancel: bool = False, disarm: bool = False) -> None:
            interrupt = Interrupt()
            task = asyncio.current_task()
            assert task is not None
            loop = asyncio.get_running_loop()
            loop.call_soon(interrupt.client_left)
            if also_cancel:
                loop.call_soon(task.cancel)  # a shutdown at the same moment
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                if disarm:
                    interrupt.disarm()
                    interrupt.worker_lost()  # too late: nothing more is cancelled
                outcome.append(interrupt.take())
                if outcome[-1] is None:
                    raise
            await asyncio.sleep(0)  # the task is not cancelled any more

        outcome: list[str | None] = []
        await waiting(outcome)
        await waiting(outcome, disarm=True)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(waiting(outcome, also_cancel=True))
        assert outcome == ["client", "client", None]

    run(main())

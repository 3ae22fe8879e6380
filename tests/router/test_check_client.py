"""The router's client for its checks and KV event reads (`router.check_client.CheckClient`) against scripted
servers on loopback: what it sends, answers read whole (Content-Length, chunked), its bounds (time, bytes),
its keep-alive connections (reused; one the worker closed replaced, the request sent again once), and what a
check says when a worker is slow or answers too much.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from scripted_server import LOOPS, Exchange, Server, answer, choose_loop, chunked, run

from tokenfront.router.check_client import CheckAnswer, CheckClient, describe_failure
from tokenfront.router.connections import AnswerTooLarge, ConnectError, ReadTimeout, RemoteProtocolError
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.worker_pool import PoolSettings, WorkerPool
from tokenfront.router.worker_spec import WorkerSpec


@pytest.fixture(autouse=True, params=LOOPS)
def event_loop_kind(request: pytest.FixtureRequest) -> str:
    """Every test runs on the standard loop and on uvloop (what the router's server runs on)."""
    return choose_loop(request)


# The resolution of uvloop's `loop.time()` (libuv's uv_now: milliseconds).
_LOOP_CLOCK_STEP = 0.001


def client_of(url: str, **settings: Any) -> CheckClient:
    options: dict[str, Any] = {
        "connect_timeout": 5.0,
        "timeout": 5.0,
        "max_response_bytes": 1_000_000,
        "max_connections": 4,
        "keepalive_expiry": 4.0,
    }
    return CheckClient(url, **{**options, **settings})


async def wait_until(condition: Any, deadline: float = 5.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), deadline)


def test_a_get_with_a_query_and_a_post_with_json_carry_the_routers_headers() -> None:
    async def main() -> None:
        async def echo(exchange: Exchange) -> None:
            await exchange.write(answer(b'{"seen":%d}' % len(exchange.body), "200 OK", "x-worker: w1"))

        async with Server(echo) as server:
            client = client_of(
                server.url + "/base/", headers={"x-tokenfront-via": "r-1", "authorization": "Bearer k"}
            )
            params = {"after": 3, "limit": 10_000, "log_id": "a b&c"}
            got = await client.get("/kv_cache_events", params=params, timeout=2.0)
            assert got == CheckAnswer(
                200,
                {"content-type": "application/json", "content-length": "10", "x-worker": "w1"},
                b'{"seen":0}',
            )
            assert got.json() == {"seen": 0} and got.text == '{"seen":0}'
            posted = await client.post("/tokenize", json={"prompt": "héllo"})
            assert posted.json() == {"seen": len(orjson.dumps({"prompt": "héllo"}))}
            await client.get("/health")

            first, second, third = (exchange.head.decode("latin-1") for exchange in server.requests)
            port = server.url.rsplit(":", 1)[1]
            assert first == (
                "GET /base/kv_cache_events?after=3&limit=10000&log_id=a+b%26c HTTP/1.1\r\n"
                f"host: 127.0.0.1:{port}\r\nx-tokenfront-via: r-1\r\nauthorization: Bearer k\r\n\r\n"
            )
            assert second == (
                f"POST /base/tokenize HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nx-tokenfront-via: r-1\r\n"
                "authorization: Bearer k\r\ncontent-type: application/json\r\ncontent-length: 19\r\n\r\n"
            )
            assert server.requests[1].body == orjson.dumps({"prompt": "héllo"})
            assert third.startswith("GET /base/health HTTP/1.1\r\n") and "content-length" not in third
            client.close()

    run(main())


def test_checks_reuse_one_kept_alive_connection() -> None:
    async def main() -> None:
        async def health(exchange: Exchange) -> None:
            await exchange.write(answer(b"{}"))

        async with Server(health) as server:
            client = client_of(server.url)
            statuses = [(await client.get("/health")).status_code for _ in range(20)]
            assert statuses == [200] * 20
            assert (server.connections, len(server.requests)) == (1, 20)
            assert len(client.connections.idle_connections) == 1
            client.close()
            assert client.connections.idle_connections == []

    run(main())


def test_a_chunked_answer_is_read_whole_and_its_connection_reused() -> None:
    events = orjson.dumps({"events": [{"seq": n, "stored": list(range(n, n + 50))} for n in range(200)]})

    async def main() -> None:
        async def pages(exchange: Exchange) -> None:
            pieces = [events[i : i + 1000] for i in range(0, len(events), 1000)]
            await exchange.write(chunked(*pieces))

        async with Server(pages) as server:
            client = client_of(server.url)
            for _ in range(3):
                got = await client.get("/kv_cache_events", params={"after": 0})
                assert (got.status_code, got.content) == (200, events)
                assert got.headers["transfer-encoding"] == "chunked"
            assert server.connections == 1

    run(main())


def test_a_slow_worker_is_a_read_timeout_within_the_checks_timeout() -> None:
    async def main() -> None:
        closed: list[bool] = []

        async def silent(exchange: Exchange) -> None:
            closed.append(await exchange.closed_by_client())

        async def head_then_nothing(exchange: Exchange) -> None:
            await exchange.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
            closed.append(await exchange.closed_by_client())

        for handler in (silent, head_then_nothing):
            async with Server(handler) as server:
                client = client_of(server.url, timeout=5.0)
                loop = asyncio.get_running_loop()
                began = loop.time()
                with pytest.raises(ReadTimeout) as caught:
                    await client.get("/health", timeout=0.2)
                # uvloop's clock counts whole milliseconds: 0.2 s on it can read 0.19999... after the
                # subtraction, so the lower bound allows the clock's one millisecond.
                assert 0.2 - _LOOP_CLOCK_STEP <= loop.time() - began < 2.0
                assert describe_failure("/health", caught.value) == (
                    "/health unreachable (ReadTimeout: no whole answer within 0.2 s)"
                )
                assert client.connections.idle_connections == []
        await wait_until(lambda: len(closed) == 2)
        assert closed == [True, True]  # the request abandoned mid-answer closed its connection

    run(main())


def test_an_answer_over_the_byte_bound_stops_the_read() -> None:
    big = b'{"x":"' + b"y" * 2000 + b'"}'

    async def main() -> None:
        async def sized(exchange: Exchange) -> None:
            await exchange.write(answer(big))

        async def streamed(exchange: Exchange) -> None:
            await exchange.write(chunked(*(big[i : i + 300] for i in range(0, len(big), 300))))

        async with Server(sized) as server:
            client = client_of(server.url, max_response_bytes=1000)
            with pytest.raises(AnswerTooLarge) as caught:
                await client.get("/server_info")
            assert describe_failure("/server_info", caught.value) == (
                "/server_info answered 2008 bytes (Content-Length), over --max-response-bytes (1000)"
            )
            assert client.connections.idle_connections == []
            exact = client_of(server.url, max_response_bytes=len(big))
            assert (await exact.get("/server_info")).content == big  # the bound itself is allowed
        async with Server(streamed) as server:
            client = client_of(server.url, max_response_bytes=1000)
            with pytest.raises(AnswerTooLarge) as caught:
                await client.get("/kv_cache_events")
            assert str(caught.value) == "answered over --max-response-bytes (1000 bytes)"
            await wait_until(server.closed.is_set)

    run(main())


def test_a_kept_alive_connection_the_worker_closed_is_sent_again_once() -> None:
    async def main() -> None:
        async def drops_the_second(exchange: Exchange) -> None:
            if len(exchange.server.requests) == 2:
                exchange.writer.close()  # the worker closed the kept-alive connection as the request came
                return
            await exchange.write(answer(b'{"n":%d}' % len(exchange.server.requests)))

        async with Server(drops_the_second) as server:
            client = client_of(server.url)
            assert (await client.get("/health")).json() == {"n": 1}
            assert (await client.get("/health")).json() == {"n": 3}  # sent again on a new connection
            assert (server.connections, len(server.requests)) == (2, 3)

        async def drops_all_but_the_first(exchange: Exchange) -> None:
            if len(exchange.server.requests) > 1:
                exchange.writer.close()
                return
            await exchange.write(answer())

        async with Server(drops_all_but_the_first) as server:
            client = client_of(server.url)
            assert (await client.get("/health")).status_code == 200
            with pytest.raises(RemoteProtocolError, match="without answering"):
                await client.get("/health")
            assert (server.connections, len(server.requests)) == (2, 3)  # sent again once, not more

    run(main())


def test_a_pool_check_asks_over_three_kept_alive_connections_and_says_why_a_worker_fails() -> None:
    async def main() -> None:
        info = orjson.dumps({"role": "worker", "padding": "x" * 5000})

        async def worker(exchange: Exchange) -> None:
            target = exchange.head.split(b" ", 2)[1]
            if target == b"/health":
                await exchange.write(answer(b"{}"))
            elif target == b"/server_info":
                await exchange.write(answer(info))
            else:
                await exchange.write(answer(b'{"detail":"Not Found"}', "404 Not Found"))

        async with Server(worker) as server:
            small = WorkerPool(KvIndex(), PoolSettings(health_timeout=2.0, max_response_bytes=4096))
            try:
                added = await small.add(WorkerSpec(server.url))
                for _ in range(4):
                    await small.check(added)
                assert added.healthy
                assert added.report is not None and added.report.missing == (
                    f"/server_info answered {len(info)} bytes (Content-Length), over --max-response-bytes "
                    "(4096)"
                )
                # Five checks, three questions each asked together: /health's and /v1/models' connections
                # reused, /server_info's closed after each answer over the bound (its body left unread).
                assert (server.connections, len(server.requests)) == (3 + 4, 15)
                roomy = WorkerPool(KvIndex(), PoolSettings(health_timeout=2.0))
                try:
                    other = await roomy.add(WorkerSpec(server.url + "/"))
                    for _ in range(4):
                        await roomy.check(other)
                    assert other.report is not None and other.report.role == "worker"
                    assert (server.connections, len(server.requests)) == (7 + 3, 30)  # three, each reused
                finally:
                    await roomy.stop()
            finally:
                await small.stop()

        async def slow(exchange: Exchange) -> None:
            await asyncio.Event().wait()

        async with Server(slow) as server:
            pool = WorkerPool(KvIndex(), PoolSettings(health_timeout=0.3))
            try:
                stuck = await pool.add(WorkerSpec(server.url))
                assert not stuck.healthy
                assert stuck.problem == "/health unreachable (ReadTimeout: no whole answer within 0.3 s)"
            finally:
                await pool.stop()

    run(main())


def test_connection_errors_are_named_as_httpx_named_them() -> None:
    async def main() -> None:
        async with Server(lambda exchange: asyncio.sleep(0)) as server:
            url = server.url
        client = client_of(url)  # nothing listens there any more
        with pytest.raises(ConnectError) as caught:
            await client.get("/health")
        assert describe_failure("/health", caught.value).startswith("/health unreachable (ConnectError: ")

    run(main())

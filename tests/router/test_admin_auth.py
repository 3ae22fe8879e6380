"""Who may change a router's fleet (issue 17, item 1): the admin key, the worker allow-list and the pool's cap.

Real routers (without a model: they start in a second) on loopback; the workers are stand-ins the test runs
(`PlainOpenAIServer`), which record every request they receive: an attacker-run worker must receive nothing
after a refused `POST /workers`, not even a health check carrying the router's `--worker-api-key`. A stand-in
that *is* added shows the router's checks have had time to reach a refused one: each test waits until the
admitted stand-in has had several checks, then looks at what the refused ones received.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from conftest import ADMIN, ADMIN_KEY, Fleet, router_command, wait_until

CLIENT_KEY = "client-key"
WORKER_KEY = "worker-key"
CLIENT = {"authorization": f"Bearer {CLIENT_KEY}"}


def _checked(server: Any, times: int = 3) -> bool:
    """Whether the router has checked the stand-in's /health at least `times` times."""
    return sum(1 for method, path, _ in server.requests if (method, path) == ("GET", "/health")) >= times


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return str(error["message"])


def _start_up_error(args: list[str]) -> str:
    """`tokenfront route ARGS` failing at start-up: its one `error:` line (exit 2, no traceback)."""
    done = subprocess.run(
        [sys.executable, "-m", "tokenfront.cli", "route", *args, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return errors[0]


def _urls(router: Any, headers: dict[str, str]) -> list[str]:
    response = httpx.get(f"{router.url}/workers", headers=headers, timeout=30.0)
    assert response.status_code == 200, response.text
    return [item["url"] for item in response.json()["workers"]]


@pytest.fixture(scope="module")
def routers(fleet: Fleet, plain_servers: Any) -> SimpleNamespace:
    """A router with a client key, an admin key and a worker key; one with only a client key; one with no key
    at all. Each has one admitted stand-in from its `--worker` (the proof that checks are running)."""
    control = [plain_servers() for _ in range(3)]
    keyed, client_only, open_router = fleet.start_many(
        router_command(
            None,
            [control[0].url],
            "--api-key",
            CLIENT_KEY,
            "--admin-api-key",
            ADMIN_KEY,
            "--worker-api-key",
            WORKER_KEY,
        ),
        router_command(None, [control[1].url], "--api-key", CLIENT_KEY, "--worker-api-key", WORKER_KEY),
        router_command(None, [control[2].url], "--worker-api-key", WORKER_KEY),
    )
    return SimpleNamespace(keyed=keyed, client_only=client_only, open=open_router, control=control)


def test_the_client_key_never_opens_admin_writes_and_the_admin_key_does(
    routers: SimpleNamespace, plain_servers: Any
) -> None:
    router, control = routers.keyed, routers.control[0]
    attacker = plain_servers()  # the worker an inference client runs, hoping to receive others' chats
    added = plain_servers()
    refused = 0
    with httpx.Client(base_url=router.url, timeout=30.0) as http:
        for headers, status, code in (
            (CLIENT, 401, "invalid_admin_api_key"),
            ({"authorization": f"Bearer {ADMIN_KEY}x"}, 401, "invalid_api_key"),
            ({"authorization": f"Basic {ADMIN_KEY}"}, 401, "invalid_api_key"),
            ({}, 401, "invalid_api_key"),
        ):
            message = _error(http.post("/workers", json={"url": attacker.url}, headers=headers), status, code)
            if code == "invalid_admin_api_key":
                assert "--admin-api-key" in message and "client key" in message
            # Nor can the real workers be taken away.
            _error(http.delete("/workers", params={"url": control.url}, headers=headers), status, code)
            refused += 2
        assert refused == 8
        # With the client key, the admin key is checked before the body is read or an address looked at: a
        # closed port, an open one, a malformed URL and a body that is not JSON all get the same answer.
        answers = {
            http.post("/workers", content=body, headers={**CLIENT, "content-type": "application/json"}).text
            for body in (
                b'{"url": "http://127.0.0.1:1"}',
                f'{{"url": "{attacker.url}"}}'.encode(),
                b'{"url": "ftp://x"}',
                b"not json",
            )
        }
        assert len(answers) == 1, answers
        # The client key reads the fleet (the inspector page lists it), the admin key opens the client routes.
        assert _urls(router, CLIENT) == [control.url]
        assert http.get("/server_info", headers=ADMIN).status_code == 200
        # The admin key adds and removes.
        response = http.post("/workers", json={"url": added.url}, headers=ADMIN)
        assert response.status_code == 201 and response.json()["state"] == "healthy", response.text
        assert http.delete("/workers", params={"url": added.url}, headers=ADMIN).status_code == 200
        assert _urls(router, CLIENT) == [control.url]
    assert wait_until(lambda: _checked(control), timeout=30.0)
    assert attacker.requests == []
    # What the admitted workers received: the worker key, never the client or the admin key.
    sent = {authorization for _, _, authorization in [*control.requests, *added.requests]}
    assert sent == {f"Bearer {WORKER_KEY}"}


def test_without_an_admin_key_the_admin_writes_are_off(routers: SimpleNamespace, plain_servers: Any) -> None:
    attacker = plain_servers()
    checked = 0
    for router, control, headers in (
        (routers.client_only, routers.control[1], CLIENT),
        (routers.open, routers.control[2], {}),
    ):
        with httpx.Client(base_url=router.url, timeout=30.0, headers=headers) as http:
            for response in (
                http.post("/workers", json={"url": attacker.url}),
                http.delete("/workers", params={"url": control.url}),
                http.post("/workers/", json={"url": attacker.url}),
            ):
                message = _error(response, 403, "admin_api_disabled")
                assert "--admin-api-key" in message and "$TOKENFRONT_ADMIN_API_KEY" in message
                checked += 1
            assert _urls(router, headers) == [control.url]  # reading stays open to clients
        assert wait_until(lambda control=control: _checked(control), timeout=30.0)
    assert checked == 6
    assert attacker.requests == []


def test_an_admin_key_that_is_another_key_is_a_start_up_error() -> None:
    cases = [
        (["--api-key", "same", "--admin-api-key", "same"], "--admin-api-key is the same key as --api-key"),
        (
            ["--worker-api-key", "same", "--admin-api-key", "same"],
            "--admin-api-key is the same key as --worker-api-key",
        ),
        (["--admin-api-key", " "], "--admin-api-key (or $TOKENFRONT_ADMIN_API_KEY) is empty"),
        (["--admin-api-key", "key\n"], "--admin-api-key (or $TOKENFRONT_ADMIN_API_KEY) has a character"),
    ]
    failed = 0
    for args, line in cases:
        error = _start_up_error(args)
        assert error.startswith(f"error: {line}") and "same" not in error.replace("the same key", ""), error
        failed += 1
    assert failed == len(cases) == 4


# --- where workers may be, and how many -------------------------------------------------------------------------


def test_worker_allow_refuses_addresses_outside_it(fleet: Fleet, plain_servers: Any) -> None:
    allowed, outside, kv_outside = plain_servers(), plain_servers(), plain_servers()
    router = fleet.start(
        *router_command(None, [], "--admin-api-key", ADMIN_KEY),
        "--worker-allow",
        "localhost",
        "--worker-allow",
        "10.0.0.0/8",
    )
    with httpx.Client(base_url=router.url, timeout=30.0, headers=ADMIN) as http:
        # The stand-in listens on 127.0.0.1: named so it is outside (only the name localhost is allowed).
        message = _error(http.post("/workers", json={"url": outside.url}), 403, "worker_not_allowed")
        assert (
            message
            == f"worker URL {outside.url}: 127.0.0.1 is outside --worker-allow (10.0.0.0/8, localhost)"
        )
        kv = {"url": kv_outside.url.replace("127.0.0.1", "localhost"), "kv_events": "tcp://127.0.0.1:5557"}
        response = http.post("/workers", json=kv)
        message = _error(response, 403, "worker_not_allowed")
        assert response.json()["error"]["param"] == "kv_events" and "tcp://127.0.0.1:5557" in message
        by_name = allowed.url.replace("127.0.0.1", "localhost")
        response = http.post("/workers", json={"url": by_name})
        assert response.status_code == 201 and response.json()["state"] == "healthy", response.text
        assert _urls(router, ADMIN) == [by_name]
    assert wait_until(lambda: _checked(allowed), timeout=30.0)
    assert outside.requests == [] and kv_outside.requests == []


def test_worker_allow_and_max_workers_at_start_up(plain_servers: Any) -> None:
    stand_ins = [plain_servers() for _ in range(3)]
    workers = [arg for server in stand_ins for arg in ("--worker", server.url)]
    cases = [
        (
            ["--worker-allow", "10.0.0.0/8", "--worker", stand_ins[0].url],
            f"error: --worker {stand_ins[0].url}: 127.0.0.1 is outside --worker-allow (10.0.0.0/8)",
        ),
        (["--max-workers", "2", *workers], "error: 3 --worker given, more than --max-workers 2"),
        (["--worker-allow", "10.0.0.1/8"], "error: argument --worker-allow: '10.0.0.1/8' is not a network"),
        (["--worker-allow", "host:80"], "error: argument --worker-allow: 'host:80': give a host name or"),
    ]
    failed = 0
    for args, line in cases:
        error = _start_up_error(args)
        assert error.startswith(line), error
        failed += 1
    assert failed == len(cases) == 4
    assert all(server.requests == [] for server in stand_ins)


def test_a_full_pool_refuses_more_workers(fleet: Fleet, plain_servers: Any) -> None:
    first, second, third = plain_servers(), plain_servers(), plain_servers()
    router = fleet.start(
        *router_command(None, [first.url], "--admin-api-key", ADMIN_KEY, "--max-workers", "2")
    )
    with httpx.Client(base_url=router.url, timeout=30.0, headers=ADMIN) as http:
        assert http.post("/workers", json={"url": second.url}).status_code == 201
        message = _error(http.post("/workers", json={"url": third.url}), 409, "worker_pool_full")
        assert "it has 2 workers" in message and "--max-workers" in message
        assert _urls(router, ADMIN) == [first.url, second.url]
        assert wait_until(lambda: _checked(second), timeout=30.0)
        assert third.requests == []
        # Room again after a DELETE.
        assert http.delete("/workers", params={"url": first.url}).status_code == 200
        assert http.post("/workers", json={"url": third.url}).status_code == 201
        assert _urls(router, ADMIN) == [second.url, third.url]

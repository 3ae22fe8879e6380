"""The router's worker membership under bad input (issue 10, items 6 and 7), with real routers on loopback.

Invalid worker URLs are a 400 that names the problem and never enter the pool; the same worker under another
spelling is a 409 naming the entry; the router itself (or a router routing back to it) is refused; a worker is
healthy only when `/health` answers 200, when it takes the router's `--worker-api-key`, and when it serves the
router's model name. The admin API needs the router's `--api-key` when one is set, and its writes the
`--admin-api-key` (tests/router/test_admin_auth.py has the rest of who may change the fleet).

The router test helpers (Fleet, PlainOpenAIServer, ...) are `tests/router/conftest.py`'s, loaded by path: a
bare `from conftest import` here would find whichever conftest pytest loaded last.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest

from tokenfront import fixtures
from tokenfront.core.errors import TokenfrontError
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.model_placement import ModelPlacement
from tokenfront.router.worker import Worker
from tokenfront.router.worker_pool import PoolSettings, WorkerPool
from tokenfront.router.worker_report import WorkerReport
from tokenfront.router.worker_spec import WorkerSpec
from tokenfront.server.metrics import ServerMetrics
from tokenfront.server.middleware import AuthAndMetrics
from tokenfront.server_address import normalize_url, worker_identity


def _router_helpers() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "router" / "conftest.py"
    spec = importlib.util.spec_from_file_location("tokenfront_tests_router_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _router_helpers()
WORKER_HEADER = helpers.WORKER_HEADER
ADMIN = helpers.ADMIN


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    started = helpers.Fleet(helpers._root_conftest(request.config), tmp_path_factory.mktemp("router-fleet"))
    yield started
    started.stop_all()


@pytest.fixture(scope="module")
def plain_servers() -> Iterator[Any]:
    started: list[Any] = []

    def start(**options: Any) -> Any:
        server = helpers.PlainOpenAIServer(**options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture(scope="module")
def tiny_random() -> Path:
    return fixtures.ensure_checkpoint("tiny-random")


@pytest.fixture(scope="module")
def router(fleet: Any) -> Any:
    """A router without a model (it starts in a second) and without workers: the admin API's subject."""
    return fleet.start(*helpers.router_command(None, [], "--admin-api-key", helpers.ADMIN_KEY))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _listed(client: httpx.Client) -> dict[str, dict[str, Any]]:
    response = client.get("/workers")
    assert response.status_code == 200, response.text
    return {item["url"]: item for item in response.json()["workers"]}


def _chat(client: httpx.Client, **fields: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0, **fields}
    return client.post("/v1/chat/completions", json=body)


# --- invalid URLs ---------------------------------------------------------------------------------------------

# (URL, what the 400 must say)
INVALID_URLS = [
    ("http://127.0.0.1:99999", "port must be a number from 1 to 65535, not '99999'"),
    ("http://127.0.0.1:-1", "port must be a number from 1 to 65535, not '-1'"),
    ("http://127.0.0.1:0", "port must be a number from 1 to 65535, not '0'"),
    ("http://256.1.1.1:8000", "'256.1.1.1' is not an IPv4 address"),
    ("http://127.1:8000", "'127.1' is not an IPv4 address"),
    ("http://a\r\nb:8000", "control character"),
    ("http://127.0.0.1:8000\r\nX-Injected: 1", "control character"),
    ("http://a\x00b:8000", "control character"),
    ("http://127.0.0.1:8000\t", "control character"),
    ("http://" + "a" * 100_000 + ":8000", "too long (at most 2048 characters)"),
    ("http://\ud800:8000", "lone surrogate"),
    ("http://xn--zz:8000", "invalid IDNA label 'xn--zz'"),
    ("http://a..b:8000", "invalid label ''"),
    ("http://-bad-.example:8000", "invalid label '-bad-'"),
    ("http://\u2603.example:8000", "not a valid internationalized name"),
    ("http://127.0.0.1:8000?x=1", "has a query string"),
    ("http://127.0.0.1:8000/#frag", "has a fragment"),
    ("http://127.0.0.1:8000/v1", "has a path ('/v1')"),
    ("http://user:pw@127.0.0.1:8000", "has user info"),
    ("ftp://127.0.0.1:8000", "scheme must be http:// or https://"),
    ("127.0.0.1:8000", "scheme must be http:// or https://"),
    ("http://:8000", "has no host"),
    ("http://[::1:8000", "IPv6 host must be written [ADDRESS]"),
    ("http://[zz]:8000", "'zz' in brackets is not an IPv6 address"),
    ("http://::1:8000", "IPv6 host must be in brackets"),
    ("", "scheme must be http:// or https://"),
]


def test_router_refuses_invalid_worker_urls(router: Any, plain_servers: Any) -> None:
    assert len(INVALID_URLS) == 26
    refused = []
    with httpx.Client(base_url=router.url, timeout=30.0, headers=ADMIN) as client:
        for url, problem in INVALID_URLS:
            # json.dumps escapes a lone surrogate as JSON allows (httpx's json= would refuse to encode it).
            body = json.dumps({"url": url})
            response = client.post("/workers", content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400, (url[:60], response.text[:300])
            error = response.json()["error"]
            assert error["code"] == "invalid_worker_url" and error["param"] == "url"
            assert problem in error["message"], (url[:60], error["message"])
            assert len(error["message"]) < 400  # the 100 KB URL is not echoed back
            refused.append(url)
            # Nothing stays behind: the listing and /server_info answer, and list no worker.
            assert _listed(client) == {}
            info = client.get("/server_info")
            assert info.status_code == 200 and info.json()["workers"] == []
        # A bad kv_events endpoint is refused the same way, and a bad URL to DELETE says what is wrong.
        bad_events = client.post("/workers", json={"url": "http://127.0.0.1:9", "kv_events": "tcp://h:1\r\n"})
        assert bad_events.status_code == 400 and bad_events.json()["error"]["code"] == "invalid_kv_endpoint"
        deleted = client.delete("/workers", params={"url": "http://127.0.0.1:99999"})
        assert deleted.status_code == 400 and "65535" in deleted.json()["error"]["message"]
        not_a_string = client.post("/workers", json={"url": 8000})
        assert not_a_string.status_code == 400
        assert _listed(client) == {}
    assert len(refused) == len(INVALID_URLS)
    # Three health rounds (a witness worker's three checks): a bad entry would show in the log by now.
    witness = plain_servers()
    with httpx.Client(base_url=router.url, timeout=30.0, headers=ADMIN) as client:
        assert client.post("/workers", json={"url": witness.url}).status_code == 201
        assert helpers.wait_for_checks(client, witness.url, 3)
        assert client.delete("/workers", params={"url": witness.url}).status_code == 200
    assert "Traceback" not in router.log()


# --- the same worker twice -----------------------------------------------------------------------------------


def test_router_refuses_the_same_worker_under_another_spelling(router: Any, plain_servers: Any) -> None:
    plain = plain_servers()
    port = _port(plain.url)
    spellings = [
        f"http://localhost:{port}",
        f"http://LOCALHOST:{port}/",
        f"http://127.0.0.1:{port}/",
        f"HTTP://127.0.0.1:{port}",
        f"http://[::1]:{port}",
        f"http://0.0.0.0:{port}",
        f"  http://127.0.0.1:{port}  ",
        f"http://localhost.:{port}",
    ]
    with httpx.Client(base_url=router.url, timeout=30.0, headers=ADMIN) as client:
        added = client.post("/workers", json={"url": plain.url})
        assert added.status_code == 201 and added.json()["state"] == "healthy", added.text
        conflicts = 0
        for spelling in spellings:
            response = client.post("/workers", json={"url": spelling})
            assert response.status_code == 409, (spelling, response.text)
            error = response.json()["error"]
            assert (
                error["code"] == "worker_exists" and f"already in the pool as {plain.url}" in error["message"]
            )
            conflicts += 1
        assert conflicts == len(spellings) == 8
        assert [url for url in _listed(client) if _port(url) == port] == [plain.url]
        # Any spelling names it for DELETE too.
        removed = client.delete("/workers", params={"url": f"http://localhost:{port}/"})
        assert removed.status_code == 200 and removed.json()["removed"] == plain.url
        assert plain.url not in _listed(client)


def test_worker_url_spellings_and_the_default_port() -> None:
    same = {
        "http://h:80": "http://h",
        "http://H/": "http://h",
        "https://h:443": "https://h",
        "http://h:443": "http://h:443",
        "http://[0:0:0:0:0:0:0:1]:8000": "http://[::1]:8000",
        "http://b\u00fccher.example:8000": "http://xn--bcher-kva.example:8000",
        "http://a_b.svc:8000": "http://a_b.svc:8000",
    }
    for given, canonical in same.items():
        assert normalize_url(given) == canonical
    assert worker_identity("http://h") == worker_identity("http://h:80") == ("http", "h", 80)
    assert worker_identity("http://localhost:1") == worker_identity("http://[::1]:1")
    assert worker_identity("http://h:1") != worker_identity("https://h:1")
    assert worker_identity("http://127.0.0.2:1") != worker_identity("http://127.0.0.1:1")
    # `--worker` reads the same way, in one line.
    assert WorkerSpec.parse("http://LOCALHOST:8000/,protocol=generate").url == "http://localhost:8000"
    with pytest.raises(ValueError, match="has a query string"):
        WorkerSpec.parse("http://h:8000?x=1")
    with pytest.raises(ValueError, match="kv-events 'tcp://h:99999'"):
        WorkerSpec.parse("http://h:8000,kv-events=tcp://h:99999")
    assert len(same) == 7


def test_router_worker_flag_errors_are_one_line(tmp_path: Path) -> None:
    cases = [
        (["--worker", "http://127.0.0.1:9?x=1"], "has a query string"),
        (["--worker", "http://127.0.0.1:70000"], "from 1 to 65535"),
        (["--worker", "http://localhost:9", "--worker", "http://127.0.0.1:9/"], "is given twice"),
        (["--worker", "http://127.0.0.1:9", "--host", "127.0.0.1", "--port", "9"], None),
    ]
    failed = 0
    for args, problem in cases[:3]:
        done = subprocess.run(
            [sys.executable, "-m", "tokenfront.cli", "route", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr[-2000:]
        assert problem in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
        failed += 1
    assert failed == 3 and len(cases) == 4
    # The router's own address, when the app knows it (cli.py passes RouterSettings.listen), refuses too.
    from tokenfront.router.app import RouterSettings, create_router_app

    spec = WorkerSpec.parse("http://localhost:9")
    with pytest.raises(TokenfrontError, match="is this router itself"):
        create_router_app(None, RouterSettings(workers=[spec], listen=("127.0.0.1", 9)))
    with pytest.raises(TokenfrontError, match="given twice"):
        create_router_app(None, RouterSettings(workers=[spec, WorkerSpec.parse("http://[::1]:9")]))


# --- the router itself ---------------------------------------------------------------------------------------


class _Forwarder:
    """A TCP relay on another loopback port: a spelling of the router's URL no address comparison catches."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target))
            except OSError:  # nothing listening there yet
                client.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()


def test_router_refuses_itself_and_a_router_routing_back(fleet: Any, router: Any) -> None:
    port = _port(router.url)
    own_spellings = [
        router.url,
        f"http://localhost:{port}",
        f"http://LOCALHOST:{port}/",
        f"http://[::1]:{port}",
        f"http://0.0.0.0:{port}",
    ]
    forwarder = _Forwarder(port)
    other = fleet.start(*helpers.router_command(None, [], "--admin-api-key", helpers.ADMIN_KEY))
    refused = 0
    try:
        with httpx.Client(base_url=router.url, timeout=30.0, headers=ADMIN) as client:
            for url in own_spellings:
                response = client.post("/workers", json={"url": url})
                assert response.status_code == 400, (url, response.text)
                error = response.json()["error"]
                assert error["code"] == "worker_is_router" and "this router itself" in error["message"]
                refused += 1
            # Through a relay: found by the router's own id coming back (508 router_loop on /health).
            relayed = client.post("/workers", json={"url": forwarder.url})
            assert relayed.status_code == 400, relayed.text
            assert relayed.json()["error"]["code"] == "worker_is_router"
            assert "reaches this router itself" in relayed.json()["error"]["message"]
            assert forwarder.connections <= 4  # the check's own connections, nothing fanned out
            refused += 1
            # Another router that has this one among its workers: adding it here would be a loop.
            with httpx.Client(base_url=other.url, timeout=30.0, headers=ADMIN) as other_client:
                added = other_client.post("/workers", json={"url": router.url})
                assert added.status_code == 201 and added.json()["state"] == "healthy", added.text
                assert added.json()["router_id"] == client.get("/server_info").json()["router_id"]
                looped = client.post("/workers", json={"url": other.url})
                assert looped.status_code == 400, looped.text
                assert looped.json()["error"]["code"] == "worker_is_router"
                assert "loop" in looped.json()["error"]["message"]
                refused += 1
                assert other_client.delete("/workers", params={"url": router.url}).status_code == 200
            assert refused == len(own_spellings) + 2 == 7
            listed = _listed(client)
            assert not any(_port(url) in (port, _port(forwarder.url), _port(other.url)) for url in listed)
    finally:
        forwarder.close()


def test_router_started_with_itself_as_a_worker_marks_it_unusable(fleet: Any) -> None:
    # Its own address is refused before it starts (`--worker` naming `--host`/`--port`); through a relay it is
    # found once it listens, by its own id coming back.
    port = _free_port()
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenfront.cli",
            "route",
            "--worker",
            f"http://localhost:{port}/",
            *_on(port),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "is this router itself" in refused.stderr, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    forwarder = _Forwarder(port)
    own = forwarder.url
    router = fleet.start_on_port(port, *helpers.router_command(None, [own]))
    with httpx.Client(base_url=router.url, timeout=30.0) as client:
        assert helpers.wait_until(lambda: _listed(client)[own]["state"] == "unusable", timeout=30.0)
        item = _listed(client)[own]
        assert item["unusable"] == "router_itself" and "reaches this router itself" in item["problem"]
        started = time.monotonic()
        response = _chat(client)
        assert response.status_code == 503 and response.json()["error"]["code"] == "no_worker"
        assert time.monotonic() - started < 5.0
        assert helpers.wait_for_checks(client, own, 3)  # three more checks: still one line in the log
        assert len(helpers.log_lines(router, "cannot be used")) == 1
        assert client.get("/server_info").status_code == 200
    forwarder.close()


def _on(port: int) -> list[str]:
    return ["--host", "127.0.0.1", "--port", str(port)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- health ----------------------------------------------------------------------------------------------------


def test_router_worker_is_healthy_only_on_health_200(router: Any, plain_servers: Any) -> None:
    missing_health = plain_servers(health_status=404)
    good = plain_servers()
    with httpx.Client(base_url=router.url, timeout=30.0, headers=ADMIN) as client:
        for server in (missing_health, good):
            assert client.post("/workers", json={"url": server.url}).status_code == 201
        item = _listed(client)[missing_health.url]
        assert item["state"] == "unhealthy" and item["problem"].startswith("/health answered 404")
        served_by = [_chat(client).headers[WORKER_HEADER] for _ in range(6)]
        assert served_by == [good.url] * 6 and missing_health.bodies == []
        missing_health.health_status = 200  # the only thing wrong with it
        assert helpers.wait_until(lambda: _listed(client)[missing_health.url]["state"] == "healthy")
        for server in (missing_health, good):
            assert client.delete("/workers", params={"url": server.url}).status_code == 200


# --- the worker's key and model names ----------------------------------------------------------------------------

WORKER_KEY = "worker-secret"
OTHER_NAME = "other-name"


@pytest.fixture(scope="module")
def keyed(fleet: Any, tiny_random: Path, plain_servers: Any) -> SimpleNamespace:
    """A real worker with its own key and another model name, plain servers listing names (or none), and
    routers with no worker key, a wrong one, the right one, and the right one and the worker's name."""
    worker = fleet.start(
        "serve", "--model", str(tiny_random), "--api-key", WORKER_KEY, "--served-model-name", OTHER_NAME
    )
    other_model = plain_servers(models=["another-model"])  # names from GET /v1/models, as vLLM lists them
    unnamed = plain_servers()  # says no names: taken to serve any
    named = plain_servers(models=["tiny-random"])
    no_key, wrong_key, right_key, same_name = fleet.start_many(
        helpers.router_command(tiny_random, [worker.url]),
        helpers.router_command(tiny_random, [worker.url], "--worker-api-key", "wrong"),
        helpers.router_command(
            tiny_random, [worker.url, other_model.url, unnamed.url, named.url], "--worker-api-key", WORKER_KEY
        ),
        helpers.router_command(
            tiny_random, [worker.url], "--served-model-name", OTHER_NAME, "--worker-api-key", WORKER_KEY
        ),
    )
    return SimpleNamespace(
        worker=worker,
        other_model=other_model,
        unnamed=unnamed,
        named=named,
        no_key=no_key,
        wrong_key=wrong_key,
        right_key=right_key,
        same_name=same_name,
    )


def test_router_worker_refusing_the_key_is_not_healthy(keyed: SimpleNamespace) -> None:
    worker = keyed.worker
    checked = 0
    for router in (keyed.no_key, keyed.wrong_key):
        with httpx.Client(base_url=router.url, timeout=30.0) as client:
            item = _listed(client)[worker.url]
            assert item["state"] == "unusable" and item["unusable"] == "worker_api_key", item
            assert "--worker-api-key" in item["problem"] and "GET /v1/models answered 401" in item["problem"]
            assert _chat(client).status_code == 503
            # Two more checks: still one line in the log.
            assert helpers.wait_for_checks(client, worker.url, 2)
        assert len(helpers.log_lines(router, "--worker-api-key")) == 1
        checked += 1
    assert checked == 2
    # The right key (and the worker's name): healthy, and it serves.
    with httpx.Client(base_url=keyed.same_name.url, timeout=60.0) as client:
        assert helpers.wait_until(lambda: _listed(client)[worker.url]["state"] == "healthy")
        assert _listed(client)[worker.url]["model_mismatch"] is None
        response = _chat(client, model=OTHER_NAME)
        assert response.status_code == 200 and response.headers[WORKER_HEADER] == worker.url


def test_router_flags_a_worker_serving_another_model_name(keyed: SimpleNamespace) -> None:
    router = keyed.right_key
    with httpx.Client(base_url=router.url, timeout=60.0) as client:
        listed = _listed(client)
        flagged = 0
        for server, names in ((keyed.worker, [OTHER_NAME]), (keyed.other_model, ["another-model"])):
            item = listed[server.url]
            assert item["state"] == "healthy" and item["served_model_names"] == names, item
            mismatch = item["model_mismatch"]
            assert mismatch is not None and f"it serves {names[0]}, not tiny-random" in mismatch
            assert "--served-model-name tiny-random" in mismatch
            assert len(helpers.log_lines(router, f"worker {server.url}: model names differ")) == 1
            flagged += 1
        assert flagged == 2
        assert listed[keyed.named.url]["served_model_names"] == ["tiny-random"]
        for server in (keyed.named, keyed.unnamed):
            assert listed[server.url]["state"] == "healthy" and listed[server.url]["model_mismatch"] is None
        # A request that names no model may go to any of them: each answers with its own model.
        assert all(_chat(client).status_code == 200 for _ in range(4))


def test_router_sends_no_request_naming_a_model_a_worker_does_not_serve(keyed: SimpleNamespace) -> None:
    with httpx.Client(base_url=keyed.right_key.url, timeout=60.0) as client:
        responses = [_chat(client, model="tiny-random") for _ in range(8)]
    served_by = [response.headers.get(WORKER_HEADER) for response in responses]
    assert [response.status_code for response in responses] == [200] * 8, served_by
    assert set(served_by) <= {keyed.unnamed.url, keyed.named.url}, served_by


def test_pool_serving_filters_by_model_name() -> None:
    async def main() -> None:
        pool = WorkerPool(KvIndex(), PoolSettings(), placement=ModelPlacement([("a", "b")]))
        for url, names in (("http://w1", ("a",)), ("http://w2", ("a", "b")), ("http://w3", None)):
            worker = Worker(url, pool.check_client_for(url), pool.connections_for(url), healthy=True)
            worker.report = WorkerReport(None, served_model_names=names)
            pool.workers[url] = worker
        try:
            assert [w.url for w in pool.serving(None)] == ["http://w1", "http://w2", "http://w3"]
            assert [w.url for w in pool.serving("b")] == ["http://w2", "http://w3"]
            assert [w.url for w in pool.serving("zzz")] == ["http://w3"]
            pool.workers["http://w2"].healthy = False
            assert [w.url for w in pool.serving("b")] == ["http://w3"]
            assert pool.find("http://W1:80/") is pool.workers["http://w1"]
        finally:
            for worker in pool.workers.values():
                worker.connections.close()
                worker.client.close()

    asyncio.run(main())


# --- the router's own key --------------------------------------------------------------------------------------

ROUTER_KEY = "router-secret"


def test_router_admin_api_needs_the_key(fleet: Any, plain_servers: Any) -> None:
    plain = plain_servers()
    router = fleet.start(
        *helpers.router_command(None, []), "--api-key", ROUTER_KEY, "--admin-api-key", helpers.ADMIN_KEY
    )
    calls = [
        ("GET", "/workers", {}),
        ("POST", "/workers", {"json": {"url": plain.url}}),
        ("DELETE", "/workers", {"params": {"url": plain.url}}),
        ("GET", "/server_info", {}),
        ("GET", "/v1/models", {}),
    ]
    refusals = 0
    with httpx.Client(base_url=router.url, timeout=30.0) as client:
        for headers in (
            {},
            {"authorization": "Bearer wrong"},
            {"authorization": f"Bearer {ROUTER_KEY}x"},
            {"authorization": f"Basic {ROUTER_KEY}"},
        ):
            for method, path, options in calls:
                response = client.request(method, path, headers=headers, **options)
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.json()["error"]["code"] == "invalid_api_key"
                refusals += 1
        assert refusals == 4 * len(calls) == 20
        assert _listed_with(client, {}) == 401 and plain.url not in _workers(client)
        assert client.get("/health").status_code == 200  # load balancers probe it without a key
        key = {"authorization": f"bearer {ROUTER_KEY}"}
        assert client.get("/workers", headers=key).status_code == 200
        # The client key reads the fleet; changing it takes the admin key.
        for response in (
            client.post("/workers", json={"url": plain.url}, headers=key),
            client.delete("/workers", params={"url": plain.url}, headers=key),
        ):
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_admin_api_key"
        admin = {"authorization": f"bearer {helpers.ADMIN_KEY}"}
        assert client.post("/workers", json={"url": plain.url}, headers=admin).status_code == 201
        assert client.get("/workers", headers=admin).status_code == 200
        assert client.delete("/workers", params={"url": plain.url}, headers=admin).status_code == 200


def _listed_with(client: httpx.Client, headers: dict[str, str]) -> int:
    return client.get("/workers", headers=headers).status_code


def _workers(client: httpx.Client) -> list[str]:
    response = client.get("/workers", headers={"authorization": f"Bearer {ROUTER_KEY}"})
    return [item["url"] for item in response.json()["workers"]]


def test_api_key_is_compared_whole_and_an_empty_key_is_refused() -> None:
    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    auth = AuthAndMetrics(ok, metrics=ServerMetrics(), api_key="s3cret")

    async def status(authorization: bytes | None, path: str = "/workers") -> int:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        headers = [(b"authorization", authorization)] if authorization is not None else []
        await auth({"type": "http", "path": path, "headers": headers, "method": "GET"}, receive, send)
        return int(sent[0]["status"])

    expected = {
        None: 401,
        b"Bearer s3cret": 200,
        b"bearer s3cret": 200,
        b"Bearer s3cre": 401,
        b"Bearer s3cretx": 401,
        b"Bearer S3CRET": 401,
        b"Bearer ": 401,
        b"s3cret": 401,
    }
    for header, code in expected.items():
        assert asyncio.run(status(header)) == code, header
    assert asyncio.run(status(None, "/health")) == 200
    assert len(expected) == 8
    for empty in ("", "  "):
        with pytest.raises(TokenfrontError, match="is empty"):
            AuthAndMetrics(ok, metrics=ServerMetrics(), api_key=empty)

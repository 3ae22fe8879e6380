"""Worker test fixtures: real `tokenfront serve` / `tokenfront render` processes shared by a module.

Starting a worker loads torch and a model (seconds), so the end-to-end modules share their servers through
module-scoped fixtures built on the root conftest's `start_server` (the same launcher `server_factory` uses).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

_ROOT_CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"


def _root_conftest(config: pytest.Config) -> Any:
    # conftest.py files outside packages all import as "conftest"; pytest keeps each under its path.
    module = config.pluginmanager.get_plugin(str(_ROOT_CONFTEST))
    assert module is not None, f"{_ROOT_CONFTEST} is not loaded"
    return module


@pytest.fixture(scope="module")
def module_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Any]]:
    """Start servers (`tokenfront ARGS...`) that live until the end of the test module."""
    start_server = _root_conftest(request.config).start_server
    log_dir = tmp_path_factory.mktemp("servers")
    started: list[Any] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Any:
        server = start_server(list(args), log_dir=log_dir, env=env, timeout=240.0)
        started.append(server)
        return server

    yield start
    for server in started:
        code = server.stop()
        # A graceful shutdown (SIGTERM) exits 0: in-flight work finished or was aborted cleanly.
        assert code == 0, f"server exited with {code}:\n{server.log()[-3000:]}"


@pytest.fixture(scope="session")
def smollm2(checkpoint: Callable[[str], Path]) -> Path:
    """The real SmolLM2-135M-Instruct checkpoint (weights included)."""
    return checkpoint("smollm2")


@pytest.fixture(scope="session")
def tiny_random(checkpoint: Callable[[str], Path]) -> Path:
    """A 2-layer random-weight Llama on the SmolLM2 tokenizer: fast, deterministic, meaningless output."""
    return checkpoint("tiny-random")


class WorkerClient(httpx.Client):
    """An httpx client with what the worker tests read: SSE payloads and /metrics samples."""

    def sse(self, path: str, body: dict[str, Any]) -> list[Any]:
        """POST a streaming request; return its `data:` payloads (JSON objects, and "[DONE]" as a string)."""
        payloads: list[Any] = []
        with self.stream("POST", path, json={**body, "stream": True}) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            for line in response.iter_lines():
                if not line:
                    continue
                assert line.startswith("data: "), line
                data = line[len("data: ") :]
                payloads.append(data if data == "[DONE]" else json.loads(data))
        return payloads

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample on /metrics (0 when it is not there yet)."""
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        return 0.0

    @staticmethod
    def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
        """Poll `condition` until it holds or `timeout` seconds pass; return whether it held."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.1)
        return condition()


@pytest.fixture(scope="module")
def connect() -> Iterator[Callable[[Any], WorkerClient]]:
    """Open a `WorkerClient` on a started server; all are closed at the end of the module."""
    clients: list[WorkerClient] = []

    def open_client(server: Any) -> WorkerClient:
        client = WorkerClient(base_url=server.url, timeout=120.0)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        client.close()

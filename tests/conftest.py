"""Shared test fixtures: real checkpoints from the project's fixture script, real servers on loopback."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from installed_build import installed_package, stale_files
from tokenfront import fixtures


def pytest_configure(config: pytest.Config) -> None:
    """The tests run on the installed package (a built wheel): stop at once when it is not the current source."""
    stale = stale_files()
    if stale:
        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        raise pytest.UsageError(
            f"the installed tokenfront ({installed_package()}) is not src/: {shown} changed since it was "
            "installed; run `make install-test` (the tests run on the built wheel, its hot path compiled)"
        )


@pytest.fixture(scope="session")
def checkpoint() -> Callable[[str], Path]:
    """Return the folder of a fixture checkpoint by name (qwen3, llama3, ...), fetching it once if needed."""
    return fixtures.ensure_checkpoint


@pytest.fixture(scope="session")
def qwen3(checkpoint: Callable[[str], Path]) -> Path:
    return checkpoint("qwen3")


@pytest.fixture(scope="session")
def llama_cpp_templates() -> Path:
    """The folder of the ~70 real chat templates from the llama.cpp sources."""
    return fixtures.ensure_templates()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """A tokenfront server started as a real process on loopback."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """Stop it by its own pid (SIGTERM: a graceful shutdown), and return its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return int(self.process.returncode)


def start_server(
    args: list[str],
    *,
    log_dir: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    verify: ssl.SSLContext | None = None,
) -> ServerProcess:
    """Run `python -m tokenfront.cli ARGS --host 127.0.0.1 --port P` and wait until /health answers (over
    HTTPS, checked with `verify`, when given: a server started with --ssl-certfile)."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    command = [sys.executable, "-m", "tokenfront.cli", *args, "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    scheme = "http" if verify is None else "https"
    server = ServerProcess(process, f"{scheme}://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1.0, verify=verify or True).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server did not become healthy in {timeout} s:\n{server.log()}")


@pytest.fixture(scope="session")
def launch() -> Callable[..., ServerProcess]:
    """`start_server`, as a fixture: a test module in any folder gets this launcher without importing a
    `conftest` module by name (a bare `from conftest import` finds whichever conftest pytest loaded last)."""
    return start_server


@pytest.fixture(scope="session")
def pick_port() -> Callable[[], int]:
    """`free_port`, as a fixture (for a server's second port: a ZMQ endpoint, say), importable from any folder."""
    return free_port


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start tokenfront servers for one test; every one is stopped afterwards."""
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        server = start_server(list(args), log_dir=tmp_path, env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def qwen3_renderer(qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One renderer on the Qwen3 checkpoint with the qwen3 reasoning parser, shared by the session."""
    server = start_server(
        ["render", "--model", str(qwen3), "--reasoning-parser", "qwen3", "--served-model-name", "Qwen3-0.6B"],
        log_dir=tmp_path_factory.mktemp("qwen3-renderer"),
    )
    yield server
    server.stop()

"""Running an app as a server: uvicorn (httptools + uvloop), one process or several on one port.

One process: `uvicorn.run`. Several (`--workers N`): the parent has loaded everything already (the pipeline,
the app), and forks N children that each listen on the port with a socket of their own (SO_REUSEPORT: the
kernel spreads connections over the children evenly; with one shared socket, whichever child wakes first
takes most of them) and serve it with their own event loop — a pre-fork server, as gunicorn's `--preload`. Each child has its own copy of the pipeline; the pages are
shared copy-on-write until written, so N processes cost far less than N times one. The parent only
supervises: it restarts a child that dies (a fork of the loaded parent: ready at once), and on SIGTERM or
SIGINT passes the signal on, waits for every child's graceful shutdown, and exits 0.

uvicorn re-raises the signal that stopped it once its shutdown is done, which would make a finished,
graceful shutdown look like a kill (exit -15) to supervisors; SIGTERM then exits with status 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Any

__all__ = ["GRACEFUL_SHUTDOWN_SECONDS", "MULTIPROC_DIR_ENV", "prepare_workers", "run_server"]

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_SECONDS = 30
# Where prometheus-client's multiprocess mode keeps its files (read by server.metrics too).
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A child that dies this soon after it started, this many times in a row, means it cannot run: give up.
_CRASH_WINDOW_SECONDS = 5.0
_MAX_QUICK_CRASHES = 5


def prepare_workers(workers: int) -> None:
    """Before anything imports prometheus-client: with several processes, count metrics in shared files.

    prometheus-client reads PROMETHEUS_MULTIPROC_DIR when it is first imported, so this must run first.
    """
    if workers > 1 and not os.environ.get(MULTIPROC_DIR_ENV):
        os.environ[MULTIPROC_DIR_ENV] = tempfile.mkdtemp(prefix="tokenfront-metrics-")
    if workers > 1 and "prometheus_client" in sys.modules:
        log.warning(
            "prometheus-client was imported before the metrics directory was set: /metrics is per process"
        )


def run_server(
    app: Any, *, host: str, port: int, log_level: str, access_log: bool = False, workers: int = 1
) -> None:
    """Serve `app` until SIGTERM or SIGINT; in-flight requests finish before the process exits."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        # "auto" takes uvloop and httptools (dependencies of tokenfront): the C parser, not h11.
        loop="auto",
        http="auto",
    )
    if workers <= 1:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        uvicorn.Server(config).run()
        return
    _PreforkServer(config, workers).run()


class _PreforkServer:
    """A parent that binds the port, forks `workers` uvicorn children on it, and supervises them."""

    def __init__(self, config: Any, workers: int) -> None:
        self.config = config
        self.workers = workers
        self.children: dict[int, float] = {}  # pid -> start time
        self.stopping = False
        self.quick_crashes = 0

    def run(self) -> None:
        sock = self._bind()
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for _ in range(self.workers):
                self._spawn(sock)
            log.info("serving on http://%s:%d with %d worker processes", *self._address(), self.workers)
            log.info("metrics of the worker processes are kept in %s", os.environ.get(MULTIPROC_DIR_ENV))
            self._supervise(sock)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            sock.close()
            directory = os.environ.get(MULTIPROC_DIR_ENV, "")
            if directory.startswith(tempfile.gettempdir()) and "tokenfront-metrics-" in directory:
                shutil.rmtree(directory, ignore_errors=True)

    def _address(self) -> tuple[str, int]:
        return str(self.config.host), int(self.config.port)

    def _bind(self, *, listen: bool = False) -> socket.socket:
        """A socket bound to the port with SO_REUSEPORT. The parent's is bound but never listens: it holds the
        port (and fails early when it is taken) without being handed any connection."""
        host, port = self._address()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            from tokenfront.core.errors import TokenfrontError

            raise TokenfrontError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        if listen:
            sock.listen(2048)
        return sock

    def _spawn(self, reserved: socket.socket) -> None:
        pid = os.fork()
        if pid == 0:  # the child: serve until told to stop, then leave without the parent's cleanup
            code = 0
            try:
                reserved.close()
                sock = self._bind(listen=True)
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
                import uvicorn

                uvicorn.Server(self.config).run(sockets=[sock])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0
            except BaseException:
                log.exception("worker process %d failed", os.getpid())
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        self.children[pid] = time.monotonic()

    def _stop(self, signum: int, _frame: Any) -> None:
        if not self.stopping:
            log.info("stopping %d worker processes (graceful shutdown)", len(self.children))
        self.stopping = True
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _supervise(self, sock: socket.socket) -> None:
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            started = self.children.pop(pid, None)
            if started is None:
                continue
            _mark_dead(pid)
            if self.stopping:
                continue
            lived = time.monotonic() - started
            self.quick_crashes = self.quick_crashes + 1 if lived < _CRASH_WINDOW_SECONDS else 0
            log.warning(
                "worker process %d exited (%s) after %.1f s; starting another",
                pid,
                _describe_status(status),
                lived,
            )
            if self.quick_crashes >= _MAX_QUICK_CRASHES:
                log.error("worker processes keep dying at start-up; stopping the server")
                self._stop(signal.SIGTERM, None)
                continue
            self._spawn(sock)


def _mark_dead(pid: int) -> None:
    if os.environ.get(MULTIPROC_DIR_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"

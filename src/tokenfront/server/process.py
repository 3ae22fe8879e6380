"""Running an app as a server: uvicorn (httptools + uvloop), one process or several on one port.

One process: `uvicorn.run`. Several (`--workers N`): the parent has loaded everything already (the pipeline,
the app), and forks N children that each listen on the port with a socket of their own (SO_REUSEPORT: the
kernel spreads connections over the children evenly; with one shared socket, whichever child wakes first
takes most of them) and serve it with their own event loop — a pre-fork server, as gunicorn's `--preload`. Each child has its own copy of the pipeline; the pages are
shared copy-on-write until written, so N processes cost far less than N times one. The parent only
supervises: it restarts a child that dies (a fork of the loaded parent: ready at once), and on SIGTERM or
SIGINT passes the signal on, waits for every child's graceful shutdown, and exits 0.

The port is bound before anything is loaded (`bind_socket`, called by the command first): a port already taken
is a one-line error at once, not after the model has loaded. The bound socket starts listening only when the
server is ready to answer, so a client (a router's health check) is refused meanwhile rather than left waiting.

Shutdown (SIGTERM or SIGINT): the server stops listening, in-flight requests get `--shutdown-timeout` seconds
to finish, and those still running then are cut in their API's shape (`server.shutdown.Drain`: a 503 OpenAI
error, or an error event and `data: [DONE]` on a stream). uvicorn re-raises the signal that stopped it once its
shutdown is done, which would make a finished, graceful shutdown look like a kill (exit -15) to supervisors;
SIGTERM then exits with status 0.

Connections: every process serves with `server.http_protocol.BoundedHttpProtocol` (uvicorn's httptools
protocol with the head size and line limits, the head, body and keep-alive timeouts, and the connection cap of
`ConnectionLimits`), the pre-fork children too (they run the parent's config). The open-file limit is raised to
fit `--max-connections` before anything is forked.

Logging: every request goes through `server.middleware.RequestIdLayer` (its id, the `X-Request-Id` answer header,
and with `--access-log` tokenfront's own access line, written when the answer has ended; uvicorn's, written when
it starts and without an id, is off). In text mode uvicorn keeps its own handlers and line format, as it always
had; with `--log-format json` it gets none (`log_config=None`), so its records reach the root logger's JSON
handler. The pre-fork children inherit the parent's logging as it is when they are forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from tokenfront.core.errors import TokenfrontError
from tokenfront.server.connection_limits import ConnectionLimits
from tokenfront.server.logs import adopt_library_handlers
from tokenfront.server.open_files import fit_open_file_limit
from tokenfront.server.shutdown import DEFAULT_SHUTDOWN_TIMEOUT
from tokenfront.tls import ServerTls

__all__ = ["DEFAULT_SHUTDOWN_TIMEOUT", "MULTIPROC_DIR_ENV", "bind_socket", "prepare_workers", "run_server"]

log = logging.getLogger(__name__)

# After the shutdown timeout has cut the requests still in flight, the seconds uvicorn waits for those cut
# answers to go out before it cancels whatever is left.
_CUT_GRACE_SECONDS = 5.0
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


def bind_socket(host: str, port: int, *, reuse_port: bool = False, joining: bool = False) -> socket.socket:
    """A TCP socket bound to `host`:`port`, not listening yet (the server listens once it is ready).

    TokenfrontError (one line) when the address cannot be bound: the port is taken, the host is not an address
    of this machine or cannot be resolved. `reuse_port` (SO_REUSEPORT) lets the pre-fork children bind the same
    port; `joining` is for those children, which bind a port their parent holds. Port 0 takes a free port:
    `sock.getsockname()` tells which.
    """
    if reuse_port and not joining and port != 0:
        # SO_REUSEPORT would also let this process share a port that another pre-forked server of the same
        # user holds, each getting part of the connections: prove the port free with a plain bind first.
        bind_socket(host, port).close()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            reason = "the port is already in use (another server listens on it)"
        shown = f"[{host}]" if ":" in host else host
        raise TokenfrontError(f"cannot listen on {shown}:{port}: {reason}") from exc
    sock.set_inheritable(True)
    return sock


def run_server(
    app: Any,
    *,
    host: str,
    port: int,
    log_level: str,
    access_log: bool = False,
    log_format: str = "text",
    workers: int = 1,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    connection_limits: ConnectionLimits | None = None,
    sock: socket.socket | None = None,
    tls: ServerTls | None = None,
    on_serving: Callable[[], None] | None = None,
) -> None:
    """Serve `app` until SIGTERM or SIGINT; in-flight requests get `shutdown_timeout` seconds to finish.

    `sock` is the socket `bind_socket` bound for it (bound here when None; with `workers` > 1 it must have been
    bound with `reuse_port`). `access_log`: a line per request; `log_format` (text or json) is the one
    `server.logs.configure_logging` set up, and says whether uvicorn keeps its own log handlers (text).
    `connection_limits` bound every connection of every process (`server.http_protocol`; the defaults when
    None); the open-file limit is raised to fit them first (`server.open_files`), which the pre-fork children
    inherit. `tls`: serve HTTPS (`tokenfront.tls`, checked at start-up); plain HTTP when None. `on_serving`
    is called (on the event loop, so briefly) once the one process listens; not with `workers` > 1.
    """
    if sock is None:
        sock = bind_socket(host, port, reuse_port=workers > 1)
    # Here, not at the top: the CLI imports this module before `prepare_workers` and the torch guard have run.
    from tokenfront.server.direct import DirectLane
    from tokenfront.server.http_protocol import bounded_protocol
    from tokenfront.server.middleware import RequestIdLayer

    limits = connection_limits or ConnectionLimits()
    limits = replace(limits, max_connections=fit_open_file_limit(limits.max_connections))
    port = int(sock.getsockname()[1])  # the real one when port 0 was asked for
    drain = getattr(app, "drain", None)  # a TokenfrontApp's (server.app)
    # Its direct answers (server.direct): not with an access log, which the usual path writes.
    direct = None if access_log else DirectLane.of(app)
    config = uvicorn.Config(
        RequestIdLayer(app, access_log=access_log),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,  # RequestIdLayer writes the access line
        log_config=None if log_format == "json" else LOGGING_CONFIG,
        timeout_graceful_shutdown=math.ceil(shutdown_timeout + _CUT_GRACE_SECONDS),
        # uvicorn annotates it as whole seconds; its timer takes any number of them.
        timeout_keep_alive=cast(int, limits.keep_alive_timeout),
        # "auto" takes uvloop (a dependency of tokenfront); the protocol is uvicorn's httptools one (the C
        # parser, not h11) with every connection bounded. uvicorn calls `http` with the protocol's arguments:
        # a factory works as a class does.
        loop="auto",
        http=cast("type[asyncio.Protocol]", bounded_protocol(limits, direct)),
        ws="none",  # no WebSocket route: uvicorn then imports no WebSocket library at start-up
        **(tls.uvicorn_options() if tls is not None else {}),
    )
    adopt_library_handlers()  # the checkpoint's libraries are imported by now
    if workers <= 1:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            _Server(config, shutdown_timeout, drain, announce=True, on_serving=on_serving).run(sockets=[sock])
        finally:
            sock.close()
        return
    _PreforkServer(config, workers, sock, shutdown_timeout, drain).run()


class _Server(uvicorn.Server):
    """uvicorn's server, which starts the app's drain (`server.shutdown`) as its shutdown begins."""

    def __init__(
        self,
        config: Any,
        shutdown_timeout: float,
        drain: Any,
        *,
        announce: bool = False,
        on_serving: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.shutdown_timeout = shutdown_timeout
        self.drain = drain  # the app's `server.shutdown.Drain`, or None for an app without one
        self.announce = announce
        self.on_serving = on_serving

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.announce:  # uvicorn says nothing of sockets it was given
            host = self.config.host
            scheme = "https" if self.config.is_ssl else "http"
            log.info("serving on %s://%s:%d", scheme, f"[{host}]" if ":" in host else host, self.config.port)
        if self.started and self.on_serving is not None:
            self.on_serving()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.drain is not None:
            self.drain.begin(self.shutdown_timeout)
        await super().shutdown(sockets=sockets)


class _PreforkServer:
    """A parent that holds the port, forks `workers` uvicorn children on it, and supervises them."""

    def __init__(
        self, config: Any, workers: int, reserved: socket.socket, shutdown_timeout: float, drain: Any
    ) -> None:
        self.config = config
        self.workers = workers
        self.reserved = reserved  # bound with SO_REUSEPORT by `bind_socket`, never listening
        self.shutdown_timeout = shutdown_timeout
        self.drain = drain
        self.children: dict[int, float] = {}  # pid -> start time
        self.stopping = False
        self.quick_crashes = 0

    def run(self) -> None:
        sock = self.reserved
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for _ in range(self.workers):
                self._spawn(sock)
            scheme = "https" if self.config.is_ssl else "http"
            log.info("serving on %s://%s:%d with %d worker processes", scheme, *self._address(), self.workers)
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

    def _bind(self) -> socket.socket:
        """A child's own socket on the parent's port, with SO_REUSEPORT: the kernel spreads the connections
        over the children. The parent's is bound but never listens: it holds the port without being handed any
        connection."""
        sock = bind_socket(*self._address(), reuse_port=True, joining=True)
        sock.listen(self.config.backlog)
        return sock

    def _spawn(self, reserved: socket.socket) -> None:
        pid = os.fork()
        if pid == 0:  # the child: serve until told to stop, then leave without the parent's cleanup
            code = 0
            try:
                reserved.close()
                sock = self._bind()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
                _Server(self.config, self.shutdown_timeout, self.drain).run(sockets=[sock])
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

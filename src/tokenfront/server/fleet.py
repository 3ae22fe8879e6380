"""Many apps in one process on one event loop, each on a socket of its own: how `tokenfront simulate` serves a
fleet of simulated workers (`run_fleet`); or spread over several such processes (`run_fleet_processes`).

Each app gets its own uvicorn server (uvloop, and `server.http_protocol`'s bounded httptools connections, as
`server.process` runs one), with its own lifespan (a worker starts and stops its engine there) and its own
graceful shutdown (`server.shutdown.Drain`). The connection limits hold for the process, as `--max-connections`
says: every server's connections count in one table, and the open-file limit is raised to fit them. What uvicorn
does once per process is done once for the fleet instead: the signal handlers (uvicorn's are per server,
and the last installed would be the only one told), and the once-a-second refresh of the `Date` header
(uvicorn's ticker wakes every 100 ms per server: thousands of wake-ups a second for a large fleet doing nothing).

The sockets are bound by the caller before anything loads (`server.process.bind_socket`), so a port in use is a
one-line error at once. uvicorn's own start-up and shutdown lines, one set per server, are left out below
`--log-level debug`; the fleet says once when every server is listening (`on_ready`) and when it stops.
SIGTERM or SIGINT stops every server the way `tokenfront serve` stops one: no new connections, in-flight
requests get the shutdown timeout, then those still running are cut; the process exits 0. A second signal cuts
at once.

Several processes (`run_fleet_processes`, `simulate --processes K`): one event loop is one core, and a fleet
whose traffic needs more is spread over K processes forked once the caller has loaded what they share (the
rendering pipeline: its pages stay shared until written). Child k builds and serves a contiguous K-th of the
apps on their sockets, bound by the parent beforehand, with `run_fleet`. The parent only supervises: it calls
`on_ready` with every URL, in order, once every child says its servers listen; it passes SIGTERM or SIGINT on
to every child and waits for their graceful shutdowns. A child that exits on its own (a crash) is not
replaced — its workers' caches and logs would start over behind the routers' backs — the others are stopped and
the parent exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import selectors
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import uvicorn

from tokenfront.server.connection_limits import ConnectionLimits
from tokenfront.server.logs import adopt_library_handlers
from tokenfront.server.open_files import fit_open_file_limit
from tokenfront.server.process import DEFAULT_SHUTDOWN_TIMEOUT
from tokenfront.tls import ServerTls

__all__ = ["FleetSettings", "run_fleet", "run_fleet_processes"]

log = logging.getLogger(__name__)

# As `server.process`: after the shutdown timeout has cut what was in flight, the seconds uvicorn waits for the
# cut answers to go out before it cancels whatever is left.
_CUT_GRACE_SECONDS = 5.0
# How often the fleet looks whether every server is listening yet, while they start.
_READY_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class FleetSettings:
    """How every server of a fleet runs: its host, logging, graceful shutdown (in-flight requests get
    `shutdown_timeout` seconds), `connection_limits` (every connection bounded, `max_connections` counting
    those of all the servers of a process; the defaults when None) and `tls` (every server serves HTTPS with
    it, `tokenfront.tls`)."""

    host: str
    log_level: str
    access_log: bool = False
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    connection_limits: ConnectionLimits | None = None
    tls: ServerTls | None = None


def run_fleet(
    apps: Sequence[Any],
    sockets: Sequence[socket.socket],
    settings: FleetSettings,
    *,
    on_ready: Callable[[list[str]], None] | None = None,
) -> None:
    """Serve `apps[i]` on `sockets[i]` (bound, not listening) until SIGTERM or SIGINT, all on one event loop.

    `on_ready` is called with the base URLs, in the apps' order, once every server listens. Returns after every
    server has shut down gracefully.
    """
    host, log_level, access_log = settings.host, settings.log_level, settings.access_log
    shutdown_timeout, tls = settings.shutdown_timeout, settings.tls
    if len(apps) != len(sockets):
        raise ValueError(f"{len(apps)} apps for {len(sockets)} sockets: give one socket per app")
    # As in `server.process`: imported after the CLI's set-up (the torch guard).
    from tokenfront.server.http_protocol import bounded_protocol
    from tokenfront.server.middleware import RequestIdLayer

    limits = settings.connection_limits or ConnectionLimits()
    limits = replace(limits, max_connections=fit_open_file_limit(limits.max_connections + len(apps)))
    protocol = bounded_protocol(limits)  # one for all: its connection table is the process's

    # uvicorn's lines come once per server: only at debug are they worth hundreds of copies.
    member_level = "debug" if log_level == "debug" else "warning"
    members = []
    for app, sock in zip(apps, sockets, strict=True):
        config = uvicorn.Config(
            RequestIdLayer(app, access_log=access_log),
            host=host,
            port=int(sock.getsockname()[1]),
            log_level=member_level,
            access_log=False,  # RequestIdLayer writes the access line
            log_config=None,  # the root logger's handler (server.logs) writes uvicorn's records
            timeout_graceful_shutdown=math.ceil(shutdown_timeout + _CUT_GRACE_SECONDS),
            timeout_keep_alive=cast(int, limits.keep_alive_timeout),  # annotated int; any number works
            loop="auto",
            http=cast("type[asyncio.Protocol]", protocol),  # a factory works as a class does
            **(tls.uvicorn_options() if tls is not None else {}),
        )
        members.append(_Member(config, shutdown_timeout, getattr(app, "drain", None)))
    adopt_library_handlers()
    loop = _new_event_loop()
    # As `server.startup.serve_app` does: what start-up built lives as long as the process, and frozen the
    # collector never walks it again. Here that is every member's app and engine, their prefix caches and event
    # logs included (containers that fill up as the fleet runs): walking them all at every full collection
    # held the loop for seconds at 256 workers (docs/simulation.md).
    gc.collect()
    gc.freeze()
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(_serve(members, list(sockets), on_ready))
    finally:
        for sock in sockets:
            sock.close()
        asyncio.set_event_loop(None)
        loop.close()
        gc.unfreeze()  # collectable again before the interpreter exits, as serve_app leaves it


class _Member(uvicorn.Server):
    """One app's uvicorn server in the fleet: signals and the `Date` ticker are the fleet's."""

    def __init__(self, config: uvicorn.Config, shutdown_timeout: float, drain: Any) -> None:
        super().__init__(config)
        self.shutdown_timeout = shutdown_timeout
        self.drain = drain  # the app's `server.shutdown.Drain`, or None for an app without one
        self.stopping = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the fleet's handlers tell every member

    async def main_loop(self) -> None:
        await self.on_tick(0)  # the Date header, before the first request
        await self.stopping.wait()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.drain is not None:
            self.drain.begin(self.shutdown_timeout)
        await super().shutdown(sockets=sockets)


async def _serve(
    members: list[_Member], sockets: list[socket.socket], on_ready: Callable[[list[str]], None] | None
) -> None:
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()

    def stop(*_: Any) -> None:
        if signalled.is_set():  # a second signal: cut what is still in flight now
            for member in members:
                member.force_exit = True
        signalled.set()
        for member in members:
            member.should_exit = True
            member.stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    tasks = [
        asyncio.create_task(member.serve(sockets=[sock]))
        for member, sock in zip(members, sockets, strict=True)
    ]
    ticker = asyncio.create_task(_refresh_date_headers(members, signalled))
    try:
        while not all(member.started for member in members) and not any(task.done() for task in tasks):
            await asyncio.sleep(_READY_POLL_SECONDS)
        ready = all(member.started for member in members) and not signalled.is_set()
        if ready and on_ready is not None:
            on_ready([_url(member.config) for member in members])
        await asyncio.gather(*tasks)
    finally:
        ticker.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for task in tasks:
            task.cancel()
    log.info("fleet stopped: %d servers shut down", len(members))


async def _refresh_date_headers(members: list[_Member], signalled: asyncio.Event) -> None:
    """uvicorn's once-a-second `Date` refresh, for every member from one task."""
    while not signalled.is_set():
        await asyncio.sleep(1.0)
        for member in members:
            if member.started:
                await member.on_tick(0)


def run_fleet_processes(
    build: Callable[[int], Any],
    sockets: Sequence[socket.socket],
    processes: int,
    settings: FleetSettings,
    *,
    on_ready: Callable[[list[str]], None] | None = None,
) -> int:
    """Serve app `build(i)` on `sockets[i]` (bound, not listening) from `processes` forked processes, each a
    `run_fleet` of a contiguous share of them, until SIGTERM or SIGINT (see the module docstring). `build` is
    called in the child that serves the app. The connection limits hold per process. Returns the exit status:
    0 when every child stopped gracefully on a signal, 1 when one exited on its own or failed to start."""
    if not 1 <= processes <= len(sockets):
        raise ValueError(f"{processes} processes for {len(sockets)} sockets: between 1 and one a socket")
    shares = [
        range(k * len(sockets) // processes, (k + 1) * len(sockets) // processes) for k in range(processes)
    ]
    # What the caller loaded is shared by the children: frozen, the collectors of the children never write the
    # objects' headers (which would copy their pages).
    gc.collect()
    gc.freeze()
    stopping = False
    children: dict[int, int] = {}  # pid -> its share's index
    ready_pipes: dict[int, int] = {}  # read end -> its share's index

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signals = {signal.SIGTERM, signal.SIGINT}
    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        for index, share in enumerate(shares):
            read_end, write_end = os.pipe()
            # Blocked across the fork: a signal must not reach the child's copy of `stop` (it would signal the
            # children forked before it).
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)
            pid = os.fork()
            if pid == 0:
                os.close(read_end)
                _serve_share(build, sockets, share, write_end, settings)  # never returns
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
            os.close(write_end)
            children[pid] = index
            ready_pipes[read_end] = index
        for sock in sockets:
            sock.close()  # the children's copies serve them
        urls = _await_ready(ready_pipes, shares, children, lambda: stopping)
        if urls is not None and on_ready is not None:
            on_ready(urls)
        return _supervise(children, stop, lambda: stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for read_end in ready_pipes:
            with contextlib.suppress(OSError):
                os.close(read_end)
        gc.unfreeze()


def _serve_share(
    build: Callable[[int], Any],
    sockets: Sequence[socket.socket],
    share: range,
    ready: int,
    settings: FleetSettings,
) -> None:
    """A child of `run_fleet_processes`: build and serve the apps of `share`, say on `ready` (a pipe) when they
    listen, and leave without the parent's clean-up."""
    code = 0
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)  # until the fleet's own handlers are installed
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        mine = [sockets[i] for i in share]
        for index, sock in enumerate(sockets):
            if index not in share:
                sock.close()
        apps = [build(i) for i in share]

        def say_ready(urls: list[str]) -> None:
            os.write(ready, json.dumps(urls).encode() + b"\n")

        run_fleet(apps, mine, settings, on_ready=say_ready)
    except BaseException:
        log.exception("fleet process %d (workers %d to %d) failed", os.getpid(), share.start, share.stop - 1)
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


def _await_ready(
    pipes: dict[int, int], shares: list[range], children: dict[int, int], stopping: Callable[[], bool]
) -> list[str] | None:
    """Every share's URLs, in order, once every child said its servers listen; None when a child exited first
    or a signal came (the supervisor then says why and stops the rest)."""
    urls: dict[int, list[str]] = {}
    buffers = dict.fromkeys(pipes, b"")
    with selectors.DefaultSelector() as selector:
        for read_end in pipes:
            selector.register(read_end, selectors.EVENT_READ)
        while len(urls) < len(shares) and not stopping():
            for key, _ in selector.select(timeout=_READY_POLL_SECONDS * 10):
                read_end = int(key.fd)
                chunk = os.read(read_end, 65536)
                if not chunk:  # the child exited before it was ready
                    return None
                buffers[read_end] += chunk
                if buffers[read_end].endswith(b"\n"):
                    urls[pipes[read_end]] = json.loads(buffers[read_end])
                    selector.unregister(read_end)
    if stopping():
        return None
    return [url for index in range(len(shares)) for url in urls[index]]


def _supervise(children: dict[int, int], stop: Callable[[], None], stopping: Callable[[], bool]) -> int:
    """Wait for every child; one that exits before the parent was signalled stops the rest. The exit status."""
    status = 0
    while children:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            break
        if children.pop(pid, None) is None:
            continue
        failed = not (os.WIFEXITED(code) and os.WEXITSTATUS(code) == 0)
        if not stopping():
            log.error("fleet process %d exited (%s) while serving: stopping the fleet", pid, _describe(code))
            status = 1
            stop()
        elif failed:
            log.error("fleet process %d exited (%s) while stopping", pid, _describe(code))
            status = 1
    return status


def _describe(code: int) -> str:
    if os.WIFSIGNALED(code):
        return f"killed by {signal.Signals(os.WTERMSIG(code)).name}"
    return f"exit status {os.WEXITSTATUS(code)}"


def _url(config: uvicorn.Config) -> str:
    host = str(config.host)
    scheme = "https" if config.is_ssl else "http"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{config.port}"


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (as uvicorn's "auto" picks), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()

"""Many apps in one process on one event loop, each on a socket of its own: how `tokenfront simulate` serves a
fleet of simulated workers.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

import uvicorn

from tokenfront.server.connection_limits import ConnectionLimits
from tokenfront.server.logs import adopt_library_handlers
from tokenfront.server.open_files import fit_open_file_limit
from tokenfront.server.process import DEFAULT_SHUTDOWN_TIMEOUT
from tokenfront.tls import ServerTls

__all__ = ["run_fleet"]

log = logging.getLogger(__name__)

# As `server.process`: after the shutdown timeout has cut what was in flight, the seconds uvicorn waits for the
# cut answers to go out before it cancels whatever is left.
_CUT_GRACE_SECONDS = 5.0
# How often the fleet looks whether every server is listening yet, while they start.
_READY_POLL_SECONDS = 0.05


def run_fleet(
    apps: Sequence[Any],
    sockets: Sequence[socket.socket],
    *,
    host: str,
    log_level: str,
    access_log: bool = False,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    connection_limits: ConnectionLimits | None = None,
    tls: ServerTls | None = None,
    on_ready: Callable[[list[str]], None] | None = None,
) -> None:
    """Serve `apps[i]` on `sockets[i]` (bound, not listening) until SIGTERM or SIGINT, all on one event loop.

    `connection_limits` bound every connection, `max_connections` counting those of all the servers (the
    defaults when None). `on_ready` is called with the base URLs, in the apps' order, once every server
    listens. Returns after every server has shut down gracefully (in-flight requests get `shutdown_timeout`
    seconds). `tls`: every server serves HTTPS with it (`tokenfront.tls`).
    """
    if len(apps) != len(sockets):
        raise ValueError(f"{len(apps)} apps for {len(sockets)} sockets: give one socket per app")
    # As in `server.process`: imported after the CLI's set-up (the torch guard).
    from tokenfront.server.http_protocol import bounded_protocol
    from tokenfront.server.middleware import RequestIdLayer

    limits = connection_limits or ConnectionLimits()
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

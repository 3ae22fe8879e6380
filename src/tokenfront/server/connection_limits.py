"""What one client connection may cost a server process, and how many it holds: the shared server flags
`--max-header-bytes`, `--max-headers`, `--header-timeout`, `--body-timeout`, `--keep-alive-timeout` and
`--max-connections` (enforced by `server.http_protocol`; the process's open-file limit is raised to fit them by
`server.open_files`).

This module imports nothing heavy: the CLI reads the defaults from it before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConnectionLimits"]


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds every connection of a server process is held to.

    The defaults: a request head (request line and headers, up to the blank line) of 64 KiB is far more than
    any client sends (browsers and HTTP libraries send a few KiB; nginx's default is 4 x 8 KiB), and 100 header
    lines is what Go's and Node's servers allow; 10 s for a head and 30 s without a byte of body are nginx's
    60 s defaults divided for a service whose clients sit next to it; 5 s idle on keep-alive is uvicorn's; 16,384
    connections per process is above the 10,000 idle connections the renderer is tested with.
    """

    # Bytes of one request head; more is a 431 and the connection closed, nothing above it buffered.
    max_header_bytes: int = 64 * 1024
    # Header lines in one request head; more is a 431.
    max_headers: int = 100
    # Seconds a request head may take: from the connection opening for its first request, from the head's
    # first byte for a later one on a keep-alive connection. Then a 408 (a connection that sent nothing is
    # just closed).
    header_timeout: float = 10.0
    # Seconds a request body may go without a byte arriving (while the server is reading it): then a 408, the
    # connection closed and the handler waiting on the body told the client disconnected.
    body_timeout: float = 30.0
    # Seconds a keep-alive connection may sit idle between requests before it is closed (uvicorn's timer).
    keep_alive_timeout: float = 5.0
    # Open connections per server process. At the cap a new connection first reclaims the connection that has
    # waited longest without a request in progress; when every one has a request in progress it is answered
    # 503 and closed.
    max_connections: int = 16384

"""The process's open-file limit (RLIMIT_NOFILE), raised at start-up to what `--max-connections` needs.

Every client connection is a file descriptor. Linux's usual soft limit (1024) would stop a server near 1,000
connections: past it `accept` fails (EMFILE) and new clients wait in the backlog instead of being answered.
A process may raise its soft limit up to its hard limit without privileges, so the server does that once,
before the pre-fork children are forked (they inherit it). When even the hard limit is below what
`--max-connections` needs, the connection cap is lowered to what fits, and a warning says so once.
"""

from __future__ import annotations

import logging
import resource

__all__ = ["RESERVED_FILES", "fit_open_file_limit"]

log = logging.getLogger(__name__)

# Descriptors a server needs besides its client connections: the checkpoint's files, logs, the metrics
# files of `--workers N`, the router's connections to its workers and its event subscriptions, the render
# thread's and the loop's own. Generous: descriptors cost nothing until used.
RESERVED_FILES = 1024


def fit_open_file_limit(max_connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (never lowering it; when the hard limit is unlimited, to
    what `max_connections` client connections plus `RESERVED_FILES` need), and return how many client
    connections the limit then holds: `max_connections`, or fewer (with one warning that names the fix) when
    the hard limit is too low."""
    wanted = max_connections + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        # Up to the hard limit, not just to `wanted`: the router's connections to its workers (up to
        # --max-connections-per-worker each, workers added at runtime) need descriptors too.
        target = max(wanted, soft) if hard == resource.RLIM_INFINITY else hard
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError) as exc:  # a sandbox or platform that refuses it
                log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fits = max(soft // 2, soft - RESERVED_FILES)  # a small limit keeps half for the server itself
    log.warning(
        "the open-file limit is %d (hard limit %s): with %d descriptors kept for the server itself it holds %d "
        "client connections, fewer than --max-connections %d, so connections are capped at %d. Raise the hard "
        "limit (ulimit -Hn, systemd LimitNOFILE=, docker run --ulimit nofile=) to serve more",
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
        soft - fits,
        fits,
        max_connections,
        fits,
    )
    return fits

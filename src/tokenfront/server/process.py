"""Running an app as a server process: uvicorn, with a clean exit after a graceful shutdown."""

from __future__ import annotations

import signal
import sys
from typing import Any

GRACEFUL_SHUTDOWN_SECONDS = 30


def run_server(app: Any, *, host: str, port: int, log_level: str) -> None:
    """Serve `app` until SIGTERM or SIGINT; in-flight requests finish before the process exits.

    uvicorn re-raises the signal that stopped it once its shutdown is done, which would make a finished,
    graceful shutdown look like a kill (exit -15) to supervisors; SIGTERM then exits with status 0.
    """
    import uvicorn

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvicorn.run(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS
    )

"""SIGHUP on a router: read its files again now (docs/operations.md, "Several models"; docs/worker-sources.md).

Two parts of a router follow files: the worker sources (`--worker-file`, `--worker-dns`: `router.worker_sources`)
and the models of `--config` (`router.config_reload`). Each reads its files on its own interval, and SIGHUP
asks every one of them to read now: one signal handler, installed on the event loop while the app serves, calls
each part's `reload`. A router that follows no file installs none, so SIGHUP ends it, as it ends any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Sequence

__all__ = ["Hangup"]

log = logging.getLogger(__name__)


class Hangup:
    """The router's SIGHUP handler: each of `readers` (a part's `reload`, which must not block) is called."""

    def __init__(self, readers: Sequence[Callable[[], None]]) -> None:
        self.readers = tuple(readers)
        self._installed = False

    def install(self) -> None:
        """Handle SIGHUP on the running loop (nothing to do without readers). Where SIGHUP cannot be handled (an
        app run off the main thread, by a test client), the parts still read on their intervals."""
        if not self.readers:
            return
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.fire)
            self._installed = True
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            log.debug("SIGHUP is not available here: the files are read on their intervals only")

    def fire(self) -> None:
        """What SIGHUP does: every reader asked to read now."""
        for reader in self.readers:
            reader()

    def remove(self) -> None:
        """Stop handling SIGHUP."""
        if self._installed:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._installed = False

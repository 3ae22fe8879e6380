"""Progress of long work: fixture downloads and conversions, the worker's model load.

One reporter, two faces. On a terminal it is a bar redrawn in place (tqdm, on stderr). Anywhere else (a pipe,
a log file, CI) it is plain lines, at a bounded rate so a log stays readable::

    fetching smollm2: 0.0 kB of 92.9 MB (0%)
    fetching smollm2: 9.4 MB of 92.9 MB (10%)
    ...

A plain line is written when the work starts (if its size is known), each time it crosses another tenth of
its size (at most one a second), and every `quiet_interval` seconds when nothing else was said, so a stalled
transfer or a step that takes long still shows its time. A transfer of known size therefore writes at most
a dozen lines plus one per `quiet_interval` seconds, however many updates it makes.

`Progress.close(message)` ends either face with one summary line (`model loaded in 2.1 s (538.1 MB)`).
Updates may come from another thread (a subprocess reader) than ticks and close.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any

__all__ = ["BYTES", "Progress", "format_bytes", "is_terminal"]

# The unit of a transfer: counts are shown as sizes (`12.3 MB of 270.1 MB`).
BYTES = "bytes"


def format_bytes(size: float) -> str:
    """A size as tokenfront's messages write it: `12.3 MB`, or `45.6 kB` below 100 kB."""
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def is_terminal(stream: IO[str]) -> bool:
    """Whether `stream` is a terminal a bar can be redrawn on (not a pipe, a file, or a `TERM=dumb` one)."""
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _terminal_size(stream: IO[str]) -> tuple[int, int]:
    """The columns and lines of the terminal `stream` writes to; zeros when it reports none."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return 0, 0
    return size.columns, size.lines


class Progress:
    """The progress of one long task, on stderr: a bar on a terminal, plain lines otherwise.

    `label` starts every line (`fetching smollm2`). `total` is the size of the work when known (it may
    also come later, with `update`); `unit` is `BYTES` or a noun for counted items (`"tensors"`,
    `"steps"`). `emit` writes a plain line (default: to `stream`, stderr); the worker passes its logger, so
    the lines are log records. `bar` forces a face (default: a bar when `stream` is a terminal). `clock`,
    `min_interval` and `quiet_interval` set the pace of plain lines (see the module doc).
    """

    def __init__(
        self,
        label: str,
        *,
        total: float | None = None,
        unit: str = BYTES,
        stream: IO[str] | None = None,
        emit: Callable[[str], Any] | None = None,
        bar: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_interval: float = 1.0,
        quiet_interval: float = 15.0,
    ) -> None:
        self.label = label
        self.unit = unit
        self.total = total or None
        self.done: float = 0
        self.note: str | None = None
        self._stream = stream if stream is not None else sys.stderr
        self._emit = emit if emit is not None else self._write
        self._clock = clock
        self._min_interval = min_interval
        self._quiet_interval = quiet_interval
        self._started = clock()
        self._last_line: float | None = None  # when the last plain line was written
        self._last_tenth = -1
        self._last_draw = float("-inf")
        self._closed = False
        self._lock = threading.Lock()
        self._bar = self._make_bar() if (is_terminal(self._stream) if bar is None else bar) else None

    # ------------------------------------------------------------------ reporting

    def update(self, done: float, *, total: float | None = None, note: str | None = None) -> None:
        """Set how much is done (and the total, and a note on what is happening now, when they change)."""
        with self._lock:
            if self._closed:
                return
            if total:
                self.total = total
            if note is not None:
                self.note = note
            self.done = done
            self._show()

    def advance(self, amount: float = 1) -> None:
        """Count `amount` more done."""
        with self._lock:
            done = self.done + amount
        self.update(done)

    def tick(self) -> None:
        """Nothing new was counted: let the time show (a plain line after a quiet spell, the bar's clock)."""
        with self._lock:
            if not self._closed:
                self._show()

    def close(self, message: str | None = None) -> None:
        """End the report: clear the bar, then write `message` (a summary line) if given. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._bar is not None:
                self._bar.close()
        if message:
            self._emit(message)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()  # no summary: whoever failed says why

    # ------------------------------------------------------------------ what a line says

    def describe(self, *, elapsed: bool = False) -> str:
        """The plain line for the current state: `fetching smollm2: 12.3 MB of 270.1 MB (4%)`, then the
        note, then (with `elapsed`, or when nothing is counted) the time taken so far."""
        parts = []
        if self.total:
            percent = min(100, int(100 * self.done / self.total))
            if self.unit == BYTES:
                parts.append(f"{format_bytes(self.done)} of {format_bytes(self.total)} ({percent}%)")
            else:
                parts.append(f"{self.done:.0f} of {self.total:.0f} {self.unit} ({percent}%)")
        elif self.done:
            parts.append(format_bytes(self.done) if self.unit == BYTES else f"{self.done:.0f} {self.unit}")
        if self.note:
            parts.append(self.note)
        if elapsed or not parts:
            parts.append(f"{self._clock() - self._started:.0f} s so far")
        return f"{self.label}: {', '.join(parts)}"

    # ------------------------------------------------------------------ the two faces

    def _show(self) -> None:
        if self._bar is not None:
            self._draw(self._bar)
            return
        now = self._clock()
        tenth = self._tenth()
        if self._line_due(now, tenth):
            # A line without a new tenth to tell is a line about time: it says how long it has taken.
            quiet = self._last_line is not None and (tenth is None or tenth <= self._last_tenth)
            self._last_line = now
            self._last_tenth = tenth if tenth is not None else -1
            self._emit(self.describe(elapsed=quiet))

    def _tenth(self) -> int | None:
        return int(10 * self.done / self.total) if self.total else None

    def _line_due(self, now: float, tenth: int | None) -> bool:
        if self._last_line is None:
            # The first line: at once when the size is known, else once the work has taken a while.
            return tenth is not None or now - self._started >= self._quiet_interval
        since = now - self._last_line
        if since < self._min_interval:
            return False
        return (tenth is not None and tenth > self._last_tenth) or since >= self._quiet_interval

    def _write(self, line: str) -> None:
        print(line, file=self._stream, flush=True)

    def _make_bar(self) -> Any:
        from tqdm import tqdm  # only on a terminal

        columns, lines = _terminal_size(self._stream)
        return tqdm(
            total=self.total,
            desc=self.label,
            file=self._stream,
            leave=False,  # the summary line replaces it
            # A terminal that reports no size (a fresh pty) would get no bar at all: assume 80x24.
            ncols=columns or 80,
            nrows=lines or 24,
            dynamic_ncols=bool(columns and lines),
            bar_format=None if self.total else "{desc}: {elapsed}",
            **self._bar_units(),
        )

    def _bar_units(self) -> dict[str, Any]:
        if self.unit == BYTES:
            return {"unit": "B", "unit_scale": True, "unit_divisor": 1000}
        return {"unit": f" {self.unit}"}

    def _draw(self, bar: Any) -> None:
        now = self._clock()
        finished = self.total is not None and self.done >= self.total
        if now - self._last_draw < 0.1 and not finished:
            return  # a redraw per chunk of a download would cost more than the download
        self._last_draw = now
        if self.total != bar.total or (bar.bar_format and self.done):
            bar.total = self.total
            bar.bar_format = None  # something to count now: tqdm's own bar, rate and time left
        bar.n = self.done
        if self.note is not None:
            bar.set_postfix_str(self.note, refresh=False)
        bar.refresh()

"""Log lines, for every command: text (one line a record, as always) or JSON (one object a line).

`--log-format json` writes each record as one JSON object on one line of stderr:

    {"time": "2025-01-01T12:00:00.123Z", "level": "info", "logger": "tokenfront.access",
     "message": "POST /v1/chat/completions/render 200 2.1 ms", "request_id": "…", …}

`time` (UTC, milliseconds), `level` (lower case), `logger` and `message` are on every line; `request_id` on
every line written while a request is answered (`server.request_ids`); then the structured fields a record
carries (`extra=`: the access line's `method`, `path`, `status`, `duration_ms`, `client`; the router's gate
warnings' `forwarding`, `blocking`, `router_reasons`), and `exception` (the traceback, inside the one line).
Text lines keep the format they always had, and end with `request_id=…` when written during a request.

A text line is one line whatever a message holds: the message's control characters (CR, LF, ESC, NUL, ...,
and the Unicode line and paragraph separators) are written escaped (`\\n`, `\\r`, `\\x1b`, `\\u2028`), so a
value from a client or a worker (a request path, a worker's model names) can never start a line that looks
like one of the server's own. `EscapedText` does it at the handler: the root handler's `TextFormatter`, and
in text mode the handlers uvicorn and transformers bring (`adopt_library_handlers`). A traceback, which is
our own code's and comes after the message, is printed as it is. JSON lines escape in the JSON already.

In JSON mode the lines of libraries that bring their own stderr handler (uvicorn, transformers) are routed to
the one JSON handler (`adopt_library_handlers`), Python warnings become records, an uncaught exception is a
record too, and the hub's and transformers' progress bars are off: every line of a JSON-mode server's stderr
parses as JSON.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import sys
import threading
import time
from types import TracebackType
from typing import Any

from tokenfront.server.request_ids import current_request_id

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "TEXT_FORMAT",
    "EscapedText",
    "JsonFormatter",
    "TextFormatter",
    "adopt_library_handlers",
    "configure_logging",
    "escape_control_characters",
    "json_logging",
]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every LogRecord has: anything else on a record was given with `extra=` and goes into the JSON line.
# `color_message` is uvicorn's coloured copy of the message; `request_id` is placed by the formatter itself.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
    "request_id",
}


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line: time, level, logger, message, request_id, extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _utc_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or current_request_id()
        if request_id is not None:
            line["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and key not in line and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # ASCII only: a line stays valid UTF-8 whatever a message holds (a lone surrogate, say).
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, with ` request_id=…` at the end of the line when written during a request."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        request_id = current_request_id()
        return f"{text} request_id={request_id}" if request_id is not None else text


# What could end or rewrite a line on a terminal or in a log file: C0 and C1 control characters, DEL, and
# the Unicode line and paragraph separators (some viewers break lines there).
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED_ESCAPES.get(char) or char.encode("unicode_escape").decode("ascii")


def escape_control_characters(text: str) -> str:
    """`text` with every control character written as its escape (a newline as the two characters `\\n`)."""
    return _CONTROL_CHARACTERS.sub(_escaped, text)


class EscapedText(logging.Formatter):
    """A text formatter around another one (`inner`): the record's message is escaped
    (`escape_control_characters`) before `inner` lays out the line, so the message is never more than one
    line; the traceback `inner` appends after it is kept as it is.
    """

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if _CONTROL_CHARACTERS.search(message) is None:  # nearly every line: formatted as it is
            return self.inner.format(record)
        safe = copy.copy(record)  # the record goes on to other handlers as it was
        safe.msg, safe.args = escape_control_characters(message), None
        # uvicorn's coloured copy of the message would be formatted instead of `msg`: the plain one wins.
        safe.__dict__.pop("color_message", None)
        return self.inner.format(safe)


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """Set up the root logger for a command: `level` (debug, info, warning, error) and `log_format` (text or
    json), on stderr. Leaves a root logger that already has handlers as it is, like `logging.basicConfig`."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else EscapedText(TextFormatter()))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if log_format == "json":
        logging.captureWarnings(True)  # `warnings.warn` prints to stderr otherwise
        # Progress bars (transformers' "Loading weights", the hub's downloads) are no log lines: off, unless the
        # operator asked for them. Read when huggingface_hub is imported, which is later.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
        adopt_library_handlers()


def json_logging() -> bool:
    """Whether the root logger writes JSON lines (`configure_logging` with `json`)."""
    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)


def adopt_library_handlers() -> None:
    """Bring the handlers libraries add for stderr or stdout (uvicorn's, and transformers' when it is
    imported) under the server's rules: in JSON mode their loggers' records go to the root logger's JSON
    handler instead; in text mode they keep their own lines, with the message escaped (`EscapedText`).

    Called when logging is set up and again just before a server starts serving, after uvicorn has set up its
    loggers and the libraries that load the checkpoint were imported.
    """
    escape_only = not json_logging()
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger):
            continue
        streams = [
            h for h in logger.handlers if type(h) is logging.StreamHandler and h.stream in _STANDARD_STREAMS
        ]
        for handler in streams:
            if not escape_only:
                logger.removeHandler(handler)
            elif not isinstance(handler.formatter, EscapedText):
                handler.setFormatter(EscapedText(handler.formatter))
        if streams and not escape_only:
            logger.propagate = True


_STANDARD_STREAMS = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)


def _utc_time(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def _log_uncaught(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, traceback)
        return
    logging.getLogger("tokenfront").critical("uncaught exception", exc_info=(kind, value, traceback))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    thread = args.thread.name if args.thread is not None else "?"
    logging.getLogger("tokenfront").critical(
        "uncaught exception in thread %s",
        thread,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )

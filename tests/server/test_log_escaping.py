"""Text log lines are one line whatever a message holds (server/logs.py `EscapedText`): the message's control
characters escaped, the traceback after it kept as it is, on the root handler and on the handlers uvicorn and
transformers bring (`adopt_library_handlers`). A real router's log under forged input from a client and a
worker is tests/router/test_router_log_escaping.py.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest
from uvicorn.logging import DefaultFormatter

from tokenfront.server.logs import (
    EscapedText,
    TextFormatter,
    adopt_library_handlers,
    escape_control_characters,
    json_logging,
)

FORGED = "2031-01-01 00:00:00,000 CRITICAL tokenfront: forged"


def test_every_control_character_is_escaped_and_the_rest_kept() -> None:
    cases = {
        "a\nb": "a\\nb",
        "a\r\nb": "a\\r\\nb",
        "tab\there": "tab\\there",
        "nul\x00 esc\x1b[2K del\x7f": "nul\\x00 esc\\x1b[2K del\\x7f",
        "c1\x85 line\u2028para\u2029": "c1\\x85 line\\u2028para\\u2029",
        "caf\u00e9 \u4e2d \\n": "caf\u00e9 \u4e2d \\n",  # text, and a backslash already there, as they are
        "": "",
    }
    assert {text: escape_control_characters(text) for text in cases} == cases
    assert len(cases) == 7
    assert all("\n" not in escape_control_characters(chr(code)) for code in range(0x110000))


def _lines(formatter: logging.Formatter, message: str, *args: object, failing: bool = False) -> list[str]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("tokenfront.test_log_escaping")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        if failing:
            try:
                raise ValueError("boom")
            except ValueError:
                logger.exception(message, *args)
        else:
            logger.warning(message, *args)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue().splitlines()


def test_a_message_is_one_line_and_a_traceback_follows_as_it_is() -> None:
    (line,) = _lines(EscapedText(TextFormatter()), "worker %s: names %s", "http://w", f"a\n{FORGED}")
    assert line.endswith(f"WARNING tokenfront.test_log_escaping: worker http://w: names a\\n{FORGED}")
    first, *traceback = _lines(EscapedText(TextFormatter()), "failed for %s", f"x\n{FORGED}", failing=True)
    assert first.endswith(f"ERROR tokenfront.test_log_escaping: failed for x\\n{FORGED}")
    assert traceback[0] == "Traceback (most recent call last):" and traceback[-1] == "ValueError: boom"
    # Nothing to escape: the inner formatter's line, unchanged (the same record, so the same time).
    record = logging.makeLogRecord(
        {"name": "tokenfront.x", "levelname": "INFO", "msg": "plain %d", "args": (7,)}
    )
    assert EscapedText(TextFormatter()).format(record) == TextFormatter().format(record)
    assert TextFormatter().format(record).endswith(" INFO tokenfront.x: plain 7")


@pytest.fixture
def library_logger() -> Iterator[logging.Logger]:
    """A logger with its own stderr handler, as uvicorn's text config sets up (coloured, as on a terminal);
    every handler's formatter in the process is put back afterwards."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]
    formatters = [(handler, handler.formatter) for handler in handlers]
    logger = logging.getLogger("tokenfront.test_log_escaping.library")
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=True))
    logger.addHandler(handler)
    yield logger
    logger.removeHandler(handler)
    for other, formatter in formatters:
        other.setFormatter(formatter)


def test_library_handlers_are_escaped_in_text_mode(library_logger: logging.Logger) -> None:
    assert not json_logging()  # pytest's handlers: text mode
    adopt_library_handlers()
    adopt_library_handlers()  # again, as the server does before it serves: wrapped once
    (handler,) = library_logger.handlers
    assert isinstance(handler.formatter, EscapedText) and isinstance(
        handler.formatter.inner, DefaultFormatter
    )
    record = library_logger.makeRecord(
        library_logger.name,
        logging.WARNING,
        __file__,
        0,
        "client sent %s",
        (f"x\n{FORGED}",),
        None,
        extra={"color_message": "client sent \x1b[1m%s\x1b[0m"},
    )
    line = handler.format(record)
    assert "\n" not in line and f"client sent x\\n{FORGED}" in line
    assert line.startswith("\x1b[33mWARNING\x1b[0m:")  # uvicorn's coloured level is its own, and kept
    plain = handler.format(
        library_logger.makeRecord(library_logger.name, logging.INFO, __file__, 0, "ok", (), None)
    )
    assert plain.endswith(" ok")

"""The value types of the command line's flags (a port, a positive number, a fraction, ...) and the checks of a
flag's value every command shares (an API key that names a file by mistake): each an argparse `type` or a
start-up check that answers a mistake in one line."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenfront.core.errors import TokenfrontError

if TYPE_CHECKING:
    pass

log = logging.getLogger("tokenfront")


def float_between(low: float, high: float = float("inf"), *, low_inclusive: bool = True) -> Any:
    """An argparse type: a float in [low, high] (or (low, high] when `low_inclusive` is false)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
        above = value >= low if low_inclusive else value > low
        if not (above and value <= high):
            bound = f"must be at least {low:g}" if low_inclusive else f"must be more than {low:g}"
            raise argparse.ArgumentTypeError(bound + (f" and at most {high}" if high != float("inf") else ""))
        return value

    return parse


non_negative_float = float_between(0)


positive_float = float_between(0, low_inclusive=False)


fraction = float_between(0, 1)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from exc
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port: give 1 to 65535 (0: any free port)")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def check_api_key(key: str | None, option: str, env: str) -> None:
    """An API key must be something a client can send: not empty, printable ASCII without spaces. The key
    itself is never shown."""
    if key is None:
        return
    source = f"{option} (or ${env})"
    if not key.strip():
        raise TokenfrontError(f"{source} is empty: give a key, or unset it to serve without one")
    bad = next((index for index, char in enumerate(key) if not "!" <= char <= "~"), None)
    if bad is not None:
        raise TokenfrontError(
            f"{source} has a character that cannot be sent in an Authorization header at position {bad + 1} "
            "(whitespace, a control character or non-ASCII; a key read from a file may end with a newline)"
        )


def names_local_path(value: str) -> bool:
    """Whether --model / --tokenizer names a local path rather than a hub id (as `resolve_folder` tells them)."""
    return Path(value).expanduser().exists() or value.startswith((".", "/", "~")) or value.count("/") > 1

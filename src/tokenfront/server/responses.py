"""JSON in and out, fast: orjson where it can, the standard library where orjson cannot (integers beyond 64 bits).

Every server answers through these, so a body is parsed once and a response is encoded once, without the
standard library's slower encoder on the hot path.

A request body is parsed with `loads_request`, which takes exactly what can be answered: JSON text (RFC 8259)
in UTF-8 without a byte order mark, whose strings are Unicode text (a render answer echoes the body's bytes, so
a body in another encoding would make an answer that is not JSON). What the standard library's parser also
takes — `NaN`, `Infinity`, numbers too large for a double, and lone surrogates (`"\\ud800"`) — could not be
encoded again (in the echo of a render answer, in an error message, in a forwarded body), so it is refused there
with the field named.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from typing import Any

import orjson
from starlette.responses import Response

__all__ = ["JSONBytesResponse", "RequestJSONError", "dumps", "loads", "loads_request"]


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (non-ASCII written as is, like `json.dumps(..., ensure_ascii=False)`)."""
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        # orjson refuses integers beyond 64 bits (a client may send one in chat_template_kwargs).
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def loads(data: bytes | str) -> Any:
    """Parse JSON; ValueError (with the parser's reason) when it is not JSON.

    Lenient, for answers from peers (workers, vLLM): see `loads_request` for a client's body.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:  # orjson refuses integers beyond 64 bits, which JSON allows
            return json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ValueError(str(exc)) from None


class RequestJSONError(ValueError):
    """A request body that is not JSON tokenfront can answer; `param` names the field (None: the body)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class _NonFinite:
    """Stands for a `NaN` / `Infinity` literal, or a number beyond a double, until its field is found."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _number(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def loads_request(data: bytes) -> Any:
    """A client's JSON body, parsed; `RequestJSONError` naming the field when it is not JSON that can be
    answered (see the module doc), ValueError with the parser's reason when it is not JSON at all."""
    try:
        return orjson.loads(data)  # strict: UTF-8 only, no BOM, NaN, Infinity or lone surrogates
    except orjson.JSONDecodeError as exc:
        reason = str(exc)
    encoding = _not_utf8(data)
    if encoding is not None:
        # The standard library would decode it, and the answer would echo bytes that are not UTF-8 JSON.
        raise RequestJSONError(
            f"the request body is {encoding}: send JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)"
        )
    # What orjson refuses that JSON allows: integers beyond 64 bits, nesting beyond 1024 levels. The standard
    # library parses those, and also what JSON does not allow: found below, by field.
    try:
        # As `json.loads(bytes)` decodes UTF-8: an encoded lone surrogate is read, to be named by its field below.
        text = data.decode("utf-8", "surrogatepass")
        value = json.loads(text, parse_constant=_NonFinite, parse_float=_number)
    except RecursionError:
        raise RequestJSONError("the request body is nested too deeply to parse") from None
    except (ValueError, UnicodeDecodeError):
        raise ValueError(reason) from None
    problem = _first_unanswerable(value)
    if problem is not None:
        raise RequestJSONError(*problem)
    return value


def _not_utf8(data: bytes) -> str | None:
    """What a body that is not UTF-8 JSON is encoded as (by its byte order mark, or by the zero bytes that its
    first ASCII characters leave in UTF-16 and UTF-32, as `json.detect_encoding` reads them), else None."""
    if data.startswith(codecs.BOM_UTF8):
        return "UTF-8 with a byte order mark"
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        return "UTF-32 (it starts with a byte order mark)"
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "UTF-16 (it starts with a byte order mark)"
    # JSON text starts with an ASCII character, and UTF-8 JSON holds no zero byte at all.
    head = data[:4]
    if len(data) % 4 == 0 and len(head) == 4 and b"\x00\x00\x00" in (head[:3], head[1:]):
        return "UTF-32"
    if len(data) % 2 == 0 and len(head) >= 2 and 0 in (head[0], head[1]):
        return "UTF-16"
    return None


def _first_unanswerable(value: Any) -> tuple[str, str | None] | None:
    """(message, param) of the first value (in document order) that JSON text cannot carry, or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        where = path or "the request body"
        if isinstance(item, _NonFinite):
            return (
                f"{where} is {item.text}, which is not a JSON number: send a finite number "
                "(JSON has no NaN or Infinity, and a number must fit in a double)",
                path or None,
            )
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return _surrogate_message(f"{where} contains", item), path or None
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                if _SURROGATE.search(key):
                    owner = (
                        f"{where} has a key that contains"
                        if path
                        else "the request body has a key containing"
                    )
                    return _surrogate_message(owner, key), path or None
                children.append((f"{path}.{key}" if path else key, child))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(f"{path}[{index}]", child) for index, child in enumerate(item)]))
    return None


def _surrogate_message(subject: str, text: str) -> str:
    found = _SURROGATE.search(text)
    assert found is not None
    return (
        f"{subject} a lone surrogate ({ascii(found.group())[1:-1]}), which is not Unicode text: write a "
        "character beyond U+FFFF as a surrogate pair (e.g. \\ud83d\\ude00) or as UTF-8"
    )


class JSONBytesResponse(Response):
    """A JSON response encoded with `dumps`; `content` may also be JSON bytes already encoded."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        return dumps(content)

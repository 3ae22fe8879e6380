"""Assertions the renderer's HTTP tests share."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

RENDER_KEYS = [
    "schema_version",
    "kind",
    "request_id",
    "token_ids",
    "model",
    "reasoning_ended",
    "reasoning_parser_kwargs",
    "cache_salt",
    "request",
]
ERROR_KEYS = {"message", "type", "param", "code"}


def _pairs(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return pairs


def raw_keys(text: str) -> list[str]:
    """Top-level keys of a JSON object in the order they appear in the raw text."""
    return [key for key, _ in json.loads(text, object_pairs_hook=_pairs)]


def raw_item_keys(text: str) -> list[list[str]]:
    """Keys of every object of a top-level JSON list, in raw order."""
    return [[key for key, _ in item] for item in json.loads(text, object_pairs_hook=_pairs)]


def metric_value(text: str, name: str, labels: str) -> float:
    """The value of one Prometheus sample (0 when it has not been created yet)."""
    pattern = re.compile(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", re.MULTILINE)
    match = pattern.search(text)
    return float(match.group(1)) if match else 0.0


def assert_error(
    response: httpx.Response,
    status: int,
    *,
    param: str | None = None,
    code: str | None = None,
    contains: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The response is the OpenAI error object with this status (and param/code/message text when given)."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert list(body) == ["error"], body
    error = body["error"]
    assert set(error) == ERROR_KEYS, error
    assert isinstance(error["message"], str) and len(error["message"]) > 10, error
    assert isinstance(error["type"], str) and error["type"], error
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    for text in contains:
        assert text.lower() in error["message"].lower(), (text, error["message"])
    return error

"""The render answers, as the client returns them, and the worker request each one becomes.

A render answer is the envelope `{"schema_version", "kind", "request_id", "token_ids", "model",
"reasoning_ended", "reasoning_parser_kwargs", "cache_salt", "request"}`; `request` is the original body (for a
completions item, with that item's own prompt). What goes to the worker is the reference recipes' body:

- chat: `request` plus `prompt_token_ids` — except with a named `tool_choice`, where the worker must render the
  prompt itself (it appends the tool-call parser's forced-call prefix) and refuses ids with a 400: then
  `request` as it is;
- completions: `request` with the item's ids as its `prompt`, one `/v1/completions` request per item.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tokenfront.client._exceptions import InvalidResponseError

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "SCHEMA_VERSION", "RenderedChat", "RenderedCompletion"]

SCHEMA_VERSION = 1
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True, kw_only=True)
class _Rendered:
    """The fields every render answer carries, in the envelope's order (`kind` is the class's)."""

    kind: ClassVar[str]
    worker_path: ClassVar[str]

    schema_version: int = SCHEMA_VERSION
    request_id: str
    token_ids: list[int]
    model: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    request: dict[str, Any]

    @property
    def stream(self) -> bool:
        """Whether the original request asks for a stream (`"stream": true`)."""
        return bool(self.request.get("stream"))

    @classmethod
    def _from_json(cls, data: Any, *, url: str) -> Any:
        if not isinstance(data, dict):
            raise InvalidResponseError(
                f"expected a render answer (a JSON object), got {_kind_of(data)}", url=url
            )
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise InvalidResponseError(
                f"the render answer has schema_version {version!r}; this client reads {SCHEMA_VERSION}",
                url=url,
            )
        if data.get("kind") != cls.kind:
            raise InvalidResponseError(
                f"expected a render answer of kind {cls.kind!r}, got {data.get('kind')!r}", url=url
            )
        token_ids, request = data.get("token_ids"), data.get("request")
        if not isinstance(token_ids, list) or not all(type(i) is int for i in token_ids):
            raise InvalidResponseError("the render answer's token_ids is not a list of integers", url=url)
        if not isinstance(request, dict):
            raise InvalidResponseError("the render answer's request is not a JSON object", url=url)
        return cls(
            request_id=str(data.get("request_id")),
            token_ids=token_ids,
            request=request,
            model=data.get("model"),
            reasoning_ended=data.get("reasoning_ended"),
            reasoning_parser_kwargs=data.get("reasoning_parser_kwargs"),
            cache_salt=data.get("cache_salt"),
            schema_version=version,
        )


@dataclass(frozen=True, kw_only=True)
class RenderedChat(_Rendered):
    """The answer of `POST /v1/chat/completions/render`: one chat request rendered into its prompt ids."""

    kind: ClassVar[str] = "chat"
    worker_path: ClassVar[str] = CHAT_PATH

    @property
    def named_tool_choice(self) -> bool:
        """Whether the request forces one function (`tool_choice: {"type": "function", "function": {...}}`).

        Any object `tool_choice` is the named form; the strings ("none", "auto", "required") are not.
        """
        return isinstance(self.request.get("tool_choice"), dict)

    @property
    def sends_token_ids(self) -> bool:
        """Whether `worker_body()` carries the ids (False only for a named tool_choice)."""
        return not self.named_tool_choice

    def worker_body(self) -> dict[str, Any]:
        """The body for the worker's `/v1/chat/completions`: the request plus `prompt_token_ids`, or the request
        as it is when it has a named tool_choice (a worker refuses ids with one)."""
        if self.named_tool_choice:
            return dict(self.request)
        return {**self.request, "prompt_token_ids": list(self.token_ids)}

    @classmethod
    def from_json(cls, data: Any, *, url: str = "") -> RenderedChat:
        """Read a chat render answer (decoded JSON); `InvalidResponseError` when it is not one."""
        rendered: RenderedChat = cls._from_json(data, url=url)
        return rendered


@dataclass(frozen=True, kw_only=True)
class RenderedCompletion(_Rendered):
    """One item of the answer of `POST /v1/completions/render`: one prompt of a completions request rendered;
    `request` is the original body with `prompt` set to this item's own prompt."""

    kind: ClassVar[str] = "completion"
    worker_path: ClassVar[str] = COMPLETIONS_PATH

    @property
    def sends_token_ids(self) -> bool:
        """Always True: a completions item always goes as its ids."""
        return True

    def worker_body(self) -> dict[str, Any]:
        """The body for the worker's `/v1/completions`: the item's request with its ids as the `prompt`."""
        return {**self.request, "prompt": list(self.token_ids)}

    @classmethod
    def from_json(cls, data: Any, *, url: str = "") -> RenderedCompletion:
        """Read one completions render item (decoded JSON); `InvalidResponseError` when it is not one."""
        rendered: RenderedCompletion = cls._from_json(data, url=url)
        return rendered

    @classmethod
    def list_from_json(cls, data: Any, *, url: str = "") -> list[RenderedCompletion]:
        """Read a completions render answer: a list with one item per prompt."""
        if not isinstance(data, list) or not data:
            raise InvalidResponseError(
                f"expected a completions render answer (a non-empty list), got {_kind_of(data)}", url=url
            )
        return [cls.from_json(item, url=url) for item in data]


def _kind_of(data: Any) -> str:
    if data == []:
        return "an empty list"
    names: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
    return names.get(type(data), type(data).__name__)

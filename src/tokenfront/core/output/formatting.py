"""OpenAI response shapes of parsed output: one chat and one completion formatter, whole and streamed.

A formatter turns `OutputDelta`s (and the sampled tokens behind them, for logprobs) into the JSON objects
of `/v1/chat/completions` and `/v1/completions`: the whole answer, or the chunks of a stream (a first chunk
per choice, one per delta, a usage chunk). Everything that answers in OpenAI form from generated ids uses
these, so a worker answering directly and a router derendering a worker's ids answer alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tokenfront.core.output.choice import OutputDelta

__all__ = [
    "AnswerHead",
    "ChatFormatter",
    "CompletionFormatter",
    "FinishedChoice",
    "ResponseFormatter",
    "SampledToken",
    "chat_logprobs",
    "completion_logprobs",
    "usage",
]

# JSON has no -inf; a token the grammar forbade gets this instead, as vLLM does.
_MIN_LOGPROB = -9999.0

TokenText = Callable[[int], str]


class SampledToken(Protocol):
    """A generated token with its log-probability and the most likely alternatives (`(id, logprob)`)."""

    @property
    def token_id(self) -> int: ...

    @property
    def logprob(self) -> float | None: ...

    @property
    def top_logprobs(self) -> Sequence[tuple[int, float]] | None: ...


def _logprob(value: float | None) -> float:
    return max(float(value), _MIN_LOGPROB) if value is not None else _MIN_LOGPROB


def chat_logprobs(tokens: Sequence[SampledToken], token_text: TokenText) -> dict[str, Any]:
    """Chat `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}`, one per token."""

    def entry(token_id: int, logprob: float | None) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": _logprob(logprob), "bytes": list(text.encode("utf-8"))}

    content = []
    for token in tokens:
        item = entry(token.token_id, token.logprob)
        item["top_logprobs"] = [entry(i, lp) for i, lp in token.top_logprobs or ()]
        content.append(item)
    return {"content": content}


def completion_logprobs(
    tokens: Sequence[SampledToken], token_text: TokenText, *, text_offset: int = 0
) -> tuple[dict[str, Any], int]:
    """Completions `logprobs` (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`), and the next offset.

    Offsets are where each token's text starts in the choice's text, counting the tokens' own texts (as
    vLLM does); `text_offset` is where the first one starts (after an echoed prompt, after earlier chunks).
    """
    texts, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token in tokens:
        text = token_text(token.token_id)
        texts.append(text)
        token_logprobs.append(_logprob(token.logprob))
        top_logprobs.append({token_text(i): _logprob(lp) for i, lp in token.top_logprobs or ()} or None)
        offsets.append(text_offset)
        text_offset += len(text)
    body = {"tokens": texts, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs}
    return {**body, "text_offset": offsets}, text_offset


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The `usage` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def vllm_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """vLLM's `UsageInfo` as it dumps it, without details (derender and the generate route answer in it)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


@dataclass(frozen=True)
class AnswerHead:
    """What every object of one answer repeats. `include_usage`: a stream carries `usage` (null until its
    last chunk), as `stream_options.include_usage` asks."""

    request_id: str
    model: str
    created: int
    include_usage: bool = False


@dataclass(frozen=True)
class FinishedChoice:
    """A whole choice: its parsed output (finish reason included) and the tokens sampled for it."""

    index: int
    output: OutputDelta
    tokens: Sequence[SampledToken] = ()


class ResponseFormatter(ABC):
    """The OpenAI objects of one answer. `logprobs`: whether choices carry them (`token_text` shows a
    token as logprobs do, special tokens included)."""

    object: str
    chunk_object: str

    def __init__(
        self, head: AnswerHead, *, logprobs: bool = False, token_text: TokenText | None = None
    ) -> None:
        if logprobs and token_text is None:
            raise ValueError("logprobs need token_text")
        self.head = head
        self.logprobs = logprobs
        self._token_text: TokenText = token_text or str

    def response(self, choices: Sequence[FinishedChoice], usage: dict[str, Any]) -> dict[str, Any]:
        """The whole answer (choices in index order)."""
        return {
            "id": self.head.request_id,
            "object": self.object,
            "created": self.head.created,
            "model": self.head.model,
            "choices": [self._choice(choice) for choice in sorted(choices, key=lambda c: c.index)],
            "usage": usage,
        }

    def first_chunk(self, index: int) -> dict[str, Any]:
        """The chunk that opens choice `index` of a stream."""
        return self._chunk([self._first_choice(index)])

    def chunk(
        self, index: int, delta: OutputDelta, tokens: Sequence[SampledToken] = ()
    ) -> dict[str, Any] | None:
        """The chunk of one delta of choice `index` (None when it has nothing to say)."""
        if not delta and delta.finish_reason is None and not tokens:
            return None
        return self._chunk([self._chunk_choice(index, delta, tokens)])

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The last chunk of a stream that includes usage: no choices, the usage."""
        return self._chunk([], usage)

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.head.request_id,
            "object": self.chunk_object,
            "created": self.head.created,
            "model": self.head.model,
            "choices": choices,
        }
        if self.head.include_usage:
            body["usage"] = usage  # null on every chunk but the last, as OpenAI sends it
        return body

    @abstractmethod
    def _choice(self, choice: FinishedChoice) -> dict[str, Any]: ...

    @abstractmethod
    def _first_choice(self, index: int) -> dict[str, Any]: ...

    @abstractmethod
    def _chunk_choice(
        self, index: int, delta: OutputDelta, tokens: Sequence[SampledToken]
    ) -> dict[str, Any]: ...


class ChatFormatter(ResponseFormatter):
    """`chat.completion` and its chunks. `reasoning_field`: messages carry `reasoning_content` (a reasoning
    parser is configured: null when there is none)."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(
        self,
        head: AnswerHead,
        *,
        reasoning_field: bool = False,
        logprobs: bool = False,
        token_text: TokenText | None = None,
    ) -> None:
        super().__init__(head, logprobs=logprobs, token_text=token_text)
        self.reasoning_field = reasoning_field

    def _choice(self, choice: FinishedChoice) -> dict[str, Any]:
        output = choice.output
        message: dict[str, Any] = {
            "role": "assistant",
            # null when the answer is all calls or all reasoning, as vLLM answers; else a string.
            "content": output.content or (None if output.tool_calls or output.reasoning else ""),
            "tool_calls": [call.to_openai() for call in output.tool_calls],
        }
        if self.reasoning_field:
            message["reasoning_content"] = output.reasoning or None
        return {
            "index": choice.index,
            "message": message,
            "logprobs": self._logprobs(choice.tokens),
            "finish_reason": output.finish_reason,
        }

    def _first_choice(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }

    def _chunk_choice(self, index: int, delta: OutputDelta, tokens: Sequence[SampledToken]) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if delta.reasoning:
            body["reasoning_content"] = delta.reasoning
        if delta.content:
            body["content"] = delta.content
        if delta.tool_calls:
            body["tool_calls"] = [{"index": i, **call.to_openai()} for i, call in enumerate(delta.tool_calls)]
        return {
            "index": index,
            "delta": body,
            "logprobs": self._logprobs(tokens),
            "finish_reason": delta.finish_reason,
        }

    def _logprobs(self, tokens: Sequence[SampledToken]) -> dict[str, Any] | None:
        return chat_logprobs(tokens, self._token_text) if self.logprobs else None


class CompletionFormatter(ResponseFormatter):
    """`text_completion` objects, whole and streamed. `echo` maps a choice index to the prompt text it
    starts with (`echo: true`); logprob offsets count from there, across a stream's chunks."""

    object = "text_completion"
    chunk_object = "text_completion"

    def __init__(
        self,
        head: AnswerHead,
        *,
        echo: Mapping[int, str] | None = None,
        logprobs: bool = False,
        token_text: TokenText | None = None,
    ) -> None:
        super().__init__(head, logprobs=logprobs, token_text=token_text)
        self._echo = dict(echo or {})
        self._offsets: dict[int, int] = {}  # per choice: where the next streamed token's text starts

    def _choice(self, choice: FinishedChoice) -> dict[str, Any]:
        prefix = self._echo.get(choice.index, "")
        logprobs = None
        if self.logprobs:
            logprobs, _ = completion_logprobs(choice.tokens, self._token_text, text_offset=len(prefix))
        return {
            "index": choice.index,
            "text": prefix + choice.output.content,
            "logprobs": logprobs,
            "finish_reason": choice.output.finish_reason,
        }

    def _first_choice(self, index: int) -> dict[str, Any]:
        return {"index": index, "text": self._echo.get(index, ""), "logprobs": None, "finish_reason": None}

    def _chunk_choice(self, index: int, delta: OutputDelta, tokens: Sequence[SampledToken]) -> dict[str, Any]:
        logprobs = None
        if self.logprobs:
            offset = self._offsets.get(index, len(self._echo.get(index, "")))
            logprobs, self._offsets[index] = completion_logprobs(tokens, self._token_text, text_offset=offset)
        return {
            "index": index,
            "text": delta.content,
            "logprobs": logprobs,
            "finish_reason": delta.finish_reason,
        }

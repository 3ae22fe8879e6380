"""Splitting generated text into reasoning and content, delta by delta, with a reasoning parser's markers.

Where the output starts (inside reasoning, in content, or undecided until its first characters) is the
parser's rule (`core.reasoning.output_start`); this module follows the markers from there.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, NamedTuple

from tokenfront.core.output.markers import partial_marker_length
from tokenfront.core.reasoning import OutputStart, ReasoningParser, output_start

__all__ = ["ReasoningStream", "SplitText", "split_reasoning"]


class SplitText(NamedTuple):
    """Reasoning and content of some generated text; ``None`` where there is none."""

    reasoning: str | None
    content: str | None


class _Phase(enum.Enum):
    UNDECIDED = "undecided"
    REASONING_OPENING = "reasoning_opening"  # inside reasoning; a leading start marker is dropped
    REASONING = "reasoning"
    CONTENT = "content"


_FIRST_PHASE = {
    OutputStart.UNDECIDED: _Phase.UNDECIDED,
    OutputStart.REASONING: _Phase.REASONING_OPENING,
    OutputStart.CONTENT: _Phase.CONTENT,
}


class ReasoningStream:
    """Splits generated text, delta by delta, into reasoning and content.

    Never emits part of a marker: a suffix that could be the beginning of one is held
    back until the next delta (or ``finish``) tells. Feeding all deltas then calling
    ``finish`` gives exactly what ``split_reasoning`` gives for the whole text.

    ``start`` says where the output starts; without it, it is worked out from
    ``prompt_reasoning_ended`` and ``chat_template_kwargs`` (see ``output_start``).
    """

    def __init__(
        self,
        parser: ReasoningParser,
        *,
        start: OutputStart | None = None,
        prompt_reasoning_ended: bool | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._parser = parser
        if start is None:
            start = output_start(
                parser,
                prompt_reasoning_ended=prompt_reasoning_ended,
                chat_template_kwargs=chat_template_kwargs,
            )
        self._phase = _FIRST_PHASE[start]
        if parser.markers_anywhere and self._phase is _Phase.UNDECIDED:
            self._phase = _Phase.CONTENT  # content watches for markers itself
        # What ends reasoning, the first one found winning; a repeated start marker is dropped.
        self._closers = (
            parser.end,
            *parser.content_markers,
            *((parser.start,) if parser.markers_anywhere else ()),
        )
        self._pending = ""
        self._reasoning: list[str] = []
        self._content: list[str] = []

    @property
    def parser(self) -> ReasoningParser:
        """The parser whose markers this stream splits on."""
        return self._parser

    @property
    def in_reasoning(self) -> bool:
        """Whether text fed so far leaves the model inside a reasoning block."""
        return self._phase in (_Phase.REASONING, _Phase.REASONING_OPENING)

    def feed(self, delta: str) -> SplitText:
        """Consume a delta of generated text; return what can be emitted now."""
        self._pending += delta
        return self._drain(final=False)

    def finish(self) -> SplitText:
        """Flush what was held back once generation is over (a partial marker is text)."""
        return self._drain(final=True)

    def state(self) -> dict[str, Any]:
        """Where the stream is and the text it holds back, as JSON data (`from_state` resumes)."""
        return {"phase": self._phase.value, "pending": self._pending}

    @classmethod
    def from_state(cls, parser: ReasoningParser, state: dict[str, Any]) -> ReasoningStream:
        """A stream for `parser` that continues from `state` (its start no longer matters)."""
        pending = state["pending"]
        if not isinstance(pending, str):
            raise ValueError("reasoning state `pending` must be a string")
        stream = cls(parser, start=OutputStart.CONTENT)
        stream._phase, stream._pending = _Phase(state["phase"]), pending
        return stream

    def _drain(self, *, final: bool) -> SplitText:
        while self._step(final=final):
            pass
        reasoning, content = "".join(self._reasoning), "".join(self._content)
        self._reasoning.clear()
        self._content.clear()
        return SplitText(reasoning or None, content or None)

    def _step(self, *, final: bool) -> bool:
        """Advance by one decision; return whether another step may make progress."""
        if self._phase is _Phase.UNDECIDED:
            return self._step_undecided(final)
        if self._phase is _Phase.REASONING_OPENING:
            return self._step_reasoning_opening(final)
        if self._phase is _Phase.REASONING:
            return self._step_reasoning(final)
        return self._step_content(final)

    def _step_content(self, final: bool) -> bool:
        if not self._parser.markers_anywhere:
            self._content.append(self._pending)
            self._pending = ""
            return False
        start, end = self._parser.start, self._parser.end
        found = [(at, marker) for marker in (start, end) if (at := self._pending.find(marker)) >= 0]
        if found:
            at, marker = min(found)
            self._content.append(self._pending[:at])
            self._pending = self._pending[at + len(marker) :]
            if marker == start:
                self._phase = _Phase.REASONING
            return True  # a stray end marker is dropped
        held = 0 if final else partial_marker_length(self._pending, (start, end))
        cut = len(self._pending) - held
        self._content.append(self._pending[:cut])
        self._pending = self._pending[cut:]
        return False

    def _step_undecided(self, final: bool) -> bool:
        start, end = self._parser.start, self._parser.end
        head = self._pending.lstrip()
        if head.startswith(start):
            self._pending, self._phase = head[len(start) :], _Phase.REASONING
            return True
        if head.startswith(end):
            # A stray closer before any reasoning (MiniMax M3, Laguna without a mode): drop it.
            self._pending, self._phase = head[len(end) :], _Phase.CONTENT
            return True
        if not final and (head == "" or start.startswith(head) or end.startswith(head)):
            return False  # could still become a marker
        self._phase = _Phase.CONTENT
        return True

    def _step_reasoning_opening(self, final: bool) -> bool:
        start = self._parser.start
        head = self._pending.lstrip()
        if head.startswith(start):
            # The model repeated the start marker the template may have prefilled (R1-0528).
            self._pending, self._phase = head[len(start) :], _Phase.REASONING
            return True
        if not final and (head == "" or start.startswith(head)):
            return False
        self._phase = _Phase.REASONING
        return True

    def _step_reasoning(self, final: bool) -> bool:
        parser = self._parser
        found = [(at, marker) for marker in self._closers if (at := self._pending.find(marker)) >= 0]
        if found:
            at, marker = min(found)
            reasoning = self._pending[:at]
            if marker == parser.start:  # repeated inside reasoning: dropped
                self._reasoning.append(reasoning)
                self._pending = self._pending[at + len(marker) :]
                return True
            self._reasoning.append(reasoning.rstrip() if parser.strips_trailing_whitespace else reasoning)
            # The end marker is dropped; a content marker starts the content.
            after = at + len(marker) if marker == parser.end else at
            self._pending, self._phase = self._pending[after:], _Phase.CONTENT
            return True
        held = 0 if final else partial_marker_length(self._pending, self._closers)
        cut = len(self._pending) - held
        if parser.strips_trailing_whitespace:
            # Held back until more reasoning follows it; dropped at the end of the output.
            cut = len(self._pending[:cut].rstrip())
        self._reasoning.append(self._pending[:cut])
        self._pending = "" if final else self._pending[cut:]
        return False


def split_reasoning(
    parser: ReasoningParser | None,
    text: str,
    *,
    prompt_reasoning_ended: bool | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> SplitText:
    """Split complete generated text into ``(reasoning, content)``; empty parts are ``None``.

    Without a parser everything is content. See ``output_start`` for the arguments.
    """
    if parser is None:
        return SplitText(None, text or None)
    stream = ReasoningStream(
        parser, prompt_reasoning_ended=prompt_reasoning_ended, chat_template_kwargs=chat_template_kwargs
    )
    first, last = stream.feed(text), stream.finish()
    reasoning = (first.reasoning or "") + (last.reasoning or "")
    content = (first.content or "") + (last.content or "")
    return SplitText(reasoning or None, content or None)

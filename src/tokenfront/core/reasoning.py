"""Reasoning parsers: their markers, the prompt-tail rule, and splitting generated text.

A reasoning parser (``--reasoning-parser NAME``) knows the markers a model wraps its
reasoning in and whether it reads its reasoning mode from the prompt text (SPEC §4).
The renderer uses it to compute ``reasoning_ended``; the router uses it to decide
whether a request may be forwarded as ids (SPEC §8); the worker uses it to split
generated text into ``reasoning_content`` and ``content`` (SPEC §7).

Where generation starts (the rules of vLLM's parsers, made consistent between the
streaming and the non-streaming paths):

- parsers that read the mode from the prompt (``poolside_v1``/``laguna``, ``minimax_m3``):
  a prompt ending with the start marker means generation starts inside reasoning;
  one ending with the end marker means everything is content; otherwise the output
  decides (see ``OutputStart.UNDECIDED``).
- the others never look at the prompt, so forwarding ids cannot change how their
  output is split. ``deepseek_r1`` always starts inside reasoning (R1 may or may not
  emit ``<think>`` itself). ``qwen3`` starts inside reasoning unless the request's
  ``chat_template_kwargs`` set ``enable_thinking`` false (vLLM's current Qwen3 parser:
  a missing ``</think>`` means the output was cut off while reasoning).
"""

from __future__ import annotations

import enum
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tokenfront.core.errors import TokenfrontError

__all__ = [
    "REASONING_PARSERS",
    "OutputStart",
    "ReasoningParser",
    "ReasoningStream",
    "SplitText",
    "UnknownParserError",
    "get_reasoning_parser",
    "lookup_parser",
    "output_start",
    "prompt_carries_reasoning_mode",
    "reasoning_ended",
    "split_reasoning",
]


class UnknownParserError(TokenfrontError, ValueError):
    """A parser name that is not registered; the message lists the known names."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = tuple(sorted(known))
        super().__init__(f"unknown {kind} parser {name!r}; known {kind} parsers: {', '.join(self.known)}")


@dataclass(frozen=True)
class ReasoningParser:
    """What a reasoning parser knows about a model's reasoning output.

    ``thinking_kwargs`` / ``thinks_by_default`` only matter for parsers that do not read
    the mode from the prompt: they say whether generation starts inside reasoning,
    from the request's ``chat_template_kwargs`` (any listed key present: thinking is on
    when one of them is truthy; none present: ``thinks_by_default``).
    """

    name: str
    start: str
    end: str
    reads_mode_from_prompt: bool = False
    aliases: tuple[str, ...] = ()
    thinking_kwargs: tuple[str, ...] = ()
    thinks_by_default: bool = False
    # The markers are special tokens: generated text must be decoded with special tokens kept.
    markers_are_special_tokens: bool = False
    # Markers that end reasoning and stay in the content (a tool call started from inside reasoning).
    content_markers: tuple[str, ...] = ()
    # Whitespace at the end of the reasoning is dropped (Mistral's "[THINK]...\n[/THINK]").
    strips_trailing_whitespace: bool = False
    # Reasoning blocks may open anywhere in the output, more than once: the output starts as content, a
    # stray end marker is dropped and a repeated start marker inside reasoning too (vLLM's Mistral parser).
    markers_anywhere: bool = False
    # The output is OpenAI Harmony (gpt-oss): channels, not these markers, say what is reasoning, and
    # core/harmony_output.py reads it. The markers only serve the prompt-tail rule.
    harmony: bool = False

    def fingerprint_component(self) -> dict[str, str] | None:
        """The part of this parser that the rendering fingerprint compares (SPEC §5).

        Only a parser that reads the mode from the prompt changes what a worker does with
        a given prompt, so the others contribute nothing (``None``).
        """
        if not self.reads_mode_from_prompt:
            return None
        return {"start": self.start, "end": self.end}


_THINK = ("<think>", "</think>")

# Canonical name -> parser. Read-only: parsers are looked up, never registered at runtime.
REASONING_PARSERS: Mapping[str, ReasoningParser] = types.MappingProxyType(
    {
        parser.name: parser
        for parser in (
            ReasoningParser("qwen3", *_THINK, thinking_kwargs=("enable_thinking",), thinks_by_default=True),
            ReasoningParser("deepseek_r1", *_THINK, thinks_by_default=True),
            # DeepSeek V3.1+: thinking is off unless the request turns it on (vLLM's deepseek_v3).
            ReasoningParser("deepseek_v3", *_THINK, thinking_kwargs=("thinking", "enable_thinking")),
            # GLM-4.5: the model opens its own <think> block; the output decides.
            ReasoningParser("glm45", *_THINK),
            ReasoningParser("poolside_v1", *_THINK, reads_mode_from_prompt=True, aliases=("laguna",)),
            ReasoningParser("minimax_m3", "<mm:think>", "</mm:think>", reads_mode_from_prompt=True),
            # Mistral (Magistral, tokenizer v13+): [THINK] opens reasoning, a call may start inside it.
            ReasoningParser(
                "mistral",
                "[THINK]",
                "[/THINK]",
                markers_are_special_tokens=True,
                content_markers=("[TOOL_CALLS]",),
                strips_trailing_whitespace=True,
                markers_anywhere=True,
            ),
            # gpt-oss: the analysis channel is reasoning (vLLM's name; its tool-call parser is "openai").
            ReasoningParser(
                "openai_gptoss",
                "<|channel|>analysis<|message|>",
                "<|end|>",
                markers_are_special_tokens=True,
                harmony=True,
            ),
        )
    }
)


def _normalize_name(name: str) -> str:
    # Accept the spellings other servers use ("deepseek-r1", "Qwen3").
    return name.strip().lower().replace("-", "_")


def lookup_parser(kind: str, name: str, registry: Mapping[str, Any]) -> Any:
    """Find ``name`` among the canonical names and aliases of ``registry``'s parsers.

    Shared by the reasoning and tool-call registries so both accept the same spellings
    and fail the same way. Raises ``UnknownParserError``.
    """
    wanted = _normalize_name(name)
    for parser in registry.values():
        if wanted == parser.name or wanted in parser.aliases:
            return parser
    known = [*registry, *(alias for parser in registry.values() for alias in parser.aliases)]
    raise UnknownParserError(kind, name, known)


def get_reasoning_parser(name: str) -> ReasoningParser:
    """Return the reasoning parser registered as ``name`` (or an alias of it).

    Raises ``UnknownParserError`` (a ``ValueError``) naming the known parsers.
    """
    parser: ReasoningParser = lookup_parser("reasoning", name, REASONING_PARSERS)
    return parser


# --- the prompt tail ---------------------------------------------------------------


def _tail(text: str, size: int) -> str:
    """The last ``size`` characters of ``text`` once trailing whitespace is dropped.

    Equivalent to ``text.rstrip()[-size:]`` without copying a long prompt.
    """
    end = len(text)
    while end > 0 and text[end - 1].isspace():
        end -= 1
    return text[max(0, end - size) : end]


def reasoning_ended(parser: ReasoningParser | None, prompt_text: str) -> bool | None:
    """Whether reasoning had ended before the first generated token (SPEC §4).

    Read off the prompt's tail only, since earlier turns contain closed blocks; trailing
    whitespace is ignored. Ends with the end marker: ``True``; with the start marker:
    ``False``; otherwise, or without a parser: ``None``.
    """
    if parser is None:
        return None
    tail = _tail(prompt_text, max(len(parser.start), len(parser.end)))
    if tail.endswith(parser.end):
        return True
    if tail.endswith(parser.start):
        return False
    return None


def prompt_carries_reasoning_mode(parser: ReasoningParser | None, prompt_text: str) -> bool:
    """Whether the prompt's tail is a start or end marker (a prefilled reasoning mode).

    The router never forwards such a prompt as ids to a worker whose parser reads the
    mode from the prompt, since that worker would not see the text (SPEC §8).
    """
    return reasoning_ended(parser, prompt_text) is not None


# --- where generation starts -------------------------------------------------------


class OutputStart(enum.Enum):
    """Where generated text starts, before any of it is seen."""

    REASONING = "reasoning"  # inside reasoning: text up to the end marker is reasoning
    CONTENT = "content"  # reasoning is over: everything is content, markers included
    # The output decides: a leading start marker opens reasoning, a leading stray end
    # marker is dropped, anything else makes all of it content.
    UNDECIDED = "undecided"


def _thinking_enabled(parser: ReasoningParser, chat_template_kwargs: Mapping[str, Any] | None) -> bool:
    kwargs = chat_template_kwargs or {}
    present = [key for key in parser.thinking_kwargs if key in kwargs]
    if not present:
        return parser.thinks_by_default
    return any(bool(kwargs[key]) for key in present)


def output_start(
    parser: ReasoningParser,
    *,
    prompt_reasoning_ended: bool | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> OutputStart:
    """Where generation starts for ``parser``.

    ``prompt_reasoning_ended`` is ``reasoning_ended(parser, prompt_text)``; it is used only
    by parsers that read the mode from the prompt. ``chat_template_kwargs`` (the request's,
    merged with the server defaults) is used only by the others.
    """
    if parser.reads_mode_from_prompt:
        if prompt_reasoning_ended is None:
            return OutputStart.UNDECIDED
        return OutputStart.CONTENT if prompt_reasoning_ended else OutputStart.REASONING
    if _thinking_enabled(parser, chat_template_kwargs):
        return OutputStart.REASONING
    return OutputStart.UNDECIDED


# --- splitting generated text ------------------------------------------------------


class SplitText(NamedTuple):
    """Reasoning and content of some generated text; ``None`` where there is none."""

    reasoning: str | None
    content: str | None


def _partial_marker_length(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


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
    """

    def __init__(
        self,
        parser: ReasoningParser,
        *,
        prompt_reasoning_ended: bool | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._parser = parser
        start = output_start(
            parser, prompt_reasoning_ended=prompt_reasoning_ended, chat_template_kwargs=chat_template_kwargs
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
        held = 0 if final else max(_partial_marker_length(self._pending, m) for m in (start, end))
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
        held = 0 if final else max(_partial_marker_length(self._pending, marker) for marker in self._closers)
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

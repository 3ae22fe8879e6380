"""Reasoning parsers: their markers, the prompt-tail rule, and splitting generated text.

A reasoning parser (``--reasoning-parser NAME``) knows the markers a model wraps its
reasoning in and whether it reads its reasoning mode from the prompt text (docs/contract.md §4).
The renderer uses it to compute ``reasoning_ended``; the router uses it to decide
whether a request may be forwarded as ids (docs/contract.md §8); the output core
(``core.output.reasoning``) uses it to split generated text into ``reasoning_content``
and ``content`` (docs/contract.md §7).

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
from typing import Any

from tokenfront.core.errors import TokenfrontError

__all__ = [
    "REASONING_PARSERS",
    "OutputStart",
    "ReasoningParser",
    "UnknownParserError",
    "get_reasoning_parser",
    "lookup_parser",
    "output_start",
    "prompt_carries_reasoning_mode",
    "reasoning_ended",
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
    # core/output/harmony.py reads it. The markers only serve the prompt-tail rule.
    harmony: bool = False

    def fingerprint_component(self) -> dict[str, str] | None:
        """The part of this parser that the rendering fingerprint compares (docs/contract.md §5).

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
    """Whether reasoning had ended before the first generated token (docs/contract.md §4).

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
    mode from the prompt, since that worker would not see the text (docs/contract.md §8).
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

"""From generated ids to OpenAI text: incremental detokenization, stop strings, reasoning and tool-call text.

Everything here is synchronous and knows no HTTP. One `ChoiceText` per generated sequence turns token ids,
one at a time, into deltas of reasoning and content that are safe to show: a stop string is never shown
(text that could be the start of one is held back until the next token tells), a reasoning marker is never
shown, and content that could be the start of a tool call is held back until the end, when the tool-call
parser reads the whole output. Harmony output (gpt-oss) is read by its own channel parser instead, which
says what is reasoning, content and a call. The streaming and non-streaming paths both feed a `ChoiceText`,
so their text is identical by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from tokenfront.core.harmony_output import HarmonyStream
from tokenfront.core.reasoning import ReasoningStream
from tokenfront.core.tool_calls import ToolCall, ToolCallParser

__all__ = [
    "ChoiceText",
    "ForcedToolCall",
    "IncrementalDetokenizer",
    "StopStringMatcher",
    "TextDelta",
    "ToolCallHold",
]

# --- ids -> text -------------------------------------------------------------------------------------------

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Turns ids into text one id at a time, the way vLLM does: decode a short window, emit what it adds.

    Decoding ids one by one would break multi-byte characters split across tokens and the spacing rules of
    some tokenizers. Instead two windows are decoded: ids[prefix:read] (already shown) and ids[prefix:]
    (with the new ids); the difference is the new text, held back while it ends in an incomplete character
    (U+FFFD). The concatenated deltas plus `flush()` equal decoding all ids at once.
    """

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids before this are shown

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes ("" while it is held back)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return whatever is held back (an incomplete character is shown as it decodes)."""
        return self._advance(final=True) if self._read < len(self._ids) else ""

    def _advance(self, *, final: bool) -> str:
        shown = self._decode(self._ids[self._prefix : self._read])
        with_new = self._decode(self._ids[self._prefix :])
        if with_new == shown:
            # The new ids add no text (skipped special tokens): count them as read, so a run of them does
            # not widen the window decoded at every step.
            self._read = len(self._ids)
            return ""
        if len(with_new) <= len(shown) and not final:
            return ""
        if with_new.endswith("\ufffd") and not final:
            return ""  # a character split across tokens: wait for the rest of its bytes
        self._prefix, self._read = self._read, len(self._ids)
        return with_new[len(shown) :]


class StopStringMatcher:
    """Finds the first stop string in streamed text and cuts the text before it.

    Text is released only when no stop string can still start in it: a tail that is a proper prefix of a
    stop string is held back until more text (or `flush`) decides. After a match, `stopped` is true and
    nothing more is accepted.
    """

    def __init__(self, stop: Collection[str]) -> None:
        self._stop = [s for s in stop if s]
        self._pending = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Add text; return the part that is now certainly before any stop string."""
        if self.stopped or not delta:
            return ""
        if not self._stop:
            return delta
        self._pending += delta
        found = [at for at in (self._pending.find(s) for s in self._stop) if at >= 0]
        if found:
            released, self._pending, self.stopped = self._pending[: min(found)], "", True
            return released
        held = max(_partial_suffix_length(self._pending, s) for s in self._stop)
        cut = len(self._pending) - held
        released, self._pending = self._pending[:cut], self._pending[cut:]
        return released

    def flush(self) -> str:
        """Release what was held back (generation ended without completing a stop string)."""
        released, self._pending = self._pending, ""
        return released


def _partial_suffix_length(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


# --- tool calls in content ---------------------------------------------------------------------------------

# Where a call may begin, per parser: text from the first of these on is held back until the end. A parser
# without an entry holds all content (always correct, only later).
_CALL_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>",),
    "llama3_json": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]",),
}
# Parsers whose output is a call when it starts with one of these (after whitespace).
_CALL_OPENINGS: dict[str, tuple[str, ...]] = {"llama3_json": ("{",)}


class ToolCallHold:
    """Streams content while it certainly is not part of a tool call; the parser reads it all at the end.

    The parser's final content is the text unchanged when it finds no call, and the text around the calls,
    stripped, when it does. So content is released only while it is a prefix of both: nothing while the
    text starts with whitespace, no trailing whitespace, and nothing from where a call may begin. `finish`
    returns the rest of the final content and the calls.
    """

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self._markers = _CALL_MARKERS.get(parser.name)
        self._openings = _CALL_OPENINGS.get(parser.name, ())
        self._text = ""
        self._released = 0

    def feed(self, delta: str) -> str:
        """Add content; return the part that can be shown now."""
        self._text += delta
        safe = self._safe_end()
        if safe <= self._released:
            return ""
        released, self._released = self._text[self._released : safe], safe
        return released

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content not yet shown, and the calls the parser found in all of it."""
        parsed = self._parser.parse(self._text)
        final = (parsed.content or "") if parsed.calls else self._text
        shown = self._text[: self._released]
        # By construction `shown` is a prefix of `final`; were a parser to break that, show no more text
        # rather than repeat some.
        rest = final[len(shown) :] if final.startswith(shown) else ""
        return rest, list(parsed.calls)

    def _safe_end(self) -> int:
        text = self._text
        head = text.lstrip()
        if self._markers is None or len(head) != len(text) or not head:
            return 0  # unknown parser, or leading whitespace the parser would strip when it finds a call
        if any(head.startswith(o) or o.startswith(head) for o in self._openings):
            return 0
        end = len(text)
        for marker in self._markers:
            at = text.find(marker)
            end = min(end, at if at >= 0 else len(text) - _partial_suffix_length(text, marker))
        return len(text[:end].rstrip())


class ForcedToolCall:
    """The output of a named tool_choice: the generated text is the arguments of one call.

    The prompt ended with the parser's forced-call prefix, so the call the model wrote is
    `prefix + generated + suffix`; the parser reads it back (as it would a call it wrote unprompted). Output
    the parser cannot read (arguments cut off by max_tokens) gives no call: a client is never handed
    arguments that are not the JSON object the schema asked for.
    """

    def __init__(self, parser: ToolCallParser, function_name: str) -> None:
        self._parser = parser
        self._name = function_name
        self._text = ""

    def feed(self, delta: str) -> str:
        """Collect arguments text; none of it is content."""
        self._text += delta
        return ""

    def finish(self) -> tuple[str, list[ToolCall]]:
        """No content, and the one forced call."""
        parsed = self._parser.parse(self._parser.forced_call_text(self._name, self._text))
        calls = [call for call in parsed.calls if call.name == self._name]
        return "", calls[:1]


# --- one choice --------------------------------------------------------------------------------------------


@dataclass
class TextDelta:
    """What one step adds to a choice: reasoning and content text, and calls (only at the end)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: TextDelta) -> None:
        """Append another delta to this one."""
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)


class ChoiceText:
    """The text pipeline of one generated sequence: ids -> text -> stop strings -> reasoning -> tool calls.

    `hidden_ids` (the EOS ids) are never shown. `push` returns what a stream may send now; after a stop
    string, `stopped` is true and further ids are ignored. `finish` returns the rest, the calls included.
    With `harmony`, that parser alone splits the text (and `reasoning` and `tools` are not given); it needs
    text decoded with special tokens kept.
    """

    def __init__(
        self,
        decode: Decode,
        *,
        hidden_ids: Collection[int] = (),
        stop: Collection[str] = (),
        reasoning: ReasoningStream | None = None,
        tools: ToolCallHold | ForcedToolCall | None = None,
        harmony: HarmonyStream | None = None,
    ) -> None:
        if harmony is not None and (reasoning is not None or tools is not None):
            raise ValueError("Harmony output is split by its channel parser alone")
        self._detokenizer = IncrementalDetokenizer(decode)
        self._hidden = frozenset(hidden_ids)
        self._stop = StopStringMatcher(stop)
        self._reasoning = reasoning
        self._tools = tools
        self._harmony = harmony
        self.text = ""  # all generated text shown to the stop check, before reasoning/tool parsing

    @property
    def stopped(self) -> bool:
        """Whether a stop string ended the text."""
        return self._stop.stopped

    def push(self, token_id: int) -> TextDelta:
        """Add one generated id; return the delta it makes visible."""
        if self.stopped or token_id in self._hidden:
            return TextDelta()
        return self._route(self._stop.feed(self._detokenizer.push(token_id)), final=False)

    def finish(self) -> TextDelta:
        """Flush everything held back and parse tool calls; call once, after the last id."""
        delta = TextDelta()
        if not self.stopped:
            delta.extend(self._route(self._stop.feed(self._detokenizer.flush()), final=False))
            delta.extend(self._route(self._stop.flush(), final=False))
        delta.extend(self._route("", final=True))
        return delta

    def _route(self, text: str, *, final: bool) -> TextDelta:
        # `final` comes with no text: it only flushes the reasoning splitter and the tool-call parser.
        self.text += text
        if self._harmony is not None:
            out = self._harmony.finish() if final else self._harmony.feed(text)
            return TextDelta(out.reasoning, out.content, out.tool_calls)
        if self._reasoning is None:
            reasoning, content = "", text
        else:
            split = self._reasoning.finish() if final else self._reasoning.feed(text)
            reasoning, content = split.reasoning or "", split.content or ""
        if self._tools is None:
            return TextDelta(reasoning, content)
        shown = self._tools.feed(content)
        if not final:
            return TextDelta(reasoning, shown)
        rest, calls = self._tools.finish()
        return TextDelta(reasoning, shown + rest, calls)

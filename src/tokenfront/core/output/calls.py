"""Tool calls in streamed content: what may be shown before the parser reads the whole output.

A tool-call parser reads complete output (`ToolCallParser.parse`). A stream cannot wait that long for
plain answers, so `ToolCallHold` shows content while it certainly is not part of a call, using the
parser's `call_markers` / `call_openings`. `ForcedToolCall` reads the output of a named `tool_choice`,
which is one call's arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenfront.core.output.markers import partial_marker_length
from tokenfront.core.tool_call import ToolCall

if TYPE_CHECKING:
    from tokenfront.core.tool_calls import ToolCallParser

__all__ = ["ForcedToolCall", "ToolCallHold"]


class ToolCallHold:
    """Streams content while it certainly is not part of a tool call; the parser reads it all at the end.

    The parser's final content is the text unchanged when it finds no call, and the text around the calls,
    stripped, when it does. So content is released only while it is a prefix of both: nothing while the
    text starts with whitespace, no trailing whitespace, and nothing from where a call may begin (the
    parser's `call_markers`; a parser without markers holds everything). `finish` returns the rest of the
    final content and the calls.
    """

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
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

    def state(self) -> dict[str, Any]:
        """The content so far (the parser reads all of it at the end) and how much is shown."""
        return {"text": self._text, "released": self._released}

    @classmethod
    def from_state(cls, parser: ToolCallParser, state: dict[str, Any]) -> ToolCallHold:
        """A hold for `parser` that continues from `state`."""
        text, released = state["text"], state["released"]
        if not isinstance(text, str) or type(released) is not int or not 0 <= released <= len(text):
            raise ValueError("tool-call state must hold a string `text` and a `released` offset within it")
        hold = cls(parser)
        hold._text, hold._released = text, released
        return hold

    def _safe_end(self) -> int:
        text = self._text
        head = text.lstrip()
        markers = self._parser.call_markers
        if markers is None or len(head) != len(text) or not head:
            return 0  # no markers known, or leading whitespace the parser would strip when it finds a call
        if any(head.startswith(o) or o.startswith(head) for o in self._parser.call_openings):
            return 0
        end = len(text)
        for marker in markers:
            at = text.find(marker)
            end = min(end, at if at >= 0 else len(text) - partial_marker_length(text, (marker,)))
        return len(text[:end].rstrip())


class ForcedToolCall:
    """The output of a named tool_choice: the generated text is the arguments of one call.

    The prompt ended with the parser's forced-call prefix (`RenderPipeline.render_chat(forced_tool=...)`),
    so the call the model wrote is `prefix + generated + suffix`; the parser reads it back (as it would a
    call it wrote unprompted). Output the parser cannot read (arguments cut off by max_tokens) gives no
    call: a client is never handed arguments that are not the JSON object the schema asked for.
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

    def state(self) -> dict[str, Any]:
        """The arguments text so far."""
        return {"text": self._text}

    @classmethod
    def from_state(cls, parser: ToolCallParser, function_name: str, state: dict[str, Any]) -> ForcedToolCall:
        """A forced call to `function_name` that continues from `state`."""
        if not isinstance(state["text"], str):
            raise ValueError("forced-call state `text` must be a string")
        forced = cls(parser, function_name)
        forced._text = state["text"]
        return forced

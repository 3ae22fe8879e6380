"""Harmony output (gpt-oss): channels into reasoning, content and tool calls, as vLLM 0.33 reads them.

gpt-oss writes its answer as Harmony messages. Generation starts right after the prompt's
``<|start|>assistant``, so the first message has no ``<|start|>`` of its own::

    <|channel|>analysis<|message|>Let me think.<|end|>
    <|start|>assistant<|channel|>final<|message|>Hello!<|return|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

What a message is for follows from its header (vLLM's ``HarmonyParser``): a recipient that names a
function (``functions.NAME``, or a bare name that is not a built-in tool) makes it a tool call; the
``analysis`` channel is reasoning; ``final``, and ``commentary`` without a recipient (a preamble), are
content; anything else is dropped. Several messages of one kind are joined with a newline.

vLLM feeds token ids to the harmony library's ``StreamableParser``; this module reads the same states off
the decoded text with special tokens kept, so it needs no vocabulary file. The markers are special tokens
in gpt-oss's vocabulary, so text equal to a marker is the marker (a model would have to spell one out
with ordinary tokens to tell them apart). It follows the library's rules, errors included: text between
messages that is not a ``<|start|>`` is skipped; a header that does not parse drops its message; output
that ends inside a header (cut off, or not Harmony at all) is returned as content, raw.
"""

from __future__ import annotations

import contextlib
import enum
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from tokenfront.core.errors import CheckpointError
from tokenfront.core.output.markers import partial_marker_length
from tokenfront.core.reasoning import ReasoningParser
from tokenfront.core.tool_call import ToolCall

if TYPE_CHECKING:
    from tokenfront.core.tool_calls import ToolCallParser

__all__ = [
    "HarmonyDelta",
    "HarmonyHeader",
    "HarmonyStream",
    "parse_harmony",
    "parse_harmony_header",
    "reads_harmony",
]

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
# What ends a message (the encoding's stop tokens for the parser); <|endoftext|> is not one of them.
_MESSAGE_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_ROLES = frozenset({"user", "assistant", "system", "developer", "tool"})
# Built-in tools' recipients are not function calls (vLLM's BUILTIN_TOOL_TO_MCP_SERVER_LABEL).
_BUILTIN_TOOLS = frozenset({"python", "browser", "container"})
_FUNCTIONS = "functions."
_ASCII_WHITESPACE = re.compile(r"[ \t\n\x0c\r]+")


def reads_harmony(reasoning: ReasoningParser | None, tools: ToolCallParser | None) -> bool:
    """Whether output is read as Harmony: the reasoning or the tool-call parser is gpt-oss's.

    Harmony channels carry reasoning and calls at once, so the other parser, when given, must be
    gpt-oss's too (vLLM refuses the mix as well); raises ``CheckpointError`` otherwise.
    """
    flags = {parser.name: parser.harmony for parser in (reasoning, tools) if parser is not None}
    if any(flags.values()) and not all(flags.values()):
        raise CheckpointError(
            f"parsers {' and '.join(sorted(flags))} cannot be combined: gpt-oss output (Harmony) is read by "
            "--reasoning-parser openai_gptoss and --tool-call-parser openai together; use those two, or one"
        )
    return any(flags.values())


class HarmonyHeader(NamedTuple):
    """A parsed message header: who wrote it, on which channel, to whom, in what format."""

    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None


def parse_harmony_header(header: str, *, role: str | None) -> HarmonyHeader | None:
    """Parse the text between a message's start and ``<|message|>``, as the harmony library does.

    ``role`` is the role already known (the prompt's ``<|start|>assistant``), or ``None`` when the header
    starts with it. Returns ``None`` for a header the library rejects.
    """
    channel = None
    at = header.find(CHANNEL)
    if at >= 0:
        after = header[at + len(CHANNEL) :]
        end = next((i for i, char in enumerate(after) if char.isspace() or char == "<"), len(after))
        if end == 0:
            return None
        channel = after[:end]
        header = header[:at] + after[end:]
    header = header.strip()
    if CONSTRAIN in header:
        # "to=functions.f<|constrain|>json": the content type is a part of its own.
        header = header.replace(CONSTRAIN, " " + CONSTRAIN).strip()
    parts = [part for part in _ASCII_WHITESPACE.split(header) if part]
    if role is None:
        if not parts:
            return None
        if parts[0] in _ROLES:
            role = parts[0]
        elif len(parts) > 1 or parts[0].startswith("to="):
            parts.pop(0)  # an unknown author with a recipient: a tool's message
            role = "tool"
        else:
            return None
    if parts and parts[0] == role:
        parts.pop(0)
    recipient = content_type = None
    if parts:
        count, last = len(parts), parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif count == 1:
            recipient = last
        else:
            content_type = last
            if parts:
                raw = parts.pop()
                recipient = raw[3:] if raw.startswith("to=") else raw
    if parts:
        return None
    return HarmonyHeader(role, channel, _normalize_recipient(recipient), content_type)


def _normalize_recipient(recipient: str | None) -> str | None:
    # vLLM cuts a constrained format that older harmony versions left in the recipient.
    if recipient is None or CONSTRAIN not in recipient:
        return recipient
    return recipient[: recipient.find(CONSTRAIN)].rstrip() or None


def _is_function_recipient(recipient: str) -> bool:
    if recipient.startswith("<|") or recipient == "assistant":
        return False
    if recipient.startswith(_FUNCTIONS):
        return len(recipient) > len(_FUNCTIONS)
    return recipient.split(".", 1)[0] not in _BUILTIN_TOOLS


class _Kind(enum.Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    TOOL = "tool"
    DROPPED = "dropped"


def _kind(header: HarmonyHeader) -> _Kind:
    if header.role != "assistant":
        return _Kind.DROPPED
    if header.recipient and _is_function_recipient(header.recipient):
        return _Kind.TOOL
    if header.channel == "analysis":
        return _Kind.REASONING
    if header.channel == "final" or (header.channel == "commentary" and header.recipient is None):
        return _Kind.CONTENT
    return _Kind.DROPPED


def _tool_call(header: HarmonyHeader, text: str) -> ToolCall:
    """A function call from a tool message: JSON arguments are re-serialized, others kept as written."""
    assert header.recipient is not None
    arguments = text
    if header.content_type is None or "json" in header.content_type:
        with contextlib.suppress(ValueError):  # vLLM hands invalid JSON over as written
            arguments = json.dumps(json.loads(text))
    return ToolCall(name=header.recipient.removeprefix(_FUNCTIONS), arguments=arguments)


@dataclass
class HarmonyDelta:
    """What some Harmony output adds: reasoning and content text, and the tool calls it completed."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class _State(enum.Enum):
    HEADER = "header"
    CONTENT = "content"
    EXPECT_START = "expect_start"


class HarmonyStream:
    """Reads Harmony output (special tokens kept), delta by delta, into reasoning, content and tool calls.

    ``reasoning``: whether analysis text is returned (a reasoning parser is configured); ``tools``: whether
    calls are (a tool-call parser is configured and the request takes calls). What is not returned is
    dropped, never turned into content, as vLLM does. Calls are returned by ``finish``. Text that could be
    the start of a marker is held back until the next delta tells, so feeding all deltas then calling
    ``finish`` gives exactly ``parse_harmony`` of the whole text.
    """

    def __init__(self, *, reasoning: bool = True, tools: bool = True) -> None:
        self._returns = {_Kind.REASONING: reasoning, _Kind.CONTENT: True, _Kind.TOOL: tools}
        self._state = _State.HEADER
        # The prompt ends with "<|start|>assistant": the first header has its role already.
        self._role: str | None = "assistant"
        self._pending = ""
        self._header: list[str] = []  # the header so far, in parts
        self._header_tail = ""  # its last characters, where <|message|> may have begun
        self._message: HarmonyHeader | None = None
        self._kind = _Kind.DROPPED
        self._message_text: list[str] = []
        # Text since the last complete message, minus what the library skipped: the content vLLM returns
        # when the output ends inside a header.
        self._unfinished = ""
        self._seen: set[_Kind] = set()  # kinds some earlier message returned text of
        self._first_of_message = True
        self._calls: list[ToolCall] = []
        self._out = HarmonyDelta()

    def feed(self, delta: str) -> HarmonyDelta:
        """Consume generated text; return the reasoning and content it makes certain."""
        self._pending += delta
        while self._step():
            pass
        return self._take()

    def finish(self) -> HarmonyDelta:
        """End of output: flush what was held back and return it with all the calls."""
        while self._step():
            pass
        if self._state is _State.CONTENT:
            self._message_text_append(self._pending)
            self._complete_message()
        elif self._state is _State.HEADER:
            # The library fails on an end inside a header; vLLM then returns the raw text as final content.
            self._emit(_Kind.CONTENT, self._unfinished + "".join(self._header) + self._pending)
        self._pending = self._header_tail = self._unfinished = ""
        self._header = []
        self._state = _State.EXPECT_START
        out = self._take()
        out.tool_calls, self._calls = self._calls, []
        return out

    def state(self) -> dict[str, Any]:
        """Where the reader is in the output and what it holds, as JSON data (`from_state` resumes)."""
        message = self._message
        return {
            "state": self._state.value,
            "role": self._role,
            "pending": self._pending,
            "header": "".join(self._header),
            "header_tail": self._header_tail,
            "message": list(message) if message is not None else None,
            "kind": self._kind.value,
            "message_text": "".join(self._message_text),
            "unfinished": self._unfinished,
            "seen": sorted(kind.value for kind in self._seen),
            "first_of_message": self._first_of_message,
            "calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self._calls],
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], *, reasoning: bool = True, tools: bool = True
    ) -> HarmonyStream:
        """A reader that continues from `state`; `reasoning` and `tools` as for a new one."""
        texts = ("pending", "header", "header_tail", "message_text", "unfinished")
        if not all(isinstance(state[key], str) for key in texts):
            raise ValueError(f"Harmony state {', '.join(texts)} must be strings")
        role, message, calls = state["role"], state["message"], state["calls"]
        if role is not None and not isinstance(role, str):
            raise ValueError("Harmony state `role` must be a string or null")
        if message is not None and not (
            isinstance(message, list)
            and len(message) == 4
            and isinstance(message[0], str)
            and all(part is None or isinstance(part, str) for part in message)
        ):
            raise ValueError("Harmony state `message` must be a header [role, channel, recipient, type]")
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("id", "name", "arguments"))
            for c in calls
        ):
            raise ValueError("Harmony state `calls` must be a list of {id, name, arguments} strings")
        if not isinstance(state["first_of_message"], bool) or not isinstance(state["seen"], list):
            raise ValueError("Harmony state `first_of_message` must be a boolean and `seen` a list")
        stream = cls(reasoning=reasoning, tools=tools)
        stream._state, stream._role = _State(state["state"]), role
        stream._pending, stream._header_tail = state["pending"], state["header_tail"]
        stream._header = [state["header"]] if state["header"] else []
        stream._message = HarmonyHeader(*message) if message is not None else None
        stream._kind = _Kind(state["kind"])
        stream._message_text = [state["message_text"]] if state["message_text"] else []
        stream._unfinished = state["unfinished"]
        stream._seen = {_Kind(kind) for kind in state["seen"]}
        stream._first_of_message = state["first_of_message"]
        stream._calls = [ToolCall(c["name"], c["arguments"], id=c["id"]) for c in calls]
        return stream

    def _take(self) -> HarmonyDelta:
        out, self._out = self._out, HarmonyDelta()
        return out

    def _step(self) -> bool:
        """Advance by one marker; return whether another step may make progress."""
        if self._state is _State.EXPECT_START:
            return self._step_expect_start()
        if self._state is _State.HEADER:
            return self._step_header()
        return self._step_content()

    def _step_expect_start(self) -> bool:
        at = self._pending.find(START)
        if at < 0:
            # Anything but <|start|> between messages is skipped.
            keep = partial_marker_length(self._pending, (START,))
            self._pending = self._pending[len(self._pending) - keep :]
            return False
        self._pending = self._pending[at + len(START) :]
        self._unfinished += START
        self._state = _State.HEADER
        return True

    def _step_header(self) -> bool:
        # Output that is not Harmony stays in the header to the end: keep it in parts, search only the new
        # text and the few characters before it that a marker could start in.
        tail = self._header_tail
        window = tail + self._pending
        at = window.find(MESSAGE)
        if at < 0:
            if self._pending:
                self._header.append(self._pending)
            self._header_tail = window[-(len(MESSAGE) - 1) :]
            self._pending = ""
            return False
        seen = "".join(self._header)
        header = seen[: len(seen) - len(tail)] + window[:at]
        self._pending, self._header, self._header_tail = window[at + len(MESSAGE) :], [], ""
        self._unfinished += header
        parsed = parse_harmony_header(header, role=self._role)
        if parsed is None:
            self._state = _State.EXPECT_START  # the message is lost; its header text is not
            return True
        self._unfinished += MESSAGE
        self._role = None
        self._message, self._kind = parsed, _kind(parsed)
        self._state = _State.CONTENT
        return True

    def _step_content(self) -> bool:
        ends = [(at, marker) for marker in _MESSAGE_ENDS if (at := self._pending.find(marker)) >= 0]
        if ends:
            at, marker = min(ends)
            self._message_text_append(self._pending[:at])
            self._pending = self._pending[at + len(marker) :]
            self._complete_message()
            self._state = _State.EXPECT_START
            return True
        keep = partial_marker_length(self._pending, _MESSAGE_ENDS)
        cut = len(self._pending) - keep
        self._message_text_append(self._pending[:cut])
        self._pending = self._pending[cut:]
        return False

    def _message_text_append(self, text: str) -> None:
        if not text:
            return
        if self._kind is _Kind.TOOL:
            self._message_text.append(text)
        else:
            self._emit(self._kind, text)

    def _complete_message(self) -> None:
        if self._kind is _Kind.TOOL and self._returns[_Kind.TOOL] and self._message is not None:
            self._calls.append(_tool_call(self._message, "".join(self._message_text)))
        self._message, self._kind, self._message_text = None, _Kind.DROPPED, []
        self._unfinished = ""
        self._first_of_message = True

    def _emit(self, kind: _Kind, text: str) -> None:
        if not text or kind is _Kind.DROPPED or not self._returns[kind]:
            return
        if kind in self._seen and self._first_of_message:
            text = "\n" + text  # vLLM joins the messages of one kind with newlines
        self._seen.add(kind)
        self._first_of_message = False
        if kind is _Kind.REASONING:
            self._out.reasoning += text
        else:
            self._out.content += text


def parse_harmony(text: str, *, reasoning: bool = True, tools: bool = True) -> HarmonyDelta:
    """Read complete Harmony output into reasoning, content and tool calls (see ``HarmonyStream``)."""
    stream = HarmonyStream(reasoning=reasoning, tools=tools)
    first, last = stream.feed(text), stream.finish()
    return HarmonyDelta(first.reasoning + last.reasoning, first.content + last.content, last.tool_calls)

"""One choice's output: generated ids in; reasoning, content, tool calls and the finish reason out.

`OutputConfig` says how a request's output is read (stop strings, hidden ids, reasoning and tool-call
parsers, a forced call, Harmony); it is built from the server's parsers and the request, the same for
each of its choices. `ChoiceParser` is one choice's pipeline

    ids -> IncrementalDetokenizer -> StopStringMatcher -> ReasoningStream -> ToolCallHold / ForcedToolCall
                                                       \\-> HarmonyStream (gpt-oss: channels, not markers)

driven token by token (`push`), a chunk at a time (`push_ids`), or all at once (`parse_output`), and
resumed from `state()` (`ChoiceParser.resume`). Every way gives the same text: the parser moves one id at
a time whatever the chunking, so the concatenated deltas of a stream equal the whole-output answer.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tokenfront.core.errors import RenderError
from tokenfront.core.output.calls import ForcedToolCall, ToolCallHold
from tokenfront.core.output.detokenizer import Decode, IncrementalDetokenizer
from tokenfront.core.output.harmony import HarmonyStream, reads_harmony
from tokenfront.core.output.reasoning import ReasoningStream
from tokenfront.core.output.stop_strings import StopStringMatcher, StopStrings
from tokenfront.core.reasoning import OutputStart, ReasoningParser, output_start
from tokenfront.core.tool_call import ToolCall

if TYPE_CHECKING:
    from tokenfront.core.tool_calls import ToolCallParser
from tokenfront.protocol import ChatCompletionRequest

__all__ = [
    "STATE_VERSION",
    "ChoiceParser",
    "OutputConfig",
    "OutputDelta",
    "OutputStateError",
    "TokenDecoder",
    "parse_output",
    "resolve_finish_reason",
]

# Bumped whenever the meaning of a stored state changes: a state of another version is refused.
STATE_VERSION = 1


class TokenDecoder(Protocol):
    """What the output core needs of a tokenizer (a transformers tokenizer is one)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str:
        """The text of `token_ids`."""
        ...


class OutputStateError(RenderError):
    """A carried parser state (a derender `stream_state`) that cannot be resumed: a 400 naming it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="stream_state", code="invalid_stream_state")


@dataclass
class OutputDelta:
    """What a step adds to a choice: reasoning and content text, calls (only at the end), and on the last
    step the finish reason."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None

    def __bool__(self) -> bool:
        """Whether there is anything to show (the finish reason aside)."""
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: OutputDelta) -> None:
        """Append another delta to this one."""
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)
        self.finish_reason = other.finish_reason or self.finish_reason


@dataclass(frozen=True)
class OutputConfig:
    """How one request's output is read; built from the server's parsers and the request.

    `hidden_ids` (EOS ids) are never shown. `reasoning` splits reasoning from content, starting where
    `reasoning_start` says. `tool_calls` parses calls out of the content (None: the request takes none).
    `forced_tool` (a named tool_choice): the output is that call's arguments, neither reasoning nor content.
    `harmony` (gpt-oss): channels split the output; analysis is reasoning only when `reasoning` is set, calls
    are kept only when `tool_calls` is.
    """

    stop: tuple[str, ...] = ()
    hidden_ids: frozenset[int] = frozenset()
    reasoning: ReasoningParser | None = None
    reasoning_start: OutputStart = OutputStart.UNDECIDED
    tool_calls: ToolCallParser | None = None
    forced_tool: str | None = None
    harmony: bool = False

    def __post_init__(self) -> None:
        if self.forced_tool is not None and self.tool_calls is None:
            raise ValueError("a forced tool call needs the tool-call parser that reads it back")

    @functools.cached_property
    def stop_strings(self) -> StopStrings:
        """`stop` compiled into one automaton, once for every choice read with this config."""
        return StopStrings(self.stop)

    @property
    def keep_special_tokens(self) -> bool:
        """Whether output is decoded with special tokens kept: call markers may be special tokens (vLLM's
        hermes parser keeps them the same way), as are Harmony's and some reasoning markers ([THINK])."""
        return (
            self.tool_calls is not None
            or self.harmony
            or (self.reasoning is not None and self.reasoning.markers_are_special_tokens)
        )

    @classmethod
    def for_completion(
        cls, *, stop: str | Sequence[str] | None = None, hidden_ids: Iterable[int] = ()
    ) -> OutputConfig:
        """Completions output: text, cut at stop strings; no parser reads it."""
        return cls(stop=_stops(stop), hidden_ids=frozenset(hidden_ids))

    @classmethod
    def for_chat(
        cls,
        request: ChatCompletionRequest,
        *,
        reasoning_parser: ReasoningParser | None,
        tool_call_parser: ToolCallParser | None,
        hidden_ids: Iterable[int] = (),
        prompt_reasoning_ended: bool | None = None,
        default_chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> OutputConfig:
        """Chat output of `request` on a server with these parsers.

        `prompt_reasoning_ended` is `reasoning_ended(parser, prompt text)` (read only by parsers that take
        the mode from the prompt); the server's default chat_template_kwargs are merged under the
        request's, as the prompt was rendered. A named tool_choice must have been validated (it names a
        request tool, and the tool-call parser is configured).
        """
        stop, hidden = _stops(request.stop), frozenset(hidden_ids)
        forced = request.named_tool
        if forced is not None and tool_call_parser is not None:
            return cls(stop=stop, hidden_ids=hidden, tool_calls=tool_call_parser, forced_tool=forced)
        # "required" is read like "auto": the output is parsed, but not constrained to contain a call.
        takes_calls = bool(request.tools) and request.tool_choice != "none"
        tools = tool_call_parser if takes_calls else None
        if reads_harmony(reasoning_parser, tool_call_parser):
            return cls(
                stop=stop, hidden_ids=hidden, reasoning=reasoning_parser, tool_calls=tools, harmony=True
            )
        start = OutputStart.UNDECIDED
        if reasoning_parser is not None:
            kwargs = {**(default_chat_template_kwargs or {}), **(request.chat_template_kwargs or {})}
            start = output_start(
                reasoning_parser, prompt_reasoning_ended=prompt_reasoning_ended, chat_template_kwargs=kwargs
            )
        return cls(
            stop=stop, hidden_ids=hidden, reasoning=reasoning_parser, reasoning_start=start, tool_calls=tools
        )


def _stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


def resolve_finish_reason(reason: str, *, stopped: bool, tool_calls: bool) -> str:
    """The OpenAI finish reason of a choice: a stop string makes it "stop"; calls make it "tool_calls",
    unless the output was cut by the token budget ("length" tells a client the call may be incomplete)."""
    reason = "stop" if stopped else reason
    return "tool_calls" if tool_calls and reason != "length" else reason


class ChoiceParser:
    """The output pipeline of one generated sequence (see the module docstring).

    `push` returns what a stream may send now; once a stop string is found, `stopped` is true and further
    ids are ignored (the caller stops generating). `finish` returns the rest, calls included, with the
    finish reason. `context_ids`: the prompt's last ids, so the first output token decodes as it follows
    them (vLLM seeds its detokenizer this way); none by default.
    """

    def __init__(
        self, config: OutputConfig, tokenizer: TokenDecoder, *, context_ids: Sequence[int] = ()
    ) -> None:
        self.config = config
        self._decode = _decoder(tokenizer, keep_special_tokens=config.keep_special_tokens)
        self._detokenizer = IncrementalDetokenizer(self._decode, context=context_ids)
        self._stop = StopStringMatcher(config.stop_strings)
        self._reasoning: ReasoningStream | None = None
        self._tools: ToolCallHold | ForcedToolCall | None = None
        self._harmony: HarmonyStream | None = None
        tools = config.tool_calls
        if config.forced_tool is not None and tools is not None:
            self._tools = ForcedToolCall(tools, config.forced_tool)
        elif config.harmony:
            self._harmony = HarmonyStream(reasoning=config.reasoning is not None, tools=tools is not None)
        else:
            if config.reasoning is not None:
                self._reasoning = ReasoningStream(config.reasoning, start=config.reasoning_start)
            if tools is not None:
                self._tools = ToolCallHold(tools)
        self.finished = False

    @property
    def stopped(self) -> bool:
        """Whether a stop string ended the text."""
        return self._stop.stopped

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the text, if one did (vLLM's `stop_reason`)."""
        return self._stop.matched

    def push(self, token_id: int) -> OutputDelta:
        """Add one generated id; return the delta it makes visible."""
        if self.stopped or self.finished or token_id in self.config.hidden_ids:
            return OutputDelta()
        return self._route(self._stop.feed(self._detokenizer.push(token_id)))

    def push_ids(self, token_ids: Iterable[int]) -> OutputDelta:
        """Add several generated ids (a chunk of a stream); return the delta they make visible."""
        # Joined once at the end: `extend` per id would copy the text so far each time (a million ids: minutes).
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCall] = []
        for token_id in token_ids:
            if self.stopped:
                break
            step = self.push(token_id)
            reasoning.append(step.reasoning)
            content.append(step.content)
            calls.extend(step.tool_calls)
        return OutputDelta("".join(reasoning), "".join(content), calls)

    def finish(self, reason: str) -> OutputDelta:
        """Flush everything held back, parse tool calls, and resolve the finish reason; call once, last.

        `reason` is why generation ended ("stop", "length", "abort", ...); see `resolve_finish_reason`.
        """
        delta = OutputDelta()
        if not self.finished:
            self.finished = True
            if not self.stopped:
                delta.extend(self._route(self._stop.feed(self._detokenizer.flush())))
                delta.extend(self._route(self._stop.flush()))
            delta.extend(self._route("", final=True))
        delta.finish_reason = resolve_finish_reason(
            reason, stopped=self.stopped, tool_calls=bool(delta.tool_calls)
        )
        return delta

    # -- carried state -------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything this parser holds between two ids, as JSON data; `resume` continues from it.

        Only what the output so far leaves behind: the detokenizer's window (a few ids), text held back
        for stop strings and markers, the reasoning phase, the content a tool-call parser will read at the
        end, Harmony's message state. The request's configuration is not in it: the caller rebuilds the
        same `OutputConfig` on every call.
        """
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "detokenizer": self._detokenizer.state(),
            "stop": self._stop.state(),
        }
        if self._reasoning is not None:
            state["reasoning"] = self._reasoning.state()
        if self._tools is not None:
            state["tool_calls"] = self._tools.state()
        if self._harmony is not None:
            state["harmony"] = self._harmony.state()
        return state

    @classmethod
    def resume(cls, config: OutputConfig, tokenizer: TokenDecoder, state: Mapping[str, Any]) -> ChoiceParser:
        """A parser that continues where the one whose `state()` this is stopped, for the same `config`.

        Raises `OutputStateError` (a 400) for a state this config cannot continue from: another version,
        missing or mistyped fields, parts of other parsers.
        """
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise OutputStateError(f"stream_state is not a version {STATE_VERSION} output parser state")
        parser = cls(config, tokenizer)
        expected = {"version", "detokenizer", "stop"} | {
            name
            for name, part in (
                ("reasoning", parser._reasoning),
                ("tool_calls", parser._tools),
                ("harmony", parser._harmony),
            )
            if part is not None
        }
        if set(state) != expected:
            raise OutputStateError(
                f"stream_state holds {', '.join(sorted(set(state)))}; this request's output needs "
                f"{', '.join(sorted(expected))} (was it made for another request or server?)"
            )
        try:
            parser._detokenizer = IncrementalDetokenizer.from_state(parser._decode, state["detokenizer"])
            parser._stop = StopStringMatcher.from_state(config.stop_strings, state["stop"])
            if config.reasoning is not None and parser._reasoning is not None:
                parser._reasoning = ReasoningStream.from_state(config.reasoning, state["reasoning"])
            if isinstance(parser._tools, ForcedToolCall) and config.forced_tool is not None:
                assert config.tool_calls is not None
                parser._tools = ForcedToolCall.from_state(
                    config.tool_calls, config.forced_tool, state["tool_calls"]
                )
            elif parser._tools is not None and config.tool_calls is not None:
                parser._tools = ToolCallHold.from_state(config.tool_calls, state["tool_calls"])
            if parser._harmony is not None:
                parser._harmony = HarmonyStream.from_state(
                    state["harmony"],
                    reasoning=config.reasoning is not None,
                    tools=config.tool_calls is not None,
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise OutputStateError(f"stream_state is malformed ({type(exc).__name__}: {exc})") from exc
        return parser

    # -- routing text ----------------------------------------------------------------------------------------

    def _route(self, text: str, *, final: bool = False) -> OutputDelta:
        # `final` comes with no text: it only flushes the reasoning splitter and the tool-call parser.
        if self._harmony is not None:
            out = self._harmony.finish() if final else self._harmony.feed(text)
            return OutputDelta(out.reasoning, out.content, out.tool_calls)
        if self._reasoning is None:
            reasoning, content = "", text
        else:
            split = self._reasoning.finish() if final else self._reasoning.feed(text)
            reasoning, content = split.reasoning or "", split.content or ""
        if self._tools is None:
            return OutputDelta(reasoning, content)
        shown = self._tools.feed(content)
        if not final:
            return OutputDelta(reasoning, shown)
        rest, calls = self._tools.finish()
        return OutputDelta(reasoning, shown + rest, calls)


def _decoder(tokenizer: TokenDecoder, *, keep_special_tokens: bool) -> Decode:
    skip = not keep_special_tokens
    return lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=skip))


def parse_output(
    config: OutputConfig,
    tokenizer: TokenDecoder,
    token_ids: Sequence[int],
    finish_reason: str,
    *,
    context_ids: Sequence[int] = (),
) -> OutputDelta:
    """A whole output at once: what a stream of the same ids sends, concatenated."""
    parser = ChoiceParser(config, tokenizer, context_ids=context_ids)
    delta = parser.push_ids(token_ids)
    delta.extend(parser.finish(finish_reason))
    return delta

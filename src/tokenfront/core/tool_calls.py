"""Tool-call parsers: forced-call prefixes for a named ``tool_choice`` and parsing calls out of output.

A tool-call parser (``--tool-call-parser NAME``) knows how a model writes a function
call. It serves twice (docs/contract.md §7): to force a call to one named function, the render
pipeline appends ``forced_call_prefix(name)`` to the rendered prompt
(``RenderPipeline.render_chat(..., forced_tool=name)``) so the model's continuation is
just the JSON arguments object (``forced_call_suffix`` is what closes the call after
it); and the output core (``core.output``) turns generated text into ``tool_calls``
with ``parse``, streaming content up to the parser's ``call_markers``. The prefix
changes the prompt ids, so the rendering fingerprint hashes ``fingerprint_component()``
(docs/contract.md §5).
"""

from __future__ import annotations

import json
import re
import types
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenfront.core.output.harmony import parse_harmony
from tokenfront.core.reasoning import UnknownParserError, lookup_parser
from tokenfront.core.tool_call import ToolCall, make_mistral_tool_call_id, make_tool_call_id

__all__ = [
    "TOOL_CALL_PARSERS",
    "HarmonyToolCallParser",
    "HermesToolCallParser",
    "Llama3JsonToolCallParser",
    "MistralToolCallParser",
    "ParsedToolCalls",
    "ToolCall",
    "ToolCallParser",
    "UnknownParserError",
    "get_tool_call_parser",
    "make_mistral_tool_call_id",
    "make_tool_call_id",
]

_NAME_PLACEHOLDER = "{name}"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ParsedToolCalls:
    """Generated text split into the calls found and the remaining ``content``.

    Without calls, ``content`` is the text unchanged; with calls, the text around them,
    stripped (``None`` when nothing but whitespace is left).
    """

    content: str | None
    calls: list[ToolCall]


class ToolCallParser(ABC):
    """How one model family writes tool calls."""

    name: str
    aliases: tuple[str, ...] = ()
    # The forced-call prefix with ``{name}`` standing for the JSON-encoded function name.
    prefix_template: str
    forced_call_suffix: str
    # The output is OpenAI Harmony (gpt-oss): core/output/harmony.py reads calls, reasoning and content.
    harmony: bool = False
    # Where a call may begin in streamed content: text from the first of these on is held back until the
    # output ends and the parser reads it all. None: any text may be part of a call, so all content is held
    # (always correct, only later).
    call_markers: tuple[str, ...] | None = None
    # Output that starts with one of these (after whitespace) may be a call as a whole (Llama 3's bare JSON).
    call_openings: tuple[str, ...] = ()

    def forced_call_prefix(self, function_name: str) -> str:
        """Text appended to the rendered prompt to force a call to ``function_name``.

        The model's continuation is then the arguments JSON object, closed by
        ``forced_call_suffix``.
        """
        # JSON-encoded, so a name can never break out of the string it sits in.
        return self.prefix_template.replace(_NAME_PLACEHOLDER, json.dumps(function_name, ensure_ascii=False))

    def forced_call_text(self, function_name: str, arguments_json: str) -> str:
        """The whole call as the model would have written it, from a forced call's arguments."""
        return self.forced_call_prefix(function_name) + arguments_json + self.forced_call_suffix

    def fingerprint_component(self) -> dict[str, str]:
        """What this parser contributes to the prompt ids: the forced-call prefix and suffix."""
        return {"forced_call_prefix": self.prefix_template, "forced_call_suffix": self.forced_call_suffix}

    @abstractmethod
    def parse(self, text: str) -> ParsedToolCalls:
        """Find the tool calls in complete generated text."""


def _arguments_json(value: Any) -> str | None:
    """Arguments as a JSON object string, or ``None`` when they are not an object."""
    if isinstance(value, str):
        # Some models write the arguments as a JSON string holding the object.
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def _call_from_object(obj: Any, argument_keys: tuple[str, ...]) -> ToolCall | None:
    """A ``ToolCall`` from a decoded ``{"name": ..., <argument key>: {...}}`` object, if it is one."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    key = next((key for key in argument_keys if key in obj), None)
    arguments = "{}" if key is None else _arguments_json(obj[key])
    return None if arguments is None else ToolCall(name=name, arguments=arguments)


def _skip_whitespace(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _decode_object(text: str, at: int) -> tuple[Any, int] | None:
    """Decode one JSON value starting at ``at`` (leading whitespace allowed); return it and its end."""
    at = _skip_whitespace(text, at)
    try:
        return _DECODER.raw_decode(text, at)
    except ValueError:
        return None


def _content_around(pieces: list[str]) -> str | None:
    return "".join(pieces).strip() or None


class HermesToolCallParser(ToolCallParser):
    """Hermes / Qwen style: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks.

    Any number of blocks, text before, between and after them. A block whose JSON does
    not decode to a call stays in the content verbatim. The last block may lack its
    closing tag (generation stopped on it).
    """

    name = "hermes"
    aliases = ("qwen", "qwen25")
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    call_markers = (open_tag,)
    # As Qwen's own template writes a call, so a forced call looks like one from history.
    prefix_template = '<tool_call>\n{"name": {name}, "arguments": '
    forced_call_suffix = "}\n</tool_call>"

    def parse(self, text: str) -> ParsedToolCalls:
        """Find the ``<tool_call>`` blocks in ``text``."""
        calls: list[ToolCall] = []
        pieces: list[str] = []
        copied = searched = 0
        while (start := text.find(self.open_tag, searched)) >= 0:
            block = self._read_block(text, start + len(self.open_tag))
            if block is None:
                searched = start + len(self.open_tag)
                continue
            call, end = block
            calls.append(call)
            pieces.append(text[copied:start])
            copied = searched = end
        if not calls:
            return ParsedToolCalls(content=text or None, calls=[])
        pieces.append(text[copied:])
        return ParsedToolCalls(content=_content_around(pieces), calls=calls)

    def _read_block(self, text: str, at: int) -> tuple[ToolCall, int] | None:
        """The call in the block whose JSON starts at ``at`` and where the block ends."""
        # Decoding the JSON (rather than searching for the close tag) keeps a
        # "</tool_call>" inside an argument string from cutting the block short.
        decoded = _decode_object(text, at)
        if decoded is None:
            return None
        obj, end = decoded
        call = _call_from_object(obj, ("arguments", "parameters"))
        if call is None:
            return None
        end = _skip_whitespace(text, end)
        if text.startswith(self.close_tag, end):
            return call, end + len(self.close_tag)
        if end == len(text):
            return call, end
        return None


class Llama3JsonToolCallParser(ToolCallParser):
    """Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}``, maybe after ``<|python_tag|>``.

    Several calls may follow one another, separated by ``;``. Output that does not start
    with a call (after an optional ``<|python_tag|>``) is content.
    """

    name = "llama3_json"
    aliases = ("llama3",)
    python_tag = "<|python_tag|>"
    call_markers = (python_tag,)
    call_openings = ("{",)
    # As the Llama 3.1-3.3 templates write a call in history.
    prefix_template = '{"name": {name}, "parameters": '
    forced_call_suffix = "}"

    def parse(self, text: str) -> ParsedToolCalls:
        """Find the JSON calls at the start of ``text`` (or right after ``<|python_tag|>``)."""
        tag_at = text.find(self.python_tag)
        before = text[:tag_at] if tag_at >= 0 else ""
        at = tag_at + len(self.python_tag) if tag_at >= 0 else 0
        calls: list[ToolCall] = []
        while (decoded := _decode_object(text, at)) is not None:
            obj, end = decoded
            call = _call_from_object(obj, ("parameters", "arguments"))
            if call is None:
                break
            calls.append(call)
            at = _skip_whitespace(text, end)
            if not text.startswith(";", at):
                break
            at += 1
        if not calls:
            return ParsedToolCalls(content=text or None, calls=[])
        return ParsedToolCalls(content=_content_around([before, text[at:]]), calls=calls)


class MistralToolCallParser(ToolCallParser):
    """Mistral's ``[TOOL_CALLS]`` calls, as vLLM 0.33's ``mistral`` parser reads complete output.

    Two formats, told apart by what follows the first ``[TOOL_CALLS]``: a JSON array of
    ``{"name", "arguments"}`` objects (or one object; tokenizers before v11), or one or more
    ``[TOOL_CALLS]name[ARGS]{...}`` (v11 and later; ``name{...}`` without ``[ARGS]`` too). Content is the
    text before the first marker (v11: stripped); text after the calls is dropped, as vLLM drops it.
    Unlike vLLM, output whose calls have no name or arguments that are not a JSON object gives no call:
    it stays content, unchanged (v11: only that call's ``[TOOL_CALLS]`` segment does).
    """

    name = "mistral"
    marker = "[TOOL_CALLS]"
    args_marker = "[ARGS]"
    call_markers = (marker,)
    # The v11+ format, which current Mistral models write; the name is written as is.
    prefix_template = "[TOOL_CALLS]{name}[ARGS]"
    forced_call_suffix = ""

    def forced_call_prefix(self, function_name: str) -> str:
        """``[TOOL_CALLS]name[ARGS]``: the model's continuation is the arguments object."""
        return self.prefix_template.replace(_NAME_PLACEHOLDER, function_name)

    def parse(self, text: str) -> ParsedToolCalls:
        """Find the ``[TOOL_CALLS]`` calls in ``text``."""
        at = text.find(self.marker)
        if at < 0:
            return ParsedToolCalls(content=text or None, calls=[])
        before, segments = text[:at], text[at + len(self.marker) :].split(self.marker)
        first = next((segment.strip() for segment in segments if segment.strip()), "")
        if first.startswith(("[", "{")):
            calls = self._json_calls(first)
            content = before if before.strip() else None
        else:
            calls, leftovers = self._named_calls(segments)
            content = (before + "".join(leftovers)).strip() or None
        if not calls:
            return ParsedToolCalls(content=text or None, calls=[])
        return ParsedToolCalls(content=content, calls=calls)

    def _json_calls(self, payload: str) -> list[ToolCall]:
        """Before v11: the first JSON value after the marker (vLLM's regex fallback included)."""
        decoded = _decode_object(payload, 0)
        if decoded is not None:
            value = decoded[0]
        else:
            match = _JSON_ARRAY_OF_OBJECTS.search(payload)
            try:
                value = json.loads(match.group(0)) if match else None
            except ValueError:
                return []
        items = [value] if isinstance(value, dict) else value if isinstance(value, list) else []
        calls = []
        for item in items:
            if not isinstance(item, dict) or not ("name" in item or "arguments" in item):
                continue  # not a call object: vLLM skips it
            call = self._json_call(item)
            if call is None:
                return []
            calls.append(call)
        return calls

    def _json_call(self, item: dict[str, Any]) -> ToolCall | None:
        name, value = item.get("name"), item.get("arguments")
        if not isinstance(name, str) or not name:
            return None
        if value is None:
            arguments: str | None = "{}"
        elif isinstance(value, str):
            # A JSON object in a string is kept as the model wrote it, as vLLM keeps it.
            arguments = value if _arguments_json(value) is not None else None
        else:
            arguments = json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None
        return None if arguments is None else ToolCall(name, arguments, id=make_mistral_tool_call_id())

    def _named_calls(self, segments: list[str]) -> tuple[list[ToolCall], list[str]]:
        """v11+: one call per ``[TOOL_CALLS]`` segment; segments that are not calls stay, marker and all."""
        calls, leftovers = [], []
        for segment in segments:
            if not segment.strip():
                continue  # a marker with nothing after it
            call = self._named_call(segment)
            if call is None:
                leftovers.append(self.marker + segment)
            else:
                calls.append(call)
        return calls, leftovers

    def _named_call(self, segment: str) -> ToolCall | None:
        if self.args_marker in segment:
            name, arguments = segment.split(self.args_marker, 1)
        elif "{" in segment:
            brace = segment.index("{")
            name, arguments = segment[:brace], segment[brace:]
        else:
            return None
        name, arguments = name.strip(), arguments.strip()
        if not name:
            return None
        if not arguments:
            return ToolCall(name, "{}", id=make_mistral_tool_call_id())
        decoded = _decode_object(arguments, 0)
        if decoded is None or not isinstance(decoded[0], dict):
            return None
        # The arguments as written; anything after the object is dropped (vLLM's raw_decode).
        return ToolCall(name, arguments[: decoded[1]], id=make_mistral_tool_call_id())


_JSON_ARRAY_OF_OBJECTS = re.compile(r"\[{.*}\]", re.DOTALL)


class HarmonyToolCallParser(ToolCallParser):
    """gpt-oss's Harmony calls: a message to ``functions.NAME`` (vLLM's ``openai`` tool-call parser).

    The output core reads Harmony output, calls included, with ``core.output.harmony.HarmonyStream``;
    ``parse`` serves forced calls, whose prefix opens the call message as Harmony renders one in history.
    """

    name = "openai"
    harmony = True
    prefix_template = "<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
    forced_call_suffix = "<|call|>"

    def forced_call_prefix(self, function_name: str) -> str:
        """The header of a call message to ``functions.NAME``; the model writes its arguments."""
        return self.prefix_template.replace(_NAME_PLACEHOLDER, function_name)

    def parse(self, text: str) -> ParsedToolCalls:
        """The calls in Harmony output; content is its final and preamble text."""
        parsed = parse_harmony(text, reasoning=False, tools=True)
        if not parsed.tool_calls:
            return ParsedToolCalls(content=text or None, calls=[])
        return ParsedToolCalls(content=parsed.content.strip() or None, calls=parsed.tool_calls)


# Canonical name -> parser. Read-only: parsers are looked up, never registered at runtime.
TOOL_CALL_PARSERS: Mapping[str, ToolCallParser] = types.MappingProxyType(
    {
        parser.name: parser
        for parser in (
            HermesToolCallParser(),
            Llama3JsonToolCallParser(),
            MistralToolCallParser(),
            HarmonyToolCallParser(),
        )
    }
)


def get_tool_call_parser(name: str) -> ToolCallParser:
    """Return the tool-call parser registered as ``name`` (or an alias of it).

    Raises ``UnknownParserError`` (a ``ValueError``) naming the known parsers.
    """
    parser: ToolCallParser = lookup_parser("tool-call", name, TOOL_CALL_PARSERS)
    return parser

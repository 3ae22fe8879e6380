"""gpt-oss (`model_type` gpt_oss): chat is rendered in the Harmony format, as vLLM 0.33 does, not by a template.

vLLM ignores the checkpoint's chat template for gpt-oss (`use_harmony`): it turns the request into Harmony
messages (`vllm/renderers/online_renderer.py` `_make_request_with_harmony`,
`vllm/entrypoints/openai/parser/harmony_utils.py`) and renders them with the oss-harmony library
(`openai_harmony`). This module builds the same messages and renders them with the same library:

- a system message: the library's defaults (model identity, knowledge cutoff 2024-06, the three channels),
  the current date and `reasoning_effort` (low, medium, high; absent is medium). `none` is refused, as are
  `minimal`, `xhigh` and `max`, which Harmony has no value for;
- a developer message when the first message is a system or developer message with text, or tools are given:
  that text as `# Instructions` and the tools as the `functions` namespace; it is not rendered for empty
  text and no tools. Later system and developer messages become developer messages of their own;
- user messages, one text content per part (an empty user message is still rendered);
- assistant messages: `reasoning` (else `reasoning_content`) on the `analysis` channel, the content on
  `final`, or — with tool calls — on `commentary`, followed by one `functions.NAME` call per tool call
  (arguments as sent, content type `json`); an assistant message whose content is empty (or whose first
  part is) renders no final message. Analysis messages before the last final message are dropped;
- tool messages from `functions.NAME`, the name found through `tool_call_id` among the assistant tool calls;
- the tool-call headers of earlier assistant turns in the pre-0.0.10 shape vLLM rewrites them to
  (`assistant to=functions.NAME<|channel|>commentary json`), then `<|start|>assistant`.

`add_generation_prompt`, `continue_final_message`, `add_special_tokens`, `documents` and
`chat_template_kwargs` change nothing, as in vLLM. What vLLM refuses is refused with a `RenderError` (400):
the reasoning efforts above, `tools: []`, a `tool_choice` without tools or naming none of them, tool calls
without an `id`, `type` or string `arguments`, null content outside assistant messages, the `function` role,
content parts other than text and refusal (refusal parts render no text, as in vLLM). Media parts are refused
too, as everywhere in tokenfront (vLLM drops them silently for gpt-oss).

The date: the conversation start date is today's date in UTC when the request is rendered (vLLM uses the
server's local date; set the machines' time zone to UTC to match). Two processes rendering the same request on
either side of midnight produce different ids; ids forwarded by a router are used by the worker as sent, so a
request is never rendered twice. `VLLM_SYSTEM_START_DATE` (read at start-up) pins the date, as it does in
vLLM; a pinned date is part of the fingerprint.

The vocabulary: oss-harmony reads `o200k_base.tiktoken` from the directory named by `TIKTOKEN_ENCODINGS_BASE`
(else it downloads it) and checks its sha256. tokenfront derives that file from the checkpoint's own
tokenizer.json (byte-level BPE: each token's bytes, base64, and its id as rank), so a checkpoint whose
vocabulary is not o200k fails at start-up with one clear `CheckpointError`. The file is written once into
`$TOKENFRONT_CACHE/harmony` (default `~/.cache/tokenfront/harmony`), through a temporary name and a rename,
or into a private temporary directory when that is not writable. The encoding is loaded once per process, with
the variable set only for that call, and its special-token ids are checked against the tokenizer's.
"""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
import threading
from array import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenfront.cache_root import cache_root
from tokenfront.core.errors import CheckpointError, RenderError
from tokenfront.core.families.chat_format import FormattedChat
from tokenfront.core.messages import refuse_media_part

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding

    from tokenfront.core.checkpoint import Checkpoint
    from tokenfront.protocol import ChatCompletionRequest

__all__ = [
    "ENCODING_NAME",
    "MODEL_TYPE",
    "O200K_BASE_SHA256",
    "HarmonyChatFormat",
    "check_special_tokens",
    "harmony_encoding",
    "harmony_messages",
    "o200k_base_file",
    "tiktoken_encodings_dir",
]

MODEL_TYPE = "gpt_oss"
ENCODING_NAME = "HarmonyGptOss"
LIBRARY = "oss-harmony"
TIKTOKEN_FILE = "o200k_base.tiktoken"
# The sha256 oss-harmony (and tiktoken) expect of o200k_base.tiktoken.
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# Bump when a change here changes ids for some request (it is part of the fingerprint's chat_format).
_SEMANTICS_VERSION = "1"

# vLLM's `REASONING_EFFORT`: the request's value -> the library's ReasoningEffort value.
_REASONING_EFFORTS = {"high": "High", "medium": "Medium", "low": "Low"}
# The tokens Harmony's format itself emits: they must be the tokenizer's tokens of the same name.
_FORMAT_TOKENS = (
    "<|start|>",
    "<|message|>",
    "<|end|>",
    "<|channel|>",
    "<|constrain|>",
    "<|call|>",
    "<|return|>",
)
# Bounded caches (ids kept as 4-byte arrays). System and developer messages, rendered by the library, by their
# JSON when it is at most 32K characters (most requests share them): 64 of them, at most ~16 MB. Message texts
# of at most 2K characters and their ids (the earlier turns of growing conversations): at most ~16 MB (a few
# MB for ASCII). Frames, one per kind of message header: small.
_CACHED_MESSAGE_CHARS = 32768
_CACHED_MESSAGES = 64
_CACHED_TEXT_CHARS = 2048
_CACHED_TEXTS = 2048
_CACHED_FRAMES = 1024

_lock = threading.RLock()
_encoding: HarmonyEncoding | None = None
# A private directory for the vocabulary file when the cache is not writable; removed at exit.
_private_dir: tempfile.TemporaryDirectory[str] | None = None


# -- the vocabulary ------------------------------------------------------------------------------------------


def _byte_level_alphabet() -> dict[int, str]:
    # GPT-2's byte-to-unicode table, inverted for str.translate: the code point a byte-level BPE token spells a
    # byte with -> that byte as a latin-1 character.
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    code_points = {byte: byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in code_points:
            code_points[byte] = 256 + shifted
            shifted += 1
    return {code_point: chr(byte) for byte, code_point in code_points.items()}


def o200k_base_file(vocab: Mapping[str, int]) -> bytes:
    """The bytes of `o200k_base.tiktoken` derived from a byte-level BPE vocabulary (token string -> id, added
    tokens excluded): one `base64(token bytes) rank` line per token, by rank. Raises `CheckpointError` when the
    vocabulary is not o200k (the result's sha256 is not o200k_base's)."""
    alphabet = _byte_level_alphabet()
    tokens = sorted(vocab.items(), key=lambda item: item[1])
    try:
        data = b"".join(
            [
                base64.b64encode(token.translate(alphabet).encode("latin-1")) + b" %d\n" % rank
                for token, rank in tokens
            ]
        )
    except UnicodeEncodeError:  # a character outside the byte-level alphabet: not a byte-level BPE vocabulary
        data = b""
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_BASE_SHA256 or any(rank != index for index, (_, rank) in enumerate(tokens)):
        raise CheckpointError(
            f"gpt-oss (model_type {MODEL_TYPE}) is rendered in the Harmony format, whose vocabulary is o200k, but "
            f"this tokenizer's vocabulary ({len(tokens)} base tokens) is not o200k (199998 byte-level BPE tokens): "
            "tokenizer.json must hold gpt-oss's own tokenizer"
        )
    return data


def tiktoken_encodings_dir(folder: Path) -> Path:
    """A directory holding the `o200k_base.tiktoken` derived from `folder`'s tokenizer.json, for a process that
    loads the Harmony encoding itself (`TIKTOKEN_ENCODINGS_BASE`, e.g. vLLM). Written once into the cache."""
    from tokenizers import Tokenizer

    file = Path(folder) / "tokenizer.json"
    if not file.is_file():
        raise CheckpointError(f"{folder} has no tokenizer.json to derive gpt-oss's o200k vocabulary from")
    vocab = Tokenizer.from_file(str(file)).get_vocab(with_added_tokens=False)
    return _encodings_dir(o200k_base_file(vocab))


def _cache_dir() -> Path:
    return cache_root() / "harmony"  # the fixtures' root too


def _encodings_dir(data: bytes) -> Path:
    """A directory whose o200k_base.tiktoken holds `data`: the cache, else a private temporary directory."""
    global _private_dir
    try:
        return _write_once(_cache_dir(), data)
    except OSError:  # a read-only cache: this process's own directory
        with _lock:
            if _private_dir is None:
                _private_dir = tempfile.TemporaryDirectory(prefix="tokenfront-harmony-")
            return _write_once(Path(_private_dir.name), data)


def _write_once(directory: Path, data: bytes) -> Path:
    target = directory / TIKTOKEN_FILE
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == O200K_BASE_SHA256:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    # Concurrent processes each write a temporary file and rename it into place: a reader never sees half.
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{TIKTOKEN_FILE}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return directory


def harmony_encoding(checkpoint: Checkpoint) -> HarmonyEncoding:
    """oss-harmony's `HarmonyGptOss` encoding on the checkpoint's own vocabulary, loaded once per process.

    Every call checks that the checkpoint's vocabulary is o200k and that Harmony's special tokens have the
    tokenizer's ids (`CheckpointError` otherwise); the encoding itself is shared, since it is the same for
    every o200k checkpoint.
    """
    global _encoding
    data = o200k_base_file(_base_vocab(checkpoint))
    with _lock:
        if _encoding is None:
            _encoding = _load_encoding(_encodings_dir(data))
        encoding = _encoding
    check_special_tokens(encoding, checkpoint.tokenizer)
    return encoding


def _base_vocab(checkpoint: Checkpoint) -> Mapping[str, int]:
    backend = getattr(checkpoint.tokenizer, "backend_tokenizer", None)
    if backend is not None:  # the loaded tokenizer.json: no second parse of the file
        vocab: Mapping[str, int] = backend.get_vocab(with_added_tokens=False)
        return vocab
    folder = checkpoint.tokenizer_path
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise CheckpointError(
            "gpt-oss is rendered in the Harmony format, whose vocabulary tokenfront takes from the checkpoint's "
            "tokenizer.json, and this checkpoint has none"
        )
    from tokenizers import Tokenizer

    tokens: Mapping[str, int] = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(
        with_added_tokens=False
    )
    return tokens


def _load_encoding(directory: Path) -> HarmonyEncoding:
    from openai_harmony import load_harmony_encoding

    # oss-harmony reads the variable when it loads the vocabulary; set it for that call only.
    previous = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
    try:
        return load_harmony_encoding(ENCODING_NAME)
    except Exception as exc:
        raise CheckpointError(f"oss-harmony could not load {ENCODING_NAME} from {directory}: {exc}") from exc
    finally:
        if previous is None:
            del os.environ["TIKTOKEN_ENCODINGS_BASE"]
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = previous


def check_special_tokens(encoding: HarmonyEncoding, tokenizer: Any) -> None:
    """Raise `CheckpointError` unless the tokens Harmony's format emits are the tokenizer's added tokens of the
    same name and every special token both know by name has one id.

    Harmony renders text without special tokens, so only its format's tokens reach a prompt (gpt-oss's
    tokenizer also names 200018 `<|endofprompt|>`, which Harmony calls `<|reserved_200018|>` and never renders).
    """
    added: dict[str, int] = dict(tokenizer.get_added_vocab())
    missing = [token for token in _FORMAT_TOKENS if token not in added]
    differ = [
        f"{token} is {added[token]} in the tokenizer, {ids} in Harmony"
        for token in sorted(encoding.special_tokens_set & set(added))
        if (ids := encoding.encode(token, allowed_special="all")) != [added[token]]
    ]
    if missing or differ:
        raise CheckpointError(
            "the tokenizer's special tokens are not Harmony's: "
            + "; ".join([*(f"{token} is missing" for token in missing), *differ])
        )


# -- request -> Harmony messages -----------------------------------------------------------------------------


def harmony_messages(body: Mapping[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """The first system/developer message's text (the instructions, None without one) and the Harmony messages
    (as `openai_harmony.Message.to_dict()` spells them) of the rest of the request's messages, as vLLM builds
    them; analysis messages before the last final message are dropped."""
    messages = list(body["messages"])
    for index, message in enumerate(messages):
        _check_message(message, index)
    instructions = None
    if messages and messages[0].get("role") in ("system", "developer"):
        instructions = _flat_text(messages[0].get("content"))
        messages = messages[1:]
    names = _tool_call_names(messages)
    converted = [harmony for message in messages for harmony in _convert(message, names)]
    return instructions, _drop_early_analysis(converted)


def _check_message(message: Mapping[str, Any], index: int) -> None:
    role = message.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise RenderError(
            f"messages[{index}] has role {role!r}, which the Harmony format of gpt-oss has no author for "
            "(system, developer, user, assistant, tool); send tool results as role 'tool'",
            param=f"messages[{index}].role",
        )
    content = message.get("content")
    if content is None and "content" in message and role != "assistant":
        raise RenderError(
            f"messages[{index}].content is null: a {role} message needs a string or a list of text parts "
            "(vLLM refuses null content outside assistant messages)",
            param=f"messages[{index}].content",
        )
    if isinstance(content, list):
        for number, part in enumerate(content):
            _check_part(part, f"messages[{index}].content[{number}]")
    if role == "assistant":
        for number, call in enumerate(message.get("tool_calls") or ()):
            _check_tool_call(call, f"messages[{index}].tool_calls[{number}]")


def _check_part(part: Any, param: str) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    refuse_media_part(kind, param)
    field = {"text": "text", "refusal": "refusal"}.get(kind) if isinstance(kind, str) else None
    if field is None:
        raise RenderError(
            f'{param} must be a content part object with "type" "text" (or "refusal"), like '
            '{"type": "text", "text": "..."}',
            param=param,
        )
    assert isinstance(part, dict)
    if not isinstance(part.get(field), str):
        raise RenderError(f"{param}.{field} must be a string", param=f"{param}.{field}")


def _check_tool_call(call: Any, param: str) -> None:
    if not isinstance(call, dict) or not isinstance(call.get("id"), str):
        raise RenderError(f"{param}.id must be the tool call's id (a string)", param=f"{param}.id")
    if call.get("type") != "function":
        raise RenderError(f'{param}.type must be "function"', param=f"{param}.type")
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        raise RenderError(
            f"{param}.function.arguments must be the call's arguments as a JSON string (as OpenAI sends them)",
            param=f"{param}.function.arguments",
        )


def _flat_text(content: Any) -> str | None:
    # vLLM's flatten_input_text_content: the text parts joined with nothing; None when there is no text.
    if content is None or isinstance(content, str):
        return content
    texts = [part["text"] for part in content if part.get("text") is not None and part.get("type") == "text"]
    return "".join(texts) if texts else None


def _texts(content: Any) -> list[str]:
    # vLLM's default path: one text content per part (a refusal part is an empty text); absent or empty
    # content is one empty text.
    if not content:
        return [""]
    if isinstance(content, str):
        return [content]
    return [part["text"] if part.get("type") == "text" else "" for part in content]


def _tool_call_names(messages: Iterable[Mapping[str, Any]]) -> dict[Any, str]:
    # tool_call_id -> function name over the whole conversation (a later call with the same id wins).
    return {
        call.get("id"): call["function"].get("name", "")
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or ()
    }


def _message(
    role: str,
    texts: Sequence[str],
    *,
    name: str | None = None,
    channel: str | None = None,
    recipient: str | None = None,
    content_type: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": role,
        "name": name,
        "content": [{"type": "text", "text": t} for t in texts],
    }
    if channel is not None:
        message["channel"] = channel
    if recipient is not None:
        message["recipient"] = recipient
    if content_type is not None:
        message["content_type"] = content_type
    return message


def _convert(message: Mapping[str, Any], names: Mapping[Any, str]) -> list[dict[str, Any]]:
    # vLLM's parse_chat_input_to_harmony_message, for one (checked) request message.
    role = message["role"]
    content = message.get("content")
    reasoning = message.get("reasoning")
    if reasoning is None:  # vLLM renames the deprecated reasoning_content when reasoning is not set
        reasoning = message.get("reasoning_content")
    tool_calls = message.get("tool_calls") or ()
    if role == "assistant" and tool_calls:
        converted = []
        text = _flat_text(content)
        if text:
            converted.append(_message("assistant", [text], channel="commentary"))
        if reasoning:
            converted.append(_message("assistant", [reasoning], channel="analysis"))
        for call in tool_calls:
            function = call["function"]
            converted.append(
                _message(
                    "assistant",
                    [function["arguments"]],
                    channel="commentary",
                    recipient=f"functions.{function.get('name', '')}",
                    content_type="json",
                )
            )
        return converted
    if role == "tool":
        name = names.get(message.get("tool_call_id", ""), "")
        text = _flat_text(content) or ""
        return [
            _message("tool", [text], name=f"functions.{name}", channel="commentary", recipient="assistant")
        ]
    if role == "assistant":
        converted = [_message("assistant", [reasoning], channel="analysis")] if reasoning else []
        texts = _texts(content)
        if texts[0]:
            converted.append(_message("assistant", texts, channel="final"))
        return converted
    if role in ("system", "developer"):
        text = _flat_text(content)
        return [] if text is None else [_developer_message(text, None)]
    return [_message(role, _texts(content))]


def _developer_message(instructions: str | None, tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    # DeveloperContent.to_dict(): unset fields left out; the tools as the `functions` namespace.
    content: dict[str, Any] = {}
    if instructions is not None:
        content["instructions"] = instructions
    if tools:
        described = []
        for tool in tools:
            function = tool["function"]
            description: dict[str, Any] = {
                "name": function["name"],
                "description": function.get("description") or "",
            }
            if function.get("parameters") is not None:
                description["parameters"] = function["parameters"]
            described.append(description)
        content["tools"] = {"functions": {"name": "functions", "tools": described}}
    content["type"] = "developer_content"
    return {"role": "developer", "name": None, "content": [content]}


def _drop_early_analysis(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # vLLM's auto_drop_analysis_messages: analysis before the last final assistant message is dropped.
    last_final = next(
        (
            index
            for index in range(len(messages) - 1, -1, -1)
            if messages[index]["role"] == "assistant" and messages[index].get("channel") == "final"
        ),
        -1,
    )
    return [
        m for index, m in enumerate(messages) if not (index < last_final and m.get("channel") == "analysis")
    ]


def _check_tools(body: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    # vLLM's request validation (check_tool_usage), which decides what reaches the Harmony developer message.
    tools = body.get("tools")
    if tools is not None and not tools:
        raise RenderError(
            "`tools` must not be an empty array: give at least one tool or leave the field out", param="tools"
        )
    choice = body.get("tool_choice")
    if choice is not None and choice != "none":
        if tools is None:
            raise RenderError(
                "tool_choice needs tools: set `tools`, or leave tool_choice out", param="tool_choice"
            )
        if isinstance(choice, dict):
            name = choice["function"]["name"]
            if all(tool["function"]["name"] != name for tool in tools):
                raise RenderError(
                    f"tool_choice names the function {name!r}, which is not among the request's tools",
                    param="tool_choice",
                )
    return tools


def _check_reasoning_effort(effort: str | None) -> str | None:
    if effort is None:
        return None
    if effort == "none":
        raise RenderError(
            "gpt-oss always reasons: the Harmony format has no reasoning_effort 'none'; use low, medium or high",
            param="reasoning_effort",
        )
    value = _REASONING_EFFORTS.get(effort)
    if value is None:
        raise RenderError(
            f"reasoning_effort {effort!r} is not supported by the Harmony format of gpt-oss; "
            "supported values are low, medium and high",
            param="reasoning_effort",
        )
    return value


# -- rendering -----------------------------------------------------------------------------------------------


class HarmonyChatFormat:
    """Renders chat requests for gpt-oss with the Harmony encoding, as vLLM 0.33."""

    name = "harmony"
    truncates_prompt = False  # vLLM 0.33 renders Harmony chat without reading truncate_prompt_tokens

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.encoding = harmony_encoding(checkpoint)
        self.pinned_date = os.environ.get("VLLM_SYSTEM_START_DATE") or None
        self._special = {
            token: self.encoding.encode(token, allowed_special="all")[0]
            for token in ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
        }
        self._suffix = self._render_suffix()
        # Per instance, so that nothing outlives the pipeline; functools' caches are thread-safe.
        self._system_message = functools.lru_cache(maxsize=16)(_system_message_json)
        self._frame = functools.lru_cache(maxsize=_CACHED_FRAMES)(self._render_frame)
        self._cached_render = functools.lru_cache(maxsize=_CACHED_MESSAGES)(self._render_message)
        self._cached_encode = functools.lru_cache(maxsize=_CACHED_TEXTS)(self._encode)

    def render_chat(
        self, request: ChatCompletionRequest, body: Mapping[str, Any], template_kwargs: Mapping[str, Any]
    ) -> FormattedChat:
        """The ids vLLM 0.33 renders for this chat request; `template_kwargs` play no part (as in vLLM)."""

        tools = _check_tools(body)
        effort = _check_reasoning_effort(request.reasoning_effort)
        instructions, messages = harmony_messages(body)
        has_tools = bool(tools)
        date = self.pinned_date or _today_utc()
        ids = list(self._render_with_library(self._system_message(effort, date), has_tools))
        if instructions or tools:
            ids += self._render_with_library(_to_json(_developer_message(instructions, tools)), has_tools)
        for message in messages:
            if message["role"] == "developer":
                ids += self._render_with_library(_to_json(message), has_tools)
            else:
                ids += self._render_text_message(message)
        ids += self._suffix
        return FormattedChat(token_ids=ids, prompt_text=self.encoding.decode(ids))

    def fingerprint_component(self) -> dict[str, Any]:
        """What builds the prompt: the Harmony encoding, the library and its version (and a pinned date)."""
        component = {
            "name": self.name,
            "encoding": ENCODING_NAME,
            "library": LIBRARY,
            "version": _package_version(LIBRARY),
            "semantics": _SEMANTICS_VERSION,
        }
        if self.pinned_date is not None:
            component["conversation_start_date"] = self.pinned_date
        return component

    def tokenizer_components(self) -> tuple[dict[str, Any], list[str]] | None:
        """None: the generic component hashes tokenizer.json, which is the vocabulary Harmony renders with."""
        return None

    # -- rendering one message -------------------------------------------------------------------------------
    #
    # A conversation renders as its messages' renderings in a row (vLLM turns the library's automatic dropping
    # of analysis off and drops them itself); only the system message depends on the others (whether the
    # conversation has function tools). A text message renders as its header, `<|message|>`, each text
    # encoded as it is (no special tokens), and `<|end|>` or `<|call|>`: the library renders each kind of
    # header once (a "frame") and the texts are encoded with its encoder (and cached), which is most of the
    # speed. System and developer messages, whose text the library writes itself, are rendered by it whole
    # and cached.

    def _render_text_message(self, message: Mapping[str, Any]) -> list[int]:
        prefix, suffix = self._frame(
            message["role"],
            message.get("name"),
            message.get("channel"),
            message.get("recipient"),
            message.get("content_type"),
        )
        ids = list(prefix)
        for part in message["content"]:
            text = part["text"]
            ids += self._cached_encode(text) if len(text) <= _CACHED_TEXT_CHARS else self._encode(text)
        ids += suffix
        return ids

    def _encode(self, text: str) -> array[int]:
        # As the library encodes message text: special-token strings are text. Text that is not UTF-8 (a lone
        # surrogate) cannot reach the library's conversation JSON, which vLLM answers with a 400.
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RenderError(
                    f"message text holds a lone surrogate ({exc.object[exc.start : exc.end]!r}), which is not "
                    "valid Unicode text",
                    param="messages",
                ) from exc
        return array("I", self.encoding.encode(text, disallowed_special=()))

    def _render_frame(
        self,
        role: str,
        name: str | None,
        channel: str | None,
        recipient: str | None,
        content_type: str | None,
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        from openai_harmony import Author, Message

        message = Message(
            author=Author(role=role, name=name),
            channel=channel,
            recipient=recipient,
            content_type=content_type,
        )
        ids = self._library_render(message, has_tools=False)
        if recipient is not None:
            try:
                ids = self._legacy_tool_call_header(ids)
            except Exception as exc:  # a recipient spelling a special token (vLLM answers a 500 here)
                raise RenderError(
                    f"the Harmony format cannot address a message to {recipient!r}: {exc}", param="messages"
                ) from exc
        end = ids.index(self._special["<|message|>"]) + 1
        return tuple(ids[:end]), tuple(ids[end:])

    def _render_with_library(self, message_json: str, has_tools: bool) -> Sequence[int]:
        if len(message_json) <= _CACHED_MESSAGE_CHARS:
            return self._cached_render(message_json, has_tools)
        return self._render_message(message_json, has_tools)

    def _render_message(self, message_json: str, has_tools: bool) -> array[int]:
        from openai_harmony import Message

        return array(
            "I", self._library_render(Message.from_dict(json.loads(message_json)), has_tools=has_tools)
        )

    def _library_render(self, message: Any, *, has_tools: bool) -> list[int]:
        from openai_harmony import RenderOptions

        try:
            return self.encoding.render(message, RenderOptions(conversation_has_function_tools=has_tools))
        except Exception as exc:  # the library's validation or rendering error: the request's content
            raise RenderError(
                f"the Harmony format cannot render this {message.author.role.value} message: {exc}",
                param="messages",
            ) from exc

    def _legacy_tool_call_header(self, ids: list[int]) -> list[int]:
        # vLLM's _use_legacy_tool_call_headers on one message: oss-harmony 0.0.10+ renders a call's header as
        # `assistant<|channel|>commentary to=functions.f <|constrain|>json`; vLLM rewrites it to the shape
        # gpt-oss was trained on, `assistant to=functions.f<|channel|>commentary json`.
        start, channel, constrain, message = (
            self._special[token] for token in ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
        )
        if not ids or ids[0] != start or message not in ids:
            return ids
        header_end = ids.index(message)
        try:
            channel_index = ids.index(channel, 1, header_end)
            constrain_index = ids.index(constrain, channel_index + 1, header_end)
        except ValueError:
            return ids
        decode = self.encoding.decode
        author = decode(ids[1:channel_index])
        channel_and_recipient = decode(ids[channel_index + 1 : constrain_index])
        content_type = decode(ids[constrain_index + 1 : header_end])
        if (
            author != "assistant"
            or " to=" not in channel_and_recipient
            or not channel_and_recipient.endswith(" ")
        ):
            return ids
        channel_name, recipient = channel_and_recipient[:-1].split(" to=", 1)
        if not channel_name or not recipient or not content_type:
            return ids
        header = [
            start,
            *self.encoding.encode(f"assistant to={recipient}"),
            channel,
            *self.encoding.encode(f"{channel_name} {content_type}"),
            message,
        ]
        return header + ids[header_end + 1 :]

    def _render_suffix(self) -> tuple[int, ...]:
        from openai_harmony import Conversation, RenderConversationConfig, Role

        return tuple(
            self.encoding.render_conversation_for_completion(
                Conversation.from_messages([]),
                Role.ASSISTANT,
                config=RenderConversationConfig(auto_drop_analysis=False),
            )
        )


def _system_message_json(effort: str | None, date: str) -> str:
    # vLLM's get_system_message: the library's SystemContent defaults, the reasoning effort, the date.
    from openai_harmony import Message, ReasoningEffort, Role, SystemContent

    content = SystemContent.new()
    if effort is not None:
        content = content.with_reasoning_effort(ReasoningEffort(effort))
    content = content.with_conversation_start_date(date)
    return Message.from_role_and_content(Role.SYSTEM, content).to_json()


def _to_json(message: Mapping[str, Any]) -> str:
    return json.dumps(message)


def _today_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"

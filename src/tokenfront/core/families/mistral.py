"""Mistral checkpoints in `--tokenizer-mode mistral`: mistral-common's tokenizer and request encoder, as vLLM 0.33.

In this mode there is no chat template: vLLM hands the request's messages to transformers'
`MistralCommonBackend.apply_chat_template`, which builds a mistral-common `ChatCompletionRequest`, validates it
and encodes it. This module does the same, with vLLM's own steps around it (`vllm/tokenizers/mistral.py`,
`vllm/renderers/mistral.py`, `vllm/renderers/online_renderer.py`):

- the request may not carry `chat_template` or `chat_template_kwargs`;
- every assistant message gets a `tool_calls` list (empty when it had none), and tool-call arguments given as
  a JSON string reach mistral-common as the parsed object (empty, invalid or non-object JSON as `{}`);
- tool-call ids longer than 9 characters keep their last 9 (Mistral's ids are 9 characters), in assistant
  `tool_calls` and in tool messages' `tool_call_id` alike;
- `add_generation_prompt` (true by default) may not follow a final assistant message, and
  `continue_final_message` needs one;
- `reasoning_effort` reaches mistral-common only for tokenizer versions 15 and up (it is dropped before);
- `documents` and the request's `add_special_tokens` play no part;
- whatever mistral-common (or transformers' adapter) raises is the client's mistake: a 400 with its message.

Completions need nothing here: vLLM encodes their text with the same tokenizer object's `__call__`, which the
generic transformers backend calls too.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenfront.core.errors import CheckpointError, RenderError
from tokenfront.core.families.chat_format import FormattedChat
from tokenfront.core.messages import (
    parse_tool_arguments,
    refuse_media_part,
)

if TYPE_CHECKING:
    from tokenfront.core.checkpoint import Checkpoint
    from tokenfront.protocol import ChatCompletionRequest

__all__ = [
    "TOKENIZER_MODES",
    "MistralChatFormat",
    "load_tokenizer",
    "resolve_tokenizer_mode",
    "tokenizer_file",
]

TOKENIZER_MODES = ("auto", "hf", "mistral")

# vLLM's auto mode picks mistral-common for a repository with Mistral's own weights and tokenizer files
# (`resolve_tokenizer_args`; file names matched anywhere below the folder, by base name).
_MISTRAL_WEIGHTS_PATTERNS = ("consolidated*.safetensors",)
_MISTRAL_TOKENIZER_PATTERNS = ("tekken.json", "tokenizer.model.v*")
# Files transformers can build a tokenizer from; a folder with a Mistral SentencePiece file and none of these
# cannot be loaded in hf mode.
_HF_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "tekken.json",
)

# Mistral tool-call ids are 9 characters; vLLM keeps the last 9 of longer ones (`truncate_tool_call_ids`).
TOOL_CALL_ID_LENGTH = 9
# The first tokenizer version whose requests carry model settings (`reasoning_effort`); vLLM passes the
# effort on from there only.
_REASONING_EFFORT_VERSION = 15
_NO_MISTRAL_COMMON = (
    "--tokenizer-mode mistral needs the mistral-common package ({exc}): pip install mistral-common"
)
# Bump when a change here changes ids for some request (it is part of the fingerprint's chat_format).
_SEMANTICS_VERSION = "1"


# -- choosing the mode ---------------------------------------------------------------------------------------


def resolve_tokenizer_mode(folder: Path, mode: str) -> str:
    """`hf` or `mistral` for `--tokenizer-mode` `mode` on a tokenizer folder.

    `auto` picks `mistral` exactly where vLLM 0.33's auto does: the folder holds (at any depth) a
    `consolidated*.safetensors` file and a `tekken.json` or `tokenizer.model.v*` file. `mistral` needs a file
    mistral-common can load; `hf` a file transformers can (a folder with only a Mistral SentencePiece file has
    none, and is refused here with a one-line error rather than transformers' multi-line one).
    """
    if mode not in TOKENIZER_MODES:
        raise CheckpointError(f"--tokenizer-mode {mode!r} is not one of {', '.join(TOKENIZER_MODES)}")
    if mode == "auto":
        names = _file_names_below(folder)
        weights = _any_match(names, _MISTRAL_WEIGHTS_PATTERNS)
        mode = "mistral" if weights and _any_match(names, _MISTRAL_TOKENIZER_PATTERNS) else "hf"
    if mode == "mistral":
        if tokenizer_file(folder) is None:
            raise CheckpointError(
                f"--tokenizer-mode mistral needs a mistral-common tokenizer file (tekken.json or "
                f"tokenizer.model.v*) in {folder}, and there is none; use --tokenizer-mode hf for this folder"
            )
        return "mistral"
    _check_transformers_can_load(folder)
    return "hf"


def _file_names_below(folder: Path) -> list[str]:
    # As vLLM's `list_repo_files` for a local folder: every file below it, recursively.
    return [path.name for path in folder.rglob("*") if path.is_file()]


def _any_match(names: Iterable[str], patterns: Iterable[str]) -> bool:
    return any(fnmatch(name, pattern) for pattern in patterns for name in names)


def _check_transformers_can_load(folder: Path) -> None:
    names = set(os.listdir(folder)) if folder.is_dir() else set()
    if names.intersection(_HF_TOKENIZER_FILES) or any(name.endswith(".tiktoken") for name in names):
        return
    mistral_files = sorted(name for name in names if fnmatch(name, "*.model.v*"))
    if mistral_files:
        raise CheckpointError(
            f"{folder} holds only a mistral-common tokenizer ({mistral_files[0]}), which transformers cannot "
            "load: start with --tokenizer-mode mistral"
        )


# -- loading the tokenizer -----------------------------------------------------------------------------------


def tokenizer_file(folder: Path) -> Path | None:
    """The tokenizer file mistral-common loads from a folder (its own rule: `tekken.json` first, else the last
    SentencePiece `*.model.vN` / `*.model` by name), or None when there is none."""
    try:
        from mistral_common.tokens.tokenizers.utils import get_one_valid_tokenizer_file
    except ImportError as exc:
        raise CheckpointError(_NO_MISTRAL_COMMON.format(exc=exc)) from exc
    if not folder.is_dir():
        return None
    try:
        return folder / get_one_valid_tokenizer_file(sorted(os.listdir(folder)))
    except ValueError:  # "No tokenizer file found."
        return None


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer of a folder in mistral mode: transformers' `MistralCommonBackend`, loaded as vLLM loads it
    (validation mode `test`, truncation from the left), so `len()`, `decode` and the special tokens are its."""
    try:
        from mistral_common.protocol.instruct.validator import ValidationMode
        from transformers.tokenization_mistral_common import MistralCommonBackend
    except ImportError as exc:
        raise CheckpointError(_NO_MISTRAL_COMMON.format(exc=exc)) from exc
    file = tokenizer_file(folder)
    if file is None:
        raise CheckpointError(
            f"--tokenizer-mode mistral needs a mistral-common tokenizer file (tekken.json or tokenizer.model.v*) "
            f"in {folder}, and there is none"
        )
    try:
        return MistralCommonBackend.from_pretrained(
            str(folder), mode=ValidationMode.test, truncation_side="left"
        )
    except Exception as exc:  # a broken or unknown tokenizer file: mistral-common raises many kinds
        raise CheckpointError(
            f"cannot load the mistral-common tokenizer {file}: {type(exc).__name__}: {_first_line(exc)}"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no detail"


# -- chat ----------------------------------------------------------------------------------------------------


class MistralChatFormat:
    """Renders chat requests through mistral-common's request validation and encoder, as vLLM 0.33."""

    name = "mistral-common"
    truncates_prompt = True  # as vLLM: the last N ids of the encoded chat

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.tokenizer = checkpoint.tokenizer
        # mistral-common's own tokenizer (a Tekkenizer or a SentencePieceTokenizer) under transformers' wrapper.
        inner = self.tokenizer.tokenizer.instruct_tokenizer.tokenizer
        self._inner = inner
        self.tokenizer_version: str = str(inner.version.value)  # "v3", "v13", ...
        self.version_number = int(self.tokenizer_version.lstrip("v"))
        self.file = _loaded_file(self.tokenizer, checkpoint.tokenizer_path)

    def render_chat(
        self, request: ChatCompletionRequest, body: Mapping[str, Any], template_kwargs: Mapping[str, Any]
    ) -> FormattedChat:
        """The ids vLLM 0.33 computes for this chat request in mistral mode."""

        if request.chat_template is not None or body.get("chat_template_kwargs") is not None:
            raise RenderError(
                "chat_template and chat_template_kwargs are not supported with --tokenizer-mode mistral "
                "(mistral-common builds the prompt): remove them",
                param="chat_template_kwargs" if request.chat_template is None else "chat_template",
            )
        messages = prepare_messages(body["messages"])
        _check_final_message(
            messages,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
        )
        extra: dict[str, Any] = {}
        if self.version_number >= _REASONING_EFFORT_VERSION:
            # A server-side default (--default-chat-template-kwargs) applies when the request sets none, as in vLLM.
            extra["reasoning_effort"] = (
                request.reasoning_effort
                if request.reasoning_effort is not None
                else template_kwargs.get("reasoning_effort")
            )
        tools = body.get("tools")
        try:
            ids = self.tokenizer.apply_chat_template(
                conversation=messages,
                tools=list(tools) if tools is not None else None,
                continue_final_message=request.continue_final_message,
                tokenize=True,
                padding=False,
                truncation=False,
                max_length=None,
                return_tensors=None,
                return_dict=False,
                **extra,
            )
        except Exception as exc:  # vLLM answers every failure here with a 400 carrying the message
            raise RenderError(str(exc) or type(exc).__name__, param="messages") from exc
        token_ids = [int(token_id) for token_id in ids]
        return FormattedChat(token_ids=token_ids, prompt_text=self.decode(token_ids))

    def decode(self, token_ids: list[int]) -> str:
        """Ids back to text with special tokens spelled out (`[INST]`, `</s>`, ...)."""
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    def fingerprint_component(self) -> dict[str, Any]:
        """What builds the prompt: mistral-common, its version, and the tokenizer version it encodes for."""
        return {
            "name": self.name,
            "version": _package_version("mistral-common"),
            "tokenizer_version": self.tokenizer_version,
            "validation_mode": "test",
            "semantics": _SEMANTICS_VERSION,
        }

    def tokenizer_components(self) -> tuple[dict[str, Any], list[str]] | None:
        """The tokenizer's part of the fingerprint: the tokenizer file's bytes identify it completely."""
        digest = hashlib.sha256(self.file.read_bytes()).hexdigest()
        components = {
            "class": type(self.tokenizer).__name__,
            "mode": "mistral",
            "model": digest,
            # The file's suffix decides a SentencePiece tokenizer's version and image support (".model.v7m1").
            "file_suffix": "".join(self.file.suffixes),
            "kind": type(self._inner).__name__,
            "tokenizer_version": self.tokenizer_version,
            "vocab_size": len(self.tokenizer),
            "mistral_common": _package_version("mistral-common"),
            "special_tokens": dict(sorted(self.tokenizer.special_tokens_map.items())),
        }
        return components, []


def _loaded_file(tokenizer: Any, folder: Path | None) -> Path:
    # The file MistralCommonBackend loaded (it keeps it privately), else the one it would load from the folder.
    loaded = getattr(tokenizer, "_tokenizer_path", None)
    file = Path(loaded) if loaded else (tokenizer_file(folder) if folder is not None else None)
    if file is None or not file.is_file():
        raise CheckpointError(f"cannot find the mistral-common tokenizer file of {folder}")
    return file


def prepare_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages as vLLM hands them to mistral-common: copies, every assistant message with a
    `tool_calls` list, tool-call ids cut to their last 9 characters, media parts refused."""
    prepared = []
    for index, message in enumerate(messages):
        out = dict(message)
        _refuse_media(out.get("content"), param=f"messages[{index}].content")
        role = out.get("role")
        if role == "assistant":
            calls = []
            for number, call in enumerate(out.get("tool_calls") or []):
                calls.append(_prepare_tool_call(call, param=f"messages[{index}].tool_calls[{number}]"))
            out["tool_calls"] = calls
        elif role == "tool" and isinstance(out.get("tool_call_id"), str):
            out["tool_call_id"] = out["tool_call_id"][-TOOL_CALL_ID_LENGTH:]
        prepared.append(out)
    return prepared


def _prepare_tool_call(call: Any, *, param: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise RenderError(f"{param} must be a tool call of type 'function'", param=param)
    if not isinstance(call.get("id"), str):
        raise RenderError(f"{param}.id is required with --tokenizer-mode mistral", param=f"{param}.id")
    # vLLM's chat message parsing turns JSON-string arguments into an object before mistral-common sees them
    # (it edits the request in place), so mistral-common re-serialises them: '{"a":1}' is encoded as '{"a": 1}'.
    return {
        **call,
        "id": call["id"][-TOOL_CALL_ID_LENGTH:],
        "function": {**function, "arguments": parse_tool_arguments(function.get("arguments"))},
    }


def _refuse_media(content: Any, *, param: str) -> None:
    if not isinstance(content, list):
        return
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        refuse_media_part(kind, f"{param}[{number}]")


def _check_final_message(
    messages: list[dict[str, Any]], *, add_generation_prompt: bool, continue_final_message: bool
) -> None:
    # vLLM's `_validate_apply_chat_template_args`, with its messages.
    last_role = messages[-1].get("role") if messages else None
    if add_generation_prompt and last_role == "assistant":
        raise RenderError(
            "Cannot set `add_generation_prompt` to True when the last message is from the assistant. "
            "Consider using `continue_final_message` instead.",
            param="add_generation_prompt",
        )
    if continue_final_message and last_role != "assistant":
        raise RenderError(
            "Cannot set `continue_final_message` to True when the last message is not from the assistant.",
            param="continue_final_message",
        )


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"

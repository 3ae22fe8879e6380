"""The shared rendering options (docs/contract.md §1): identical on `render`, `serve` and `route`."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

TOKENIZER_MODES = ("auto", "hf", "mistral")


@dataclass(frozen=True)
class RenderOptions:
    """Everything that decides how a request becomes ids, besides the request itself."""

    model: str | None
    tokenizer: str | None = None
    chat_template: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    served_model_name: tuple[str, ...] = ()
    trust_remote_code: bool = False
    allow_request_chat_template: bool = False
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # How text is encoded, not what it encodes to: every backend gives the same ids (not fingerprinted).
    tokenizer_backend: str = "auto"
    # Which tokenizer and chat format (vLLM's spelling): `hf` (transformers + the Jinja chat template),
    # `mistral` (mistral-common's tokenizer and request encoder), `auto` (mistral where vLLM's auto picks it).
    tokenizer_mode: str = "auto"


def add_render_arguments(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    """Add the shared rendering options to a command's parser, spelled the same on every command."""
    group = parser.add_argument_group("rendering (identical on render, serve and route)")
    group.add_argument(
        "--model",
        required=model_required,
        help="checkpoint: a local folder or a Hugging Face model id (the hub is tried; offline it fails clearly). "
        "Its fingerprint's tokenizer hashes are remembered under $TOKENFRONT_CACHE/fingerprints (default "
        "~/.cache/tokenfront): a restart skips ~1 s of hashing",
    )
    group.add_argument("--tokenizer", help="tokenizer folder or hub id, when it is not the model's")
    group.add_argument("--chat-template", help="chat template: a file path or an inline Jinja string")
    group.add_argument(
        "--reasoning-parser",
        help="reasoning parser name (e.g. qwen3, deepseek_r1, laguna, minimax_m3, mistral, openai_gptoss)",
    )
    group.add_argument(
        "--tool-call-parser", help="tool-call parser name (hermes, llama3_json, mistral, openai for gpt-oss)"
    )
    group.add_argument(
        "--served-model-name",
        nargs="+",
        default=[],
        help="names clients may send as `model` (default: the checkpoint folder's name)",
    )
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow tokenizer code shipped with the checkpoint (makes the fingerprint incomplete)",
    )
    group.add_argument(
        "--allow-request-chat-template",
        action="store_true",
        help="accept a per-request `chat_template` (rejected with 400 otherwise)",
    )
    group.add_argument(
        "--default-chat-template-kwargs",
        type=_json_object,
        default={},
        metavar="JSON",
        help="chat_template_kwargs applied to every chat request, e.g. '{\"enable_thinking\": false}'; "
        "a request's own kwargs win",
    )
    group.add_argument(
        "--tokenizer-backend",
        choices=["auto", "fastokens", "tokenizers", "transformers"],
        default="auto",
        help="encoder of the tokenizer (same ids by contract; auto: fastokens when it agrees with tokenizers "
        "on a start-up probe, else tokenizers; transformers: transformers' own tokenizer object, loaded by "
        "transformers even where tokenfront builds the same tokenizer without it)",
    )
    group.add_argument(
        "--tokenizer-mode",
        choices=TOKENIZER_MODES,
        default="auto",
        help="hf: transformers tokenizer and chat template; mistral: mistral-common's tokenizer (tekken.json or "
        "tokenizer.model.vN) and request encoder, as vLLM's --tokenizer-mode mistral; auto (default): mistral "
        "where vLLM's auto picks it (consolidated*.safetensors with a Mistral tokenizer file), else hf",
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def options_from_args(args: argparse.Namespace) -> RenderOptions:
    """Build RenderOptions from parsed command-line arguments."""
    return RenderOptions(
        model=args.model,
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        served_model_name=tuple(args.served_model_name or ()),
        trust_remote_code=args.trust_remote_code,
        allow_request_chat_template=args.allow_request_chat_template,
        default_chat_template_kwargs=dict(args.default_chat_template_kwargs or {}),
        tokenizer_backend=args.tokenizer_backend,
        tokenizer_mode=args.tokenizer_mode,
    )

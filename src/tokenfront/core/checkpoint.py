"""Find and load what rendering needs from a checkpoint: tokenizer, config, processor and generation files.

Never weights. A local folder is read as it is; anything else is taken for a Hugging Face model id and fetched
with the hub client (only the small files), which fails with a clear message on a machine without the hub.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from tokenfront.core.direct_tokenizer import DirectTokenizer, load_direct
from tokenfront.core.errors import CheckpointError
from tokenfront.core.tokenizer_files import has_vocabulary

log = logging.getLogger(__name__)

# Everything rendering may read. Weights (*.safetensors, *.bin, *.gguf) are never fetched.
RENDER_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "additional_chat_templates/*.jinja",
    "processor_config.json",
    "preprocessor_config.json",
    "tokenizer.model",
    "tokenizer.model.v*",
    "params.json",
    "vocab.json",
    "merges.txt",
    "*.tiktoken",
    "tekken.json",
    "*.py",
)

# Files whose presence means a processor (vision/audio) builds the prompt, not the tokenizer alone.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")

# Characters that make --chat-template an inline template rather than a path (vLLM's rule).
_JINJA_CHARS = "{}\n"


# The name under which `ChatTemplateSource.templates` holds a processor's own template, when the processor's
# differs from the tokenizer's. (An `additional_chat_templates/processor.jinja` would be shadowed by it.)
PROCESSOR_TEMPLATE = "processor"


@dataclass(frozen=True)
class ChatTemplateSource:
    """The effective chat template(s): one unnamed template, or named ones (`default`, `tool_use`, ...).

    A checkpoint whose processor carries a template of its own (`processor_config.json`'s `chat_template`, or
    the legacy `chat_template.json`) that differs from the tokenizer's also holds it, as `PROCESSOR_TEMPLATE`.
    """

    templates: dict[str, str]
    origin: str

    def name_for(self, *, has_tools: bool) -> str:
        """The template a request uses, in vLLM's order after `--chat-template`: the processor's template
        unless tools are given (even `[]`); then the tokenizer's `tool_use` when tools are given and it
        exists, else `default`. With tools and no tokenizer template at all, the processor's (vLLM refuses
        such a request; transformers' processor renders it with its template)."""
        tokenizer_has_one = "default" in self.templates or (has_tools and "tool_use" in self.templates)
        if PROCESSOR_TEMPLATE in self.templates and (not has_tools or not tokenizer_has_one):
            return PROCESSOR_TEMPLATE
        return "tool_use" if has_tools and "tool_use" in self.templates else "default"

    def select(self, *, has_tools: bool) -> str | None:
        """The text of the template `name_for` picks, or None when there is none."""
        return self.templates.get(self.name_for(has_tools=has_tools))


@dataclass
class Checkpoint:
    """The loaded render-relevant parts of one checkpoint."""

    model_path: Path | None
    tokenizer_path: Path | None
    config: dict[str, Any]
    tokenizer: Any  # a transformers tokenizer (PreTrainedTokenizerBase), or a DirectTokenizer built as one
    chat_templates: ChatTemplateSource | None
    processor: dict[str, Any] | None
    generation_config: dict[str, Any] = field(default_factory=dict)
    remote_code: bool = False
    source: str = ""
    # `hf` (a transformers tokenizer and the chat template) or `mistral` (mistral-common's; see families.mistral).
    tokenizer_mode: str = "hf"

    @property
    def model_type(self) -> str | None:
        """The config's `model_type`, or None when there is no config (a generic text model)."""
        value = self.config.get("model_type")
        return str(value) if value else None

    @property
    def default_name(self) -> str:
        """The name served when `--served-model-name` is not given: a hub id as is, a folder by its name."""
        if self.model_path is None or self.source.startswith("hub:"):
            return self.source.removeprefix("hub:") or "default"
        return self.model_path.name

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The ids that end generation and are never shown: generation_config's `eos_token_id` (else the
        config's) and the tokenizer's, as vLLM takes them."""
        declared = self.generation_config.get("eos_token_id", self.config.get("eos_token_id"))
        return frozenset(_int_ids(declared) + _int_ids(getattr(self.tokenizer, "eos_token_id", None)))


def resolve_folder(name_or_path: str, *, what: str) -> tuple[Path, str]:
    """Return a local folder for a path or a hub id, fetching only the render files from the hub."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return local.resolve(), f"local:{local.resolve()}"
    if local.exists():
        raise CheckpointError(
            f"{what} {name_or_path!r} is a file; pass the checkpoint folder that contains it"
        )
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise CheckpointError(f"{what} folder {name_or_path!r} does not exist")
    return _download_from_hub(name_or_path, what=what), f"hub:{name_or_path}"


def _download_from_hub(repo_id: str, *, what: str) -> Path:
    # Keep the hub's own timeouts short: on an offline machine the answer is "no", quickly.
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "5")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo_id, allow_patterns=list(RENDER_FILE_PATTERNS))
    except Exception as exc:  # the hub client raises many kinds; all mean the same thing here
        raise CheckpointError(
            f"{what} {repo_id!r} is not a local folder, and fetching it from the Hugging Face Hub failed "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}). "
            "On a machine without hub access, pass a local checkpoint folder "
            "(e.g. one made by `tokenfront fixtures`), or fill the Hugging Face cache beforehand."
        ) from exc
    return Path(path)


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object file, with a clear error when it is not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return value


def load_chat_templates(folder: Path | None, override: str | None) -> ChatTemplateSource | None:
    """Resolve the chat template(s) (docs/contract.md §3), as vLLM does for a request without its own template.

    `--chat-template` wins. Otherwise the tokenizer's templates, read as transformers' tokenizer reads them:
    `chat_template.jinja` and `additional_chat_templates/*.jinja` before `tokenizer_config.json`'s entry. A
    folder with a processor (`processor_config.json` / `preprocessor_config.json`) also has the processor's
    template, which vLLM prefers when a request has no tools: as transformers' processor loads it,
    `processor_config.json`'s `chat_template`, else `chat_template.json`, else the same `.jinja` files as
    the tokenizer. It is kept (as `PROCESSOR_TEMPLATE`) only when it differs from the tokenizer's default.
    `chat_template.json` in a folder without a processor is read by neither and ignored.
    """
    if override is not None:
        return ChatTemplateSource({"default": _read_template_option(override)}, origin="--chat-template")
    if folder is None:
        return None
    templates, origin = _tokenizer_templates(folder)
    processor_template = _processor_template(folder)
    if processor_template is not None and processor_template[0] != templates.get("default"):
        templates[PROCESSOR_TEMPLATE] = processor_template[0]
        origin = f"{origin or 'none'}; processor: {processor_template[1]}"
    if not templates:
        return None
    return ChatTemplateSource(templates, origin=origin)


def _tokenizer_templates(folder: Path) -> tuple[dict[str, str], str]:
    """The templates transformers' tokenizer loads from a folder, and the file they come from."""
    templates: dict[str, str] = {}
    origin = ""
    if (folder / "tokenizer_config.json").is_file():
        value = read_json(folder / "tokenizer_config.json").get("chat_template")
        templates.update(_templates_from_config_value(value))
        origin = "tokenizer_config.json" if templates else ""
    files = _template_files(folder)
    if files:  # separate files take priority over the tokenizer config's entries, as a whole
        templates = files
        origin = "chat_template.jinja" if "default" in files else "additional_chat_templates"
    return templates, origin


def _template_files(folder: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        files["default"] = jinja.read_text(encoding="utf-8")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            files[file.stem] = file.read_text(encoding="utf-8")
    return files


def _processor_template(folder: Path) -> tuple[str, str] | None:
    """The default template of the folder's processor, when it has one not read from the tokenizer's files."""
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        return None
    sources = (("processor_config.json", "chat_template"), ("chat_template.json", "chat_template"))
    for name, key in sources:
        if (folder / name).is_file():
            value = read_json(folder / name).get(key)
            found = _templates_from_config_value(value)
            if "default" in found:
                return found["default"], name
    return None


def _templates_from_config_value(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):  # [{"name": ..., "template": ...}, ...]
        return {item["name"]: item["template"] for item in value if isinstance(item, dict) and "name" in item}
    return {}


def _read_template_option(value: str) -> str:
    if any(char in value for char in _JINJA_CHARS):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise CheckpointError(
            f"--chat-template {value!r} looks like a file path but no such file exists; "
            "pass an existing .jinja file or the template text itself"
        )
    return path.read_text(encoding="utf-8")


# Files a transformers tokenizer is built from (its vocabulary): `tokenizer.json`, or what transformers converts
# (SentencePiece / tiktoken `tokenizer.model` and other `*.model`, `*.tiktoken`, Mistral's `tekken.json`, a
# GPT-2 style `vocab.json` + `merges.txt`, a WordPiece `vocab.txt`). Without one of them transformers builds a
# tokenizer with no vocabulary (or fails with a multi-line message), whatever `tokenizer_config.json` says.
TOKENIZER_VOCAB_PATTERNS = (
    "tokenizer.json",
    "tekken.json",
    "vocab.json",
    "vocab.txt",
    "*.model",
    "*.model.v*",
    "*.tiktoken",
)


def check_tokenizer_files(folder: Path, *, tokenizer_config: dict[str, Any] | None = None) -> None:
    """CheckpointError (one line) when `folder` has no file a tokenizer can be built from.

    A tokenizer shipped as code (`tokenizer_config.json` with `auto_map`) may read files of its own: it is left
    to load (an empty result is caught by `load_tokenizer`).
    """
    if tokenizer_config is not None and "auto_map" in tokenizer_config:
        return
    try:
        names = sorted(path.name for path in folder.iterdir() if path.is_file())
    except OSError as exc:
        raise CheckpointError(f"cannot read the tokenizer folder {folder}: {exc.strerror or exc}") from exc
    if any(fnmatch(name, pattern) for pattern in TOKENIZER_VOCAB_PATTERNS for name in names):
        return
    missing = "tokenizer.json" + ("" if "tokenizer_config.json" in names else " / tokenizer_config.json")
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    raise CheckpointError(
        f"no tokenizer in {folder}: it has no {missing} (nor a tokenizer.model, tekken.json, vocab.json or "
        f"*.tiktoken file; {'only ' + shown if names else 'it is empty'}); pass the checkpoint folder that has "
        "the tokenizer files, or the tokenizer's own folder with --tokenizer"
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def load_tokenizer(folder: Path, *, trust_remote_code: bool, with_transformers: bool = False) -> Any:
    """Load the tokenizer transformers loads for `folder`, the reference every rendered id is checked against:
    built directly with `tokenizers` where `direct_tokenizer` knows how transformers builds its class (the same
    tokenizer, without importing transformers: a second less at start-up), else with transformers itself (no
    torch needed); `with_transformers`: always with transformers (a worker whose model and grammar read
    transformers' own tokenizer object).
    """
    tokenizer = None if with_transformers else load_direct(folder)
    if tokenizer is None:
        tokenizer = _transformers_tokenizer(folder, trust_remote_code=trust_remote_code)
    if not has_vocabulary(tokenizer):
        raise CheckpointError(
            f"the tokenizer in {folder} has no vocabulary (only special tokens): its tokenizer files are missing "
            "or empty; pass the checkpoint folder that has tokenizer.json, or name it with --tokenizer"
        )
    return tokenizer


def transformers_tokenizer(tokenizer: Any) -> Any:
    """transformers' own object for a loaded tokenizer: the tokenizer itself, or for a `DirectTokenizer` the one
    transformers loads from the same folder (the same tokenizer), for a library that reads transformers'
    objects (the worker's grammar: xgrammar)."""
    if isinstance(tokenizer, DirectTokenizer):
        return _transformers_tokenizer(Path(tokenizer.name_or_path), trust_remote_code=False)
    return tokenizer


def _transformers_tokenizer(folder: Path, *, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    try:
        # mistral_format=False: a folder with only Mistral's tekken.json is converted to a transformers tokenizer,
        # as vLLM's hf mode loads it; mistral-common's own tokenizer is --tokenizer-mode mistral's.
        tokenizer = AutoTokenizer.from_pretrained(
            str(folder), trust_remote_code=trust_remote_code, mistral_format=False
        )
    except Exception as exc:
        hint = ""
        if "trust_remote_code" in str(exc):
            hint = " The tokenizer ships its own code: start with --trust-remote-code if you trust it."
        raise CheckpointError(
            f"cannot load a tokenizer from {folder}: {type(exc).__name__}: {_one_line(str(exc))}{hint}"
        ) from exc
    return tokenizer


def has_remote_code(*configs: dict[str, Any]) -> bool:
    """Whether any config points at code shipped with the checkpoint (`auto_map`)."""
    return any("auto_map" in config for config in configs)


def load_checkpoint(
    model: str | None,
    *,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    trust_remote_code: bool = False,
    tokenizer_mode: str = "auto",
    transformers_tokenizer: bool = False,
) -> Checkpoint:
    """Load everything rendering needs from a checkpoint (and an optional separate tokenizer);
    `transformers_tokenizer`: the tokenizer loaded by transformers itself (see `load_tokenizer`)."""
    from tokenfront.core.families import mistral  # imported here: families import this module

    if model is None and tokenizer is None:
        raise CheckpointError("no --model (or --tokenizer) given: there is nothing to render with")
    model_path, source = resolve_folder(model, what="model") if model else (None, "")
    tokenizer_path = resolve_folder(tokenizer, what="tokenizer")[0] if tokenizer else model_path
    assert tokenizer_path is not None
    config = (
        read_json(model_path / "config.json") if model_path and (model_path / "config.json").is_file() else {}
    )
    tokenizer_config = (
        read_json(tokenizer_path / "tokenizer_config.json")
        if (tokenizer_path / "tokenizer_config.json").is_file()
        else {}
    )
    processor = _load_processor(model_path)
    generation = (
        read_json(model_path / "generation_config.json")
        if model_path and (model_path / "generation_config.json").is_file()
        else {}
    )
    remote_code = trust_remote_code and has_remote_code(config, tokenizer_config, processor or {})
    mode = mistral.resolve_tokenizer_mode(tokenizer_path, tokenizer_mode)
    if mode == "mistral":
        loaded = mistral.load_tokenizer(tokenizer_path)
    else:
        check_tokenizer_files(tokenizer_path, tokenizer_config=tokenizer_config)
        loaded = load_tokenizer(
            tokenizer_path, trust_remote_code=trust_remote_code, with_transformers=transformers_tokenizer
        )
    templates = load_chat_templates(tokenizer_path, chat_template)
    if templates is None and model_path is not None and model_path != tokenizer_path:
        templates = load_chat_templates(model_path, None)
    return Checkpoint(
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        config=config,
        tokenizer=loaded,
        chat_templates=templates,
        processor=processor,
        generation_config=generation,
        remote_code=remote_code,
        source=source or f"local:{tokenizer_path}",
        tokenizer_mode=mode,
    )


def _load_processor(folder: Path | None) -> dict[str, Any] | None:
    """The processor's settings: `preprocessor_config.json` (the image/audio processor) overlaid with
    `processor_config.json` (the processor's own, which transformers 5 also nests the former in)."""
    if folder is None:
        return None
    found = [read_json(folder / name) for name in reversed(PROCESSOR_FILES) if (folder / name).is_file()]
    if not found:
        return None
    merged: dict[str, Any] = {}
    for value in found:
        merged.update(value)
    return merged


def _int_ids(value: Any) -> list[int]:
    """An id or a list of ids from a config file (anything else: none)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []

"""The rendering fingerprint (docs/contract.md §5): what decides the ids, hashed, so two processes can prove they agree.

`compared` holds every component that can change rendered ids and nothing else (no paths, names, ports or
tokenizer backend); `digest` is the sha256 of its canonical JSON. Computed once per pipeline, on first use.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, compress, repeat
from typing import Any

from tokenfront.core import fingerprint_cache
from tokenfront.core.tokenizer_files import (
    has_vocabulary,
    is_library_tokenizer,
    release_freed_memory,
    tokenizer_class_name,
    tokenizer_json,
    tokenizer_source_file,
)

try:  # a declared dependency; without it the (slower) standard library gives the same bytes
    import orjson
except ImportError:  # pragma: no cover
    orjson = None  # type: ignore[assignment]

# Bump when a change to the rendering code changes ids for some input: old and new processes must not match.
RENDER_SEMANTICS_VERSION = "2"
FINGERPRINT_VERSION = 1

# Values orjson writes exactly as `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`
# does (checked for every code point): strings, 64-bit integers, booleans, null, in dicts, lists and tuples.
# Not floats: orjson spells 1e-05 as 0.00001. Exact types only (a subclass may serialise differently).
_ORJSON_LEAVES = frozenset({str, int, bool, type(None)})
_ORJSON_CONTAINERS = frozenset({dict, list, tuple})
_ORJSON_TYPES = _ORJSON_LEAVES | _ORJSON_CONTAINERS
_CONTAINER_TUPLE = (dict, list, tuple)
_ORJSON_MAX_DEPTH = 200  # orjson stops at 255 levels


def _orjson_spells_like_json(value: Any) -> bool:
    """Whether every value inside `value` is of a type orjson serialises byte for byte like `json.dumps`.

    Walks level by level and flattens each level with C iterators, so a 150k-entry vocabulary or merge list
    costs milliseconds rather than a Python call per entry.
    """
    level: list[Any] = [value]
    for _ in range(_ORJSON_MAX_DEPTH):
        if not set(map(type, level)) <= _ORJSON_TYPES:
            return False
        containers = compress(level, map(isinstance, level, repeat(_CONTAINER_TUPLE)))
        level = list(chain.from_iterable(c.values() if type(c) is dict else c for c in containers))
        if not level:
            return True
    return False  # deeper than orjson goes (or a cycle, which json.dumps reports)


def _canonical_bytes(value: Any, *, checked: bool = False) -> bytes:
    if orjson is not None and (checked or _orjson_spells_like_json(value)):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # a non-string key, or an integer beyond 64 bits
            pass
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonical_json(value: Any) -> str:
    """One spelling of a JSON value: sorted keys, no spaces, unicode kept."""
    return _canonical_bytes(value).decode("utf-8")


def sha256_text(text: str) -> str:
    """Hex sha256 of a text's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_json(value: Any) -> str:
    """Hex sha256 of a value's canonical JSON: `sha256_text(canonical_json(value))`, without the round trip."""
    return hashlib.sha256(_canonical_bytes(value)).hexdigest()


def _parse_json(text: str) -> tuple[Any, bool]:
    """Parse JSON as `json.loads` does; also whether orjson can write the value back (see `_canonical_bytes`)."""
    if orjson is not None:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:  # e.g. NaN, or integers beyond 64 bits: the standard library's job
            pass
        else:
            if _orjson_spells_like_json(value):
                return value, True
    # Floats (or anything orjson would parse or print differently): exactly as before.
    return json.loads(text), False


# How each component is named when two fingerprints differ in it.
_COMPONENT_LABELS = {
    "render_semantics": "rendering code version",
    "model_type": "model type",
    "processor": "prompt processor",
    "chat_templates": "chat template",
    "chat_format": "chat format (Harmony / mistral-common)",
    "tokenizer.class": "tokenizer class",
    "tokenizer.model": "tokenizer model",
    "tokenizer.model_file": "tokenizer model file (tokenizer.model / tiktoken / tekken.json)",
    "tokenizer.vocab": "tokenizer vocabulary",
    "tokenizer.added_tokens": "tokenizer added tokens",
    "tokenizer.special_tokens": "tokenizer special tokens",
    "tokenizer.add_bos_eos": "tokenizer add-bos/add-eos behaviour",
    "tokenizer.split_special_tokens": "tokenizer split_special_tokens",
    "options.prompt_mode_reasoning_parser": "reasoning parser that reads the prompt",
    "options.forced_tool_call_prefix": "forced tool-call prefix",
    "options.default_chat_template_kwargs": "default chat_template_kwargs",
}


@dataclass(frozen=True)
class Fingerprint:
    """A rendering fingerprint as published on `/server_info` as `render_fingerprint`."""

    compared: dict[str, Any]
    complete: bool
    incomplete_reasons: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    version: int = FINGERPRINT_VERSION

    @cached_property
    def digest(self) -> str:
        """sha256 hex of the canonical JSON of `compared`, computed once (`compared` is never changed in place: a
        router compares every worker's fingerprint at each of its checks, hundreds a second at a large fleet)."""
        return sha256_json(self.compared)

    def to_json(self) -> dict[str, Any]:
        """The published form."""
        return {
            "version": self.version,
            "digest": self.digest,
            "compared": self.compared,
            "complete": self.complete,
            "incomplete_reasons": list(self.incomplete_reasons),
            "info": self.info,
        }

    @classmethod
    def from_json(cls, value: Any) -> Fingerprint | None:
        """Read a published fingerprint; None when it is missing or not of a known shape."""
        if not isinstance(value, dict) or not isinstance(value.get("compared"), dict):
            return None
        info = value.get("info")
        version = value.get("version", 0)
        return cls(
            compared=value["compared"],
            complete=bool(value.get("complete")),
            incomplete_reasons=[str(r) for r in value.get("incomplete_reasons") or []],
            info=info if isinstance(info, dict) else {},
            version=version if isinstance(version, int) else 0,
        )

    def matches(self, other: Fingerprint | None) -> bool:
        """Both complete and the same digest: ids rendered by one are valid for the other."""
        return not self.compare(other)

    def compare(self, other: Fingerprint | None, *, other_name: str = "worker") -> list[str]:
        """Readable reasons why ids rendered here may not be what `other` renders; empty when they match."""
        if other is None:
            return [f"{other_name} reports no rendering fingerprint"]
        if other.version != self.version:
            return [f"fingerprint version {self.version} vs {other.version}"]
        reasons = []
        if not self.complete:
            reasons.append(
                "this side's tokenizer is not fully identified: " + "; ".join(self.incomplete_reasons)
            )
        if not other.complete:
            reasons.append(
                f"{other_name}'s tokenizer is not fully identified: " + "; ".join(other.incomplete_reasons)
            )
        reasons.extend(_component_differences(self.compared, other.compared, other_name))
        if not reasons and self.digest != other.digest:
            reasons.append("rendering fingerprints differ")
        return reasons


def _flatten(compared: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in compared.items():
        if key in ("tokenizer", "options") and isinstance(value, dict):
            for sub, item in value.items():
                flat[f"{key}.{sub}"] = item
        else:
            flat[key] = value
    return flat


def _component_order(key: str) -> tuple[int, str]:
    labelled = list(_COMPONENT_LABELS)
    return (labelled.index(key) if key in _COMPONENT_LABELS else len(labelled), key)


def components(compared: dict[str, Any]) -> dict[str, Any]:
    """`compared` as its components (`tokenizer.vocab`, `options.forced_tool_call_prefix`, ...), in the order
    `Fingerprint.compare` tells differences: what `tokenfront check` lays out side by side."""
    flat = _flatten(compared)
    return {key: flat[key] for key in sorted(flat, key=_component_order)}


def component_label(key: str) -> str:
    """How a component is named to a person ("chat template", "tokenizer vocabulary"); unknown keys as they are."""
    return _COMPONENT_LABELS.get(key, key)


def _component_differences(mine: dict[str, Any], theirs: dict[str, Any], other_name: str) -> list[str]:
    a, b = _flatten(mine), _flatten(theirs)
    reasons = []
    for key in sorted(set(a) | set(b), key=_component_order):
        if a.get(key) == b.get(key):
            continue
        label = component_label(key)
        if key == "model_type":
            reasons.append(
                f"model type {a.get(key) or 'none (generic text model)'} vs "
                f"{b.get(key) or 'none (generic text model)'}"
            )
        elif key == "processor" and b.get(key) and not a.get(key):
            reasons.append(f"{other_name}'s model builds its prompt in a processor")
        elif key == "processor" and a.get(key) and not b.get(key):
            reasons.append(f"this model builds its prompt in a processor; the {other_name}'s does not")
        elif key == "chat_templates":
            reasons.append(_template_difference(a.get(key) or {}, b.get(key) or {}))
        else:
            reasons.append(f"{label} differs")
    return reasons


def _template_difference(mine: dict[str, str], theirs: dict[str, str]) -> str:
    if not mine or not theirs:
        return "chat template differs (one side has none)"
    names = sorted(name for name in set(mine) | set(theirs) if mine.get(name) != theirs.get(name))
    if names == ["default"]:
        return "chat template differs"
    return "chat template differs (" + ", ".join(names) + ")"


# Models whose tokenizer.json "vocab" is exactly their `get_vocab(with_added_tokens=False)` (Unigram's is a
# list of [piece, score]: asked from the Rust side instead).
_TOKEN_TO_ID_MODELS = frozenset({"BPE", "WordPiece", "WordLevel"})


def _rust_tokenizer_hashes(tokenizer: Any, serialized: str) -> tuple[str, str]:
    """sha256 of the tokenizer.json transformers runs (minus call-time settings and added tokens), and of
    the model vocabulary: ~0.5 s of CPU for a 150k vocabulary, so remembered on disk by what they are computed
    from (`fingerprint_cache`)."""
    key = fingerprint_cache.cache_key(serialized)
    remembered = fingerprint_cache.read_hashes(key)
    if remembered is not None:
        return remembered
    hashes = _computed_tokenizer_hashes(tokenizer, serialized)
    fingerprint_cache.write_hashes(key, *hashes)
    return hashes


def _computed_tokenizer_hashes(tokenizer: Any, serialized: str) -> tuple[str, str]:
    spec, checked = _parse_json(serialized)
    # Padding/truncation are call-time settings, and added tokens are hashed on their own below.
    for key in ("padding", "truncation", "added_tokens"):
        spec.pop(key, None)
    model_hash = hashlib.sha256(_canonical_bytes(spec, checked=checked)).hexdigest()
    model = spec.get("model") or {}
    if model.get("type") in _TOKEN_TO_ID_MODELS and type(model.get("vocab")) is dict:
        # These models serialise their vocabulary as the token -> id map `get_vocab` returns: no need to ask
        # the Rust side to build it again (~0.1 s for 150k tokens). Its entries were checked with the spec.
        vocab, vocab_checked = model["vocab"], checked
    else:  # str -> u32 from the Rust side: always what orjson spells like json.dumps
        vocab, vocab_checked = tokenizer._tokenizer.get_vocab(with_added_tokens=False), True
    vocab_hash = hashlib.sha256(_canonical_bytes(sorted(vocab.items()), checked=vocab_checked)).hexdigest()
    return model_hash, vocab_hash


# transformers tokenizer classes with no Rust model whose whole encoding model is the file they were built
# from (mistral-common's tekken.json or SentencePiece model, run by mistral-common under transformers).
_FILE_MODEL_CLASSES = frozenset({"MistralCommonBackend"})


def _sha256_file(path: Any) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_components(tokenizer: Any) -> tuple[dict[str, Any], list[str]]:
    """The tokenizer's part of `compared`, and why it is incomplete (empty when fully identified).

    `model`/`vocab` hash the encoding model transformers runs: its Rust tokenizer serialised (a checkpoint's
    `tokenizer.json`, or the fast tokenizer transformers 5 builds from a SentencePiece or tiktoken
    `tokenizer.model`), canonical JSON, so a re-serialised but identical tokenizer.json hashes the same.
    `model_file` is the sha256 of the bytes of the file the tokenizer was converted from (`tokenizer.model`,
    `*.tiktoken`, `tekken.json`: the ranks or pieces themselves, whatever a converter keeps of them); None
    for a tokenizer loaded from `tokenizer.json`, whose content `model` already is. The file's name is not
    compared (`tokenizer_files.tokenizer_source_file` tells it, for `info`).

    Complete (no reasons) when both hold:
    - the class is transformers' own (or built as transformers builds it: `direct_tokenizer`), not code loaded
      with `--trust-remote-code`;
    - the encoding model is hashed: a Rust model, or for a class in `_FILE_MODEL_CLASSES` (mistral-common's
      tokenizer under transformers, which has no Rust model) the file it was loaded from, found and read.
    Otherwise incomplete: a tokenizer with neither (e.g. a Python SentencePiece tokenizer without a fast
    conversion) cannot be told apart from another one with the same vocabulary.
    """

    incomplete: list[str] = []
    name = tokenizer_class_name(tokenizer)
    if not is_library_tokenizer(tokenizer):
        incomplete.append(f"tokenizer class {name} is code loaded with --trust-remote-code")
    backend = getattr(tokenizer, "_tokenizer", None)
    source = tokenizer_source_file(tokenizer)
    model_file = _sha256_file(source) if source is not None and source.name != "tokenizer.json" else None
    model_hash: str | None = None
    vocab_hash: str | None = None
    file_model = backend is None and name in _FILE_MODEL_CLASSES
    if backend is not None:
        serialized = tokenizer_json(tokenizer, keep=False)  # the cached one if start-up still holds it
        assert serialized is not None  # there is a Rust tokenizer
        model_hash, vocab_hash = _rust_tokenizer_hashes(tokenizer, serialized)
        release_freed_memory()  # the parsed tokenizer.json: ~100 MB for a 150k vocabulary
    elif file_model and model_file is not None:
        model_hash = model_file
        vocab_hash = sha256_json(sorted(tokenizer.get_vocab().items()))
    elif file_model:
        incomplete.append(f"tokenizer {name}: the file it was loaded from was not found")
    else:
        incomplete.append(f"tokenizer {name} has no serialisable model (tokenizer.json)")
    components = {
        "class": name,
        "model": model_hash,
        "model_file": model_file,
        "vocab": vocab_hash,
        "added_tokens": sha256_json(_added_tokens(tokenizer)),
        "special_tokens": dict(sorted(tokenizer.special_tokens_map.items())),
        "add_bos_eos": [
            bool(getattr(tokenizer, "add_bos_token", False)),
            bool(getattr(tokenizer, "add_eos_token", False)),
        ],
        "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
    }
    return components, incomplete


def _added_tokens(tokenizer: Any) -> list[dict[str, Any]]:
    decoder = tokenizer.added_tokens_decoder
    if callable(decoder):  # MistralCommonBackend: a method that raises; its special tokens instead
        ids = sorted(set(getattr(tokenizer, "all_special_ids", [])))
        tokens = tokenizer.convert_ids_to_tokens(ids) if ids else []
        return [{"id": i, "content": token, "special": True} for i, token in zip(ids, tokens, strict=True)]
    return [
        {
            "id": token_id,
            "content": token.content,
            "special": bool(token.special),
            "lstrip": bool(token.lstrip),
            "rstrip": bool(token.rstrip),
            "normalized": bool(token.normalized),
            "single_word": bool(token.single_word),
        }
        for token_id, token in sorted(decoder.items())
    ]


def build_fingerprint(
    *,
    model_type: str | None,
    processor: dict[str, Any] | None,
    chat_templates: dict[str, str] | None,
    tokenizer: Any,
    prompt_mode_reasoning_parser: str | None,
    forced_tool_call_prefix: Any,
    default_chat_template_kwargs: dict[str, Any],
    remote_code: bool,
    info: dict[str, Any],
    chat_format: dict[str, Any] | None = None,
    tokenizer_part: tuple[dict[str, Any], list[str]] | None = None,
) -> Fingerprint:
    """Compute the fingerprint of one rendering configuration.

    `chat_format`: what builds chat prompts instead of a template (Harmony, mistral-common), with its version;
    `tokenizer_part`: the tokenizer's components when the family identifies its tokenizer itself.
    Never complete for a tokenizer with no vocabulary (`tokenizer_files.has_vocabulary`: only special tokens).
    """
    tokenizer_components_, incomplete = tokenizer_part or tokenizer_components(tokenizer)
    incomplete = list(incomplete)
    if not has_vocabulary(tokenizer):
        # Built from no vocabulary file: every such tokenizer hashes alike, and none can encode anything.
        incomplete.append("the tokenizer has no vocabulary (only special tokens): its files were not found")
    if remote_code and not any("trust-remote-code" in reason for reason in incomplete):
        incomplete.append("the checkpoint's own code was loaded with --trust-remote-code")
    compared = {
        "render_semantics": RENDER_SEMANTICS_VERSION,
        "model_type": model_type,
        "processor": _processor_component(processor),
        "chat_templates": {name: sha256_text(text) for name, text in sorted((chat_templates or {}).items())},
        "chat_format": chat_format,
        "tokenizer": tokenizer_components_,
        "options": {
            "prompt_mode_reasoning_parser": prompt_mode_reasoning_parser,
            "forced_tool_call_prefix": forced_tool_call_prefix,
            "default_chat_template_kwargs": default_chat_template_kwargs,
        },
    }
    return Fingerprint(compared=compared, complete=not incomplete, incomplete_reasons=incomplete, info=info)


def _processor_component(processor: dict[str, Any] | None) -> dict[str, Any] | None:
    if processor is None:
        return None
    return {
        "class": processor.get("processor_class") or processor.get("image_processor_type"),
        "config": sha256_json(processor),
    }

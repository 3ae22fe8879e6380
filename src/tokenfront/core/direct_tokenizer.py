"""A checkpoint's tokenizer built with `tokenizers` alone, exactly as transformers builds it, for the tokenizer
classes whose construction tokenfront knows: a server starts without importing transformers.

`import transformers` costs about a second of a renderer's start-up, and loading a tokenizer through it another
half (it parses tokenizer.json in Python before rebuilding it in Rust). For the folders below, `load_direct`
makes the same `tokenizers` calls transformers 5 makes, in the same order — so the Rust tokenizer, its added
tokens, its serialization (the fingerprint's `tokenizer.model`) and every id are transformers' — and
`DirectTokenizer` answers what tokenfront asks of a tokenizer (its ids, text, special and added tokens,
vocabulary) as transformers' `TokenizersBackend` does.

The folders it builds (for anything else it returns None and says why, and transformers loads the folder):
- `tokenizer_config.json`'s `tokenizer_class` is `PreTrainedTokenizerFast` or `TokenizersBackend` and the model
  type is llama, gpt_oss or none: transformers' `TokenizersBackend`, `tokenizer.json` as it is;
- it is `Qwen2Tokenizer` (or `...Fast`) and the model type is qwen2, qwen2_moe, qwen3, qwen3_moe or none:
  `Qwen2Tokenizer`, which keeps tokenizer.json's vocabulary, merges and post-processor under its own BPE
  settings, normalizer, pre-tokenizer and decoder;
- and in both: a `tokenizer.json`; every key of `tokenizer_config.json` one whose effect is reproduced here
  (`_CONFIG_KEYS`, or a model-specific `*_token` naming a token); no code shipped with the checkpoint (`auto_map`);
  `split_special_tokens` off; no padding or truncation in tokenizer.json; no legacy `special_tokens_map.json` /
  `added_tokens.json` read in place of `added_tokens_decoder`.

The model types are those the fixtures prove (`tests/core/test_direct_tokenizer.py` holds every fixture and
variants of them against transformers itself: the serialized tokenizer, special and added tokens, ids and
text); transformers decides some other model types' classes differently, so they are left to it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["DirectTokenizer", "load_direct"]

log = logging.getLogger(__name__)

# transformers' names, in its order: the named special tokens (`SPECIAL_TOKENS_ATTRIBUTES`).
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_VERY_LARGE_INTEGER = int(1e30)  # transformers' model_max_length when the config gives none

_BACKEND_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
_QWEN2_CLASSES = frozenset({"Qwen2Tokenizer", "Qwen2TokenizerFast"})
_BACKEND_MODEL_TYPES = frozenset({None, "llama", "gpt_oss"})
_QWEN2_MODEL_TYPES = frozenset({None, "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
# Qwen2Tokenizer's pre-tokenizer split (transformers' PRETOKENIZE_REGEX).
_QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_QWEN2_DEFAULT_TOKEN = "<|endoftext|>"  # Qwen2Tokenizer's unk, eos and pad when the config does not name them

# tokenizer_config.json keys whose effect on the tokenizer is reproduced here; the rest of what transformers
# reads from them (padding and truncation sides, model input names, the chat template, ...) changes no id or text.
_CONFIG_KEYS = frozenset(
    {
        *_NAMED_TOKENS,
        "tokenizer_class",
        "added_tokens_decoder",
        "additional_special_tokens",
        "extra_special_tokens",
        "model_max_length",
        "clean_up_tokenization_spaces",
        "split_special_tokens",
        "add_prefix_space",
        "add_bos_token",  # dropped by transformers when there is a tokenizer.json
        "add_eos_token",
        "chat_template",
        "errors",
        "legacy",
        "backend",
        "padding_side",
        "truncation_side",
        "model_input_names",
        "processor_class",
        "use_default_system_prompt",
        "spaces_between_special_tokens",
        "sp_model_kwargs",
    }
)


class DirectTokenizer:
    """What tokenfront reads of a transformers tokenizer, over the `tokenizers.Tokenizer` transformers would
    run, built by `load_direct`. `transformers_class` is the class transformers would have made."""

    # So for every tokenizer `load_direct` builds (it leaves the others to transformers).
    split_special_tokens = False
    add_bos_token = False
    add_eos_token = False

    def __init__(
        self,
        rust: Any,
        *,
        transformers_class: str,
        folder: Path,
        special_tokens: dict[str, Any],
        extra_special_tokens: list[Any],
        model_max_length: Any,
    ) -> None:
        self._tokenizer = rust
        self.transformers_class = transformers_class
        self.name_or_path = str(folder)
        self._special_tokens = special_tokens  # name -> str or AddedToken, None when unset (named ones first)
        self._extra_special_tokens = extra_special_tokens
        self.model_max_length = model_max_length

    @property
    def init_kwargs(self) -> dict[str, Any]:
        """None of transformers' loading arguments (no `vocab_file`: the tokenizer comes from tokenizer.json)."""
        return {}

    def __repr__(self) -> str:
        return f"DirectTokenizer({self.transformers_class}, {self.name_or_path!r}, {len(self)} tokens)"

    # -- encoding and decoding -------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`, as `tokenizer.encode(text, add_special_tokens=...)` gives them."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """`{"input_ids": ids}`, as `tokenizer(text, add_special_tokens=...)` holds them."""
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`, as transformers' `decode` gives it (its tokenization-space clean-up is never
        applied to a BPE model, and `load_direct` builds no other kind with it on)."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> Any:
        """The token (None when unknown) of an id, or of each id of a list (the special ones left out on ask)."""
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        skipped = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skipped]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> Any:
        """The id of a token, or of each token of a list; an unknown one is the unknown token's id (or None)."""
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(token) for token in tokens]

    def _token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
        unk = self._special_tokens.get("unk_token")
        return None if unk is None else self._tokenizer.token_to_id(str(unk))

    # -- vocabulary ------------------------------------------------------------------------------------------

    @property
    def backend_tokenizer(self) -> Any:
        """The `tokenizers.Tokenizer` itself."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without added tokens."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=False))

    def __len__(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        """Every token and its id, added tokens included."""
        return dict(self._tokenizer.get_vocab(with_added_tokens=True))

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        """The added tokens by id, each a `tokenizers.AddedToken` with its flags."""
        return dict(self._tokenizer.get_added_tokens_decoder())

    def get_added_vocab(self) -> dict[str, int]:
        """The added tokens' contents and ids, by id."""
        return {token.content: i for i, token in sorted(self.added_tokens_decoder.items())}

    # -- special tokens --------------------------------------------------------------------------------------

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set (model-specific names too), as strings."""
        return {name: str(value) for name, value in self._special_tokens.items() if value is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, then the extra ones, each once."""
        named = [str(value) for value in self._special_tokens.values() if value is not None]
        return list(dict.fromkeys([*named, *map(str, self._extra_special_tokens)]))

    @property
    def all_special_ids(self) -> list[int | None]:
        """The ids of `all_special_tokens`."""
        return [self._token_id(token) for token in self.all_special_tokens]

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token's id; None when the tokenizer names none."""
        return self._named_id("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence token's id; None when the tokenizer names none."""
        return self._named_id("bos_token")

    def _named_id(self, name: str) -> int | None:
        value = self._special_tokens.get(name)
        return None if value is None else self._token_id(str(value))


def load_direct(folder: Path) -> DirectTokenizer | None:
    """The folder's tokenizer built as transformers builds it, or None (with the reason logged at debug level)
    when its class or configuration is not one this module reproduces: transformers must load it."""
    try:
        reason = _not_covered(folder)
        if reason is None:
            return _build(folder)
    except Exception as exc:  # anything unexpected: transformers loads it (and says what is wrong)
        reason = f"{type(exc).__name__}: {exc}"
    log.debug("tokenizer in %s loaded with transformers: %s", folder, reason)
    return None


def _read(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else None


def _not_covered(folder: Path) -> str | None:
    """Why this module does not build the folder's tokenizer; None when it does."""
    tokenizer_config = _read(folder, "tokenizer_config.json")
    config = _read(folder, "config.json") or {}
    if tokenizer_config is None or not (folder / "tokenizer.json").is_file():
        return "no tokenizer.json or no tokenizer_config.json"
    if "auto_map" in tokenizer_config or "auto_map" in config:
        return "the checkpoint ships code (auto_map)"
    model_type = config.get("model_type") or None
    cls = tokenizer_config.get("tokenizer_class")
    if not (
        (cls in _BACKEND_CLASSES and model_type in _BACKEND_MODEL_TYPES)
        or (cls in _QWEN2_CLASSES and model_type in _QWEN2_MODEL_TYPES)
    ):
        return f"tokenizer class {cls} with model type {model_type}"
    unknown = [
        key
        for key, value in tokenizer_config.items()
        if key not in _CONFIG_KEYS and not (key.endswith("_token") and isinstance(value, str))
    ]
    if unknown:
        return f"tokenizer_config.json keys {', '.join(sorted(unknown))}"
    if tokenizer_config.get("split_special_tokens"):
        return "split_special_tokens"
    if "added_tokens_decoder" not in tokenizer_config and any(
        (folder / name).is_file() for name in ("special_tokens_map.json", "added_tokens.json")
    ):
        return "legacy special_tokens_map.json / added_tokens.json"
    if isinstance(tokenizer_config.get("extra_special_tokens"), list) and tokenizer_config.get(
        "additional_special_tokens"
    ):
        return "both additional_special_tokens and extra_special_tokens"
    tokens = [tokenizer_config.get(name) for name in _NAMED_TOKENS]
    for key in ("additional_special_tokens", "extra_special_tokens"):
        listed = tokenizer_config.get(key)
        tokens += listed if isinstance(listed, list) else []
    if not all(value is None or isinstance(value, str) or _is_added_token(value) for value in tokens):
        return "a special token that is neither a string nor an AddedToken"
    return None


def _is_added_token(value: Any) -> bool:
    return isinstance(value, dict) and value.get("__type") == "AddedToken"


def _added_token(value: Any) -> Any:
    """A config value as transformers reads it: `{"__type": "AddedToken", ...}` objects become AddedTokens."""
    from tokenizers import AddedToken

    if _is_added_token(value):
        return AddedToken(**{key: item for key, item in value.items() if key != "__type"})
    if isinstance(value, list):
        return [_added_token(item) for item in value]
    return value


def _build(folder: Path) -> DirectTokenizer:
    from tokenizers import AddedToken, Tokenizer

    tokenizer_config = _read(folder, "tokenizer_config.json") or {}
    qwen2 = tokenizer_config.get("tokenizer_class") in _QWEN2_CLASSES
    source = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if source.padding is not None or source.truncation is not None:
        raise ValueError("tokenizer.json sets padding or truncation")
    if tokenizer_config.get("clean_up_tokenization_spaces") and type(source.model).__name__ != "BPE":
        raise ValueError("clean_up_tokenization_spaces on a model that is not BPE")

    # tokenizer_config.json as transformers' `_from_pretrained` hands it on.
    settings = {key: _added_token(value) for key, value in tokenizer_config.items()}
    if "added_tokens_decoder" in settings:
        added = {int(i): AddedToken(**token) for i, token in settings["added_tokens_decoder"].items()}
    else:  # read from tokenizer.json
        added = dict(source.get_added_tokens_decoder())
    by_text = {str(token): token for token in added.values()}
    extra = settings.get("extra_special_tokens")
    if not extra and settings.get("additional_special_tokens"):
        extra = settings["additional_special_tokens"]
    model_specific = {
        key: value
        for key, value in tokenizer_config.items()
        if key not in _NAMED_TOKENS and key.endswith("_token") and isinstance(value, str)
    }
    if isinstance(extra, dict):
        model_specific.update(extra)
        extra = []
    # The named ones the config gives, as the added token of that text when there is one.
    named = {name: settings.get(name) for name in _NAMED_TOKENS}
    named = {name: None if value is None else by_text.get(str(value), value) for name, value in named.items()}
    if qwen2:  # Qwen2Tokenizer's own defaults, for names the config leaves out
        for name in ("unk_token", "eos_token", "pad_token"):
            if name not in tokenizer_config:
                named[name] = _QWEN2_DEFAULT_TOKEN
    special_tokens = {**named, **model_specific}
    extra_tokens = list(extra or [])

    rust = _qwen2_tokenizer(source, settings) if qwen2 else source
    if qwen2 and source.post_processor is not None:
        rust.post_processor = source.post_processor
    rust.encode_special_tokens = False  # split_special_tokens is off
    _add_special_tokens(rust, added, special_tokens, extra_tokens)
    if rust.post_processor is None:  # TokenizersBackend.update_post_processor, with add_bos/eos off
        from tokenizers import processors

        rust.post_processor = processors.TemplateProcessing(
            single="$A:0", pair="$A:0 $B:1", special_tokens=[]
        )
    max_length = tokenizer_config.get("model_max_length")
    tokenizer = DirectTokenizer(
        rust,
        transformers_class="Qwen2Tokenizer" if qwen2 else "TokenizersBackend",
        folder=folder,
        special_tokens=special_tokens,
        extra_special_tokens=extra_tokens,
        model_max_length=_VERY_LARGE_INTEGER if max_length is None else max_length,
    )
    if qwen2:  # Qwen2Tokenizer.__init__'s last step
        rust.add_tokens([AddedToken(token, special=True) for token in tokenizer.all_special_tokens])
    return tokenizer


def _qwen2_tokenizer(source: Any, settings: dict[str, Any]) -> Any:
    """Qwen2Tokenizer's fresh tokenizer: the file's BPE vocabulary and merges with its own settings, normalizer,
    pre-tokenizer and decoder (and, set by the caller, the file's post-processor)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers

    rust = Tokenizer(source.model)  # the parsed model itself: the same vocabulary and merges, no second parse
    model = rust.model
    if type(model).__name__ != "BPE":
        raise ValueError(f"Qwen2Tokenizer needs a BPE model, tokenizer.json has {type(model).__name__}")
    model.dropout = None
    model.unk_token = None
    model.continuing_subword_prefix = ""
    model.end_of_word_suffix = ""
    model.fuse_unk = False
    model.byte_fallback = False
    model.ignore_merges = False
    rust.decoder = decoders.ByteLevel()
    rust.normalizer = normalizers.NFC()
    rust.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(
                add_prefix_space=bool(settings.get("add_prefix_space")), use_regex=False
            ),
        ]
    )
    return rust


def _add_special_tokens(
    rust: Any, added: dict[int, Any], special_tokens: dict[str, Any], extra_tokens: list[Any]
) -> None:
    """TokenizersBackend.__init__'s added tokens: every token of `added_tokens_decoder` (by id), then each
    special token not among them; a named one made special; all added in one call."""
    from tokenizers import AddedToken

    to_add = [token for _, token in sorted(added.items())]
    present = [token.content for _, token in sorted(rust.get_added_tokens_decoder().items())]
    known = present + [str(token) for token in to_add]
    for value in [*special_tokens.values(), *extra_tokens]:
        if value is not None and str(value) not in known and value not in to_add:
            to_add.append(value)
    if not to_add:
        return
    named = [str(value) for value in special_tokens.values() if value]
    tokens = []
    for token in to_add:
        if isinstance(token, str):
            token = AddedToken(token, special=True)
        elif not token.special and str(token) in named:
            token.special = True
        tokens.append(token)
    rust.add_tokens(tokens)

"""The model's context length (`max_model_len`) as vLLM 0.33 derives it from the checkpoint's config.

`/tokenize` answers it (vLLM's `TokenizeResponse.max_model_len`), so it must be vLLM's number, not a guess:
the smallest of the config's length keys (`max_position_embeddings`, `n_positions`, ...) of the text config,
with the config class's defaults filled in as transformers fills them (a config.json without
`max_position_embeddings` still has the class default, e.g. 32768 for Qwen3), times the RoPE scaling factor
(not for YaRN-like scalings, which already count it, nor for Gemma 3), `original_max_position_embeddings`
for LongRoPE, `model_max_length` when the config sets it (Command-R), and 2048 when nothing says.

The class defaults of a few text model types are copied here (`CLASS_DEFAULTS`, transformers 5's values,
checked against it by tests/core/test_context_length.py): their configs are read without importing
transformers (a second of a renderer's or router's start-up); any other model type asks transformers.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["CLASS_DEFAULTS", "DEFAULT_MAX_MODEL_LEN", "LENGTH_KEYS", "max_model_len"]

DEFAULT_MAX_MODEL_LEN = 2048  # vLLM's value when the config names no length
# vLLM's `derive_max_model_len_and_key`: the config keys that say a length; the smallest wins.
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose max_position_embeddings already includes the scaling (vLLM does not multiply them).
_PRESCALED_ROPE = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})
# What transformers' config class of these text model types fills in of what `max_model_len` reads, when
# config.json leaves it out (or gives null): its only length key and its default RoPE parameters.
_DEFAULT_ROPE = {"rope_type": "default"}
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "rope_parameters": _DEFAULT_ROPE},
    "mistral": {"max_position_embeddings": 131072, "rope_parameters": _DEFAULT_ROPE},
    "qwen2": {"max_position_embeddings": 32768, "rope_parameters": _DEFAULT_ROPE},
    "qwen2_moe": {"max_position_embeddings": 32768, "rope_parameters": _DEFAULT_ROPE},
    "qwen3": {"max_position_embeddings": 32768, "rope_parameters": _DEFAULT_ROPE},
    "qwen3_moe": {"max_position_embeddings": 32768, "rope_parameters": _DEFAULT_ROPE},
    "gpt_oss": {
        "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
    },
}


def max_model_len(config: Mapping[str, Any], *, from_transformers: bool = False) -> int:
    """vLLM's default `max_model_len` for a checkpoint's `config.json` contents (no `--max-model-len`);
    `from_transformers`: the config class from transformers even for a model type of `CLASS_DEFAULTS` (what
    the copy is checked against)."""
    text = _text_config(config, from_transformers=from_transformers)
    lengths = [value for key in LENGTH_KEYS if isinstance(value := text.get(key), (int, float))]
    derived: float = min(lengths) if lengths else float("inf")
    if isinstance(text.get("model_max_length"), (int, float)) and text["model_max_length"]:
        derived = text["model_max_length"]
    if derived == float("inf"):
        derived = DEFAULT_MAX_MODEL_LEN
    rope = list(_rope_parameters(text))
    if rope and "gemma3" not in str(text.get("model_type", "")):
        factor = 1.0
        for parameters in rope:
            if parameters.get("rope_type", parameters.get("type")) not in _PRESCALED_ROPE:
                factor = parameters.get("factor", factor)
        derived *= factor if factor is not None else 1.0
    if any(p.get("rope_type", p.get("type")) == "longrope" for p in rope):
        return int(text.get("original_max_position_embeddings", derived))
    return int(derived)


def _text_config(config: Mapping[str, Any], *, from_transformers: bool) -> dict[str, Any]:
    """The text model's config as transformers builds it (class defaults included), as a plain dict."""
    model_type = config.get("model_type")
    defaults = CLASS_DEFAULTS.get(model_type) if isinstance(model_type, str) else None
    if defaults is not None and not from_transformers:
        given = {key: value for key, value in config.items() if value is not None}
        if "rope_scaling" in given:  # the file's RoPE parameters, under their older name, replace the default
            given.setdefault("rope_parameters", given["rope_scaling"])
        return {**defaults, **given}
    if isinstance(model_type, str):
        try:
            from transformers import AutoConfig

            # A deep copy: transformers writes into the RoPE dicts it is given.
            values = {key: copy.deepcopy(value) for key, value in config.items() if key != "model_type"}
            built = AutoConfig.for_model(model_type, **values).get_text_config()
            return {**built.to_dict(), "model_type": built.model_type}
        except Exception as exc:  # a model type this transformers does not know: read the file as it is
            log.debug("config class for %r unavailable (%s); reading config.json as is", model_type, exc)
    text = config.get("text_config")
    return dict(text) if isinstance(text, Mapping) else dict(config)


def _rope_parameters(config: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    # transformers 5 names it rope_parameters (per layer type for some models); older configs rope_scaling.
    parameters = config.get("rope_parameters") or config.get("rope_scaling")
    if not isinstance(parameters, Mapping):
        return
    nested = [value for value in parameters.values() if isinstance(value, Mapping)]
    if nested and all(isinstance(value, Mapping) for value in parameters.values()):
        yield from (value for value in nested if value)
    elif parameters:
        yield parameters

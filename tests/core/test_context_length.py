"""core/context_length.py: `max_model_len` as vLLM 0.33 derives it (it is part of vLLM's /tokenize answer).

The expected values are vLLM's: `vllm.config.ModelConfig(model=folder).max_model_len` for each fixture
checkpoint, from a scratch run of vLLM 0.33 (no `--max-model-len`); they exercise the config class's defaults
(Qwen3's config.json names no length), RoPE types that do not scale (Gemma 3's linear factor 8, gpt-oss's YaRN)
and a plain `max_position_embeddings`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tokenfront.core.context_length import CLASS_DEFAULTS, DEFAULT_MAX_MODEL_LEN, LENGTH_KEYS, max_model_len

VLLM_MAX_MODEL_LEN = {
    "qwen3": 32768,
    "llama3": 2048,
    "gemma3": 131072,
    "gemma3-processor": 131072,
    "deepseek_v3": 4096,
    "smollm2": 8192,
    "gptoss": 131072,
    "tiny-random": 2048,
    "mistral-tekken": 32768,
}


@pytest.mark.parametrize(("name", "expected"), sorted(VLLM_MAX_MODEL_LEN.items()))
def test_fixture_checkpoints_match_vllm(checkpoint: Callable[[str], Path], name: str, expected: int) -> None:
    config = json.loads((checkpoint(name) / "config.json").read_text(encoding="utf-8"))
    assert max_model_len(config) == expected


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, DEFAULT_MAX_MODEL_LEN),
        ({"model_type": "no_such_model", "n_positions": 1024, "max_seq_len": 512}, 512),
        (
            {
                "model_type": "no_such_model",
                "max_position_embeddings": 4096,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            },
            8192,
        ),
        (
            {
                "model_type": "no_such_model",
                "max_position_embeddings": 4096,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
            },
            4096,
        ),
        (
            {
                "model_type": "no_such_model",
                "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096,
                "rope_scaling": {"rope_type": "longrope", "factor": 32.0},
            },
            4096,
        ),
        (
            {"model_type": "no_such_model", "max_position_embeddings": 8192, "model_max_length": 131072},
            131072,
        ),
    ],
)
def test_vllms_rules_on_plain_configs(config: dict[str, object], expected: int) -> None:
    assert max_model_len(config) == expected


# -- the config class defaults copied for a few model types are transformers' --------------------------------

_LENGTH_AND_ROPE = ("max_position_embeddings", "rope_parameters")


@pytest.mark.parametrize("model_type", sorted(CLASS_DEFAULTS))
def test_copied_class_defaults_are_transformers(model_type: str) -> None:
    from transformers import AutoConfig

    built = AutoConfig.for_model(model_type).get_text_config().to_dict()
    assert built["model_type"] == model_type  # a text model: its own config is the text config
    # No other key max_model_len reads has a default in the class.
    assert [key for key in LENGTH_KEYS if key in built] == ["max_position_embeddings"]
    copied = CLASS_DEFAULTS[model_type]
    assert built["max_position_embeddings"] == copied["max_position_embeddings"]
    rope = {key: value for key, value in built["rope_parameters"].items() if key in copied["rope_parameters"]}
    assert rope == copied["rope_parameters"], built["rope_parameters"]
    assert set(built["rope_parameters"]) - set(copied["rope_parameters"]) <= {
        "rope_theta",
        "beta_fast",
        "beta_slow",
        "truncate",
        "partial_rotary_factor",
    }


# Configs of the copied model types as checkpoints write them: the length given or not, RoPE scaling given
# (under either name, either key for its type), null or absent, another length key, model_max_length.
_VARIANTS: list[dict[str, object]] = [
    {},
    {"max_position_embeddings": 40960, "rope_scaling": None, "rope_theta": 1000000.0},
    {"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"rope_scaling": {"type": "linear", "factor": 2.0}},
    {"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
    {"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "linear", "factor": 3.0}},
    {
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    {"max_position_embeddings": 4096, "model_max_length": 1000},
    {"max_position_embeddings": 4096, "seq_length": 1000},
]


@pytest.mark.parametrize("model_type", sorted(CLASS_DEFAULTS))
def test_copied_model_types_read_as_transformers_reads_them(model_type: str) -> None:
    for variant in _VARIANTS:
        config = {"model_type": model_type, **variant}
        assert max_model_len(config) == max_model_len(config, from_transformers=True), config


def test_a_copied_model_type_needs_no_transformers() -> None:
    script = (
        "import json, sys\n"
        "from tokenfront.core.context_length import max_model_len\n"
        "print(json.dumps([max_model_len({'model_type': 'qwen3'}), 'transformers' in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == [32768, False]

"""core/context_length.py: `max_model_len` as vLLM 0.33 derives it (it is part of vLLM's /tokenize answer).

The expected values are vLLM's: `vllm.config.ModelConfig(model=folder).max_model_len` for each fixture
checkpoint, from a scratch run of vLLM 0.33 (no `--max-model-len`); they exercise the config class's defaults
(Qwen3's config.json names no length), RoPE types that do not scale (Gemma 3's linear factor 8, gpt-oss's YaRN)
and a plain `max_position_embeddings`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tokenfront.core.context_length import DEFAULT_MAX_MODEL_LEN, max_model_len

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

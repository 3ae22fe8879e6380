"""Sampling defaults and the token budget (worker/sampling.py), from a real Qwen3 folder whose
generation_config.json and context length the test sets. No engine is involved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tokenfront.core.checkpoint import load_checkpoint
from tokenfront.protocol import ChatCompletionRequest
from tokenfront.server.errors import APIError
from tokenfront.worker.engine import SamplingParams
from tokenfront.worker.sampling import SamplingDefaults, context_length

CHAT = {"messages": [{"role": "user", "content": "Weather in Paris?"}]}
GENERATION_CONFIG = {
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "max_new_tokens": 100,
    "eos_token_id": [151643],
}


@pytest.fixture(scope="module")
def defaults(qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> SamplingDefaults:
    folder = tmp_path_factory.mktemp("qwen3-generation") / "Qwen3-test"
    shutil.copytree(qwen3, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return SamplingDefaults.from_checkpoint(load_checkpoint(str(folder)))


@pytest.fixture(scope="module")
def bare(qwen3: Path) -> SamplingDefaults:
    """The fixture Qwen3 folder: no context length in its config, no generation_config.json."""
    return SamplingDefaults.from_checkpoint(load_checkpoint(str(qwen3)))


def test_sampling_defaults_come_from_generation_config(defaults: SamplingDefaults) -> None:
    params = defaults.params(ChatCompletionRequest(**CHAT), 50, None, None)
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.95, 20)
    assert params.max_tokens == 100  # generation_config's max_new_tokens, below the context room
    # EOS ids: generation_config's and the tokenizer's (<|im_end|>), always stop ids.
    assert {151643, 151645} <= params.stop_token_ids
    assert defaults.eos_ids == {151643, 151645}
    request = ChatCompletionRequest(**CHAT, temperature=0, top_p=0.5, top_k=0, seed=3, stop_token_ids=[7])
    params = defaults.params(request, 50, 10, 2)
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.0, 0.5, -1, 3)
    assert params.max_tokens == 10
    assert params.logprobs == 2
    assert 7 in params.stop_token_ids
    with pytest.raises(APIError, match="top_k"):
        defaults.params(ChatCompletionRequest(**CHAT, top_k=-2), 50, 10, None)


def test_token_budget_is_the_context_room(defaults: SamplingDefaults, bare: SamplingDefaults) -> None:
    assert defaults.context_length == 4096
    assert defaults.max_tokens(4090, None) == 6  # less room than max_new_tokens
    assert defaults.max_tokens(4000, 96) == 96
    with pytest.raises(APIError, match="at most 96 tokens"):
        defaults.max_tokens(4000, 97)
    with pytest.raises(APIError, match="no room to generate"):
        defaults.max_tokens(4096, None)
    # The fixture config has no context length and no max_new_tokens: a budget is required.
    assert bare.context_length is None
    assert bare.max_tokens(10, 5) == 5
    with pytest.raises(APIError, match="send max_tokens"):
        bare.max_tokens(10, None)


def test_the_engine_context_wins(qwen3: Path) -> None:
    assert (
        SamplingDefaults.from_checkpoint(load_checkpoint(str(qwen3)), engine_context=64).context_length == 64
    )
    assert context_length({"text_config": {"max_position_embeddings": 128}}) == 128


def test_seeded_choices_differ_and_stay_reproducible() -> None:
    params = SamplingParams(max_tokens=5, seed=7)
    assert [SamplingDefaults.for_choice(params, i).seed for i in range(3)] == [7, 8, 9]
    unseeded = SamplingParams(max_tokens=5)
    assert SamplingDefaults.for_choice(unseeded, 2) is unseeded

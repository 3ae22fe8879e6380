"""How the worker prepares a request before the engine sees it: ids, forced tool-call prefix, reasoning mode,
sampling defaults and token budget. Real Qwen3 tokenizer and template; no engine is involved (none is
called by these steps), so the service is built without one.

Expected ids come from the `tokenizers` library reading the checkpoint's tokenizer.json directly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.server.errors import APIError
from tokenfront.server.metrics import ServerMetrics
from tokenfront.worker.service import NAMED_TOOL_WITH_IDS, WorkerMetrics, WorkerService

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
NAMED = {
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
    "tools": [TOOL],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
}
GENERATION_CONFIG = {
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "max_new_tokens": 100,
    "eos_token_id": [151643],
}


@pytest.fixture(scope="module")
def checkpoint_with_generation_config(qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3-generation") / "Qwen3-test"
    shutil.copytree(qwen3, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return folder


def _service(**options: Any) -> WorkerService:
    pipeline = RenderPipeline.load(RenderOptions(**options))
    return WorkerService(pipeline, None, WorkerMetrics(ServerMetrics(), None))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def hermes(checkpoint_with_generation_config: Path) -> WorkerService:
    return _service(model=str(checkpoint_with_generation_config), tool_call_parser="hermes")


@pytest.fixture(scope="module")
def laguna(qwen3: Path) -> WorkerService:
    return _service(model=str(qwen3), reasoning_parser="laguna")


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3: Path) -> Tokenizer:
    return Tokenizer.from_file(str(qwen3 / "tokenizer.json"))


# --- named tool_choice -------------------------------------------------------------------------------------


def test_forced_prefix_is_encoded_with_the_rendered_text(
    hermes: WorkerService, hf_tokenizer: Tokenizer
) -> None:
    request = ChatCompletionRequest(**NAMED)
    parser = hermes.pipeline.tool_call_parser
    assert parser is not None
    prefix = parser.forced_call_prefix("get_weather")
    assert prefix == '<tool_call>\n{"name": "get_weather", "arguments": '
    plain = hermes.pipeline.render_chat(request)
    prompt = hermes._chat_prompt(request, forced_prefix=prefix)
    assert prompt.text == (plain.prompt_text or "") + prefix
    assert prompt.token_ids == hf_tokenizer.encode(prompt.text, add_special_tokens=False).ids
    assert prompt.token_ids[: len(plain.token_ids)] == plain.token_ids
    assert prompt.usage_tokens == len(prompt.token_ids)
    assert prompt.source == "rendered"


def test_forced_tool_errors(hermes: WorkerService, laguna: WorkerService) -> None:
    parser = hermes.pipeline.tool_call_parser
    with pytest.raises(APIError) as error:
        hermes._forced_tool(ChatCompletionRequest(**NAMED, prompt_token_ids=[1, 2]), parser)
    assert error.value.message == NAMED_TOOL_WITH_IDS
    with pytest.raises(APIError, match="--tool-call-parser"):
        laguna._forced_tool(ChatCompletionRequest(**NAMED), None)
    other = {**NAMED, "tool_choice": {"type": "function", "function": {"name": "other"}}}
    with pytest.raises(APIError, match="not among the request's tools"):
        hermes._forced_tool(ChatCompletionRequest(**other), parser)
    assert hermes._forced_tool(ChatCompletionRequest(**{**NAMED, "tool_choice": "auto"}), parser) is None


# --- reasoning mode from the prompt ------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "ended"), [({"enable_thinking": False}, True), (None, None)])
def test_prompt_mode_is_read_from_rendered_text_and_from_given_ids(
    laguna: WorkerService, kwargs: dict[str, Any] | None, ended: bool | None
) -> None:
    request = ChatCompletionRequest(messages=NAMED["messages"], chat_template_kwargs=kwargs)
    rendered = laguna._chat_prompt(request, forced_prefix=None)
    assert rendered.reasoning_ended is ended
    given = laguna._chat_prompt(
        ChatCompletionRequest(messages=NAMED["messages"], prompt_token_ids=rendered.token_ids),
        forced_prefix=None,
    )
    # The ids carry no text: the worker decodes their tail and reads the same mode.
    assert given.reasoning_ended is ended
    assert given.token_ids == rendered.token_ids


# --- sampling and budget -----------------------------------------------------------------------------------


def test_sampling_defaults_come_from_generation_config(hermes: WorkerService) -> None:
    params = hermes._sampling(ChatCompletionRequest(**NAMED), 50, None, None)
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.95, 20)
    assert params.max_tokens == 100  # generation_config's max_new_tokens, below the context room
    # EOS ids: generation_config's and the tokenizer's (<|im_end|>), always stop ids.
    assert {151643, 151645} <= params.stop_token_ids
    request = ChatCompletionRequest(**NAMED, temperature=0, top_p=0.5, top_k=0, seed=3, stop_token_ids=[7])
    params = hermes._sampling(request, 50, 10, 2)
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.0, 0.5, -1, 3)
    assert params.max_tokens == 10
    assert params.logprobs == 2
    assert 7 in params.stop_token_ids


def test_token_budget_is_the_context_room(hermes: WorkerService, laguna: WorkerService) -> None:
    assert hermes.context_length == 4096
    assert hermes._max_tokens(4090, None) == 6  # less room than max_new_tokens
    assert hermes._max_tokens(4000, 96) == 96
    with pytest.raises(APIError, match="at most 96 tokens"):
        hermes._max_tokens(4000, 97)
    with pytest.raises(APIError, match="no room to generate"):
        hermes._max_tokens(4096, None)
    # The fixture config has no context length and no max_new_tokens: a budget is required.
    assert laguna.context_length is None
    assert laguna._max_tokens(10, 5) == 5
    with pytest.raises(APIError, match="send max_tokens"):
        laguna._max_tokens(10, None)


def test_id_prompts_are_validated(hermes: WorkerService) -> None:
    with pytest.raises(Exception, match="not a token id"):
        hermes._chat_prompt(
            ChatCompletionRequest(messages=NAMED["messages"], prompt_token_ids=[1, 151669]),
            forced_prefix=None,
        )
    with pytest.raises(APIError, match="empty"):
        hermes._chat_prompt(
            ChatCompletionRequest(messages=NAMED["messages"], prompt_token_ids=[]), forced_prefix=None
        )
    items = hermes.pipeline.render_completion(CompletionRequest(prompt=[[1, 2, 3]]))
    assert items[0].token_ids == [1, 2, 3]

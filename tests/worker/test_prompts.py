"""How the worker prepares a request's prompt before the engine sees it (worker/prompts.py): ids, the forced
tool-call prefix rendered by the pipeline, the reasoning mode, usage. Real Qwen3 tokenizer and template; no
engine is involved (none is called by these steps), so the service is built without one.

Expected ids come from the `tokenizers` library reading the checkpoint's tokenizer.json directly.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tokenfront.core.errors import RenderError
from tokenfront.core.families import GENERIC
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest
from tokenfront.server.errors import APIError
from tokenfront.server.metrics import ServerMetrics
from tokenfront.worker.metrics import WorkerMetrics
from tokenfront.worker.prompts import NAMED_TOOL_WITH_IDS, PromptBuilder, usage_prompt_tokens
from tokenfront.worker.service import WorkerService

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
HERMES_PREFIX = '<tool_call>\n{"name": "get_weather", "arguments": '


def _prompts(**options: Any) -> PromptBuilder:
    return PromptBuilder(RenderPipeline.load(RenderOptions(**options)), WorkerMetrics(ServerMetrics(), None))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def hermes(qwen3: Path) -> PromptBuilder:
    return _prompts(model=str(qwen3), tool_call_parser="hermes")


@pytest.fixture(scope="module")
def laguna(qwen3: Path) -> PromptBuilder:
    return _prompts(model=str(qwen3), reasoning_parser="laguna")


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3: Path) -> Tokenizer:
    return Tokenizer.from_file(str(qwen3 / "tokenizer.json"))


# --- named tool_choice: the pipeline renders the forced prefix ----------------------------------------------


def test_forced_prefix_is_rendered_into_the_prompt_text(
    hermes: PromptBuilder, hf_tokenizer: Tokenizer
) -> None:
    request = ChatCompletionRequest(**NAMED)
    assert hermes.pipeline.tool_call_parser is not None
    assert hermes.pipeline.tool_call_parser.forced_call_prefix("get_weather") == HERMES_PREFIX
    plain = hermes.pipeline.render_chat(request)
    forced = hermes.pipeline.render_chat(request, forced_tool="get_weather")
    assert forced.prompt_text == (plain.prompt_text or "") + HERMES_PREFIX
    # The whole text is encoded at once, as the template would have it had it written the prefix.
    assert forced.token_ids == hf_tokenizer.encode(forced.prompt_text, add_special_tokens=False).ids
    assert forced.token_ids[: len(plain.token_ids)] == plain.token_ids
    # The worker's own copy of the ids is a tuple (a prompt in flight is no list for the garbage collector).
    prompt = hermes.chat(request, forced_tool=hermes.forced_tool(request))
    assert (prompt.text, prompt.token_ids) == (forced.prompt_text, tuple(forced.token_ids))
    assert prompt.usage_tokens == len(prompt.token_ids)
    assert prompt.source == "rendered"


def test_without_a_named_tool_choice_nothing_is_appended(hermes: PromptBuilder) -> None:
    request = ChatCompletionRequest(**{**NAMED, "tool_choice": "auto"})
    assert hermes.forced_tool(request) is None
    assert hermes.chat(request).token_ids == tuple(hermes.pipeline.render_chat(request).token_ids)
    # What the render routes answer for a named tool_choice (no forced_tool): the prompt without the prefix,
    # as vLLM's render answers, which forces the call by constraining the output.
    named = hermes.pipeline.render_chat(ChatCompletionRequest(**NAMED))
    assert named.token_ids == hermes.pipeline.render_chat(request).token_ids
    assert not (named.prompt_text or "").endswith(HERMES_PREFIX)


@pytest.fixture(scope="module")
def short_context(qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> PromptBuilder:
    """Qwen3 whose tokenizer says its maximum length is 24 tokens (what `truncate_prompt_tokens: -1` keeps)."""
    folder = tmp_path_factory.mktemp("qwen3-short") / "Qwen3-short"
    shutil.copytree(qwen3, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 24}))
    return _prompts(model=str(folder), tool_call_parser="hermes")


@pytest.mark.parametrize("keep", [-1, 10])
def test_truncation_keeps_the_end_of_the_prompt_with_its_prefix(
    short_context: PromptBuilder, hf_tokenizer: Tokenizer, keep: int
) -> None:
    whole = short_context.pipeline.render_chat(ChatCompletionRequest(**NAMED), forced_tool="get_weather")
    assert len(whole.token_ids) > 24
    request = ChatCompletionRequest(**NAMED, truncate_prompt_tokens=keep)
    prompt = short_context.chat(request, forced_tool="get_weather")
    kept = 24 if keep == -1 else keep
    assert prompt.token_ids == tuple(whole.token_ids[-kept:])
    # The prefix is the prompt's end: the model's continuation is still the arguments.
    assert (prompt.text or "").endswith(HERMES_PREFIX)
    if keep == -1:
        assert hf_tokenizer.decode(prompt.token_ids, skip_special_tokens=False).endswith(HERMES_PREFIX)


def test_forced_tool_errors(hermes: PromptBuilder, laguna: PromptBuilder) -> None:
    with pytest.raises(APIError) as error:
        hermes.forced_tool(ChatCompletionRequest(**NAMED, prompt_token_ids=[1, 2]))
    assert error.value.message == NAMED_TOOL_WITH_IDS
    with pytest.raises(APIError, match="--tool-call-parser"):
        laguna.forced_tool(ChatCompletionRequest(**NAMED))
    other = {**NAMED, "tool_choice": {"type": "function", "function": {"name": "other"}}}
    # Refused by the request model or, failing that, by the worker.
    with pytest.raises((APIError, RenderError), match="not among the request's tools"):
        hermes.forced_tool(ChatCompletionRequest(**other))
    assert hermes.forced_tool(ChatCompletionRequest(**{**NAMED, "tool_choice": "auto"})) is None


def test_the_pipeline_refuses_a_forced_tool_without_a_parser(laguna: PromptBuilder) -> None:
    with pytest.raises(Exception, match="--tool-call-parser"):
        laguna.pipeline.render_chat(ChatCompletionRequest(**NAMED), forced_tool="get_weather")


# --- chat formats (Harmony, mistral-common): the prefix's ids follow the format's own ---------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}
NAMED_WEATHER = {
    "messages": [{"role": "user", "content": "Weather in Tokyo?"}],
    "tools": [WEATHER],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
}


@pytest.mark.parametrize(
    ("name", "options", "prefix_pieces"),
    [
        (
            "tiny-gptoss",
            {"reasoning_parser": "openai_gptoss", "tool_call_parser": "openai"},
            ["<|channel|>"],
        ),
        (
            "tiny-mistral",
            {"tokenizer_mode": "mistral", "tool_call_parser": "mistral"},
            ["[TOOL_CALLS]", "get"],
        ),
    ],
)
def test_chat_format_prompts_get_the_prefix_ids_after_their_own(
    checkpoint: Callable[[str], Path], name: str, options: dict[str, Any], prefix_pieces: list[str]
) -> None:
    pipeline = RenderPipeline.load(RenderOptions(model=str(checkpoint(name)), **options))
    request = ChatCompletionRequest(**NAMED_WEATHER)
    plain = pipeline.render_chat(request)
    forced = pipeline.render_chat(request, forced_tool="get_weather")
    assert pipeline.tool_call_parser is not None
    prefix = pipeline.tool_call_parser.forced_call_prefix("get_weather")
    assert forced.prompt_text == (plain.prompt_text or "") + prefix
    assert forced.token_ids[: len(plain.token_ids)] == plain.token_ids
    added = forced.token_ids[len(plain.token_ids) :]
    # The prefix's control tokens are single special tokens, even where the tokenizer splits them out of
    # text (mistral-common never reads [TOOL_CALLS] out of text).
    pieces = [pipeline.tokenizer.decode([i], skip_special_tokens=False) for i in added]
    assert pieces[: len(prefix_pieces)] == prefix_pieces
    assert "".join(pieces) == prefix
    assert "<|constrain|>" not in prefix or "<|constrain|>" in pieces


# --- reasoning mode from the prompt ------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "ended"), [({"enable_thinking": False}, True), (None, None)])
def test_prompt_mode_is_read_from_rendered_text_and_from_given_ids(
    laguna: PromptBuilder, kwargs: dict[str, Any] | None, ended: bool | None
) -> None:
    request = ChatCompletionRequest(messages=NAMED["messages"], chat_template_kwargs=kwargs)
    rendered = laguna.chat(request)
    assert rendered.reasoning_ended is ended
    given = laguna.chat(
        ChatCompletionRequest(messages=NAMED["messages"], prompt_token_ids=list(rendered.token_ids))
    )
    # The ids carry no text: the worker decodes their tail and reads the same mode.
    assert given.reasoning_ended is ended
    assert given.token_ids == rendered.token_ids


# --- id prompts, usage -------------------------------------------------------------------------------------


def test_id_prompts_are_validated(hermes: PromptBuilder) -> None:
    with pytest.raises(Exception, match="not a token id"):
        hermes.chat(ChatCompletionRequest(messages=NAMED["messages"], prompt_token_ids=[1, 151669]))
    with pytest.raises(APIError, match="empty"):
        hermes.chat(ChatCompletionRequest(messages=NAMED["messages"], prompt_token_ids=[]))
    [item] = hermes.completion(CompletionRequest(prompt=[[1, 2, 3]]))
    assert item.token_ids == (1, 2, 3)
    assert item.source == "token_ids"
    assert item.text is None  # not decoded: nothing reads it
    [echoed] = hermes.completion(CompletionRequest(prompt=[[1, 2, 3]], echo=True))
    assert echoed.text == hermes.pipeline.tokenizer.decode([1, 2, 3], skip_special_tokens=True)


def test_prompts_are_counted_by_source(hermes: PromptBuilder) -> None:
    before = hermes.metrics.prompts.labels("completion", "rendered")._value.get()
    hermes.completion(CompletionRequest(prompt=["Hi", "there"]))
    assert hermes.metrics.prompts.labels("completion", "rendered")._value.get() == before + 2


def test_generic_family_counts_every_prompt_token() -> None:
    assert usage_prompt_tokens(GENERIC, "anything", [1, 2, 3], lambda ids: "") == 3


def test_the_service_prepares_prompts_with_its_builder(qwen3: Path) -> None:
    pipeline = RenderPipeline.load(RenderOptions(model=str(qwen3), tool_call_parser="hermes"))
    service = WorkerService(pipeline, None, WorkerMetrics(ServerMetrics(), None))  # type: ignore[arg-type]
    assert service.prompts.pipeline is pipeline
    prompt = service.prompts.chat(ChatCompletionRequest(**NAMED), forced_tool="get_weather")
    assert (prompt.text or "").endswith(HERMES_PREFIX)

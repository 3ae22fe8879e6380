"""Model families (docs/contract.md §9): Kimi K3's usage exclusion, with its real chat template.

The checkpoint is a copy of the Qwen3 tokenizer folder whose config says `model_type: kimi_k3`, rendered with
llama.cpp's real Kimi-K3.jinja through `--chat-template` (the same `RenderPipeline.load` the worker uses).
The expected count comes from the `tokenizers` library's offsets on the rendered text: the tokens that lie
wholly inside the trailing channel opener.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tokenfront.core.families import GENERIC, family_for, kimi_k3
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest
from tokenfront.server.metrics import ServerMetrics
from tokenfront.worker.metrics import WorkerMetrics
from tokenfront.worker.prompts import usage_prompt_tokens
from tokenfront.worker.service import WorkerService

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]}


@pytest.fixture(scope="module")
def kimi_checkpoint(qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kimi-k3") / "Kimi-K3-test"
    shutil.copytree(qwen3, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "kimi_k3"}))
    return folder


@pytest.fixture(scope="module")
def pipeline(kimi_checkpoint: Path, llama_cpp_templates: Path) -> RenderPipeline:
    template = llama_cpp_templates / "Kimi-K3.jinja"
    return RenderPipeline.load(RenderOptions(model=str(kimi_checkpoint), chat_template=str(template)))


@pytest.fixture(scope="module")
def offsets_tokenizer(kimi_checkpoint: Path) -> Tokenizer:
    return Tokenizer.from_file(str(kimi_checkpoint / "tokenizer.json"))


def _decode(pipeline: RenderPipeline) -> Callable[[Any], str]:
    return lambda ids: pipeline.tokenizer.decode(list(ids), skip_special_tokens=False)


def _tokens_inside_tail(tokenizer: Tokenizer, text: str, tail: str) -> int:
    """How many tokens of `text` start at or after where `tail` begins (independent of tokenfront)."""
    encoding = tokenizer.encode(text, add_special_tokens=False)
    start = len(text) - len(tail)
    return sum(1 for begin, _ in encoding.offsets if begin >= start)


def test_registry() -> None:
    assert family_for("kimi_k3").never_forward_ids
    assert family_for("kimi_k3").name == "kimi_k3"
    assert family_for("llama") is GENERIC
    assert family_for(None) is GENERIC
    assert not GENERIC.never_forward_ids


@pytest.mark.parametrize(
    ("kwargs", "opener"),
    [({}, "<|open|>think<|sep|>"), ({"thinking": False}, "<|open|>response<|sep|>")],
)
def test_kimi_k3_excludes_the_generation_channel_opener(
    pipeline: RenderPipeline, offsets_tokenizer: Tokenizer, kwargs: dict[str, Any], opener: str
) -> None:
    assert pipeline.checkpoint.model_type == "kimi_k3"
    rendered = pipeline.render_chat(ChatCompletionRequest(**CHAT, chat_template_kwargs=kwargs or None))
    text = rendered.prompt_text
    assert text is not None
    assert text.endswith('<|open|>message role="assistant"<|sep|>' + opener)
    expected = _tokens_inside_tail(offsets_tokenizer, text, opener)
    # Qwen3's tokenizer spells the markers out in pieces: several tokens, none shared with the text before.
    assert expected >= 5
    family = family_for(pipeline.checkpoint.model_type)
    excluded = family.usage_excluded_prompt_tokens(text, rendered.token_ids, _decode(pipeline))
    assert excluded == expected
    assert usage_prompt_tokens(family, text, rendered.token_ids, _decode(pipeline)) == (
        len(rendered.token_ids) - expected
    )


def test_kimi_k3_without_generation_prompt_excludes_nothing(pipeline: RenderPipeline) -> None:
    request = ChatCompletionRequest(
        messages=[*CHAT["messages"], {"role": "assistant", "content": "Hello."}], add_generation_prompt=False
    )
    rendered = pipeline.render_chat(request)
    assert kimi_k3.generation_channel_opener(rendered.prompt_text or "") is None
    assert (
        family_for("kimi_k3").usage_excluded_prompt_tokens(
            rendered.prompt_text or "", rendered.token_ids, _decode(pipeline)
        )
        == 0
    )


def test_kimi_k3_with_single_token_markers() -> None:
    # With Kimi's own tokenizer the markers are special tokens: the opener is exactly three tokens.
    pieces = {7: "<|open|>", 8: "think", 9: "<|sep|>", 5: "Hi", 6: '<|open|>message role="assistant"<|sep|>'}
    ids = [5, 6, 7, 8, 9]
    text = "".join(pieces[i] for i in ids)
    excluded = kimi_k3.usage_excluded_prompt_tokens(text, ids, lambda part: "".join(pieces[i] for i in part))
    assert excluded == 3


def test_worker_applies_the_exclusion_when_it_renders(pipeline: RenderPipeline) -> None:
    """The worker's own prompt preparation (no generation: the engine is never called here)."""
    service = WorkerService(pipeline, None, WorkerMetrics(ServerMetrics(), None))  # type: ignore[arg-type]
    rendered = service.prompts.chat(ChatCompletionRequest(**CHAT))
    opener = kimi_k3.generation_channel_opener(rendered.text or "")
    assert opener == "<|open|>think<|sep|>"
    excluded = kimi_k3.usage_excluded_prompt_tokens(
        rendered.text or "", rendered.token_ids, _decode(pipeline)
    )
    assert excluded > 0
    assert rendered.usage_tokens == len(rendered.token_ids) - excluded
    # Ids sent as prompt_token_ids are counted as they are: only a prompt the worker rendered is trimmed.
    given = service.prompts.chat(ChatCompletionRequest(**CHAT, prompt_token_ids=list(rendered.token_ids)))
    assert given.usage_tokens == len(rendered.token_ids)
    assert given.source == "token_ids"

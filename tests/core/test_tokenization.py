"""Tokenizer backends: fastokens, tokenizers and transformers give the same ids (the contract that lets
`auto` pick the fastest), on every fixture checkpoint, over rendered corpus prompts and raw edge cases."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from corpus import CHAT, COMPLETIONS
from transformers import AutoTokenizer

from tokenfront import RenderOptions, RenderPipeline
from tokenfront.core.tokenization import (
    FastokensBackend,
    RustTokenizersBackend,
    TransformersBackend,
    backend_for,
)
from tokenfront.protocol import ChatCompletionRequest

CHECKPOINTS = ["qwen3", "llama3", "llama3_1", "deepseek_v3", "gemma3", "gptoss"]

EDGE_TEXTS = [
    "",
    " ",
    "\n\n\n",
    "The capital of France is",
    "  two leading spaces and trailing  ",
    "<|im_start|>user\nspecial tokens inside text<|im_end|><|eot_id|><bos><think></think>",
    "émoji 🚀👩‍💻 中文 日本語 한국어 العربية עברית ﷽",
    "\u200b zero width \u00a0 nbsp \t tab \r\n crlf",
    "x" * 5000,
]


def _corpus_texts(folder: Path) -> list[str]:
    pipeline = RenderPipeline.load(RenderOptions(model=str(folder), tokenizer_backend="tokenizers"))
    texts = list(EDGE_TEXTS)
    for case in CHAT:
        try:
            rendered = pipeline.render_chat(ChatCompletionRequest.model_validate(case.body))
        except Exception:
            continue  # refused requests are covered by the parity test
        texts.append(rendered.prompt_text or "")
    for case in COMPLETIONS:
        prompt = case.body["prompt"]
        texts.extend(p for p in ([prompt] if isinstance(prompt, str) else prompt) if isinstance(p, str))
    return texts


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_backends_agree(name: str, checkpoint: Callable[[str], Path]) -> None:
    folder = checkpoint(name)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    backends = [FastokensBackend(tokenizer), RustTokenizersBackend(tokenizer), TransformersBackend(tokenizer)]
    texts = _corpus_texts(folder)
    assert len(texts) > 40
    for text in texts:
        for add_special in (False, True):
            expected = list(tokenizer(text, add_special_tokens=add_special)["input_ids"])
            for backend in backends:
                assert backend.encode(text, add_special_tokens=add_special) == expected, (
                    name,
                    backend.name,
                    add_special,
                    text[:80],
                )


def test_auto_prefers_fastokens_and_honours_a_choice(qwen3: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    assert backend_for(tokenizer).name == "fastokens"
    assert backend_for(tokenizer, "tokenizers").name == "tokenizers"
    assert backend_for(tokenizer, "transformers").name == "transformers"


def test_split_special_tokens_is_honoured(qwen3: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3), split_special_tokens=True)
    text = "a<|im_end|>b"
    expected = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert 151645 not in expected  # <|im_end|> is split into ordinary pieces
    for backend in (FastokensBackend(tokenizer), RustTokenizersBackend(tokenizer)):
        assert backend.encode(text, add_special_tokens=False) == expected, backend.name

"""Tokenizer backends: fastokens, tokenizers and transformers give the same ids (the contract that lets
`auto` pick the fastest), on every fixture checkpoint, over rendered corpus prompts and raw edge cases; and the
background build servers use (the transformers tokenizer serves until fastokens is built and probed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from corpus import CHAT, COMPLETIONS
from transformers import AutoTokenizer

from tokenfront import RenderOptions, RenderPipeline
from tokenfront.core import tokenization
from tokenfront.core.segmented_encoder import SegmentedEncoder
from tokenfront.core.tokenization import (
    DeferredBackend,
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


def test_background_build_serves_the_same_ids_and_switches(qwen3: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    deferred = backend_for(tokenizer, background=True)
    assert isinstance(deferred, DeferredBackend) and deferred.name == "fastokens"
    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    expected = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    # Whatever encodes now (the transformers tokenizer, or fastokens once built), the ids are the reference's.
    assert deferred.encode(text, add_special_tokens=False) == expected
    assert deferred.wait(timeout=120)
    assert isinstance(deferred.current, FastokensBackend) and deferred.name == "fastokens"
    assert deferred.encode(text, add_special_tokens=False) == expected
    assert deferred.segment_cache_stats() is not None  # other attributes are the current backend's
    # Built like any backend from a tokenizer (as `type(backend)(tokenizer)` does): ready on return.
    direct = DeferredBackend(tokenizer)
    assert isinstance(direct.current, FastokensBackend) and direct.wait(timeout=0)


def test_background_build_falls_back_when_fastokens_disagrees(
    qwen3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    monkeypatch.setattr(tokenization, "first_disagreement", lambda *args: "ids differ (simulated)")
    deferred = backend_for(tokenizer, background=True)
    assert deferred.wait(timeout=120)  # type: ignore[attr-defined]
    assert deferred.name == "tokenizers"
    assert isinstance(deferred.current, SegmentedEncoder)  # type: ignore[attr-defined]
    text = "a<|im_end|>b " * 100
    assert deferred.encode(text, add_special_tokens=True) == list(tokenizer(text)["input_ids"])


def test_background_build_failure_keeps_the_reference(qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated")

    monkeypatch.setattr(tokenization, "rust_backend", broken)
    deferred = backend_for(tokenizer, background=True)
    assert deferred.wait(timeout=120)  # type: ignore[attr-defined]
    assert deferred.name == "transformers"
    assert isinstance(deferred.current, TransformersBackend)  # type: ignore[attr-defined]
    assert deferred.encode("x<|im_end|>", add_special_tokens=False) == [87, 151645]

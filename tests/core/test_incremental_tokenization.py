"""Incremental tokenization (`SegmentedEncoder`): cutting a prompt at added tokens and reusing the ids of the
pieces gives exactly the ids of encoding it whole, on every fixture tokenizer, cold and warm, with a cache so
small that it evicts all the time, and for tokenizers whose added tokens absorb whitespace or whose
pre-tokenizer depends on position.

Texts are random (seeded) growing conversations rendered with each checkpoint's own chat template (special-token
strings, whitespace around them, unicode and empty messages inside the content) and raw strings of added tokens,
words and whitespace. Every text is compared for both add_special_tokens values against the plain backend and
against transformers' `tokenizer(text, add_special_tokens=...)`.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tokenfront import RenderOptions, RenderPipeline
from tokenfront.core.errors import RenderError
from tokenfront.core.segmented_encoder import SegmentedEncoder, segment_plan
from tokenfront.core.tokenization import (
    FastokensBackend,
    RustTokenizersBackend,
    TokenizerBackend,
    backend_for,
)
from tokenfront.protocol import ChatCompletionRequest

CHECKPOINTS = ["qwen3", "llama3", "llama3_1", "deepseek_v3", "gemma3", "gptoss", "smollm2", "tiny-random"]
TINY_CACHE_BYTES = 4096  # a few segments: every conversation evicts

WORDS = [
    "the", "capital", "of", "France", "is", "Paris", "don't", "I'm", "WE'VE", "x", "42", "3.14159", "1234567",
    "def", "f(x):", "return", "{", "}", "[1,", "2]", "#", "**", "snake_case", "CamelCase", "http://a.b/c?d=e",
    "naïve", "café", "Ünïcödé",
]  # fmt: skip
UNICODE = [
    "数字", "東京タワー", "한국어", "עברית", "مرحبا", "🚀", "🔥", "👩‍💻", "e\u0301", "\u200b", "\u00a0", "﷽",
    "ｆｕｌｌｗｉｄｔｈ", "Ⓐ", "\u2028", "ß", "ﬁ",
]  # fmt: skip
SPACES = [" ", "  ", "\n", "\n\n", "\n\n\n", "\t", " \t ", "\r\n", "   \n  ", "\u3000"]


def _added_tokens(tokenizer: Any) -> list[str]:
    return sorted({token.content for token in tokenizer._tokenizer.get_added_tokens_decoder().values()})


def _pieces(rng: random.Random, tokens: list[str], count: int) -> Iterator[str]:
    for _ in range(count):
        roll = rng.random()
        if roll < 0.40:
            yield rng.choice(WORDS)
        elif roll < 0.55:
            yield rng.choice(UNICODE)
        elif roll < 0.75:
            yield rng.choice(SPACES)
        else:
            yield rng.choice(tokens)  # special-token strings inside the text


def _content(rng: random.Random, tokens: list[str]) -> str:
    if rng.random() < 0.1:
        return ""
    joiner = rng.choice(["", " ", " ", "\n"])
    return joiner.join(_pieces(rng, tokens, rng.randint(1, 14)))


def _raw_text(rng: random.Random, tokens: list[str]) -> str:
    """Added tokens back to back, at the ends, and touching words and whitespace."""
    return "".join(_pieces(rng, tokens, rng.randint(0, 40)))


def _conversation_texts(
    pipeline: RenderPipeline, rng: random.Random, tokens: list[str], conversations: int
) -> Iterator[str]:
    """Each conversation grows turn by turn; every step is rendered with the checkpoint's template."""
    for _ in range(conversations):
        messages: list[dict[str, Any]] = []
        if rng.random() < 0.6:
            messages.append({"role": "system", "content": _content(rng, tokens)})
        for _turn in range(rng.randint(2, 6)):
            messages.append({"role": "user", "content": _content(rng, tokens)})
            yield from _render(pipeline, messages, add_generation_prompt=True)
            messages.append({"role": "assistant", "content": _content(rng, tokens)})
            yield from _render(pipeline, messages, add_generation_prompt=False)


def _render(
    pipeline: RenderPipeline, messages: list[dict[str, Any]], *, add_generation_prompt: bool
) -> Iterator[str]:
    body = {"messages": list(messages), "add_generation_prompt": add_generation_prompt}
    try:
        rendered = pipeline.render_chat(ChatCompletionRequest.model_validate(body))
    except RenderError:  # a template that refuses this shape of conversation
        return
    assert rendered.prompt_text is not None
    yield rendered.prompt_text


def _transformers_ids(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _compare(
    tokenizer: Any, texts: list[str], plain: TokenizerBackend, encoders: dict[str, SegmentedEncoder]
) -> tuple[int, int]:
    """Every text, both add_special_tokens values, every encoder: the ids of transformers. Returns the number of
    comparisons and of texts that were actually cut into two or more segments."""
    compared = cut = 0
    cold = encoders.pop("cold")
    for text in texts:
        for add_special in (False, True):
            expected = _transformers_ids(tokenizer, text, add_special)
            context = (add_special, text)
            assert plain.encode(text, add_special_tokens=add_special) == expected, ("plain", context)
            cold.clear()
            assert cold.encode(text, add_special_tokens=add_special) == expected, ("cold", context)
            if not add_special:
                cut += cold.misses >= 2  # cold: each segment of this text was a miss
            for label, encoder in encoders.items():
                assert encoder.encode(text, add_special_tokens=add_special) == expected, (label, context)
            compared += 1
    return compared, cut


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_incremental_ids_equal_whole_text_ids(name: str, checkpoint: Callable[[str], Path]) -> None:
    pipeline = RenderPipeline.load(RenderOptions(model=str(checkpoint(name)), tokenizer_backend="tokenizers"))
    tokenizer = pipeline.tokenizer
    plan = segment_plan(tokenizer)
    assert plan.enabled, (name, plan.notes)
    tokens = _added_tokens(tokenizer)
    # Some added tokens of every kind, and always the ones the templates use.
    rng = random.Random(f"incremental-{name}")
    chosen = sorted({*tokenizer.all_special_tokens, *rng.sample(tokens, min(len(tokens), 24))})
    texts = list(_conversation_texts(pipeline, rng, chosen, conversations=12))
    rendered = len(texts)
    texts += [_raw_text(rng, chosen) for _ in range(60)]

    plain = RustTokenizersBackend(tokenizer)
    encoders = {
        "cold": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0),
        "warm": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0),
        "tiny": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0, cache_bytes=TINY_CACHE_BYTES),
        "warm-fastokens": SegmentedEncoder(
            FastokensBackend(tokenizer, segment_cache_bytes=0), tokenizer, plan=plan, min_chars=0
        ),
    }
    warm, tiny = encoders["warm"], encoders["tiny"]
    compared, cut = _compare(tokenizer, texts, plain, dict(encoders))

    assert rendered >= 60, (name, rendered)  # the template rendered most of the growing conversations
    assert compared == 2 * len(texts) >= 2 * (60 + 60)
    assert cut >= rendered, (name, cut)  # every rendered conversation has cut points; so do most raw texts
    assert warm.cache_info()["hits"] > warm.cache_info()["misses"]  # the growing history was reused
    info = tiny.cache_info()
    assert info["evictions"] > 100 and info["bytes"] <= TINY_CACHE_BYTES, info


# -- tokenizers whose added tokens or pre-tokenizer make cutting unsafe in places ----------------------------


def _edit_json(path: Path, edit: Callable[[Any], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _qwen3_with_flags(source: Path, target: Path, flags: dict[str, dict[str, bool]]) -> Any:
    """A copy of the qwen3 checkpoint whose added tokens have other flags, in tokenizer.json and in
    tokenizer_config.json. Loaded as `TokenizersBackend`, which runs tokenizer.json as it is (`Qwen2Tokenizer`
    rebuilds the tokenizer and adds the special tokens back with default flags)."""
    shutil.copytree(source, target)

    def tokenizer_json(spec: Any) -> None:
        for token in spec["added_tokens"]:
            token.update(flags.get(token["content"], {}))

    def tokenizer_config(config: Any) -> None:
        config["tokenizer_class"] = "TokenizersBackend"
        for token in config["added_tokens_decoder"].values():
            token.update(flags.get(token["content"], {}))

    _edit_json(target / "tokenizer.json", tokenizer_json)
    _edit_json(target / "tokenizer_config.json", tokenizer_config)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    loaded = {t.content: t for t in tokenizer._tokenizer.get_added_tokens_decoder().values()}
    for content, changed in flags.items():
        for flag, value in changed.items():
            assert getattr(loaded[content], flag) == value, (content, flag)  # the edit took effect
    return tokenizer


FLAG_VARIANTS = {
    # <|im_end|> swallows the newline after it, <|im_start|> the whitespace before it.
    "rstrip_lstrip": {"<|im_end|>": {"rstrip": True}, "<|im_start|>": {"lstrip": True}},
    "single_word": {"<think>": {"single_word": True}, "<tool_call>": {"single_word": True}},
    "normalized": {"<|im_end|>": {"normalized": True}, "<|endoftext|>": {"normalized": True}},
    "everything": {
        "<|im_end|>": {"rstrip": True},
        "<|im_start|>": {"lstrip": True, "rstrip": True},
        "<think>": {"single_word": True},
        "</think>": {"normalized": True},
    },
}


@pytest.mark.parametrize("variant", sorted(FLAG_VARIANTS))
def test_added_token_flags_are_respected(variant: str, qwen3: Path, tmp_path: Path) -> None:
    flags = FLAG_VARIANTS[variant]
    tokenizer = _qwen3_with_flags(qwen3, tmp_path / "qwen3", flags)
    plan = segment_plan(tokenizer)
    for content, changed in flags.items():
        if any(changed.values()):  # a token whose span depends on its neighbours is never a cut point
            assert content not in plan.cut_tokens, (content, plan.notes)
    assert plan.enabled  # the other added tokens still are

    if variant == "rstrip_lstrip":  # the edit changes ids, so this test can tell
        original = AutoTokenizer.from_pretrained(str(qwen3))
        text = "a <|im_start|>user\nhi<|im_end|>\n\nb"
        assert _transformers_ids(tokenizer, text, False) != _transformers_ids(original, text, False)

    pipeline = RenderPipeline.load(
        RenderOptions(model=str(tmp_path / "qwen3"), tokenizer_backend="tokenizers")
    )
    rng = random.Random(f"flags-{variant}")
    # The flagged tokens, and others that stay cut points next to them.
    tokens = sorted(
        {*flags, "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"}
        | {"<|endoftext|>", "<|box_start|>", "<tool_response>"}
    )
    texts = list(_conversation_texts(pipeline, rng, tokens, conversations=6))
    texts += [_raw_text(rng, tokens) for _ in range(80)]
    plain = RustTokenizersBackend(tokenizer)
    encoders = {
        "cold": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0),
        "warm": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0),
        "tiny": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0, cache_bytes=TINY_CACHE_BYTES),
    }
    compared, cut = _compare(tokenizer, texts, plain, dict(encoders))
    assert compared == 2 * len(texts) >= 2 * 110
    assert cut >= 60, cut


def test_split_special_tokens_are_not_cut_points(qwen3: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3), split_special_tokens=True)
    plan = segment_plan(tokenizer)
    special = set(tokenizer.all_special_tokens)
    assert not special & set(plan.cut_tokens)
    assert "<think>" in plan.cut_tokens  # not special: still an added token that splits
    rng = random.Random("split-special")
    tokens = sorted({*special, "<think>", "</think>", "<tool_call>"})
    texts = [_raw_text(rng, tokens) for _ in range(120)]
    plain = RustTokenizersBackend(tokenizer)
    encoders = {"cold": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0)}
    encoders["warm"] = SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0)
    compared, cut = _compare(tokenizer, texts, plain, encoders)
    assert compared == 240 and cut >= 40


def _metaspace_first_tokenizer(prepend_scheme: str) -> Any:
    """A small BPE whose Metaspace pre-tokenizer adds "▁" only to the piece at the start of the input
    (prepend_scheme "first"): the ids of a piece depend on where it is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rust = Tokenizer(models.BPE(unk_token="<unk>"))
    rust.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend_scheme)
    rust.decoder = decoders.Metaspace(prepend_scheme=prepend_scheme)
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 4
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "<|turn|>"])
    rust.train_from_iterator(corpus, trainer=trainer)
    rust.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        special_tokens=[("<s>", rust.token_to_id("<s>")), ("</s>", rust.token_to_id("</s>"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=rust,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|turn|>"],
    )


@pytest.mark.parametrize("prepend_scheme", ["first", "always"])
def test_position_dependent_pre_tokenizer(prepend_scheme: str) -> None:
    tokenizer = _metaspace_first_tokenizer(prepend_scheme)
    plan = segment_plan(tokenizer)
    assert "<|turn|>" in plan.cut_tokens and plan.wrap is not None and plan.wrap[0] and plan.wrap[1]
    plain = RustTokenizersBackend(tokenizer)
    if prepend_scheme == "first":
        # Encoding the text after a token on its own (without the token) would be wrong here: "▁" is added
        # only at the start of the input. The encoder keeps the token at the head of its segment instead.
        alone = plain.encode("the capital", add_special_tokens=False)
        after = plain.encode("<|turn|>the capital", add_special_tokens=False)[1:]
        assert alone != after
    rng = random.Random(f"metaspace-{prepend_scheme}")
    tokens = ["<|turn|>", "<s>", "</s>"]
    texts = [_raw_text(rng, tokens) for _ in range(150)]
    encoders = {
        "cold": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0),
        "warm": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0),
        "tiny": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0, cache_bytes=1024),
    }
    compared, cut = _compare(tokenizer, texts, plain, encoders)
    assert compared == 300 and cut >= 60


def test_backend_for_layers_tokenizers_only(qwen3: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    layered = backend_for(tokenizer, "tokenizers")
    assert isinstance(layered, SegmentedEncoder) and layered.name == "tokenizers"
    assert layered.min_chars > 0  # short prompts are cheaper to encode whole
    # fastokens caches the same segments itself, faster: not layered.
    assert isinstance(backend_for(tokenizer), FastokensBackend)
    assert not isinstance(backend_for(tokenizer, "tokenizers", incremental_encoding=False), SegmentedEncoder)


def test_threads_share_one_encoder(qwen3: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    plain = RustTokenizersBackend(tokenizer)
    encoder = SegmentedEncoder(plain, tokenizer, min_chars=0, cache_bytes=16 * 1024)
    rng = random.Random("threads")
    tokens = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    texts = [_raw_text(rng, tokens) for _ in range(60)]
    expected = [plain.encode(text, add_special_tokens=False) for text in texts]
    failures: list[str] = []

    def work(offset: int) -> None:
        for round_ in range(5):
            for index in range(len(texts)):
                i = (index + offset + round_) % len(texts)
                if encoder.encode(texts[i], add_special_tokens=False) != expected[i]:
                    failures.append(texts[i])

    threads = [threading.Thread(target=work, args=(n * 7,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert encoder.cache_info()["evictions"] > 0


def test_overlapping_added_tokens_are_not_cut_points(qwen3: Path) -> None:
    # "x<|im" starts before <|im_end|> / <|im_start|> and overlaps them: in "x<|im_end|>" the scan matches
    # "x<|im", not <|im_end|>; "<|im_end|>!!" is longer than <|im_end|>. Cutting before either would be wrong.
    from tokenizers import AddedToken

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    tokenizer.add_tokens(
        [AddedToken("x<|im", normalized=False), AddedToken("<|im_end|>!!", normalized=False)]
    )
    plan = segment_plan(tokenizer)
    assert "<|im_end|>" not in plan.cut_tokens and "<|im_start|>" not in plan.cut_tokens
    assert "<|endoftext|>" in plan.cut_tokens and "<think>" in plan.cut_tokens
    rng = random.Random("overlap")
    tokens = ["x<|im", "<|im_end|>!!", "<|im_end|>", "<|im_start|>", "x", "!", "<|endoftext|>", "<think>"]
    texts = ["x<|im_end|>a<think>b", "<|im_end|>!!<think>", *(_raw_text(rng, tokens) for _ in range(150))]
    plain = RustTokenizersBackend(tokenizer)
    encoders = {"cold": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0)}
    encoders["warm"] = SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0)
    compared, cut = _compare(tokenizer, texts, plain, encoders)
    assert compared == 2 * len(texts) and cut >= 50


def test_clean_cut_tokens() -> None:
    from tokenfront.core.segmented_encoder import split_clean_tokens

    patterns = ["<a>", "<b>", "x<b", "<c>", "<c>>", "<d>", "<<", "e"]
    clean, unclean = split_clean_tokens(["<a>", "<b>", "<c>", "<d>", "<<", "e"], patterns)
    # <b> is straddled by x<b, <c> extended by <c>>, << overlaps itself ("<<<"), and any pattern
    # starting with "<" is overlapped by "<<"'s second character.
    assert clean == ["e"]
    assert unclean == ["<a>", "<b>", "<c>", "<d>", "<<"]
    clean, unclean = split_clean_tokens(["<a>", "<b>", "<c>"], ["<a>", "<b>", "x<b", "<c>", "<c>>"])
    assert clean == ["<a>"] and unclean == ["<b>", "<c>"]


def test_single_word_neighbours(qwen3: Path) -> None:
    # "foo" only counts as a word: in "foobar>" the scan drops it ("b" follows), but cut before "bar>" it
    # would stand alone. So with a single_word token around, no cut token may start with a word character.
    from tokenizers import AddedToken

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    tokenizer.add_tokens(
        [AddedToken("foo", single_word=True, normalized=False), AddedToken("bar>", normalized=False)]
    )
    plan = segment_plan(tokenizer)
    assert "bar>" not in plan.cut_tokens and "foo" not in plan.cut_tokens
    assert "<think>" in plan.cut_tokens
    rng = random.Random("single-word")
    tokens = ["foo", "bar>", "<think>", "<|im_end|>", "x", "_", " "]
    texts = ["foobar>", "foo bar>", "<think>foobar><think>", *(_raw_text(rng, tokens) for _ in range(150))]
    plain = RustTokenizersBackend(tokenizer)
    encoders = {"cold": SegmentedEncoder(plain, tokenizer, plan=plan, min_chars=0)}
    compared, cut = _compare(tokenizer, texts, plain, encoders)
    assert compared == 2 * len(texts) and cut >= 50


def test_random_models_are_encoded_whole() -> None:
    from tokenizers import Tokenizer, models

    rust = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")], dropout=0.5))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=rust, additional_special_tokens=["<x>"])
    plan = segment_plan(tokenizer)
    assert not plan.enabled and "dropout" in plan.notes[0]
    plain = RustTokenizersBackend(tokenizer)
    assert backend_for(tokenizer, "tokenizers") is not plain and not isinstance(
        backend_for(tokenizer, "tokenizers"), SegmentedEncoder
    )

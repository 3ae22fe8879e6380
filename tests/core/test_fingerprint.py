"""The rendering fingerprint (SPEC §5): stable under moves and renames, sensitive to anything that changes ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tokenfront import RenderOptions, RenderPipeline
from tokenfront.core.fingerprint import Fingerprint


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
    first = server_factory("render", "--model", str(qwen3))
    second = server_factory("render", "--model", str(moved), "--served-model-name", "other")
    a = httpx.get(f"{first.url}/server_info").json()["render_fingerprint"]
    b = httpx.get(f"{second.url}/server_info").json()["render_fingerprint"]
    assert a["digest"] == b["digest"] and a["complete"] and b["complete"]
    assert a["info"]["model_path"] != b["info"]["model_path"]

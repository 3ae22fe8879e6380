"""`--tokenizer-mode mistral`: chat and completions rendered through mistral-common, as vLLM 0.33 does.

The corpus (corpus_mistral.py) carries vLLM 0.33's HTTP status for every request. Each case goes through
`RenderPipeline` and through a reference built here from mistral-common alone:

    MistralTokenizer.from_file(<the tokenizer file>)        # mistral-common's own loader, no transformers
      .encode_chat_completion(ChatCompletionRequest.from_openai(<messages>, <tools>, ...)).tokens

The reference does not call tokenfront's `prepare_messages` or transformers' `MistralCommonBackend` (which
tokenfront, like vLLM, goes through): the few steps vLLM takes before mistral-common (the final-message checks,
tool-call ids cut to their last 9 characters, tool-call arguments parsed from JSON) are restated below from
vLLM's source, and the statuses they produce are checked against the corpus, which was read off vLLM itself.
A handful of ids observed on vLLM's render server are pinned as literals too.

Tokenizer folders: the `mistral-tekken` fixture (tekken v3), SentencePiece v1/v2/v3/v7 files shipped in
mistral-common's data, and tekken v7/v11/v13/v15 files made from the v3 one by giving it that version and the
full special-token list (`[THINK]`, `[MODEL_SETTINGS]`, ... as real v13+ files have).
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
from pathlib import Path
from typing import Any

import mistral_common
import pytest
from corpus_mistral import CHAT_CASES, COMPLETION_CASES, VERSIONED_CHAT_CASES
from mistral_common.protocol.instruct.request import ChatCompletionRequest as MistralRequest
from mistral_common.tokens.tokenizers.base import SpecialTokens
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from tokenfront import RenderOptions, RenderPipeline, fixtures
from tokenfront.core.checkpoint import load_checkpoint
from tokenfront.core.errors import CheckpointError, RenderError
from tokenfront.core.families import mistral
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest

DATA = Path(mistral_common.__file__).parent / "data"
PARAMS = {"dim": 5120, "n_layers": 40, "head_dim": 128, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 131072}
CONFIG = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 131072}
SPM_FILES = {
    "spm-v1": "tokenizer.model.v1",
    "spm-v2": "mistral_instruct_tokenizer_240216.model.v2",
    "spm-v3": "mistral_instruct_tokenizer_240323.model.v3",
    "spm-v7": "mistral_instruct_tokenizer_241114.model.v7",
}
TEKKEN_VERSIONS = ("tekken-v7", "tekken-v11", "tekken-v13", "tekken-v15")
# v15 tokenizers declare which reasoning efforts their model accepts.
V15_SETTINGS = {"reasoning_effort": {"values": ["none", "high"], "default": "none", "accepts_none": True}}

# The corpus' size, so that a case cannot silently drop out of the comparison.
CHAT_CASE_COUNT = 58
CHAT_REFUSED_COUNT = 16
VERSIONED_CASE_COUNT = 20
COMPLETION_CASE_COUNT = 12

# Ids read off vLLM 0.33's render server on the mistral-tekken layout.
VLLM_USER_HI = [1, 3, 37133, 4]  # {"messages": [{"role": "user", "content": "Hi"}]}
VLLM_COMPLETION = [1, 37133, 1766, 3174, 3074, 1093]  # {"prompt": "Hi [INST]"}: no control tokens from text
VLLM_TRUNCATED_COMPLETION = [1, 6184, 5946]  # "one two three four five six", truncate_prompt_tokens 3


# -- tokenizer folders ---------------------------------------------------------------------------------------


def _write_folder(
    folder: Path, tokenizer_files: dict[str, Path | dict[str, Any]], config: dict[str, Any]
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in tokenizer_files.items():
        if isinstance(content, Path):
            shutil.copyfile(content, folder / name)
        else:
            (folder / name).write_text(json.dumps(content), encoding="utf-8")
    (folder / "params.json").write_text(json.dumps(PARAMS), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def _tekken_of_version(version: str) -> dict[str, Any]:
    spec = json.loads((DATA / "tekken_240911.json").read_text(encoding="utf-8"))
    spec["config"]["version"] = version
    specials = [dict(token) for token in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    known = {token["token_str"] for token in specials}
    for token in SpecialTokens:
        if token.value not in known:
            specials.append({"rank": len(specials), "token_str": token.value, "is_control": True})
    spec["special_tokens"] = specials
    if version == "v15":
        spec["model_settings_builder"] = V15_SETTINGS
    return spec


@pytest.fixture(scope="session")
def tekken_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mistral-tekken fixture (tekken_240911.json, params.json, config.json); built in a tmp dir when the
    fixture registry does not have it (yet)."""
    if "mistral-tekken" in fixtures.CHECKPOINTS:
        return fixtures.ensure_checkpoint("mistral-tekken")
    return _write_folder(
        tmp_path_factory.mktemp("mistral-tekken"), {"tekken.json": DATA / "tekken_240911.json"}, CONFIG
    )


@pytest.fixture(scope="session")
def tokenizer_folders(tekken_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every tokenizer kind the corpus names, by kind."""
    root = tmp_path_factory.mktemp("mistral-tokenizers")
    folders = {"tekken-v3": tekken_folder}
    for kind, file in SPM_FILES.items():
        suffix = kind.removeprefix("spm-")
        folders[kind] = _write_folder(
            root / kind, {f"tokenizer.model.{suffix}": DATA / file}, {**CONFIG, "vocab_size": 32768}
        )
    for kind in TEKKEN_VERSIONS:
        version = kind.removeprefix("tekken-")
        folders[kind] = _write_folder(root / kind, {"tekken.json": _tekken_of_version(version)}, CONFIG)
    return folders


_PIPELINES: dict[Path, RenderPipeline] = {}


def _pipeline(folder: Path) -> RenderPipeline:
    if folder not in _PIPELINES:
        _PIPELINES[folder] = RenderPipeline.load(RenderOptions(model=str(folder), tokenizer_mode="mistral"))
    return _PIPELINES[folder]


# -- the reference: mistral-common on its own ----------------------------------------------------------------


@functools.cache
def _reference_tokenizer(file: Path) -> MistralTokenizer:
    return MistralTokenizer.from_file(str(file))


class Refused(Exception):
    """The reference refuses the request (vLLM answers it with a 4xx)."""


def _reference_chat(file: Path, body: dict[str, Any]) -> list[int]:
    """The ids vLLM 0.33 renders for a chat body in mistral mode, from mistral-common directly."""
    if body.get("chat_template") is not None or body.get("chat_template_kwargs") is not None:
        raise Refused("vLLM refuses chat templates in mistral mode")
    add_generation_prompt = body.get("add_generation_prompt", True)
    continue_final = body.get("continue_final_message", False)
    messages = copy.deepcopy(body["messages"])
    last_role = messages[-1]["role"]
    if continue_final and (add_generation_prompt or last_role != "assistant"):
        raise Refused("continue_final_message needs a final assistant message and no generation prompt")
    if add_generation_prompt and last_role == "assistant":
        raise Refused("a generation prompt cannot follow an assistant message")
    for message in messages:
        for part in message["content"] if isinstance(message.get("content"), list) else []:
            if part.get("type") == "image_url":
                raise Refused("the model is not multimodal")
        for call in message.get("tool_calls") or []:
            call["id"] = call["id"][-9:]
            arguments = call["function"].get("arguments")
            try:
                parsed = json.loads(arguments) if arguments else {}
            except json.JSONDecodeError:
                parsed = {}
            call["function"]["arguments"] = parsed if isinstance(parsed, dict) else {}
        if message["role"] == "tool" and "tool_call_id" in message:
            message["tool_call_id"] = message["tool_call_id"][-9:]
    tokenizer = _reference_tokenizer(file)
    version = int(tokenizer.instruct_tokenizer.tokenizer.version.value.lstrip("v"))
    effort = body.get("reasoning_effort") if version >= 15 else None
    try:
        request = MistralRequest.from_openai(
            messages, tools=body.get("tools"), continue_final_message=continue_final, reasoning_effort=effort
        )
        ids = list(tokenizer.encode_chat_completion(request).tokens)
    except Exception as exc:  # mistral-common's verdict on the request
        raise Refused(str(exc)) from exc
    keep = body.get("truncate_prompt_tokens")
    return ids[-keep:] if keep else ids


def _reference_completion(file: Path, body: dict[str, Any]) -> list[list[int]]:
    prompt = body["prompt"]
    items = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt
    inner = _reference_tokenizer(file).instruct_tokenizer.tokenizer
    bos = body.get("add_special_tokens", True)
    return [inner.encode(item, bos=bos, eos=False) if isinstance(item, str) else list(item) for item in items]


def _ours_chat(pipeline: RenderPipeline, body: dict[str, Any]) -> list[int]:
    return pipeline.render_chat(ChatCompletionRequest.model_validate(body), body=body).token_ids


def _outcome(render: Any, *args: Any) -> Any:
    try:
        return render(*args)
    except (Refused, RenderError):
        return "4xx"


# -- chat parity ---------------------------------------------------------------------------------------------


def test_corpus_counts() -> None:
    assert len(CHAT_CASES) == CHAT_CASE_COUNT >= 30
    assert len({name for name, _, _ in CHAT_CASES}) == len(CHAT_CASES)
    assert sum(status >= 400 for _, _, status in CHAT_CASES) == CHAT_REFUSED_COUNT
    assert len(VERSIONED_CHAT_CASES) == VERSIONED_CASE_COUNT
    assert len(COMPLETION_CASES) == COMPLETION_CASE_COUNT


def _compare_chat(
    folder: Path, cases: list[tuple[str, dict[str, Any], int | None]]
) -> tuple[int, int, list[str]]:
    """Render every case with tokenfront and with the reference; the outcomes (ids, or "4xx") must be equal,
    and agree with vLLM's status where the corpus gives one. Returns (compared, refused by both, mismatches)."""
    pipeline = _pipeline(folder)
    file = mistral.tokenizer_file(folder)
    assert file is not None
    compared, refused, mismatches = 0, 0, []
    for name, body, status in cases:
        ours = _outcome(_ours_chat, pipeline, body)
        reference = _outcome(_reference_chat, file, body)
        if status is not None and (reference == "4xx") != (status >= 400):
            mismatches.append(f"{folder.name} {name}: reference {reference} vs vLLM status {status}")
        if ours != reference:
            mismatches.append(f"{folder.name} {name}: ours {ours} vs reference {reference}")
        compared += 1
        refused += ours == reference == "4xx"
    return compared, refused, mismatches


def test_chat_corpus_on_the_tekken_fixture(tekken_folder: Path) -> None:
    """Every chat case on the mistral-tekken fixture: tokenfront's ids equal the reference's, and both refuse
    exactly the requests vLLM answers with a 400."""
    compared, refused, mismatches = _compare_chat(tekken_folder, list(CHAT_CASES))
    assert mismatches == []
    assert (compared, refused) == (CHAT_CASE_COUNT, CHAT_REFUSED_COUNT)


def test_chat_corpus_on_other_tokenizer_versions(tokenizer_folders: dict[str, Path]) -> None:
    """The chat corpus and the version-specific cases on tekken v7-v15 and SentencePiece v1-v7: tokenfront
    renders what mistral-common renders and refuses what it refuses (vLLM's statuses differ by version)."""
    compared, refused, mismatches = 0, 0, []
    others = {kind: folder for kind, folder in tokenizer_folders.items() if kind != "tekken-v3"}
    for kind, folder in others.items():
        cases: list[tuple[str, dict[str, Any], int | None]] = [
            (name, body, None) for name, body, _ in CHAT_CASES
        ]
        cases += [(name, body, status) for k, name, body, status in VERSIONED_CHAT_CASES if k == kind]
        counts = _compare_chat(folder, cases)
        compared, refused, mismatches = compared + counts[0], refused + counts[1], mismatches + counts[2]
    assert mismatches == []
    assert compared == len(others) * CHAT_CASE_COUNT + VERSIONED_CASE_COUNT
    assert 0 < refused < compared


def test_ids_pinned_from_vllm(tekken_folder: Path) -> None:
    pipeline = _pipeline(tekken_folder)
    rendered = pipeline.render_chat(
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}]})
    )
    assert rendered.token_ids == VLLM_USER_HI
    assert rendered.prompt_text == "<s>[INST]Hi[/INST]"
    [completion] = pipeline.render_completion(CompletionRequest.model_validate({"prompt": "Hi [INST]"}))
    assert completion.token_ids == VLLM_COMPLETION


def test_tool_call_ids_keep_their_last_nine_characters(tekken_folder: Path) -> None:
    body = dict(CHAT_CASES[[name for name, _, _ in CHAT_CASES].index("tool_call_history_long_id")][1])
    text = (
        _pipeline(tekken_folder)
        .render_chat(ChatCompletionRequest.model_validate(body), body=body)
        .prompt_text
    )
    assert text.count('"id": "defghijkl"') == 1 and text.count('"call_id": "defghijkl"') == 1
    assert "call_abc" not in text
    assert body["messages"][1]["tool_calls"][0]["id"] == "call_abcdefghijkl"  # the request is left as sent


def test_reasoning_effort_reaches_v15_only(tokenizer_folders: dict[str, Path]) -> None:
    body = {"messages": [{"role": "user", "content": "2+2?"}], "reasoning_effort": "high"}
    v15 = _ours_chat(_pipeline(tokenizer_folders["tekken-v15"]), body)
    text = _pipeline(tokenizer_folders["tekken-v15"]).chat_format.decode(v15)  # type: ignore[union-attr]
    assert '[MODEL_SETTINGS]{"reasoning_effort": "high"}[/MODEL_SETTINGS]' in text
    v13 = _pipeline(tokenizer_folders["tekken-v13"])
    assert _ours_chat(v13, body) == _ours_chat(v13, {"messages": body["messages"]})


def test_server_default_reasoning_effort_applies_when_the_request_sets_none(
    tokenizer_folders: dict[str, Path],
) -> None:
    folder = tokenizer_folders["tekken-v15"]
    pipeline = RenderPipeline.load(
        RenderOptions(
            model=str(folder),
            tokenizer_mode="mistral",
            default_chat_template_kwargs={"reasoning_effort": "high"},
        )
    )
    body = {"messages": [{"role": "user", "content": "2+2?"}]}
    assert _ours_chat(pipeline, body) == _ours_chat(_pipeline(folder), {**body, "reasoning_effort": "high"})
    assert _ours_chat(pipeline, {**body, "reasoning_effort": "none"}) == _ours_chat(_pipeline(folder), body)


def test_mistral_common_errors_are_400_with_its_message(tekken_folder: Path) -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "?"},
        ]
    }
    with pytest.raises(RenderError) as caught:
        _ours_chat(_pipeline(tekken_folder), body)
    assert caught.value.status_code == 400
    assert "Assistant message must have either content or tool_calls" in caught.value.message


# -- completions ---------------------------------------------------------------------------------------------


def test_completion_corpus(tekken_folder: Path) -> None:
    pipeline = _pipeline(tekken_folder)
    file = mistral.tokenizer_file(tekken_folder)
    assert file is not None
    compared = 0
    for name, body, status in COMPLETION_CASES:
        if "truncate_prompt_tokens" in body:  # see test_completion_truncation_keeps_bos_like_vllm
            continue
        rendered = [r.token_ids for r in pipeline.render_completion(CompletionRequest.model_validate(body))]
        assert status == 200
        assert rendered == _reference_completion(file, body), name
        compared += 1
    assert compared == COMPLETION_CASE_COUNT - 1


def test_completion_truncation_keeps_bos_like_vllm(tekken_folder: Path) -> None:
    request = CompletionRequest.model_validate(
        {"prompt": "one two three four five six", "truncate_prompt_tokens": 3}
    )
    [rendered] = _pipeline(tekken_folder).render_completion(request)
    assert rendered.token_ids == VLLM_TRUNCATED_COMPLETION


def test_token_ids_are_checked_against_the_mistral_vocabulary(tokenizer_folders: dict[str, Path]) -> None:
    """`len(tokenizer)` is mistral-common's vocabulary size (tekken: 131072 of its 150000 ranks), vLLM's bound."""
    tekken = _pipeline(tokenizer_folders["tekken-v3"])
    assert tekken.vocab_size == 131072
    [last] = tekken.render_completion(CompletionRequest.model_validate({"prompt": [1, 131071]}))
    assert last.token_ids == [1, 131071]
    with pytest.raises(RenderError, match="131072 is not a token id"):
        tekken.render_completion(CompletionRequest.model_validate({"prompt": [1, 131072]}))
    assert _pipeline(tokenizer_folders["spm-v3"]).vocab_size == 32768


# -- fingerprint ---------------------------------------------------------------------------------------------


def test_fingerprint_identifies_the_tokenizer_file(tekken_folder: Path, tmp_path: Path) -> None:
    original = _pipeline(tekken_folder).fingerprint
    assert original.complete and original.incomplete_reasons == []
    tokenizer = original.compared["tokenizer"]
    assert tokenizer["class"] == "MistralCommonBackend" and tokenizer["mode"] == "mistral"
    assert (
        tokenizer["tokenizer_version"] == "v3" and tokenizer["mistral_common"] == mistral_common.__version__
    )
    assert original.compared["chat_format"]["name"] == "mistral-common"

    moved = shutil.copytree(tekken_folder, tmp_path / "moved")
    assert (
        RenderPipeline.load(RenderOptions(model=str(moved), tokenizer_mode="mistral")).fingerprint.digest
        == original.digest
    )

    text = (moved / "tekken.json").read_text(encoding="utf-8")
    assert text.count('"token_str": "hello"') == 1
    (moved / "tekken.json").write_text(
        text.replace('"token_str": "hello"', '"token_str": "jello"'), encoding="utf-8"
    )
    changed = RenderPipeline.load(RenderOptions(model=str(moved), tokenizer_mode="mistral")).fingerprint
    assert changed.digest != original.digest
    assert original.compare(changed) == ["tokenizer model differs"]


def test_fingerprint_differs_between_tokenizer_versions(tokenizer_folders: dict[str, Path]) -> None:
    digests = {kind: _pipeline(folder).fingerprint.digest for kind, folder in tokenizer_folders.items()}
    assert len(set(digests.values())) == len(digests)


@pytest.fixture(scope="session")
def dual_format_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder transformers and mistral-common can both read: the SentencePiece v3 file as `tokenizer.model.v3`
    and, converted by transformers, as an HF Llama tokenizer (`tokenizer.json`, `tokenizer_config.json`)."""
    from transformers import LlamaTokenizer

    folder = _write_folder(
        tmp_path_factory.mktemp("dual-format"),
        {"tokenizer.model.v3": DATA / SPM_FILES["spm-v3"], "tokenizer.model": DATA / SPM_FILES["spm-v3"]},
        {**CONFIG, "vocab_size": 32768},
    )
    # from_pretrained reads the sentencepiece model (transformers 5 ignores vocab_file= and saves 3 tokens).
    LlamaTokenizer.from_pretrained(str(folder)).save_pretrained(str(folder))
    (folder / "tokenizer.model").unlink()  # mistral mode must pick the .v3 file; hf mode reads tokenizer.json
    assert (folder / "tokenizer.json").is_file()
    return folder


def test_hf_and_mistral_modes_never_match(dual_format_folder: Path, tekken_folder: Path) -> None:
    for folder in (dual_format_folder, tekken_folder):
        hf = RenderPipeline.load(RenderOptions(model=str(folder), tokenizer_mode="hf")).fingerprint
        mistral_mode = _pipeline(folder).fingerprint
        assert hf.digest != mistral_mode.digest
        assert not hf.matches(mistral_mode) and not mistral_mode.matches(hf)
        assert "chat format (Harmony / mistral-common) differs" in mistral_mode.compare(hf)


# -- choosing and loading ------------------------------------------------------------------------------------


def _folder_with(tmp_path: Path, *names: str) -> Path:
    for name in names:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        source = {
            "tekken.json": DATA / "tekken_240911.json",
            "tokenizer.model.v3": DATA / SPM_FILES["spm-v3"],
        }.get(name)
        if source is not None:
            shutil.copyfile(source, path)
        else:
            path.write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # vLLM's auto: Mistral weights and a Mistral tokenizer file, anywhere below the folder, by base name.
        (("consolidated.safetensors", "tekken.json"), "mistral"),
        (("consolidated-00001-of-00002.safetensors", "tokenizer.model.v3"), "mistral"),
        (("original/consolidated.safetensors", "tekken.json"), "mistral"),
        (("tekken.json",), "hf"),
        (("consolidated.safetensors", "tokenizer.model"), "hf"),
        (("model.safetensors", "tekken.json"), "hf"),
    ],
)
def test_auto_mode_picks_as_vllm(tmp_path: Path, files: tuple[str, ...], expected: str) -> None:
    assert mistral.resolve_tokenizer_mode(_folder_with(tmp_path, *files), "auto") == expected


def test_auto_mode_loads_mistral_common(tekken_folder: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(tekken_folder, tmp_path / "weights")
    (folder / "consolidated.safetensors").write_bytes(b"")
    checkpoint = load_checkpoint(str(folder))
    assert checkpoint.tokenizer_mode == "mistral"
    assert type(checkpoint.tokenizer).__name__ == "MistralCommonBackend"


def test_mistral_mode_without_a_mistral_file_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(str(tmp_path), tokenizer_mode="mistral")
    assert "needs a mistral-common tokenizer file (tekken.json or tokenizer.model.v*)" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_hf_mode_on_a_sentencepiece_only_mistral_folder_is_one_clear_line(
    tokenizer_folders: dict[str, Path],
) -> None:
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(str(tokenizer_folders["spm-v3"]), tokenizer_mode="hf")
    assert "start with --tokenizer-mode mistral" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_broken_tokenizer_file_is_one_clear_line(tmp_path: Path) -> None:
    spec = json.loads((DATA / "tekken_240911.json").read_text(encoding="utf-8"))
    spec["config"]["version"] = "v99"
    (tmp_path / "tekken.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(str(tmp_path), tokenizer_mode="mistral")
    assert "cannot load the mistral-common tokenizer" in str(caught.value) and "v99" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unknown_mode_is_refused(tekken_folder: Path) -> None:
    with pytest.raises(CheckpointError, match="is not one of auto, hf, mistral"):
        mistral.resolve_tokenizer_mode(tekken_folder, "slow")

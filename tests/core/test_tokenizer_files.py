"""Checkpoints without tokenizer.json: a SentencePiece and a tiktoken `tokenizer.model`, and tekken.json.

transformers 5 converts a `tokenizer.model` into a fast (Rust) tokenizer when it loads it, so the pipeline's
Rust backends apply to it; every id must still be what `AutoTokenizer(...)` and `apply_chat_template` give.
The fingerprint identifies such a tokenizer completely, including the bytes of the file it came from.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import corpus
import pytest
import reference

from tokenfront.core.checkpoint import load_tokenizer
from tokenfront.core.errors import RenderError
from tokenfront.core.families import mistral
from tokenfront.core.fingerprint import tokenizer_components
from tokenfront.core.render import RenderPipeline
from tokenfront.core.tokenization import backend_for
from tokenfront.core.tokenizer_files import tokenizer_source_file
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest

# The two tokenizer.model kinds, and a text in each that must come out as special tokens.
CHECKPOINTS = {
    "mistral-sp": "[INST] What is 2+2?[/INST] 4</s>[INST] And 3+3?[/INST]",
    "llama3-tiktoken": "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|python_tag|>",
}

# Texts that stress a tokenizer: whitespace runs, scripts, byte fallback, digits, code, long input.
TEXTS = [
    "The capital of France is",
    "",
    " ",
    "   leading and trailing   ",
    "line one\nline two\r\n\ttabbed\n\n\n",
    "数字 123 4567 東京タワー café naïve Ünïcödé",
    "emoji 🚀🔥 and ZWJ 👩‍💻, RTL עברית مرحبا",
    "code: def f(x):\n    return x ** 2  # comment",
    "don't I'm you'll WE'VE they'd",
    "3.14159 1,000,000 0x1F 1e-9 ½ ² ∑",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "▁already▁metaspace▁ ▁",
    "\x00\x01 control \x7f chars",
    "a" * 300,
    " ".join(str(i) for i in range(200)),
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 ꙮ ᚠᛇᚻ",
    corpus.SPECIAL_TOKEN_TEXT,
    corpus.LONG_TEXT,
]


@pytest.fixture(scope="module")
def pipelines(checkpoint: Callable[[str], Path]) -> dict[str, RenderPipeline]:
    # tokenizer_mode hf: transformers' tokenizer and the checkpoint's template, whatever `auto` picks.
    return {
        name: RenderPipeline.load(RenderOptions(model=str(checkpoint(name)), tokenizer_mode="hf"))
        for name in CHECKPOINTS
    }


def _texts(name: str) -> list[str]:
    return [*TEXTS, CHECKPOINTS[name], CHECKPOINTS[name] * 3 + " tail"]


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_tokenizer_model_is_converted_to_a_rust_tokenizer(
    name: str, pipelines: dict[str, RenderPipeline], checkpoint: Callable[[str], Path]
) -> None:
    folder = checkpoint(name)
    assert not (folder / "tokenizer.json").exists()
    pipeline = pipelines[name]
    assert type(pipeline.tokenizer).__name__ == "TokenizersBackend"
    assert getattr(pipeline.tokenizer, "_tokenizer", None) is not None
    assert tokenizer_source_file(pipeline.tokenizer) == folder / "tokenizer.model"
    # A Rust backend serves, not the transformers fallback (fastokens for tiktoken's BPE; tokenizers for the
    # SentencePiece conversion, whose Metaspace pre-tokenizer fastokens does not know).
    assert pipeline.backend.name in ("fastokens", "tokenizers")


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_completions_encode_as_transformers_does(
    name: str, pipelines: dict[str, RenderPipeline], checkpoint: Callable[[str], Path]
) -> None:
    pipeline, tokenizer = pipelines[name], reference.load_tokenizer(str(checkpoint(name)))
    compared = 0
    for text in _texts(name):
        for add_special in (True, False):
            request = CompletionRequest.model_validate({"prompt": text, "add_special_tokens": add_special})
            expected = tokenizer(text, add_special_tokens=add_special)["input_ids"]
            if not expected:  # nothing to render: a 400, as for any checkpoint
                with pytest.raises(RenderError):
                    pipeline.render_completion(request)
                continue
            assert pipeline.render_completion(request)[0].token_ids == expected, (text[:60], add_special)
            compared += 1
    # The marker text is special tokens, not pieces of text.
    ids = tokenizer(CHECKPOINTS[name], add_special_tokens=False)["input_ids"]
    assert len([i for i in ids if i in tokenizer.added_tokens_decoder]) >= 4
    assert compared >= 2 * len(TEXTS)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
@pytest.mark.parametrize("choice", ["fastokens", "tokenizers"])
@pytest.mark.parametrize("incremental", [True, False])
def test_every_rust_backend_agrees_or_steps_aside(
    name: str, choice: str, incremental: bool, checkpoint: Callable[[str], Path]
) -> None:
    tokenizer = load_tokenizer(checkpoint(name), trust_remote_code=False)
    backend = backend_for(tokenizer, choice, incremental_encoding=incremental)  # type: ignore[arg-type]
    # fastokens steps aside (to tokenizers) when it cannot load the converted tokenizer or disagrees.
    assert backend.name in ("fastokens", "tokenizers")
    for text in _texts(name):
        for add_special in (True, False):
            expected = tokenizer(text, add_special_tokens=add_special)["input_ids"]
            assert backend.encode(text, add_special_tokens=add_special) == expected, (text[:60], add_special)


def _render_chat(pipeline: RenderPipeline, body: dict[str, Any]) -> list[int] | RenderError:
    parsed = json.loads(json.dumps(body))
    try:
        return pipeline.render_chat(ChatCompletionRequest.model_validate(parsed), body=parsed).token_ids
    except RenderError as error:
        return error


@pytest.mark.parametrize(("name", "min_rendered"), [("mistral-sp", 40), ("llama3-tiktoken", 50)])
def test_chat_renders_as_apply_chat_template(
    name: str, min_rendered: int, pipelines: dict[str, RenderPipeline], checkpoint: Callable[[str], Path]
) -> None:
    folder, pipeline = checkpoint(name), pipelines[name]
    equal = refused = 0
    for case in corpus.CHAT:
        expected = reference.reference_chat(folder, case.body)
        got = _render_chat(pipeline, case.body)
        if expected.error is not None:
            assert isinstance(got, RenderError), f"[{case.id}] transformers raised {expected.error!r}"
            refused += 1
        else:
            assert got == expected.ids, f"[{case.id}] {expected.text!r}"
            equal += 1
    assert equal + refused == len(corpus.CHAT)
    # Mistral v0.3's template refuses some by design (alternating roles, 9-character tool call ids).
    assert equal >= min_rendered, (equal, refused)


def test_mistral_v03_template_uses_the_control_tokens(pipelines: dict[str, RenderPipeline]) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "And?"},
        ]
    }
    ids = _render_chat(pipelines["mistral-sp"], body)
    assert isinstance(ids, list)
    tokenizer = pipelines["mistral-sp"].tokenizer
    assert (
        ids[0] == 1 and ids.count(3) == 2 and ids.count(4) == 2 and ids.count(2) == 1
    )  # <s> [INST] [/INST] </s>
    assert tokenizer.decode(ids) == "<s>[INST] Hi[/INST] Hello!</s>[INST] Be brief.\n\nAnd?[/INST]"


# -- the fingerprint -------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_fingerprint_is_complete_and_names_the_file(
    name: str, pipelines: dict[str, RenderPipeline], checkpoint: Callable[[str], Path]
) -> None:
    fingerprint = pipelines[name].fingerprint
    assert fingerprint.complete, fingerprint.incomplete_reasons
    tokenizer = fingerprint.compared["tokenizer"]
    assert tokenizer["model_file"] == _sha256(checkpoint(name) / "tokenizer.model")
    assert tokenizer["model"] and tokenizer["vocab"]  # the converted Rust tokenizer, hashed as any other
    assert "tokenizer.model" not in json.dumps(fingerprint.compared)  # names and paths are not compared


def test_a_tokenizer_json_checkpoint_has_no_model_file(checkpoint: Callable[[str], Path]) -> None:
    components, incomplete = tokenizer_components(
        load_tokenizer(checkpoint("qwen3"), trust_remote_code=False)
    )
    assert components["model_file"] is None and not incomplete


def _copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns(".complete"))
    return dest


def _change_one_byte_sentencepiece(model: Path) -> None:
    import sentencepiece

    data = bytearray(model.read_bytes())
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(model))
    old, new = "▁Hello".encode(), "▁Hellq".encode()
    assert pieces.piece_to_id("▁Hellq") == pieces.unk_id()  # not a piece yet: the model stays valid
    at = data.index(old)
    data[at + len(old) - 1] = new[-1]
    model.write_bytes(bytes(data))


def _change_one_byte_tiktoken(model: Path) -> None:
    lines = model.read_bytes().split(b"\n")
    ranks = {base64.b64decode(line.split()[0]) for line in lines if line}
    index = 100_000
    token_b64, rank = lines[index].split()
    for replacement in b"ABCDEFGHIJKLMNOPQRSTUVWXYZ":  # one base64 character, to a token not in the file
        changed = bytes([replacement]) + token_b64[1:]
        if changed != token_b64 and base64.b64decode(changed) not in ranks:
            lines[index] = changed + b" " + rank
            break
    model.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize(
    ("name", "change"),
    [("mistral-sp", _change_one_byte_sentencepiece), ("llama3-tiktoken", _change_one_byte_tiktoken)],
)
def test_one_changed_byte_of_tokenizer_model_changes_the_digest(
    name: str,
    change: Callable[[Path], None],
    pipelines: dict[str, RenderPipeline],
    checkpoint: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    original = pipelines[name].fingerprint
    options = {"tokenizer_mode": "hf"}
    moved = RenderPipeline.load(
        RenderOptions(model=str(_copy(checkpoint(name), tmp_path / "moved")), **options)
    )
    assert moved.fingerprint.digest == original.digest  # moving a checkpoint changes nothing

    folder = _copy(checkpoint(name), tmp_path / "changed")
    before = (folder / "tokenizer.model").read_bytes()
    change(folder / "tokenizer.model")
    after = (folder / "tokenizer.model").read_bytes()
    assert len(before) == len(after) and sum(a != b for a, b in zip(before, after, strict=True)) == 1

    changed = RenderPipeline.load(RenderOptions(model=str(folder), **options)).fingerprint
    assert changed.complete
    assert changed.digest != original.digest
    assert changed.compared["tokenizer"]["model_file"] != original.compared["tokenizer"]["model_file"]
    assert any("tokenizer model file" in reason for reason in original.compare(changed))


def test_tekken_under_transformers_is_identified_by_its_file(
    checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    # hf mode converts tekken.json to a transformers tokenizer (as vLLM's hf mode does): its Rust model is
    # hashed like any other, and the file it came from too.
    folder = checkpoint("mistral-tekken")
    tokenizer = load_tokenizer(folder, trust_remote_code=False)
    assert type(tokenizer).__name__ == "TokenizersBackend"
    components, incomplete = tokenizer_components(tokenizer)
    assert not incomplete
    assert components["model_file"] == _sha256(folder / "tekken.json")

    changed = _copy(folder, tmp_path / "changed")
    text = (changed / "tekken.json").read_bytes()
    at = text.index(b'"rank": 50000')
    at = text.index(b'"token_bytes": "', at) + len(b'"token_bytes": "')
    (changed / "tekken.json").write_bytes(
        text[:at] + (b"B" if text[at : at + 1] != b"B" else b"C") + text[at + 1 :]
    )
    other, _ = tokenizer_components(load_tokenizer(changed, trust_remote_code=False))
    assert other["model_file"] != components["model_file"] and other["vocab"] != components["vocab"]

    # mistral-common's own tokenizer (what --tokenizer-mode mistral loads) has no Rust model: the generic
    # component identifies it by its file, and cannot when the file is gone.
    backend = mistral.load_tokenizer(folder)
    assert type(backend).__name__ == "MistralCommonBackend"
    backend_components, incomplete = tokenizer_components(backend)
    assert not incomplete and backend_components["model"] == _sha256(folder / "tekken.json")
    backend._tokenizer_path = str(tmp_path / "gone.json")
    _, incomplete = tokenizer_components(backend)
    assert incomplete == ["tokenizer MistralCommonBackend: the file it was loaded from was not found"]

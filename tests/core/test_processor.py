"""Checkpoints whose processor builds the prompt (Gemma 3: text + vision): text-only chat requests.

The reference is transformers' own processor: `AutoProcessor.from_pretrained(folder).apply_chat_template`,
tokenized by its tokenizer without special tokens (the template writes `<bos>`), as the worker computes it.
vLLM picks the processor's template for requests without tools and the tokenizer's with tools; media parts
are not rendered yet (a 400).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import corpus
import pytest
import reference
from transformers import AutoProcessor, AutoTokenizer

from tokenfront.core.checkpoint import PROCESSOR_TEMPLATE, load_checkpoint
from tokenfront.core.errors import RenderError, UnsupportedContentError
from tokenfront.core.messages import normalize_messages
from tokenfront.core.render import RenderPipeline
from tokenfront.core.templates import compile_template
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest

# A processor template that differs from Gemma 3's (which both its processor and tokenizer carry).
PROCESSOR_ONLY = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}[processor]\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}"
    "{% endif %}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
CONFIG_TEMPLATE = PROCESSOR_ONLY.replace("[processor]", "[processor_config]")


def _processor_reference(folder: Path, body: dict[str, Any]) -> reference.Reference:
    """transformers' processor on a chat body: its template, the request's messages after normalization, the
    text tokenized as vLLM does for chat (no special tokens added: the template writes them)."""
    processor = _processor(str(folder))
    # As the servers call it: `chat_template_kwargs` may not repeat a request field (a TypeError here).
    kwargs = body.get("chat_template_kwargs") or {}
    fields = {
        "add_generation_prompt": body.get("add_generation_prompt", True),
        "continue_final_message": body.get("continue_final_message", False),
    }
    try:
        template = compile_template(processor.chat_template)
        messages = normalize_messages(
            body["messages"],
            content_format=template.content_format,
            template_knows_developer=template.knows_developer_role,
        )
        text = processor.apply_chat_template(messages, tokenize=False, **fields, **kwargs)
    except Exception as exc:  # the processor refused the request
        return reference.Reference(ids=None, error=exc)
    ids = processor.tokenizer(text, add_special_tokens=bool(body.get("add_special_tokens", False)))[
        "input_ids"
    ]
    if text.startswith(processor.tokenizer.bos_token) and not body.get("add_special_tokens"):
        # The processor's own tokenizing path agrees; it adds <bos> only when the text does not start with it
        # (a request overriding bos_token), where vLLM's chat path adds nothing.
        assert list(processor.apply_chat_template(messages, tokenize=True, **fields, **kwargs)[0]) == ids
    keep = body.get("truncate_prompt_tokens")
    ids = list(ids) if keep in (None, -1) else list(ids)[-keep:]  # the last N ids, as the servers keep them
    return reference.Reference(ids=ids, text=text)


def _load(folder: Path, **options: Any) -> RenderPipeline:
    # The transformers tokenizer encodes: the same ids as the Rust backends, without building them each time.
    return RenderPipeline.load(RenderOptions(model=str(folder), tokenizer_backend="transformers", **options))


_PROCESSORS: dict[str, Any] = {}


def _processor(folder: str) -> Any:
    if folder not in _PROCESSORS:
        _PROCESSORS[folder] = AutoProcessor.from_pretrained(folder)
    return _PROCESSORS[folder]


def _render(pipeline: RenderPipeline, body: dict[str, Any]) -> list[int] | RenderError:
    parsed = json.loads(json.dumps(body))
    try:
        return pipeline.render_chat(ChatCompletionRequest.model_validate(parsed), body=parsed).token_ids
    except RenderError as error:
        return error


def _variant(
    base: Path, dest: Path, *, drop: tuple[str, ...] = (), write: dict[str, Any] | None = None
) -> Path:
    """A copy of a checkpoint folder (large files linked), less `drop`, plus `write` (name -> JSON or text)."""
    dest.mkdir()
    for path in base.iterdir():
        if path.name in drop or path.name == ".complete":
            continue
        if path.name == "tokenizer.json":
            (dest / path.name).symlink_to(path)
        else:
            shutil.copyfile(path, dest / path.name)
    for name, value in (write or {}).items():
        text = value if isinstance(value, str) else json.dumps(value)
        (dest / name).write_text(text, encoding="utf-8")
    return dest


@pytest.fixture(scope="module")
def gemma3_processor(checkpoint: Callable[[str], Path]) -> Path:
    return checkpoint("gemma3-processor")


@pytest.fixture(scope="module")
def pipeline(gemma3_processor: Path) -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(gemma3_processor)))


def _text_only_cases() -> list[corpus.Case]:
    return [case for case in corpus.CHAT if "tools" not in case.body]


def test_text_chat_renders_as_the_processor_does(pipeline: RenderPipeline, gemma3_processor: Path) -> None:
    assert type(_processor(str(gemma3_processor))).__name__ == "Gemma3Processor"
    equal = refused = 0
    for case in _text_only_cases():
        expected = _processor_reference(gemma3_processor, case.body)
        got = _render(pipeline, case.body)
        if expected.error is not None:
            assert isinstance(got, RenderError), f"[{case.id}] the processor raised {expected.error!r}"
            refused += 1
        else:
            assert got == expected.ids, f"[{case.id}] {expected.text!r}"
            equal += 1
    # Gemma 3's template refuses non-alternating turns (and has no tool role): most of the corpus renders.
    assert equal >= 40, (equal, refused)
    assert equal + refused == len(_text_only_cases())


def test_the_fingerprint_says_a_processor_builds_the_prompt(
    pipeline: RenderPipeline, checkpoint: Callable[[str], Path]
) -> None:
    processor = pipeline.fingerprint.compared["processor"]
    assert processor is not None and processor["class"] == "Gemma3Processor"
    assert pipeline.fingerprint.complete
    # Same tokenizer and template as the plain Gemma 3 checkpoint: only the processor tells them apart.
    plain = _load(checkpoint("gemma3")).fingerprint
    assert plain.compared["processor"] is None
    assert plain.compared["chat_templates"] == pipeline.fingerprint.compared["chat_templates"]
    assert pipeline.fingerprint.compare(plain) == [
        "model type gemma3 vs gemma3_text",
        "this model builds its prompt in a processor; the worker's does not",
    ]


def test_processor_component_covers_both_processor_files(
    pipeline: RenderPipeline, gemma3_processor: Path, tmp_path: Path
) -> None:
    base = load_checkpoint(str(gemma3_processor)).processor
    assert (
        base is not None and base["processor_class"] == "Gemma3Processor" and base["image_seq_length"] == 256
    )
    assert base["image_processor_type"] == "Gemma3ImageProcessor"  # from preprocessor_config.json
    preprocessor = json.loads((gemma3_processor / "preprocessor_config.json").read_text())
    changed = _variant(
        gemma3_processor,
        tmp_path / "changed",
        write={"preprocessor_config.json": {**preprocessor, "size": {"height": 448, "width": 448}}},
    )
    theirs = _load(changed).fingerprint
    assert pipeline.fingerprint.compare(theirs) == ["prompt processor differs"]


def test_a_processor_template_is_used_without_tools_the_tokenizers_with_tools(
    pipeline: RenderPipeline, gemma3_processor: Path, tmp_path: Path
) -> None:
    folder = _variant(
        gemma3_processor,
        tmp_path / "own-template",
        write={"chat_template.json": {"chat_template": PROCESSOR_ONLY}},
    )
    processor = _processor(str(folder))
    tokenizer = processor.tokenizer  # loaded as AutoTokenizer loads it
    assert processor.chat_template == PROCESSOR_ONLY != tokenizer.chat_template  # transformers agrees

    checkpoint = load_checkpoint(str(folder))
    assert checkpoint.chat_templates is not None
    assert checkpoint.chat_templates.templates[PROCESSOR_TEMPLATE] == PROCESSOR_ONLY
    assert checkpoint.chat_templates.templates["default"] == tokenizer.chat_template
    own = _load(folder)

    plain = {"messages": [{"role": "user", "content": "Hi"}]}
    got = _render(own, plain)
    assert got == _processor_reference(folder, plain).ids
    assert isinstance(got, list) and "[processor]" in own.tokenizer.decode(got)

    # With tools, vLLM takes the tokenizer's template (Gemma 3's ignores the tools).
    with_tools = {**plain, "tools": [corpus.WEATHER_TOOL]}
    expected = reference.reference_chat(folder, with_tools)
    assert expected.ids is not None and _render(own, with_tools) == expected.ids
    assert expected.ids == _render(pipeline, plain)  # the same as Gemma 3's own template without tools
    # --chat-template beats both.
    override = _load(folder, chat_template="{{ 'X' + messages[0].content }}")
    assert _render(override, plain) == own.tokenizer("XHi", add_special_tokens=False)["input_ids"]

    # The processor's template is part of the fingerprint.
    assert pipeline.fingerprint.compare(own.fingerprint) == ["chat template differs (processor)"]


def test_processor_config_template_wins_over_chat_template_json(
    gemma3_processor: Path, tmp_path: Path
) -> None:
    processor_config = json.loads((gemma3_processor / "processor_config.json").read_text())
    folder = _variant(
        gemma3_processor,
        tmp_path / "config-template",
        write={
            "chat_template.json": {"chat_template": PROCESSOR_ONLY},
            "processor_config.json": {**processor_config, "chat_template": CONFIG_TEMPLATE},
        },
    )
    assert _processor(str(folder)).chat_template == CONFIG_TEMPLATE
    checkpoint = load_checkpoint(str(folder))
    assert checkpoint.chat_templates is not None
    assert checkpoint.chat_templates.templates[PROCESSOR_TEMPLATE] == CONFIG_TEMPLATE
    plain = {"messages": [{"role": "user", "content": "Hi"}]}
    assert _render(_load(folder), plain) == _processor_reference(folder, plain).ids


def test_a_processor_without_a_tokenizer_template_renders_tool_requests_too(
    gemma3_processor: Path, tmp_path: Path
) -> None:
    # vLLM refuses this one (with tools it asks the tokenizer, which has no template); the processor renders.
    tokenizer_config = json.loads((gemma3_processor / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template")
    folder = _variant(
        gemma3_processor,
        tmp_path / "processor-only",
        write={
            "tokenizer_config.json": tokenizer_config,
            "chat_template.json": {"chat_template": PROCESSOR_ONLY},
        },
    )
    assert _processor(str(folder)).tokenizer.chat_template is None
    own = _load(folder)
    plain = {"messages": [{"role": "user", "content": "Hi"}]}
    expected = _processor_reference(folder, plain).ids
    assert _render(own, plain) == expected
    assert _render(own, {**plain, "tools": [corpus.WEATHER_TOOL]}) == expected


def test_what_transformers_5_saves_for_a_processor(
    pipeline: RenderPipeline, gemma3_processor: Path, tmp_path: Path
) -> None:
    # Gemma3Processor.save_pretrained: processor_config.json (with the image processor nested),
    # chat_template.jinja, and a tokenizer_config.json without the template.
    saved = tmp_path / "saved"
    _processor(str(gemma3_processor)).save_pretrained(saved)
    (saved / "config.json").write_text((gemma3_processor / "config.json").read_text())
    names = {path.name for path in saved.iterdir()}
    assert {"processor_config.json", "chat_template.jinja", "tokenizer_config.json"} <= names
    assert "preprocessor_config.json" not in names and "chat_template.json" not in names
    assert "chat_template" not in json.loads((saved / "tokenizer_config.json").read_text())

    checkpoint = load_checkpoint(str(saved))
    assert checkpoint.processor is not None and checkpoint.processor["processor_class"] == "Gemma3Processor"
    assert checkpoint.chat_templates is not None and set(checkpoint.chat_templates.templates) == {"default"}
    own = _load(saved)
    rendered = 0
    for case in _text_only_cases():
        expected = _processor_reference(saved, case.body)
        got = _render(own, case.body)
        if expected.error is not None:
            assert isinstance(got, RenderError), case.id
            continue
        assert got == expected.ids == _render(pipeline, case.body), case.id
        rendered += 1
    assert rendered >= 40
    assert own.fingerprint.compared["chat_templates"] == pipeline.fingerprint.compared["chat_templates"]


def test_chat_template_json_without_a_processor_is_not_read(
    checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    # Neither transformers' tokenizer nor vLLM reads chat_template.json unless a processor loads it.
    tokenizer_config = json.loads((checkpoint("gemma3") / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template")
    folder = _variant(
        checkpoint("gemma3"),
        tmp_path / "no-processor",
        write={
            "tokenizer_config.json": tokenizer_config,
            "chat_template.json": {"chat_template": PROCESSOR_ONLY},
        },
    )
    assert AutoTokenizer.from_pretrained(folder).chat_template is None
    assert load_checkpoint(str(folder)).chat_templates is None
    error = _render(_load(folder), {"messages": [{"role": "user", "content": "Hi"}]})
    assert isinstance(error, RenderError) and error.code == "no_chat_template"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "video_url", "video_url": {"url": "https://example.invalid/v.mp4"}},
        {"type": "file", "file": {"file_id": "file-1"}},
    ],
)
def test_media_parts_are_not_rendered_yet(pipeline: RenderPipeline, part: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]}
    error = _render(pipeline, body)
    assert isinstance(error, UnsupportedContentError)
    assert error.status_code == 400 and error.code == "multimodal_not_supported"
    assert error.param == "messages[0].content[1]" and "not yet supported" in error.message

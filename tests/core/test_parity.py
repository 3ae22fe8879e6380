"""Render parity, the acceptance test: tokenfront's ids equal transformers' for every checkpoint and template.

For every fixture checkpoint (with its own template) and every llama.cpp template (paired with a fitting fixture
tokenizer), every request of the corpus (`corpus.py`) is rendered by tokenfront's `RenderPipeline` and by the
transformers reference path (`reference.py`, docs/contract.md §3). Per pair: both give ids -> equal; transformers raises ->
tokenfront raises a `RenderError` (a 400); anything else is a failure. One test per checkpoint or template collects
every mismatch of its corpus into one message; the terminal summary counts the pairs compared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import corpus
import pytest
import reference

from tokenfront import fixtures
from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.core.templates import compile_template
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.slow  # the full parity sweep


def _model_type(name: str) -> str | None:
    source = fixtures.CHECKPOINTS[name]
    return source.config.get("model_type") or (_model_type(source.base) if source.base else None)


# gpt-oss checkpoints (model_type gpt_oss) are not rendered by their chat template: tokenfront renders them in
# the Harmony format, as vLLM does, and test_gpt_oss.py checks them against oss-harmony instead. Their llama.cpp
# template stays covered here, on the same tokenizer in a folder of no model type (GPTOSS_TEMPLATE_CHECKPOINT).
CHECKPOINTS = [name for name in fixtures.CHECKPOINTS if _model_type(name) != "gpt_oss"]
GPTOSS_TEMPLATE_CHECKPOINT = "gptoss-tokenizer-only"

# llama.cpp template -> the fixture tokenizer that fits it best (first matching rule; qwen3 is the generic BPE).
_PAIRING: tuple[tuple[str, str], ...] = (
    ("gpt-oss", GPTOSS_TEMPLATE_CHECKPOINT),
    ("gemma", "gemma3"),
    ("distill-qwen", "deepseek_v3"),
    ("distill-llama", "llama3"),
    ("deepseek", "deepseek_v3"),
    ("meta-llama-llama-3", "llama3_1"),
    ("hermes", "llama3"),
    ("firefunction", "llama3"),
    ("functionary", "llama3"),
)

# DATA.md: 65 of 70 templates render under transformers; the rest refuse by design.
MIN_RENDERING_TEMPLATES = 60
MAX_REPORTED_DIFFS = 6


def checkpoint_for_template(name: str) -> str:
    """The fixture checkpoint whose tokenizer a llama.cpp template is paired with."""
    lowered = name.lower()
    return next((checkpoint for needle, checkpoint in _PAIRING if needle in lowered), "qwen3")


def _template_files() -> list[Path]:
    try:
        return sorted(fixtures.ensure_templates().glob("*.jinja"))
    except Exception:  # offline and not cached: the sweep test reports it
        return []


TEMPLATE_FILES = {path.stem: path for path in _template_files()}


# -- one sweep ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """The parity result of one checkpoint or template over the whole corpus."""

    key: str
    compared: int = 0
    equal: int = 0
    both_raise: int = 0
    reference_renders: int = 0  # corpus requests transformers rendered
    basic_renders: bool = False  # transformers rendered the plain system + user request
    reference_errors: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def report(self) -> str:
        lines = [
            f"{self.key}: {len(self.failures)} of {self.compared} requests differ from transformers "
            f"({self.equal} equal, {self.both_raise} refused by both)"
        ]
        lines += self.failures[:MAX_REPORTED_DIFFS]
        if len(self.failures) > MAX_REPORTED_DIFFS:
            lines.append(f"... and {len(self.failures) - MAX_REPORTED_DIFFS} more")
        return "\n\n".join(lines)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:200]}"


def _window(ids: list[int], at: int) -> list[int]:
    return ids[max(0, at - 4) : at + 6]


def _diff(case_id: str, expected: list[int], got: list[int], text: str | None, tokenizer: Any) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
        min(len(expected), len(got)),
    )
    start = max(0, at - 4)
    return (
        f"[{case_id}] ids differ at index {at} (transformers {len(expected)} ids, tokenfront {len(got)})\n"
        f"  transformers[{start}:]: {_window(expected, at)} = {tokenizer.decode(_window(expected, at))!r}\n"
        f"  tokenfront  [{start}:]: {_window(got, at)} = {tokenizer.decode(_window(got, at))!r}\n"
        f"  transformers text around it: {tokenizer.decode(expected[max(0, at - 12) : at + 12])!r}\n"
        f"  full transformers text (head): {(text or '')[:300]!r}"
    )


class ParitySweep:
    """Loads each checkpoint's pipeline once and runs (and remembers) the sweep of each checkpoint or template."""

    def __init__(self, checkpoint_dir: Callable[[str], Path], outcomes: dict[str, Outcome]) -> None:
        self._checkpoint_dir = checkpoint_dir
        self._folders: dict[str, Path] = {}
        self._pipelines: dict[str, RenderPipeline] = {}
        self.outcomes = outcomes

    def add_checkpoint(self, name: str, folder: Path) -> None:
        """A checkpoint folder made by the tests themselves (e.g. one with named templates)."""
        self._folders[name] = folder

    def folder(self, name: str) -> Path:
        return self._folders[name] if name in self._folders else self._checkpoint_dir(name)

    def pipeline(self, name: str) -> RenderPipeline:
        # One pipeline per checkpoint: a llama.cpp template reaches it as the request's `chat_template`, which
        # goes through the same compile-and-render path as `--chat-template` (see test_chat_template_option_path),
        # without paying the pipeline start-up (tokenizer copy, fingerprint) once per template.
        if name not in self._pipelines:
            self._pipelines[name] = RenderPipeline.load(
                RenderOptions(model=str(self.folder(name)), allow_request_chat_template=True)
            )
        return self._pipelines[name]

    def checkpoint(self, name: str) -> Outcome:
        key = f"checkpoint:{name}"
        if key not in self.outcomes:
            outcome = Outcome(key)
            self._chat_sweep(outcome, self.pipeline(name), name, template=None)
            self._completion_sweep(outcome, self.pipeline(name), name)
            self.outcomes[key] = outcome
        return self.outcomes[key]

    def template(self, template_name: str) -> Outcome:
        key = f"template:{template_name}"
        if key not in self.outcomes:
            name = checkpoint_for_template(template_name)
            text = TEMPLATE_FILES[template_name].read_text(encoding="utf-8")
            outcome = Outcome(key)
            self._chat_sweep(outcome, self.pipeline(name), name, template=text)
            self.outcomes[key] = outcome
        return self.outcomes[key]

    def _chat_sweep(
        self, outcome: Outcome, pipeline: RenderPipeline, name: str, *, template: str | None
    ) -> None:
        folder = self.folder(name)
        tokenizer = reference.load_tokenizer(str(folder))
        for case in corpus.CHAT:
            body = case.body if template is None else {**case.body, "chat_template": template}
            expected = reference.reference_chat(folder, case.body, template)
            got, error = _render(lambda body=body: _render_as_served(pipeline, body))
            outcome.compared += 1
            if expected.error is None:
                outcome.reference_renders += 1
                outcome.basic_renders |= case.id == "system_user"
            else:
                outcome.reference_errors[case.id] = _short(expected.error)
            self._judge(outcome, case.id, expected, got[0].token_ids if got else None, error, tokenizer)

    def _completion_sweep(self, outcome: Outcome, pipeline: RenderPipeline, name: str) -> None:
        folder = self.folder(name)
        tokenizer = reference.load_tokenizer(str(folder))
        for case in corpus.COMPLETIONS:
            expected_items = reference.reference_completion(folder, case.body)
            got, error = _render(
                lambda case=case: pipeline.render_completion(CompletionRequest.model_validate(case.body))
            )
            if got is not None and len(got) != len(expected_items):
                outcome.compared += 1
                outcome.failures.append(
                    f"[completion {case.id}] {len(got)} prompts rendered, expected {len(expected_items)}"
                )
                continue
            for index, expected in enumerate(expected_items):
                outcome.compared += 1
                outcome.reference_renders += 1
                self._judge(
                    outcome,
                    f"completion {case.id}[{index}]",
                    expected,
                    got[index].token_ids if got else None,
                    error,
                    tokenizer,
                )

    @staticmethod
    def _judge(
        outcome: Outcome,
        case_id: str,
        expected: reference.Reference,
        got: list[int] | None,
        error: BaseException | None,
        tokenizer: Any,
    ) -> None:
        if expected.error is not None:
            if isinstance(error, RenderError):
                outcome.both_raise += 1
            elif error is not None:
                outcome.failures.append(
                    f"[{case_id}] transformers raised ({_short(expected.error)}) and tokenfront raised a non-400 "
                    f"error: {_short(error)}"
                )
            else:
                outcome.failures.append(
                    f"[{case_id}] transformers raised ({_short(expected.error)}) but tokenfront rendered "
                    f"{len(got or [])} ids: {tokenizer.decode((got or [])[:60])!r}..."
                )
            return
        assert expected.ids is not None
        if error is not None:
            outcome.failures.append(
                f"[{case_id}] transformers rendered {len(expected.ids)} ids but tokenfront raised {_short(error)}\n"
                f"  transformers text (head): {(expected.text or '')[:300]!r}"
            )
        elif got == expected.ids:
            outcome.equal += 1
        else:
            outcome.failures.append(_diff(case_id, expected.ids, got or [], expected.text, tokenizer))


def _render_as_served(pipeline: RenderPipeline, body: dict[str, Any]) -> list[RenderedPrompt]:
    """Render as the servers do: the JSON body parsed once, validated, and handed over with the model."""
    parsed = json.loads(json.dumps(body))
    return [pipeline.render_chat(ChatCompletionRequest.model_validate(parsed), body=parsed)]


def _render(call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        result = call()
    except Exception as exc:
        return None, exc
    return (result if isinstance(result, list) else [result]), None


# Named templates (`default` + `tool_use`), as a tokenizer_config.json list or as additional_chat_templates/.
NAMED_TEMPLATE_VARIANTS = ("qwen3-named-in-config", "qwen3-named-in-files")
DEFAULT_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct"
TOOL_USE_TEMPLATE = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"


@pytest.fixture(scope="session")
def sweep(
    checkpoint: Callable[[str], Path],
    parity_outcomes: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> ParitySweep:
    parity = ParitySweep(checkpoint, parity_outcomes)
    parity.add_checkpoint(
        GPTOSS_TEMPLATE_CHECKPOINT,
        _tokenizer_only_checkpoint(
            checkpoint("gptoss-bare"), tmp_path_factory.mktemp(GPTOSS_TEMPLATE_CHECKPOINT)
        ),
    )
    if {DEFAULT_TEMPLATE, TOOL_USE_TEMPLATE} <= set(TEMPLATE_FILES):
        for variant in NAMED_TEMPLATE_VARIANTS:
            folder = _named_templates_checkpoint(
                checkpoint("qwen3"), tmp_path_factory.mktemp(variant), variant
            )
            parity.add_checkpoint(variant, folder)
    return parity


def _tokenizer_only_checkpoint(base: Path, folder: Path) -> Path:
    # The tokenizer files alone: no config.json, so no model type and no Harmony; templates render as usual.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).symlink_to(base / name)
    return folder


def _named_templates_checkpoint(base: Path, folder: Path, variant: str) -> Path:
    default = TEMPLATE_FILES[DEFAULT_TEMPLATE].read_text(encoding="utf-8")
    tool_use = TEMPLATE_FILES[TOOL_USE_TEMPLATE].read_text(encoding="utf-8")
    for name in ("tokenizer.json", "config.json"):
        (folder / name).symlink_to(base / name)
    config = json.loads((base / "tokenizer_config.json").read_text(encoding="utf-8"))
    if variant == "qwen3-named-in-config":
        config["chat_template"] = [
            {"name": "default", "template": default},
            {"name": "tool_use", "template": tool_use},
        ]
    else:
        config.pop("chat_template", None)
        (folder / "chat_template.jinja").write_text(default, encoding="utf-8")
        (folder / "additional_chat_templates").mkdir()
        (folder / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


# -- the sweep tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_checkpoint_parity(sweep: ParitySweep, name: str) -> None:
    """The checkpoint's own template on every chat request, and every completions request."""
    outcome = sweep.checkpoint(name)
    assert outcome.compared == len(corpus.CHAT) + sum(
        len(reference.reference_completion(sweep.folder(name), case.body)) for case in corpus.COMPLETIONS
    )
    if outcome.failures:
        pytest.fail(outcome.report(), pytrace=False)


@pytest.mark.parametrize("variant", NAMED_TEMPLATE_VARIANTS)
def test_named_templates_parity(sweep: ParitySweep, variant: str) -> None:
    """A checkpoint with `default` and `tool_use` templates: the same one is chosen as transformers chooses."""
    if {DEFAULT_TEMPLATE, TOOL_USE_TEMPLATE} - set(TEMPLATE_FILES):
        pytest.skip("llama.cpp templates not available")
    outcome = sweep.checkpoint(variant)
    assert outcome.compared == len(corpus.CHAT) + sum(
        len(reference.reference_completion(sweep.folder(variant), case.body)) for case in corpus.COMPLETIONS
    )
    if outcome.failures:
        pytest.fail(outcome.report(), pytrace=False)


@pytest.mark.parametrize("template_name", sorted(TEMPLATE_FILES) or ["<no templates>"])
def test_llama_cpp_template_parity(sweep: ParitySweep, template_name: str) -> None:
    """A llama.cpp template, paired with a fitting fixture tokenizer, on every chat request."""
    if template_name not in TEMPLATE_FILES:
        pytest.fail(
            "the llama.cpp templates are not available: run `tokenfront fixtures` once with registry access"
        )
    outcome = sweep.template(template_name)
    assert outcome.compared == len(corpus.CHAT)
    if outcome.failures:
        pytest.fail(outcome.report(), pytrace=False)


def test_parity_totals(sweep: ParitySweep) -> None:
    """Every checkpoint and template was compared; enough templates render under transformers."""
    outcomes = [sweep.checkpoint(name) for name in CHECKPOINTS]
    templates = [sweep.template(name) for name in sorted(TEMPLATE_FILES)]
    outcomes += templates
    compared = sum(o.compared for o in outcomes)
    rendering = [o for o in templates if o.basic_renders]
    print(
        f"\nrender parity: {compared} template x request pairs compared; "
        f"{sum(o.equal for o in outcomes)} equal, {sum(o.both_raise for o in outcomes)} refused by both; "
        f"{len(rendering)} of {len(templates)} llama.cpp templates render a system + user chat under transformers"
    )
    assert len(templates) >= 65
    assert len(rendering) >= MIN_RENDERING_TEMPLATES
    assert compared >= (len(CHECKPOINTS) + len(templates)) * len(corpus.CHAT)
    # Each refusal is the template's own decision, so transformers must actually refuse some requests ...
    assert sum(o.both_raise for o in outcomes) > 0
    # ... and both the ids path and the refusal path agree everywhere.
    assert sum(len(o.failures) for o in outcomes) == 0, "see the failing per-template tests"


# -- the --chat-template path and the spec's own examples -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "template_name"), [("qwen3", "Qwen3-Coder"), ("llama3_1", "meta-llama-Llama-3.1-8B-Instruct")]
)
def test_chat_template_option_path(
    checkpoint: Callable[[str], Path], sweep: ParitySweep, name: str, template_name: str
) -> None:
    """`--chat-template TEXT` renders exactly what the per-request template path of the sweep renders."""
    if template_name not in TEMPLATE_FILES:
        pytest.skip("llama.cpp templates not available")
    text = TEMPLATE_FILES[template_name].read_text(encoding="utf-8")
    pipeline = RenderPipeline.load(RenderOptions(model=str(checkpoint(name)), chat_template=text))
    for case in corpus.CHAT:
        expected = reference.reference_chat(checkpoint(name), case.body, text)
        got, error = _render(
            lambda case=case: pipeline.render_chat(ChatCompletionRequest.model_validate(case.body))
        )
        if expected.error is not None:
            assert isinstance(error, RenderError), (case.id, expected.error, error)
        else:
            assert error is None, (case.id, error)
            assert got[0].token_ids == expected.ids, case.id


def test_spec_content_parts_example(sweep: ParitySweep, qwen3: Path) -> None:
    """docs/contract.md §3: Qwen3 joins text parts with a newline (it is a string-format template)."""
    pipeline = sweep.pipeline("qwen3")
    request = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "First part."},
                        {"type": "text", "text": "Second part."},
                    ],
                }
            ]
        }
    )
    rendered = pipeline.render_chat(request)
    assert "<|im_start|>user\nFirst part.\nSecond part.<|im_end|>\n" in (rendered.prompt_text or "")
    assert rendered.token_ids == reference.reference_chat(qwen3, request.model_dump(exclude_unset=True)).ids


def test_reference_text_examples(sweep: ParitySweep) -> None:
    """The ids the reference text quotes for Qwen3."""
    pipeline = sweep.pipeline("qwen3")
    chat = pipeline.render_chat(
        ChatCompletionRequest.model_validate(
            {
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Name three primary colors."},
                ]
            }
        )
    )
    assert chat.token_ids[:6] == [151644, 8948, 198, 2610, 525, 50537]
    [completion] = pipeline.render_completion(
        CompletionRequest.model_validate({"prompt": "The capital of France is"})
    )
    assert completion.token_ids == [785, 6722, 315, 9625, 374]


def test_template_pairing() -> None:
    assert checkpoint_for_template("Qwen3-Coder") == "qwen3"
    assert checkpoint_for_template("openai-gpt-oss-120b") == GPTOSS_TEMPLATE_CHECKPOINT
    assert checkpoint_for_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B") == "deepseek_v3"
    assert checkpoint_for_template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B") == "llama3"
    assert checkpoint_for_template("meta-llama-Llama-3.3-70B-Instruct") == "llama3_1"
    assert checkpoint_for_template("google-gemma-2-2b-it") == "gemma3"
    assert checkpoint_for_template("llama-cpp-rwkv-world") == "qwen3"
    assert re.fullmatch(r"[a-z0-9_]+", checkpoint_for_template("anything"))


# -- the normalization inputs: the template facts vLLM's message parsing decides on ---------------------------


def _all_template_sources(checkpoint: Callable[[str], Path]) -> dict[str, str]:
    sources = {f"template:{name}": path.read_text(encoding="utf-8") for name, path in TEMPLATE_FILES.items()}
    for name in CHECKPOINTS:
        tokenizer = reference.load_tokenizer(str(checkpoint(name)))
        if (
            tokenizer.chat_template is not None
        ):  # tekken.json folders carry none (Mistral's is mistral-common)
            sources[f"checkpoint:{name}"] = reference.template_source(tokenizer, None, None)
    return sources


def test_content_format_matches_vllm(checkpoint: Callable[[str], Path]) -> None:
    """The parity reference takes the content format from tokenfront; check it against vLLM's own rule."""
    differ = [
        f"{key}: tokenfront {compile_template(source).content_format!r}, vLLM {reference.vllm_content_format(source)!r}"
        for key, source in _all_template_sources(checkpoint).items()
        if compile_template(source).content_format != reference.vllm_content_format(source)
    ]
    if differ:
        pytest.fail("\n".join(differ), pytrace=False)


def test_developer_role_detection_matches_vllm(checkpoint: Callable[[str], Path]) -> None:
    """A template "knows" the developer role when it names it as a string (vLLM); a mere mention is not enough."""
    differ = [
        f"{key}: tokenfront {compile_template(source).knows_developer_role}, "
        f"vLLM {reference.vllm_knows_developer_role(source)}"
        for key, source in _all_template_sources(checkpoint).items()
        if compile_template(source).knows_developer_role != reference.vllm_knows_developer_role(source)
    ]
    if differ:
        pytest.fail("\n".join(differ), pytrace=False)

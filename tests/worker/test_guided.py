"""Grammar-constrained decoding for named tool_choice (worker/guided.py) on real models, no mocks.

Generation is driven here by a plain loop over the model's logits, applying the constraint at every step as
the engine does: the random-weight `tiny-random` model shows that any model yields valid arguments, the real
SmolLM2-135M-Instruct that a forced hermes call comes out right.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from tokenfront import fixtures
from tokenfront.core.errors import RenderError
from tokenfront.core.tool_calls import get_tool_call_parser
from tokenfront.worker.guided import GuidedDecoding, JsonSchemaConstraint

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"],
}

NESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "lang": {"type": "string", "minLength": 2, "maxLength": 5},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        "score": {"type": "number"},
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
        "filter": {
            "type": "object",
            "properties": {
                "field": {"type": "string", "enum": ["name", "date"]},
                "values": {"type": "array", "items": {"type": "boolean"}},
                "nested": {
                    "type": "object",
                    "properties": {"depth": {"type": "integer"}},
                    "required": ["depth"],
                },
            },
            "required": ["field", "values", "nested"],
        },
    },
    "required": ["query", "lang", "limit", "score", "exact", "tags", "filter"],
}

SEEDS = [None, 0, 1, 2, 3]  # None: greedy


# ---------------------------------------------------------------------------- a tiny JSON Schema validator


def schema_errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """What is wrong with ``value`` under ``schema``: just the keywords these tests use (no jsonschema dep)."""
    errors: list[str] = []
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    if kind is not None and not checks[kind](value):
        return [f"{path}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str) and not schema.get("minLength", 0) <= len(value) <= schema.get(
        "maxLength", len(value)
    ):
        errors.append(f"{path}: {len(value)} characters")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > {schema['maximum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected {key!r}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{path}: {len(value)} items")
        for index, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{index}]")
    return errors


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with ``additionalProperties: false`` on every object: what the grammar enforces."""
    result = dict(schema)
    if "properties" in result:
        result["properties"] = {key: strict(sub) for key, sub in result["properties"].items()}
        result.setdefault("additionalProperties", False)
    if isinstance(result.get("items"), dict):
        result["items"] = strict(result["items"])
    return result


def test_the_validator_itself() -> None:
    good = {"city": "Paris", "unit": "c"}
    assert schema_errors(good, strict(WEATHER_SCHEMA)) == []
    assert schema_errors({"city": "Paris"}, WEATHER_SCHEMA) == ["$: missing 'unit'"]
    assert schema_errors({"city": 1, "unit": "k"}, WEATHER_SCHEMA) == [
        "$.city: 1 is not of type string",
        "$.unit: 'k' not in ['c', 'f']",
    ]
    assert schema_errors({**good, "x": 1}, strict(WEATHER_SCHEMA)) == ["$: unexpected 'x'"]
    assert schema_errors({"tags": [True]}, {"properties": {"tags": NESTED_SCHEMA["properties"]["tags"]}})


# ---------------------------------------------------------------------------- models and generation


@dataclass
class Model:
    tokenizer: Any
    model: Any
    guided: GuidedDecoding


def _checkpoint(name: str) -> Path:
    try:
        return fixtures.ensure_checkpoint(name)
    except Exception as error:  # FixtureError, or the worker extra missing to build it
        pytest.skip(
            f"fixture checkpoint {name!r} is not available ({error}); build it with the fixture script"
        )


def _load(name: str) -> Model:
    folder = _checkpoint(name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return Model(tokenizer, model, GuidedDecoding(tokenizer, model.config.vocab_size))


@pytest.fixture(scope="module")
def tiny() -> Model:
    """The `tiny-random` fixture: a 2-layer random-weight Llama on the SmolLM2 tokenizer."""
    return _load("tiny-random")


@pytest.fixture(scope="module")
def smol() -> Model:
    """The real SmolLM2-135M-Instruct."""
    return _load("smollm2")


@dataclass
class Generated:
    token_ids: list[int]
    text: str
    finished: bool


def generate(
    model: Model,
    constraint: JsonSchemaConstraint,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    seed: int | None = None,
    pad_to: int | None = None,
) -> Generated:
    """Decode under ``constraint`` as the engine does: greedy (seed None) or seeded sampling at T=1.

    ``pad_to`` widens the logits to a padded vocabulary, the padded rows given a huge logit: only the mask
    keeps them from being chosen.
    """
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    ids = torch.tensor([prompt_ids])
    out: list[int] = []
    with torch.no_grad():
        while not constraint.is_finished() and len(out) < max_tokens:
            logits = model.model(input_ids=ids, cache=cache, use_cache=True).logits[0, -1].float()
            if pad_to is not None:
                logits = torch.cat([logits, torch.full((pad_to - logits.shape[0],), 1e4)])
            constraint.mask_logits(logits)
            if generator is None:
                token_id = int(torch.argmax(logits))
            else:
                token_id = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))
            constraint.accept(token_id)
            out.append(token_id)
            ids = torch.tensor([[token_id]])
    return Generated(out, model.tokenizer.decode(out), constraint.is_finished())


def prompt_ids(model: Model, text: str) -> list[int]:
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


def mask_of(constraint: JsonSchemaConstraint) -> torch.Tensor:
    """Which ids the constraint allows next (bool, over the vocabulary)."""
    logits = torch.zeros(constraint.vocab_size)
    constraint.mask_logits(logits)
    return logits > float("-inf")


def accept_text(model: Model, constraint: JsonSchemaConstraint, text: str) -> None:
    for token_id in prompt_ids(model, text):
        constraint.accept(token_id)


# ---------------------------------------------------------------------------- a random model, valid JSON


@pytest.mark.parametrize("seed", SEEDS)
def test_random_model_writes_valid_weather_arguments(tiny: Model, seed: int | None) -> None:
    budget = 48
    constraint = tiny.guided.json_schema(WEATHER_SCHEMA, max_tokens=budget)
    result = generate(tiny, constraint, prompt_ids(tiny, "Weather in Paris?"), max_tokens=budget, seed=seed)
    assert result.finished, result.text
    assert len(result.token_ids) <= budget
    value = json.loads(result.text)
    assert schema_errors(value, strict(WEATHER_SCHEMA)) == [], result.text
    # Compact, in the schema's order, the separators of json.dumps: no whitespace left to the model.
    assert result.text == json.dumps(value, ensure_ascii=False)
    assert list(value) == ["city", "unit"]


# 10 is the fewest SmolLM2 tokens that spell the shortest valid object, {"city": "", "unit": "c"}.
@pytest.mark.parametrize("budget", [10, 11, 12, 16, 24])
@pytest.mark.parametrize("seed", [None, 7])
def test_a_tight_budget_still_closes_the_json(tiny: Model, budget: int, seed: int | None) -> None:
    # Without a budget this model rambles inside "city" for hundreds of tokens (greedy never stops): the
    # constraint cuts the string short in time to write the rest of the object.
    constraint = tiny.guided.json_schema(WEATHER_SCHEMA, max_tokens=budget)
    result = generate(tiny, constraint, prompt_ids(tiny, "Weather?"), max_tokens=budget, seed=seed)
    assert result.finished, result.text
    assert len(result.token_ids) <= budget
    assert schema_errors(json.loads(result.text), strict(WEATHER_SCHEMA)) == [], result.text


def test_without_a_budget_max_tokens_is_the_bound(tiny: Model) -> None:
    # The documented fallback: no max_tokens given to the constraint, the engine's max_tokens stops the
    # sequence ("length") with incomplete JSON; the grammar never lets the model out of it meanwhile.
    constraint = tiny.guided.json_schema(WEATHER_SCHEMA)
    result = generate(tiny, constraint, prompt_ids(tiny, "Weather?"), max_tokens=40, seed=1)
    assert not result.finished
    assert len(result.token_ids) == 40
    assert result.text.startswith('{"city": "')


def test_a_budget_below_the_shortest_object_is_best_effort(tiny: Model) -> None:
    constraint = tiny.guided.json_schema(WEATHER_SCHEMA, max_tokens=3)
    result = generate(tiny, constraint, prompt_ids(tiny, "Weather?"), max_tokens=3)
    assert not result.finished
    # It went straight for the shortest completion, which takes 10 tokens: it got as far as it could.
    assert len(result.token_ids) == 3
    assert '{"city": "", "unit": "c"}'.startswith(result.text)


@pytest.mark.parametrize("schema", [None, {}, {"type": "object"}, {"description": "anything"}])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_no_schema_means_any_object(tiny: Model, schema: dict[str, Any] | None, seed: int | None) -> None:
    constraint = tiny.guided.json_schema(schema, max_tokens=40)
    result = generate(tiny, constraint, prompt_ids(tiny, "Arguments:"), max_tokens=40, seed=seed)
    assert result.finished, result.text
    assert isinstance(json.loads(result.text), dict), result.text


# 56 tokens spell the shortest valid object here.
@pytest.mark.parametrize("budget", [60, 100])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_nested_objects_arrays_numbers_booleans(tiny: Model, seed: int | None, budget: int) -> None:
    constraint = tiny.guided.json_schema(NESTED_SCHEMA, max_tokens=budget)
    result = generate(tiny, constraint, prompt_ids(tiny, "Search:"), max_tokens=budget, seed=seed)
    assert result.finished, result.text
    value = json.loads(result.text)
    assert schema_errors(value, strict(NESTED_SCHEMA)) == [], result.text
    assert isinstance(value["exact"], bool)
    assert isinstance(value["filter"]["nested"]["depth"], int)
    assert all(isinstance(v, bool) for v in value["filter"]["values"])


def test_the_json_grammar_itself_on_handwritten_arguments(tiny: Model) -> None:
    # Token by token through the tokenizer's own encoding: valid text is accepted and finishes exactly at
    # the closing brace; the mask then allows only the stop token; a wrong token is an engine bug.
    text = json.dumps(
        {
            "query": 'a\\"b\u00e9\n',  # json.dumps escapes the backslash, the quote, the é and the newline
            "lang": "en-GB",
            "limit": 50,
            "score": -1.5e3,
            "exact": False,
            "tags": [0, 2.25],
            "filter": {"field": "date", "values": [], "nested": {"depth": -3}},
        }
    )
    constraint = tiny.guided.json_schema(NESTED_SCHEMA)
    ids = prompt_ids(tiny, text)
    stop = list(tiny.guided.stop_token_ids)
    for index, token_id in enumerate(ids):
        assert not constraint.is_finished()
        allowed = mask_of(constraint)
        assert allowed[token_id], (index, tiny.tokenizer.decode(ids[: index + 1]))
        assert not allowed[stop].any()  # no ending inside the JSON
        constraint.accept(token_id)
    assert constraint.is_finished()
    assert mask_of(constraint).nonzero().flatten().tolist() == stop

    constraint = tiny.guided.json_schema(WEATHER_SCHEMA)
    with pytest.raises(RuntimeError, match="mask_logits"):
        constraint.accept(prompt_ids(tiny, "hello")[0])


# ---------------------------------------------------------------------------- SmolLM2: a forced hermes call


def test_smollm2_forced_hermes_call_to_get_weather(smol: Model) -> None:
    parser = get_tool_call_parser("hermes")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    messages = [
        {"role": "system", "content": "You can call get_weather(city: string, unit: 'c' or 'f')."},
        {"role": "user", "content": "What's the weather in Paris in celsius?"},
    ]
    # The checkpoint's real chat template (it ignores `tools`), then the forced-call prefix as the worker
    # appends it.
    rendered = smol.tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    prefix = parser.forced_call_prefix("get_weather")
    constraint = smol.guided.json_schema(WEATHER_SCHEMA, max_tokens=64)
    result = generate(smol, constraint, prompt_ids(smol, rendered + prefix), max_tokens=64)
    assert result.finished, result.text

    parsed = parser.parse(prefix + result.text + parser.forced_call_suffix)
    assert parsed.content is None
    assert [call.name for call in parsed.calls] == ["get_weather"]
    arguments = json.loads(parsed.calls[0].arguments)
    assert schema_errors(arguments, strict(WEATHER_SCHEMA)) == []
    # Greedy on the real model: it understood the question.
    assert arguments == {"city": "Paris", "unit": "c"}


def test_overhead_per_step_on_the_smollm2_vocabulary(smol: Model, capsys: pytest.CaptureFixture[str]) -> None:
    # mask_logits + accept + is_finished on a 49152-wide logits row, replaying a long valid output.
    text = json.dumps({"city": "San Francisco de la Nueva Esperanza del Valle " * 4, "unit": "c"})
    ids = prompt_ids(smol, text)
    logits = torch.randn(smol.guided.vocab_size)
    timings: dict[str, float] = {}
    for label, budget in [("no budget", None), ("budget, closing checks every step", len(ids) + 12)]:
        best = float("inf")
        for _ in range(5):  # the best of 5: the machine may be busy
            constraint = smol.guided.json_schema(WEATHER_SCHEMA, max_tokens=budget)
            steps = []
            for token_id in ids:
                row = logits.clone()
                start = time.perf_counter()
                constraint.mask_logits(row)
                constraint.accept(token_id)
                constraint.is_finished()
                steps.append(time.perf_counter() - start)
            assert constraint.is_finished()
            best = min(best, statistics.median(steps))
        timings[label] = best
    with capsys.disabled():
        print("\nguided decoding overhead per step (median, smollm2 vocab 49152): ", end="")
        print(", ".join(f"{label} {seconds * 1e3:.3f} ms" for label, seconds in timings.items()))
    # Loose: a 135M model step on CPU takes tens of milliseconds.
    assert max(timings.values()) < 0.005


# ---------------------------------------------------------------------------- vocabulary edges


def test_padded_vocabulary_rows_are_never_chosen(tiny: Model) -> None:
    # A model whose lm_head is wider than the tokenizer (config.vocab_size padded; 40 rows, so the last
    # bitmask word is partial). The padded logits are huge, so only the mask keeps them out.
    real = len(tiny.tokenizer)
    padded = real + 40
    guided = GuidedDecoding(tiny.tokenizer, padded)
    for seed in [None, 0]:
        constraint = guided.json_schema(WEATHER_SCHEMA, max_tokens=40)
        result = generate(
            tiny, constraint, prompt_ids(tiny, "Weather?"), max_tokens=40, seed=seed, pad_to=padded
        )
        assert result.finished
        assert max(result.token_ids) < real
        assert schema_errors(json.loads(result.text), strict(WEATHER_SCHEMA)) == []
    constraint = guided.json_schema(None)
    accept_text(tiny, constraint, '{"a": "')
    assert not mask_of(constraint)[real:].any()


def test_special_tokens_are_never_allowed_even_inside_strings(tiny: Model) -> None:
    constraint = tiny.guided.json_schema(WEATHER_SCHEMA)
    accept_text(tiny, constraint, '{"city": "Par')
    allowed = mask_of(constraint)
    special = tiny.tokenizer.all_special_ids
    assert special and not allowed[special].any()
    assert allowed[prompt_ids(tiny, "is")].all()


def test_no_free_whitespace_between_tokens(tiny: Model) -> None:
    constraint = tiny.guided.json_schema(None)
    decode = tiny.tokenizer.decode
    allowed = mask_of(constraint).nonzero().flatten().tolist()
    assert allowed and all(decode([i]).startswith("{") for i in allowed)
    accept_text(tiny, constraint, '{"a": 1')
    allowed = mask_of(constraint).nonzero().flatten().tolist()
    # Only "," (then exactly one space) or "}" may follow a value: never a leading space or newline.
    assert allowed and all(decode([i])[0] in ",}0123456789.eE" for i in allowed)
    assert not any(decode([i]).startswith((",  ", ",\n")) for i in allowed)


def test_non_contiguous_logits_are_masked_in_place(tiny: Model) -> None:
    constraint = tiny.guided.json_schema(WEATHER_SCHEMA)
    table = torch.zeros(tiny.guided.vocab_size, 2)
    column = table[:, 0]
    assert not column.is_contiguous()
    constraint.mask_logits(column)
    assert torch.equal(column > float("-inf"), mask_of(tiny.guided.json_schema(WEATHER_SCHEMA)))
    with pytest.raises(ValueError, match="width"):
        constraint.mask_logits(torch.zeros(10))


# ---------------------------------------------------------------------------- schemas: errors and the cache


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "nonsense"}, 'must describe a JSON object ("type": "object"), got "type": "nonsense"'),
        ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, 'Unsupported type "nonsense"'),
        ({"type": "string"}, 'must describe a JSON object ("type": "object"), got "type": "string"'),
        ({"type": "object", "required": "city"}, "required must be an array"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
        ({"type": "object", "properties": {"n": {"type": "integer", "minimum": "x"}}}, "must be a number"),
        (["not", "a", "schema"], "must be a JSON Schema object, got list"),
        ({"type": "object", "default": float("nan")}, "not a JSON Schema"),
    ],
)
def test_invalid_schemas_are_a_400(tiny: Model, schema: Any, message: str) -> None:
    with pytest.raises(RenderError) as caught:
        tiny.guided.json_schema(schema)
    assert caught.value.status_code == 400
    assert caught.value.code == "invalid_json_schema"
    assert message in caught.value.message
    # xgrammar's C++ log header is not part of a client's message.
    assert ".cc:" not in caught.value.message


def test_compiled_grammars_are_cached(tiny: Model) -> None:
    guided = tiny.guided
    schema = {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}
    before = guided.compilations
    first = guided.json_schema(json.loads(json.dumps(schema)))
    second = guided.json_schema(json.loads(json.dumps(schema)))
    assert guided.compilations == before + 1
    # One compiled grammar, two independent sequences.
    accept_text(tiny, first, '{"q": "x"}')
    assert first.is_finished() and not second.is_finished()
    # None, {} and {"type": "object"} are one grammar.
    guided.json_schema(None)
    count = guided.compilations
    guided.json_schema({})
    guided.json_schema({"type": "object"})
    assert guided.compilations == count
    # Property order is generation order: a reordered schema is another grammar.
    guided.json_schema({**schema, "properties": dict(reversed(schema["properties"].items()))})
    assert guided.compilations == count + 1


def test_the_cache_is_bounded(tiny: Model) -> None:
    guided = GuidedDecoding(tiny.tokenizer, tiny.guided.vocab_size, cache_size=2)
    for name in ["a", "b", "c", "a"]:
        guided.json_schema({"type": "object", "properties": {name: {"type": "string"}}})
    # "a" was evicted by "c" and compiled again.
    assert guided.compilations == 4

"""Bounded grammar compiles and a bounded long-prompt echo on the worker (issue 17, item 3), no mocks.

The schema checks (worker/schema_limits.py) run on schemas alone; the compile budgets on the real xgrammar
with SmolLM2's tokenizer; the issue's cases end to end on a real `tokenfront serve` on SmolLM2 with the hermes
tool-call parser, whose `/health` is polled and whose resident memory is read from /proc while each request
runs. Times are never asserted (`python -m benchmarks.health_latency --only worker_grammar_and_echo` measures
them; docs/robustness.md#grammar-limits has the figures).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from benchmarks.grammar_schemas import (
    largest_allowed_schema,
    named_tool_body,
    over_limit_schemas,
    schema_depth,
)
from transformers import AutoTokenizer

from tokenfront.core.errors import RenderError
from tokenfront.worker.guided import COMPILE_TIMEOUT_CODE, GuidedDecoding
from tokenfront.worker.schema_limits import SCHEMA_LIMITS, SchemaLimits, check_schema

L = SCHEMA_LIMITS
WHERE = "tools[0].function.parameters"
# The worker's resident memory may grow by at most this much over its warmed-up size while a request runs
# (docs/robustness.md#grammar-limits): a grammar compile within the limits measured +20 to +61 MB;
# a 7,000-id prompt: its KV (46 KB a token on SmolLM2 in float32, 322 MB), the prefix cache's copy of it and
# the prefill's transients, +0.84 to +1.13 GB.
GRAMMAR_RSS_CAP = 256 * 1024 * 1024
ECHO_RSS_CAP = 1536 * 1024 * 1024
ECHO_PROMPT_IDS = 7_000


def _object(properties: dict[str, Any], required: list[str] | None = None, **more: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, **more}
    if required is not None:
        schema["required"] = required
    return schema


def _strings(count: int, prefix: str = "p") -> dict[str, Any]:
    return {f"{prefix}{i}": {"type": "string"} for i in range(count)}


def _refused(schema: Any, limits: SchemaLimits = L) -> RenderError:
    with pytest.raises(RenderError) as caught:
        check_schema(schema, WHERE, limits)
    error = caught.value
    assert error.status_code == 400 and error.code == "schema_limit" and error.param == WHERE
    return error


# ---------------------------------------------------------------------------- the checks, on schemas alone


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (_object({"a": {"$ref": "#"}}, ["a"]), 'properties.a ($ref "#") contains itself'),
        (
            _object(
                {"head": {"$ref": "#/$defs/node"}},
                ["head"],
                **{"$defs": {"node": _object({"next": {"$ref": "#/$defs/node"}}, ["next"])}},
            ),
            'properties.head ($ref "#/$defs/node") contains itself',
        ),
        (
            _object({"kids": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}}, ["kids"]),
            'properties.kids.items ($ref "#") contains itself',
        ),
        ({"type": "object", "allOf": [{"$ref": "#"}]}, 'allOf[0] ($ref "#") contains itself'),
        # Optional at the root, but once the model writes "a" every match recurses forever: refused too.
        (
            _object(
                {"a": {"$ref": "#/$defs/loop"}},
                **{"$defs": {"loop": _object({"b": {"$ref": "#/$defs/loop"}}, ["b"])}},
            ),
            'properties.a ($ref "#/$defs/loop") contains itself',
        ),
    ],
)
def test_a_recursion_every_match_takes_is_refused_naming_the_ref(schema: dict[str, Any], named: str) -> None:
    error = _refused(schema)
    assert f"{WHERE}.{named} in every match: no finite JSON matches it" in error.message


@pytest.mark.parametrize(
    "schema",
    [
        _object(
            {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}, ["name"]
        ),
        _object({"a": {"$ref": "#"}}),  # optional
        _object(
            {"head": {"$ref": "#/$defs/node"}},
            ["head"],
            **{
                "$defs": {
                    "node": {
                        "anyOf": [{"type": "null"}, _object({"next": {"$ref": "#/$defs/node"}}, ["next"])]
                    }
                }
            },
        ),
    ],
)
def test_a_recursion_with_a_way_out_is_allowed(schema: dict[str, Any]) -> None:
    check_schema(schema, WHERE)


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = _object({"x": schema}, ["x"])
    return schema


def test_each_counting_limit_is_a_400_naming_it_and_the_path() -> None:
    cases: list[tuple[Any, str]] = [
        (
            _nested(200),
            f"is nested {L.max_depth + 1} levels deep; the worker compiles schemas nested at most {L.max_depth}",
        ),
        (_object({"e": {"enum": list(range(L.max_nodes))}}), f"has more than {L.max_nodes} JSON values"),
        (
            _object({"o": _object(_strings(L.max_object_properties + 1))}),
            f"{WHERE}.properties.o has {L.max_object_properties + 1} properties; the worker compiles objects of at "
            f"most {L.max_object_properties}",
        ),
        (
            _object({f"o{j}": _object(_strings(100)) for j in range(L.max_properties // 100 + 1)}),
            f"has more than {L.max_properties} properties in all",
        ),
        (
            _object(_strings(L.max_counted_properties + 1), minProperties=1),
            f"sets minProperties on an object of {L.max_counted_properties + 1} properties",
        ),
        (
            _object({"e": {"enum": [f"v{i}" for i in range(L.max_enum_values + 1)]}}),
            f"{WHERE}.properties.e.enum has {L.max_enum_values + 1} values; the worker compiles enums of at most "
            f"{L.max_enum_values}",
        ),
        (
            _object({f"e{j}": {"enum": ["x" * 100] * 100} for j in range(L.max_literal_chars // 10_000 + 1)}),
            f"has more than {L.max_literal_chars} literal characters in all",
        ),
        (
            _object({f"s{i}": {"type": "string", "format": "email"} for i in range(L.max_patterns + 1)}),
            f"has more than {L.max_patterns} patterns and formats",
        ),
        (
            _object({"s": {"type": "string", "pattern": "a" * (L.max_pattern_chars + 1)}}),
            f"{WHERE}.properties.s.pattern is {L.max_pattern_chars + 1} characters long",
        ),
        (
            _object({"s": {"type": "string", "pattern": "^a{100000}$"}}),
            f"repeats {{100000}} times; the worker compiles repetition counts of at most {L.max_pattern_repeat}",
        ),
        (
            _object({f"s{i}": {"type": "string", "pattern": "^[a-z]{1,1000}$"} for i in range(5)}),
            f"has more than {L.max_pattern_repeats} pattern repetitions in all",
        ),
        (
            _object(
                {
                    "n": {
                        "anyOf": [{"type": "integer", "minimum": i} for i in range(L.max_bounded_numbers + 1)]
                    }
                }
            ),
            f"has more than {L.max_bounded_numbers} bounded numbers in all",
        ),
        (
            # {"a": [...]}: 7 bytes, and the array's "[]", 999 ", " and 1,000 consts of 102 bytes.
            _object({"a": {"type": "array", "items": {"const": "x" * 100}, "minItems": 1000}}, ["a"]),
            f"has about 104007 bytes of fixed text (required keys, const and enum values, minItems copies, pattern "
            f"text); the worker compiles schemas whose every part's shortest instance has at most "
            f"{L.max_minimal_instance_bytes}",
        ),
        (  # optional, but forced once the model starts it: 2 + 2 x 9,999 + 10,000 x 12 bytes
            _object({"a": {"type": "array", "items": {"const": "x" * 10}, "minItems": 10_000}}),
            f"the shortest JSON {WHERE}.properties.a allows has about 140000 bytes of fixed text",
        ),
    ]
    for schema, expected in cases:
        assert expected in _refused(schema).message, expected
    assert len(cases) == 14


def test_free_text_is_not_fixed_text_but_a_pattern_is() -> None:
    # A long minLength is the model's to write (nothing forced); a pattern's shortest match is fixed text.
    check_schema(_object({"s": {"type": "string", "minLength": 1_000_000}}, ["s"]), WHERE)
    error = _refused(_object({"s": {"type": "string", "pattern": "^(abcde){1000}$"}}, ["s"]))
    assert "about 5009 bytes of fixed text" in error.message  # {"s": "<5,000 characters>"}


def test_the_issue_schemas_are_refused_and_the_largest_allowed_passes() -> None:
    refusals = {name: _refused(schema).message for name, schema in over_limit_schemas().items()}
    assert "contains itself in every match" in refusals["ref_recursion"]
    assert f"more than {L.max_nodes} JSON values" in refusals["enum_200000"]
    assert f"more than {L.max_nodes} JSON values" in refusals["required_20000"]
    assert f"nested at most {L.max_depth} levels" in refusals["nested_200"]
    assert len(refusals) == 4
    largest = largest_allowed_schema()
    check_schema(largest, WHERE)
    assert schema_depth(largest) == L.max_depth


# ---------------------------------------------------------------------------- compile budgets, on xgrammar


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Callable[[str], Path]) -> Any:
    return AutoTokenizer.from_pretrained(checkpoint("smollm2"))


def _costly_schema(tag: str) -> dict[str, Any]:
    # Four uri-template formats: a few hundred milliseconds of compiling, well within the limits.
    return _object({f"{tag}{i}": {"type": "string", "format": "uri-template"} for i in range(4)})


def test_a_compile_over_the_time_budget_is_a_400_and_its_grammar_is_discarded(tokenizer: Any) -> None:
    guided = GuidedDecoding(tokenizer, 49152, limits=SchemaLimits(compile_seconds=0.05))
    ticks = 0

    async def run() -> RenderError:
        nonlocal ticks
        task = asyncio.ensure_future(guided.compile_off_loop(_costly_schema("a"), where=WHERE))
        while not task.done():  # the loop keeps running while the compile thread works
            ticks += 1
            await asyncio.sleep(0)
        with pytest.raises(RenderError) as caught:
            task.result()
        return caught.value

    error = asyncio.run(run())
    assert error.code == COMPILE_TIMEOUT_CODE and error.param == WHERE and error.status_code == 400
    assert f"compiling the grammar of {WHERE} took more than 0.05 s" in error.message
    assert ticks > 0
    # Once the compile thread is idle, the late grammar was not kept.
    guided.wait_for_compiles()
    assert guided.compilations == 0 and not guided.cached_grammars


def test_compiles_off_the_loop_are_cached(tokenizer: Any) -> None:
    guided = GuidedDecoding(tokenizer, 49152)

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(guided.compile_off_loop(_costly_schema(tag), where=WHERE) for tag in ("a", "b", "a"))
        )

    first, second, again = asyncio.run(run())
    # "a" twice at once may miss the cache twice (each is checked before either compile ends): 2 or 3.
    assert first is not second and guided.compilations in (2, 3)
    count = guided.compilations
    assert guided.compile(_costly_schema("a"), where=WHERE) in (first, again)
    constraint = guided.constraint(first, max_tokens=64)
    assert constraint.max_tokens == 64 and guided.compilations == count


def test_grammar_memory_is_capped_per_grammar_and_in_the_cache(tokenizer: Any) -> None:
    tiny = GuidedDecoding(tokenizer, 49152, limits=SchemaLimits(max_grammar_bytes=1000))
    with pytest.raises(RenderError) as caught:
        tiny.json_schema(_object(_strings(3)), where=WHERE)
    assert (
        caught.value.code == "schema_limit"
        and "the worker keeps grammars of at most 1000" in caught.value.message
    )
    assert tiny.compilations == 0
    # A cache budget of one grammar: a, b, a compiles three times.
    small = GuidedDecoding(tokenizer, 49152, limits=SchemaLimits(max_cached_grammar_bytes=1))
    for tag in ("a", "b", "a"):
        small.json_schema(_object(_strings(2, tag)))
    assert small.compilations == 3 and small.cached_grammars == 1


def test_an_optional_recursion_still_closes_within_the_budget(tokenizer: Any) -> None:
    guided = GuidedDecoding(tokenizer, 49152)
    schema = _object(
        {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}, ["name"]
    )
    generator = torch.Generator().manual_seed(0)
    outputs = []
    for _ in range(5):
        constraint = guided.json_schema(schema, max_tokens=48)
        ids: list[int] = []
        while not constraint.is_finished() and len(ids) < 64:
            logits = torch.randn(49152, generator=generator)
            constraint.mask_logits(logits)
            token = int(torch.argmax(logits))
            constraint.accept(token)
            ids.append(token)
        assert constraint.is_finished() and len(ids) <= 48
        outputs.append(json.loads(tokenizer.decode(ids)))
    assert all(isinstance(value["name"], str) for value in outputs) and len(outputs) == 5


# ---------------------------------------------------------------------------- the worker, end to end


@dataclass
class Watched:
    """A POST run in a thread while `/health` is polled and the worker's resident memory is read."""

    url: str
    pid: int
    path: str
    body: dict[str, Any]
    health: list[tuple[bool, int]] = field(default_factory=list)  # (request still running, status)
    peak_rss: int = 0
    response: httpx.Response | None = None

    def run(self) -> httpx.Response:
        done = threading.Event()

        def send() -> None:
            try:
                self.response = httpx.post(self.url + self.path, json=self.body, timeout=1800)
            finally:
                done.set()

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not done.is_set():
                self.peak_rss = max(self.peak_rss, resident_bytes(self.pid))
                status = client.get("/health").status_code
                # Still running once /health has answered: the loop answered while the work went on.
                self.health.append((not done.is_set(), status))
                done.wait(0.02)  # between probes, never as "long enough"
        thread.join()
        self.peak_rss = max(self.peak_rss, resident_bytes(self.pid))
        assert self.response is not None
        return self.response

    def health_answered_meanwhile(self) -> int:
        """How many probes answered 200 while the request was still running; every probe answered 200."""
        assert all(status == 200 for _, status in self.health), self.health
        return sum(running for running, _ in self.health)


def resident_bytes(pid: int) -> int:
    """VmRSS of a process, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def worker(
    launch: Callable[..., Any], checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    server = launch(
        ["serve", "--model", str(checkpoint("smollm2")), "--tool-call-parser", "hermes", "--device", "cpu"],
        log_dir=tmp_path_factory.mktemp("guided-limits"),
        timeout=240.0,
    )
    # Warmed up: the weights paged in by a first generation, and a first grammar compiled.
    warm = httpx.post(
        server.url + "/v1/chat/completions", json=named_tool_body(_object(_strings(2))), timeout=600
    )
    assert warm.status_code == 200, warm.text
    yield server
    assert server.stop() == 0


def test_the_issue_schemas_are_400s_at_once_and_the_worker_stays_small(worker: Any) -> None:
    before = resident_bytes(worker.process.pid)
    for name, schema in over_limit_schemas().items():
        watched = Watched(worker.url, worker.process.pid, "/v1/chat/completions", named_tool_body(schema))
        response = watched.run()
        assert response.status_code == 400, (name, response.text)
        error = response.json()["error"]
        assert error["code"] == "schema_limit" and error["param"] == WHERE, (name, error)
        assert WHERE in error["message"], (name, error)
        watched.health_answered_meanwhile()
        assert watched.peak_rss - before < GRAMMAR_RSS_CAP, (name, watched.peak_rss - before)
    assert httpx.get(worker.url + "/health").status_code == 200


def test_the_largest_allowed_schema_compiles_while_health_answers(worker: Any) -> None:
    before = resident_bytes(worker.process.pid)
    watched = Watched(
        worker.url,
        worker.process.pid,
        "/v1/chat/completions",
        named_tool_body(largest_allowed_schema(), max_tokens=4),
    )
    response = watched.run()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("length", "tool_calls")
    assert watched.health_answered_meanwhile() >= 1
    assert watched.peak_rss - before < GRAMMAR_RSS_CAP, watched.peak_rss - before


@pytest.mark.slow  # a 7,000-token prefill on CPU: about a minute on a quiet 2-core machine, minutes on a busy one
def test_echo_of_a_7000_id_prompt_is_answered_with_health_and_memory_bounded(
    worker: Any, checkpoint: Callable[[str], Path]
) -> None:
    rng = random.Random(17)  # a prompt no earlier test sent: nothing of it is in the prefix cache
    ids = [rng.randrange(1000, 40000) for _ in range(ECHO_PROMPT_IDS)]
    before = resident_bytes(worker.process.pid)
    started = time.monotonic()
    watched = Watched(
        worker.url, worker.process.pid, "/v1/completions", {"prompt": ids, "max_tokens": 1, "echo": True}
    )
    response = watched.run()
    assert response.status_code == 200, response.text
    answer = response.json()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint("smollm2"))
    prompt_text = tokenizer.decode(ids, skip_special_tokens=True)
    assert answer["choices"][0]["text"].startswith(prompt_text)
    assert answer["usage"]["prompt_tokens"] == ECHO_PROMPT_IDS and answer["usage"]["completion_tokens"] == 1
    assert watched.health_answered_meanwhile() >= 1, (
        f"no /health answer in {time.monotonic() - started:.0f} s"
    )
    assert watched.peak_rss - before < ECHO_RSS_CAP, watched.peak_rss - before

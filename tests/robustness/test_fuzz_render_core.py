"""Property tests of the render core (issue 10, item 2), in-process: random requests through the pipeline as the
render routes call it, on the qwen3 and llama3 fixture checkpoints.

For every generated request the pipeline either answers or raises one of tokenfront's client errors
(`RenderError`, or `APIError`, which is also what the routes make of a body their request model refuses) —
never anything else, which a server would answer with a 500. Where it answers:

- chat (`/v1/chat/completions/render`), completions and `/tokenize`: the ids are transformers'
  (`tests/core/reference.py`, the parity sweep's reference: `apply_chat_template` on the normalized messages,
  then the tokenizer; prompts through the tokenizer), and transformers does not refuse what tokenfront
  rendered;
- `/detokenize`: ids in the vocabulary decode as transformers' `decode` does, others are a 400;
- `/v1/messages/render` (Anthropic) and `/v1/responses/render`: the conversions (core/requests/) answer or
  refuse (no reference here: vLLM's conversion is checked by `make compare-vllm-protocol`);
- derender (with the renderer's output parsers): an output streamed chunk by chunk, its `stream_state`
  carried as a client carries it, reads as the whole output does (content and reasoning); a state altered at
  any place, or a chunk's `usage` of any JSON type, is an answer or a 400.

Generated: conversations of every role (text with any non-surrogate character and chat-template markers,
content part lists with text, refusal and thinking parts and some that are refused, tool calls with string
arguments, `reasoning_content` / `reasoning`), tools with random JSON-schema-like parameters, the chat request
fields that change ids (`add_generation_prompt`, `continue_final_message`, `chat_template_kwargs` with names
templates read and names reserved, `reasoning_effort`, `add_special_tokens`, `truncate_prompt_tokens`);
completions prompts (a string, strings, an id list, id lists); `/tokenize` bodies; id lists for `/detokenize`,
in and out of the vocabulary; Anthropic and Responses bodies with every block and item type; model output with
reasoning and tool-call markup.

Budget: 100 examples per property and checkpoint in CI, derandomized (about 40 s here). The long run (a random
seed each time):

    TOKENFRONT_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/robustness/test_fuzz_render_core.py -s

The counts (examples, answered, refused by which error, and the commonest refusals) are printed by the
module's last test (`-s` shows them). A failure prints the request body that caused it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from tokenfront import fixtures
from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import (
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ResponsesRequest,
    TokenizeRequest,
)
from tokenfront.protocol.vllm import ChatDerenderRequest
from tokenfront.renderer.answers import (
    render_chat_response,
    render_completion_response,
    render_converted_response,
    tokenize_response,
)
from tokenfront.server.errors import APIError, validation_error
from tokenfront.server.lean_routes import parse_body

_REFERENCE_PATH = Path(__file__).resolve().parent.parent / "core" / "reference.py"

EXAMPLES = int(os.environ.get("TOKENFRONT_FUZZ_EXAMPLES", "0") or 0) or 100
CHECKPOINTS = ("qwen3", "llama3")
CLIENT_ERRORS = (RenderError, APIError)

# Outcomes per property and checkpoint ("chat[qwen3]"): examples, answered, and refusals by error type; and the
# refusals' messages (numbers and quoted values left out), to see what the generators hit.
OUTCOMES: dict[str, Counter[str]] = {}
REFUSALS: dict[str, Counter[str]] = {}

_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=EXAMPLES <= 100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def _load_reference() -> ModuleType:
    """tests/core/reference.py, loaded by path (tests/core is not on the path here); the parity sweep's own copy
    when it is loaded already."""
    loaded = sys.modules.get("reference")
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == _REFERENCE_PATH:
        return loaded
    spec = importlib.util.spec_from_file_location("tokenfront_tests_reference", _REFERENCE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


reference = _load_reference()


# -- strategies -------------------------------------------------------------------------------------------------

# Chat-template and reasoning/tool markers of both fixtures' families, mixed into text.
MARKERS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "{{ x }}",
    "{% if %}",
    "\n",
    " ",
)
PLAIN_TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=24)
TEXT = st.one_of(
    PLAIN_TEXT, st.lists(st.one_of(PLAIN_TEXT, st.sampled_from(MARKERS)), min_size=1, max_size=4).map("".join)
)
NAME = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True), PLAIN_TEXT)

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    TEXT,
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(PLAIN_TEXT, inner, max_size=3)),
    max_leaves=8,
)
SCHEMA_TYPES = st.sampled_from(["string", "number", "integer", "boolean", "array", "object", "null"])
PROPERTY_SCHEMA = st.recursive(
    st.fixed_dictionaries(
        {"type": SCHEMA_TYPES},
        optional={"description": TEXT, "enum": st.lists(JSON_LEAF, max_size=3), "default": JSON_LEAF},
    ),
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(NAME, inner, max_size=3)},
            optional={"required": st.lists(NAME, max_size=2)},
        ),
        st.fixed_dictionaries({"type": st.just("array"), "items": inner}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)}),
    ),
    max_leaves=6,
)
PARAMETERS = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(NAME, PROPERTY_SCHEMA, max_size=3)},
        optional={"required": st.lists(NAME, max_size=2), "additionalProperties": st.booleans()},
    ),
    st.dictionaries(PLAIN_TEXT, JSON_VALUE, max_size=3),  # JSON-schema-like only in name
    st.none(),
)
TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": NAME},
            optional={
                "description": st.one_of(st.none(), TEXT),
                "parameters": PARAMETERS,
                "strict": st.booleans(),
            },
        ),
    }
)
ARGUMENTS = st.one_of(TEXT, st.dictionaries(NAME, JSON_VALUE, max_size=3).map(json.dumps), st.just(""))
TOOL_CALL = st.fixed_dictionaries(
    {
        "id": st.one_of(st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True), PLAIN_TEXT),
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": NAME, "arguments": ARGUMENTS}),
    }
)
TEXT_PART = st.builds(lambda text: {"type": "text", "text": text}, TEXT)
RENDERED_PART = st.one_of(
    TEXT_PART,
    TEXT_PART,
    st.builds(lambda text: {"type": "refusal", "refusal": text}, TEXT),
    st.builds(lambda text: {"type": "thinking", "thinking": text}, TEXT),
    st.just({"type": "text", "text": None}),  # skipped
)
REFUSED_PART = st.one_of(  # a 400 each: media, no type, a type that is not a string, not an object, unknown
    st.just({"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}),
    st.builds(lambda text: {"text": text}, TEXT),
    st.builds(lambda text: {"type": ["text"], "text": text}, TEXT),
    TEXT,
    st.just({"type": "input_text", "text": "hi"}),
)
CONTENT = st.one_of(TEXT, TEXT, st.lists(RENDERED_PART, max_size=3))
ANY_CONTENT = st.one_of(CONTENT, st.lists(st.one_of(RENDERED_PART, REFUSED_PART), max_size=3))


def _with_content(
    role: str, content: st.SearchStrategy[Any] = CONTENT, **optional: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"role": st.just(role), "content": content}, optional=optional)


ASSISTANT = st.fixed_dictionaries(
    {"role": st.just("assistant")},
    optional={
        "content": st.one_of(CONTENT, st.none()),
        "tool_calls": st.lists(TOOL_CALL, max_size=2),
        "reasoning_content": TEXT,
        "reasoning": TEXT,
    },
)
ANY_MESSAGE = st.one_of(
    _with_content("system", ANY_CONTENT),
    _with_content("developer", ANY_CONTENT),
    _with_content("user", ANY_CONTENT, name=NAME),
    ASSISTANT,
    _with_content("tool", ANY_CONTENT, tool_call_id=PLAIN_TEXT),
    st.fixed_dictionaries({"role": st.just("function"), "content": ANY_CONTENT, "name": NAME}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.none()}),  # refused
)


@st.composite
def _turns(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A conversation in the usual shape (a system message, then user / assistant turns with tool results,
    ending with the user or a tool), which templates render rather than refuse."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append(draw(_with_content("system")))
    for _ in range(draw(st.integers(1, 3))):
        messages.append(draw(_with_content("user")))
        if draw(st.booleans()):
            assistant = draw(ASSISTANT)
            messages.append(assistant)
            for call in assistant.get("tool_calls") or ():
                messages.append({"role": "tool", "content": draw(TEXT), "tool_call_id": call["id"]})
    return messages


CONVERSATION = st.one_of(_turns(), st.lists(ANY_MESSAGE, min_size=1, max_size=5))
# Template variables: the thinking switch, names templates read, names the pipeline reserves (a 400), and the
# names of template globals and special tokens.
KWARG_NAMES = st.sampled_from(
    [
        "enable_thinking",
        "thinking",
        "reasoning_effort",
        "tools_in_user_message",
        "date_string",
        "custom_tools",
        "bos_token",
        "eos_token",
        "raise_exception",
        "strftime_now",
        "messages",
        "tools",
        "add_generation_prompt",
        "tokenize",
    ]
)
TEMPLATE_KWARGS = st.one_of(
    st.fixed_dictionaries({}, optional={"enable_thinking": st.booleans()}),
    st.dictionaries(st.one_of(KWARG_NAMES, NAME), JSON_VALUE, max_size=2),
)
# add_generation_prompt / continue_final_message: the three combinations that render, and the one refused.
PROMPT_ENDS = st.sampled_from(
    [
        {},
        {"add_generation_prompt": True},
        {"add_generation_prompt": False},
        {"add_generation_prompt": False, "continue_final_message": True},
        {"continue_final_message": True},
    ]
)
CHAT_BODY = st.builds(
    lambda body, ends: {**body, **ends},
    st.fixed_dictionaries(
        {"messages": CONVERSATION},
        optional={
            "tools": st.lists(TOOL, min_size=1, max_size=3),
            "chat_template_kwargs": TEMPLATE_KWARGS,
            "reasoning_effort": st.sampled_from(["none", "low", "high"]),
            "add_special_tokens": st.booleans(),
            "truncate_prompt_tokens": st.one_of(st.integers(1, 40), st.just(-1)),
        },
    ),
    PROMPT_ENDS,
)
# Ids inside both fixtures' vocabularies (llama3: 128256 tokens, qwen3: 151669), and lists with ids around the
# vocabulary's ends and beyond (a 400 on either side).
IN_VOCABULARY = st.integers(0, 128_255)
ANY_ID = st.one_of(
    IN_VOCABULARY, st.integers(-3, 3), st.integers(128_250, 151_700), st.integers(-(2**63), 2**63 - 1)
)
ID_LIST = st.one_of(
    st.lists(IN_VOCABULARY, max_size=24), st.lists(IN_VOCABULARY, max_size=24), st.lists(ANY_ID, max_size=8)
)
COMPLETION_BODY = st.fixed_dictionaries(
    {
        "prompt": st.one_of(
            TEXT,
            st.lists(TEXT, min_size=1, max_size=3),
            ID_LIST,
            st.lists(ID_LIST, min_size=1, max_size=3),
        )
    },
    optional={
        "add_special_tokens": st.booleans(),
        "truncate_prompt_tokens": st.one_of(st.integers(1, 40), st.just(-1)),
        "echo": st.booleans(),
    },
)
TOKENIZE_BODY = st.one_of(
    st.fixed_dictionaries(
        {"prompt": TEXT}, optional={"add_special_tokens": st.booleans(), "return_token_strs": st.booleans()}
    ),
    st.fixed_dictionaries(
        {"messages": CONVERSATION},
        optional={
            "add_special_tokens": st.booleans(),
            "add_generation_prompt": st.booleans(),
            "return_token_strs": st.booleans(),
        },
    ),
)


# Responses bodies (core/requests/responses.py): every input item type, with fields of the right and wrong types.
ANY_JSON = st.one_of(
    JSON_LEAF, st.lists(JSON_LEAF, max_size=2), st.dictionaries(PLAIN_TEXT, JSON_LEAF, max_size=2)
)
CALL_ID = st.one_of(st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True), ANY_JSON)
RESPONSES_PART = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": TEXT}),
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "text", "refusal", "input_image"])}),
    ANY_JSON,
)
RESPONSES_CONTENT = st.one_of(TEXT, st.lists(RESPONSES_PART, max_size=3), ANY_JSON)
RESPONSES_ITEM = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "developer", "assistant"]), "content": RESPONSES_CONTENT},
        optional={
            "type": st.just("message"),
            "status": st.sampled_from(["completed", "in_progress", "incomplete"]),
            "id": PLAIN_TEXT,
        },
    ),
    st.fixed_dictionaries({"role": ANY_JSON, "content": RESPONSES_CONTENT}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function_call", "custom_tool_call"]), "call_id": CALL_ID},
        optional={
            "name": st.one_of(NAME, ANY_JSON),
            "arguments": st.one_of(ARGUMENTS, ANY_JSON),
            "input": st.one_of(TEXT, ANY_JSON),
            "namespace": st.one_of(NAME, st.just(""), ANY_JSON),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function_call_output", "custom_tool_call_output"]), "call_id": CALL_ID},
        optional={"output": RESPONSES_CONTENT},
    ),
    st.fixed_dictionaries(
        {"type": st.just("reasoning")},
        optional={
            "content": st.lists(
                st.one_of(st.builds(lambda t: {"type": "reasoning_text", "text": t}, TEXT), ANY_JSON)
            ),
            "summary": st.lists(
                st.one_of(st.builds(lambda t: {"type": "summary_text", "text": t}, TEXT), ANY_JSON)
            ),
            "status": st.sampled_from(["completed", "in_progress", "incomplete"]),
            "encrypted_content": st.one_of(st.just(""), PLAIN_TEXT),
        },
    ),
    st.dictionaries(PLAIN_TEXT, ANY_JSON, max_size=3),
)
RESPONSES_FUNCTION = st.fixed_dictionaries(
    {"type": st.just("function"), "name": st.one_of(NAME, NAME, ANY_JSON)},
    optional={"description": st.one_of(TEXT, ANY_JSON), "parameters": PARAMETERS, "strict": st.booleans()},
)
RESPONSES_TOOL = st.one_of(
    RESPONSES_FUNCTION,
    st.fixed_dictionaries(
        {"type": st.just("custom")},
        optional={
            "name": st.one_of(NAME, ANY_JSON),
            "description": TEXT,
            "format": st.one_of(
                st.just({"type": "text"}),
                st.just({"type": "grammar", "syntax": "lark", "definition": "x"}),
                ANY_JSON,
            ),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("namespace"), "name": st.one_of(NAME, ANY_JSON)},
        optional={
            "tools": st.one_of(st.lists(st.one_of(RESPONSES_FUNCTION, ANY_JSON), max_size=2), ANY_JSON)
        },
    ),
    st.just({"type": "web_search"}),
    st.dictionaries(PLAIN_TEXT, ANY_JSON, max_size=2),
)
RESPONSES_BODY = st.fixed_dictionaries(
    {"input": st.one_of(TEXT, st.lists(RESPONSES_ITEM, max_size=5))},
    optional={
        "instructions": TEXT,
        "tools": st.lists(RESPONSES_TOOL, max_size=3),
        "tool_choice": st.one_of(
            st.sampled_from(["auto", "none", "required"]),
            st.fixed_dictionaries({"type": st.sampled_from(["function", "custom"])}, optional={"name": NAME}),
            st.dictionaries(PLAIN_TEXT, ANY_JSON, max_size=2),
        ),
        "reasoning": st.fixed_dictionaries(
            {}, optional={"effort": st.sampled_from(["none", "low", "high"]), "summary": PLAIN_TEXT}
        ),
        "truncation": st.sampled_from(["auto", "disabled"]),
        "chat_template_kwargs": TEMPLATE_KWARGS,
    },
)

# Anthropic Messages bodies (core/requests/anthropic.py): every block type, tool changes in system messages.
ANTHROPIC_TOOL = st.fixed_dictionaries(
    {"name": NAME, "input_schema": st.one_of(PARAMETERS.filter(lambda p: p is not None), st.just({}))},
    optional={"description": TEXT, "strict": st.booleans(), "defer_loading": st.booleans()},
)
TOOL_RESULT_ITEM = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(TEXT, TEXT, ANY_JSON)}),
    st.fixed_dictionaries({"type": st.just("image"), "source": ANY_JSON}),
    st.fixed_dictionaries(
        {"type": st.just("tool_reference")},
        optional={"tool_name": st.one_of(NAME, ANY_JSON), "name": st.one_of(NAME, ANY_JSON)},
    ),
    st.dictionaries(PLAIN_TEXT, ANY_JSON, max_size=2),
)
ANTHROPIC_BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.fixed_dictionaries(
        {"type": st.just("thinking"), "thinking": TEXT}, optional={"signature": PLAIN_TEXT}
    ),
    st.fixed_dictionaries({"type": st.just("redacted_thinking"), "data": PLAIN_TEXT}),
    st.fixed_dictionaries(
        {"type": st.just("tool_use")},
        optional={"id": PLAIN_TEXT, "name": NAME, "input": st.dictionaries(NAME, JSON_VALUE, max_size=3)},
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result")},
        optional={
            "tool_use_id": PLAIN_TEXT,
            "content": st.one_of(TEXT, st.lists(TOOL_RESULT_ITEM, max_size=3)),
            "is_error": st.booleans(),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("image")},
        optional={
            "source": st.one_of(
                st.fixed_dictionaries({"type": st.just("url"), "url": PLAIN_TEXT}),
                st.dictionaries(PLAIN_TEXT, JSON_LEAF, max_size=2),
            )
        },
    ),
    st.fixed_dictionaries({"type": st.just("tool_reference")}, optional={"tool_name": NAME, "name": NAME}),
)
TOOL_CHANGE = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["tool_addition", "tool_removal"]),
        "tool": st.one_of(
            st.fixed_dictionaries({"type": st.just("tool_reference"), "name": NAME}),
            st.fixed_dictionaries({"type": st.just("tool_definition"), "definition": ANTHROPIC_TOOL}),
        ),
    }
)
ANTHROPIC_MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant"]),
            "content": st.one_of(TEXT, st.lists(ANTHROPIC_BLOCK, max_size=3)),
        }
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("system"),
            "content": st.one_of(TEXT, st.lists(st.one_of(ANTHROPIC_BLOCK, TOOL_CHANGE))),
        }
    ),
)
ANTHROPIC_BODY = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, 4096), "messages": st.lists(ANTHROPIC_MESSAGE, max_size=5)},
    optional={
        "system": st.one_of(TEXT, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}))),
        "tools": st.lists(ANTHROPIC_TOOL, max_size=3),
        "tool_choice": st.one_of(
            st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "none"])}),
            st.fixed_dictionaries({"type": st.just("tool"), "name": NAME}),
        ),
        "thinking": st.sampled_from(
            [{"type": "disabled"}, {"type": "adaptive"}, {"type": "enabled", "budget_tokens": 1024}]
        ),
        "output_config": st.fixed_dictionaries(
            {}, optional={"effort": st.sampled_from(["low", "high", "max"])}
        ),
        "chat_template_kwargs": TEMPLATE_KWARGS,
    },
)


# Derender (core/derender.py): model output as text (encoded into ids by the test), with the reasoning and
# tool-call markup of both fixtures' parsers; carried stream states, altered; usage counts of any JSON type.
OUTPUT_SNIPPETS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '{"name": ',
    "<|python_tag|>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|endoftext|>",
    "\n\n",
)
OUTPUT_TEXT = st.lists(st.one_of(PLAIN_TEXT, st.sampled_from(OUTPUT_SNIPPETS)), min_size=1, max_size=5).map(
    "".join
)
DERENDER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHAT_REQUEST = st.fixed_dictionaries(
    {"messages": st.just([{"role": "user", "content": "What is the weather in Paris?"}])},
    optional={
        "tools": st.just(DERENDER_TOOLS),
        "chat_template_kwargs": st.fixed_dictionaries({"enable_thinking": st.booleans()}),
        "skip_special_tokens": st.booleans(),
        "include_reasoning": st.booleans(),
    },
)
USAGE = st.dictionaries(
    st.sampled_from(["prompt_tokens", "completion_tokens", "total_tokens"]),
    st.one_of(st.integers(-3, 10**6), ANY_JSON),
    max_size=3,
)
FINISH_REASONS = st.one_of(st.none(), st.sampled_from(["stop", "length", "abort"]), PLAIN_TEXT)


# -- the pipeline as the routes call it -------------------------------------------------------------------------

_JSON_CONTENT_TYPE = "application/json"


def _as_served(body: dict[str, Any], model: type[BaseModel]) -> tuple[Any, dict[str, Any], bytes]:
    """The body as a lean route takes it: JSON bytes, parsed strictly, validated by the route's model (its
    pydantic errors answered as the route answers them, an APIError)."""
    raw = json.dumps(body, ensure_ascii=False).encode("utf-8")
    parsed = parse_body(raw, _JSON_CONTENT_TYPE)
    try:
        request = model.model_validate(parsed)
    except ValidationError as exc:
        raise validation_error([dict(error) for error in exc.errors()], "application/json") from None
    return request, parsed, raw


def _outcome(key: str, body: Any, call: Callable[[], Any]) -> Any:
    """Run `call`: its result, or None when it raised a client error; any other exception fails the test (with
    `body`, the request, in the report)."""
    note(f"request body: {json.dumps(body, ensure_ascii=False)}")
    counts = OUTCOMES.setdefault(key, Counter())
    counts["examples"] += 1
    try:
        result = call()
    except CLIENT_ERRORS as exc:
        counts[f"refused: {type(exc).__name__} {exc.status_code}"] += 1
        REFUSALS.setdefault(key, Counter())[_message_kind(str(exc))] += 1
        assert 400 <= exc.status_code < 500, f"a client error with status {exc.status_code}: {exc}"
        return None
    counts["answered"] += 1
    return result


def _message_kind(message: str) -> str:
    message = re.sub(r"'[^']*'|`[^`]*`|\"[^\"]*\"", "…", message.splitlines()[0] if message else "")
    return re.sub(r"\d+", "N", message)[:120]


_PIPELINES: dict[str, RenderPipeline] = {}


@pytest.fixture(scope="module", params=CHECKPOINTS)
def loaded(request: pytest.FixtureRequest) -> tuple[str, Path, RenderPipeline]:
    name = request.param
    folder = fixtures.ensure_checkpoint(name)
    if name not in _PIPELINES:
        _PIPELINES[name] = RenderPipeline.load(RenderOptions(model=str(folder)))
    return name, folder, _PIPELINES[name]


def _reference_body(request: ChatCompletionRequest, parsed: dict[str, Any]) -> dict[str, Any]:
    """The body transformers gets: the tools as vLLM dumps them (what the route hands the template) and the
    template kwargs the request resolves to (`reasoning_effort` included)."""
    body = {**parsed, "chat_template_kwargs": request.chat_template_kwargs}
    if request.tools is not None:
        body["tools"] = request.tool_dicts()
    return body


def _expect_reference(folder: Path, body: dict[str, Any], ids: list[int]) -> None:
    expected = reference.reference_chat(folder, body)
    assert expected.error is None, (
        f"tokenfront rendered {len(ids)} ids, transformers refused: {type(expected.error).__name__}: "
        f"{expected.error}"
    )
    assert ids == expected.ids, f"ids differ from transformers'\n  text: {expected.text!r}"


# -- properties -------------------------------------------------------------------------------------------------


@_SETTINGS
@given(body=CHAT_BODY)
def test_chat_renders_like_transformers_or_is_a_400(
    loaded: tuple[str, Path, RenderPipeline], body: dict[str, Any]
) -> None:
    name, folder, pipeline = loaded

    def render() -> tuple[ChatCompletionRequest, dict[str, Any], list[int]]:
        request, parsed, raw = _as_served(body, ChatCompletionRequest)
        content, rendered = render_chat_response(pipeline, request, parsed, raw)
        assert json.loads(content)["token_ids"] == rendered.token_ids
        return request, parsed, rendered.token_ids

    answered = _outcome(f"chat[{name}]", body, render)
    if answered is not None:
        request, parsed, ids = answered
        _expect_reference(folder, _reference_body(request, parsed), ids)


@_SETTINGS
@given(body=COMPLETION_BODY)
def test_completion_renders_like_transformers_or_is_a_400(
    loaded: tuple[str, Path, RenderPipeline], body: dict[str, Any]
) -> None:
    name, folder, pipeline = loaded

    def render() -> list[list[int]]:
        request, parsed, raw = _as_served(body, CompletionRequest)
        content, items = render_completion_response(pipeline, request, parsed, raw)
        assert [item["token_ids"] for item in json.loads(content)] == [item.token_ids for item in items]
        return [item.token_ids for item in items]

    answered = _outcome(f"completion[{name}]", body, render)
    if answered is not None:
        expected = reference.reference_completion(folder, body)
        assert answered == [item.ids for item in expected]


@_SETTINGS
@given(body=TOKENIZE_BODY)
def test_tokenize_counts_like_transformers_or_is_a_400(
    loaded: tuple[str, Path, RenderPipeline], body: dict[str, Any]
) -> None:
    name, folder, pipeline = loaded

    def tokenize() -> tuple[TokenizeRequest, dict[str, Any], dict[str, Any]]:
        request, parsed, _ = _as_served(body, TokenizeRequest)
        answer = tokenize_response(pipeline, request, 4096)
        json.dumps(answer)
        return request, parsed, answer

    answered = _outcome(f"tokenize[{name}]", body, tokenize)
    if answered is None:
        return
    request, parsed, answer = answered
    assert answer["count"] == len(answer["tokens"])
    if request.is_chat:
        chat = request.chat_request()
        _expect_reference(
            folder, {**_reference_body(chat, chat.model_dump(exclude_unset=True))}, answer["tokens"]
        )
    else:
        tokenizer = reference.load_tokenizer(str(folder))
        add_special = True if request.add_special_tokens is None else request.add_special_tokens
        assert answer["tokens"] == list(
            tokenizer(parsed["prompt"], add_special_tokens=add_special)["input_ids"]
        )
    if request.return_token_strs:
        assert answer["token_strs"] == reference.load_tokenizer(str(folder)).convert_ids_to_tokens(
            answer["tokens"]
        )


@_SETTINGS
@given(ids=ID_LIST)
def test_detokenize_decodes_like_transformers_or_is_a_400(
    loaded: tuple[str, Path, RenderPipeline], ids: list[int]
) -> None:
    name, folder, pipeline = loaded

    def detokenize() -> str:
        request, _, _ = _as_served({"tokens": ids}, DetokenizeRequest)
        text = pipeline.detokenize(request.tokens)
        json.dumps(DetokenizeResponse(prompt=text).model_dump(), ensure_ascii=False).encode("utf-8")
        return text

    text = _outcome(f"detokenize[{name}]", ids, detokenize)
    tokenizer = reference.load_tokenizer(str(folder))
    in_vocabulary = all(0 <= token < len(tokenizer) for token in ids)
    assert (text is not None) == in_vocabulary, "ids in the vocabulary are decoded, others are a 400"
    if text is not None:
        assert text == tokenizer.decode(ids)


@_SETTINGS
@given(body=RESPONSES_BODY)
# Found by this property: a named tool_choice with a nameless custom tool was an AttributeError (a 500).
@example(body={"input": "", "tool_choice": {"type": "function"}, "tools": [{"type": "custom"}]})
@example(
    body={
        "input": "hi",
        "tool_choice": {"type": "function", "name": "f"},
        "tools": [{"type": "function", "name": 5}],
    }
)
def test_responses_bodies_render_or_are_a_400(
    loaded: tuple[str, Path, RenderPipeline], body: dict[str, Any]
) -> None:
    name, _, pipeline = loaded

    def render() -> list[int]:
        request, parsed, raw = _as_served(body, ResponsesRequest)
        content, rendered = render_converted_response(
            pipeline, request, request_id="resp_fuzz", body=parsed, raw=raw
        )
        assert json.loads(content)["token_ids"] == rendered.token_ids
        return rendered.token_ids

    _outcome(f"responses[{name}]", body, render)


@_SETTINGS
@given(body=ANTHROPIC_BODY)
def test_anthropic_bodies_render_or_are_a_400(
    loaded: tuple[str, Path, RenderPipeline], body: dict[str, Any]
) -> None:
    name, _, pipeline = loaded

    def render() -> list[int]:
        request, parsed, raw = _as_served(
            {"model": pipeline.served_model_names[0], **body}, AnthropicMessagesRequest
        )
        content, rendered = render_converted_response(
            pipeline, request, request_id="chatcmpl-fuzz", body=parsed, raw=raw
        )
        assert json.loads(content)["token_ids"] == rendered.token_ids
        return rendered.token_ids

    _outcome(f"messages[{name}]", body, render)


_PARSING: dict[str, RenderPipeline] = {}
# The renderer's parsers for each fixture (the qwen3 renderer of test_fuzz_servers.py; llama3's JSON tool calls).
PARSERS = {
    "qwen3": {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"},
    "llama3": {"tool_call_parser": "llama3_json"},
}


@pytest.fixture(scope="module", params=CHECKPOINTS)
def parsing(request: pytest.FixtureRequest) -> tuple[str, RenderPipeline]:
    """A pipeline with the output parsers (derender reads output through them)."""
    return request.param, _parsing_pipeline(request.param)


def _parsing_pipeline(name: str) -> RenderPipeline:
    if name not in _PARSING:
        folder = fixtures.ensure_checkpoint(name)
        _PARSING[name] = RenderPipeline.load(RenderOptions(model=str(folder), **PARSERS[name]))
    return _PARSING[name]


def _chunks(data: st.DataObject, pipeline: RenderPipeline) -> list[list[int]]:
    """Output ids (of generated text with parser markup), split into one to three stream chunks."""
    ids = pipeline.tokenize(data.draw(OUTPUT_TEXT, label="output text"), add_special_tokens=False) or [0]
    cuts = sorted(
        data.draw(st.lists(st.integers(1, max(1, len(ids) - 1)), max_size=2, unique=True), label="cuts")
    )
    bounds = [0, *[c for c in cuts if c < len(ids)], len(ids)]
    return [ids[a:b] for a, b in pairwise(bounds) if ids[a:b]]


def _prompt_ids(pipeline: RenderPipeline, chat_request: dict[str, Any]) -> list[int]:
    return pipeline.render_chat(ChatCompletionRequest.model_validate(chat_request)).token_ids


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value: its leaves, and its objects and lists themselves."""
    out = [prefix] if prefix else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        out += _paths(inner, (*prefix, key))
    return out


def _mutated(data: st.DataObject, value: Any) -> Any:
    """`value` with one place replaced by arbitrary JSON (an integer, often), or removed."""
    path = data.draw(st.sampled_from(_paths(value)), label="where")
    replacement = data.draw(st.one_of(st.integers(-(2**40), 2**40), ANY_JSON, st.just(REMOVE)), label="what")
    value = json.loads(json.dumps(value))
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if replacement is REMOVE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return value


REMOVE = object()


def _stream_body(
    chat_request: dict[str, Any], prompt: list[int], ids: list[int], state: Any, finish: Any = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "stream": True,
        "chat_request": chat_request,
        "generate_chunk": {"choices": [{"index": 0, "token_ids": ids, "finish_reason": finish}]},
    }
    if state is None:
        body["prompt_token_ids"] = prompt
    else:
        body["stream_state"] = state
    return body


@_SETTINGS
@given(data=st.data())
def test_streamed_derender_reads_like_the_whole_output_or_is_a_400(
    parsing: tuple[str, RenderPipeline], data: st.DataObject
) -> None:
    """A stream derendered chunk by chunk (the state carried as the client carries it) answers the content and
    reasoning the whole output's derender answers."""
    name, pipeline = parsing
    chat_request = data.draw(CHAT_REQUEST, label="chat_request")
    prompt = _prompt_ids(pipeline, chat_request)
    chunks = _chunks(data, pipeline)
    finish = data.draw(FINISH_REASONS, label="finish_reason")
    streamed = {"content": "", "reasoning": ""}

    def stream() -> None:
        state = None
        for position, ids in enumerate(chunks):
            last = position == len(chunks) - 1
            body = _stream_body(chat_request, prompt, ids, state, (finish or "stop") if last else None)
            request, _, _ = _as_served(body, ChatDerenderRequest)
            answer = pipeline.derender_chat(request)
            json.dumps(answer)
            for choice in answer["chunk"]["choices"]:
                streamed["content"] += choice["delta"]["content"] or ""
                streamed["reasoning"] += choice["delta"]["reasoning"] or ""
            state = json.loads(json.dumps(answer["stream_state"]))

    whole_body = {
        "chat_request": chat_request,
        "prompt_token_ids": prompt,
        "generate_response": {
            "choices": [
                {"index": 0, "token_ids": [i for ids in chunks for i in ids], "finish_reason": finish}
            ]
        },
    }

    def whole() -> dict[str, Any]:
        request, _, _ = _as_served(whole_body, ChatDerenderRequest)
        answer = pipeline.derender_chat(request)
        json.dumps(answer)
        return answer

    note(f"chunks: {chunks}")
    answered = _outcome(f"derender whole[{name}]", whole_body, whole)
    if _outcome(f"derender stream[{name}]", chunks, stream) is not None and answered is not None:
        message = answered["choices"][0]["message"]
        if not message.get("tool_calls"):  # tool-call markup is held back differently when streamed
            assert streamed["content"] == (message["content"] or "")
            assert streamed["reasoning"] == (message["reasoning"] or "")


@_SETTINGS
@given(data=st.data())
def test_derender_with_an_altered_stream_state_or_usage_is_a_400(
    parsing: tuple[str, RenderPipeline], data: st.DataObject
) -> None:
    """The client carries the stream state (and sends usage counts): whatever it sends back, the answer is an
    answer or a 400."""
    name, pipeline = parsing
    chat_request = data.draw(CHAT_REQUEST, label="chat_request")
    prompt = _prompt_ids(pipeline, chat_request)
    first, *rest = _chunks(data, pipeline)
    request, _, _ = _as_served(_stream_body(chat_request, prompt, first, None), ChatDerenderRequest)
    state = pipeline.derender_chat(request)["stream_state"]
    if data.draw(st.booleans(), label="alter the state"):
        state = _mutated(data, state)
    body = _stream_body(chat_request, prompt, rest[0] if rest else first, state, data.draw(FINISH_REASONS))
    if data.draw(st.booleans(), label="with usage"):
        body["generate_chunk"]["usage"] = data.draw(USAGE, label="usage")

    def step() -> dict[str, Any]:
        request, _, _ = _as_served(body, ChatDerenderRequest)
        answer = pipeline.derender_chat(request)
        json.dumps(answer)
        return answer

    _outcome(f"derender altered state[{name}]", body, step)


# What the derender properties found (each was a 500), as plain regression cases.
_CHAT_REQUEST = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
_STATE = {
    "output": {
        "version": 1,
        "detokenizer": {"window": [-1], "read": 1},
        "stop": {"pending": "", "stopped": False},
        "reasoning": {"phase": "reasoning", "pending": ""},
    },
    "role_sent": True,
}
DERENDER_FOUND = {
    "usage count not a number (ValueError)": {
        "stream": True,
        "chat_request": _CHAT_REQUEST,
        "prompt_token_ids": [1],
        "generate_chunk": {"choices": [{"index": 0, "token_ids": [0]}], "usage": {"completion_tokens": ":"}},
    },
    "usage count a list (TypeError)": {
        "stream": True,
        "chat_request": _CHAT_REQUEST,
        "prompt_token_ids": [1],
        "generate_chunk": {"choices": [{"index": 0, "token_ids": [0]}], "usage": {"prompt_tokens": [None]}},
    },
    "negative id in the carried window (OverflowError)": {
        "stream": True,
        "chat_request": _CHAT_REQUEST,
        "generate_chunk": {"choices": [{"index": 0, "token_ids": [0]}]},
        "stream_state": _STATE,
    },
}


@pytest.mark.parametrize("body", DERENDER_FOUND.values(), ids=DERENDER_FOUND.keys())
def test_what_the_derender_properties_found_is_a_400(body: dict[str, Any]) -> None:
    pipeline = _parsing_pipeline("qwen3")
    request, _, _ = _as_served(body, ChatDerenderRequest)
    with pytest.raises(CLIENT_ERRORS) as raised:
        pipeline.derender_chat(request)
    assert raised.value.status_code == 400
    assert raised.value.param in (
        "stream_state",
        "generate_chunk.usage.completion_tokens",
        "generate_chunk.usage.prompt_tokens",
    )


def test_report_outcomes() -> None:
    """Runs last in the module: prints what the properties saw (run with -s)."""
    if not OUTCOMES:
        pytest.skip("no property ran")
    print()
    for key, counts in sorted(OUTCOMES.items()):
        refusals = ", ".join(
            f"{count} {kind}" for kind, count in sorted(counts.items()) if kind.startswith("refused")
        )
        print(
            f"{key}: {counts['examples']} examples, {counts['answered']} answered; {refusals or 'none refused'}"
        )
        for kind, count in REFUSALS.get(key, Counter()).most_common(6):
            print(f"    {count:4d}  {kind}")

"""The gpt-oss (Harmony) request corpus: chat and completions bodies, each with vLLM 0.33's HTTP status.

Constants only (a vLLM comparison script imports this module). Every status was read off vLLM 0.33's render
server (`vllm launch render <folder> --enable-auto-tool-choice --tool-call-parser openai`, the vocabulary file
from `tokenfront.core.families.gpt_oss.tiktoken_encodings_dir`) on the `gptoss` fixture; 200 means vLLM
renders the request.

- `CHAT_CASES`: (name, body, status) for `/v1/chat/completions/render`;
- `COMPLETION_CASES`: (name, body, status) for `/v1/completions/render`.

Left out on purpose, because tokenfront answers them differently from vLLM (see gpt_oss.py's docstring):
media parts (vLLM drops them, tokenfront refuses them), `messages: []` and a request `chat_template`
(tokenfront refuses both; vLLM renders the former and ignores the latter), `truncate_prompt_tokens` (vLLM
ignores it for gpt-oss chat) and bare strings among the content parts of a system message (vLLM drops the
message).
"""

from __future__ import annotations

from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in an IANA time zone.\nAnswers in 24-hour format.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}

# Arrays, nested objects, defaults, a nullable union: the TypeScript Harmony writes for each.
SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": 'Search the knowledge base; quotes "exact" phrases.',
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Filter tags"},
                "options": {
                    "type": "object",
                    "properties": {
                        "limit": {"type": "integer", "default": 10},
                        "exact": {"type": "boolean", "default": False},
                    },
                },
                "since": {"type": ["string", "null"]},
            },
            "required": ["query"],
        },
    },
}

# No description, no parameters: `type ping = () => any;`.
PING_TOOL: dict[str, Any] = {"type": "function", "function": {"name": "ping"}}
# Empty parameters: `(_: any)`.
ANY_TOOL: dict[str, Any] = {"type": "function", "function": {"name": "anything", "parameters": {}}}


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_CALL_HISTORY: list[dict[str, Any]] = [
    _user("What's the weather in Paris?"),
    {
        "role": "assistant",
        "content": "Let me look that up.",
        "reasoning": "The user wants the weather; call get_weather.",
        "tool_calls": [_call("call_1", "get_weather", '{"city": "Paris"}')],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "cloudy"}'},
]

LONG_TEXT = "The quick brown fox jumps over the lazy dog. " * 120  # > 4096 characters: not cached

CHAT_CASES: list[tuple[str, dict[str, Any], int]] = [
    # -- system / developer / instructions --
    ("user_only", {"messages": [_user("Hi")]}, 200),
    ("system_user", {"messages": [{"role": "system", "content": "Be brief."}, _user("Hi")]}, 200),
    (
        "developer_user",
        {"messages": [{"role": "developer", "content": "Answer in French."}, _user("Hi")]},
        200,
    ),
    ("system_empty", {"messages": [{"role": "system", "content": ""}, _user("Hi")]}, 200),
    ("system_and_user_without_content", {"messages": [{"role": "system"}, {"role": "user"}]}, 200),
    (
        "system_parts",
        {
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}],
                },
                _user("Hi"),
            ]
        },
        200,
    ),
    (
        "later_system_and_developer",
        {
            "messages": [
                {"role": "system", "content": "First instructions."},
                {"role": "developer", "content": "Second instructions."},
                _user("Hi"),
                {"role": "system", "content": "Late system."},
            ]
        },
        200,
    ),
    ("later_system_empty", {"messages": [_user("Hi"), {"role": "system", "content": ""}]}, 200),
    ("only_system", {"messages": [{"role": "system", "content": "Only instructions."}]}, 200),
    # -- reasoning effort --
    ("effort_low", {"messages": [_user("Hi")], "reasoning_effort": "low"}, 200),
    ("effort_medium", {"messages": [_user("Hi")], "reasoning_effort": "medium"}, 200),
    (
        "effort_high",
        {"messages": [{"role": "system", "content": "Think."}, _user("Hi")], "reasoning_effort": "high"},
        200,
    ),
    ("effort_none", {"messages": [_user("Hi")], "reasoning_effort": "none"}, 400),
    ("effort_minimal", {"messages": [_user("Hi")], "reasoning_effort": "minimal"}, 400),
    ("effort_xhigh", {"messages": [_user("Hi")], "reasoning_effort": "xhigh"}, 400),
    ("effort_max", {"messages": [_user("Hi")], "reasoning_effort": "max"}, 400),
    (
        "effort_in_template_kwargs_ignored",
        {"messages": [_user("Hi")], "chat_template_kwargs": {"reasoning_effort": "high"}},
        200,
    ),
    # -- turns and content --
    (
        "multi_turn",
        {
            "messages": [
                _user("Hi"),
                {"role": "assistant", "content": "Hello! How can I help?"},
                _user("Tell me a joke."),
            ]
        },
        200,
    ),
    (
        "assistant_null_content_dropped",
        {"messages": [_user("Hi"), {"role": "assistant", "content": None}, _user("again")]},
        200,
    ),
    ("empty_user_content", {"messages": [_user("Hi"), {"role": "assistant", "content": ""}, _user("")]}, 200),
    (
        "content_parts",
        {
            "messages": [
                _user([{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]),
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "C"}, {"type": "text", "text": "D"}],
                },
                _user([]),
            ]
        },
        200,
    ),
    (
        "assistant_first_part_empty_dropped",
        {
            "messages": [
                _user("Q"),
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": ""}, {"type": "text", "text": "T"}],
                },
                _user("Z"),
            ]
        },
        200,
    ),
    (
        "refusal_part_renders_empty",
        {"messages": [_user([{"type": "refusal", "refusal": "no"}, {"type": "text", "text": "ok"}])]},
        200,
    ),
    (
        "unicode",
        {
            "messages": [
                {"role": "system", "content": "Réponds en français, s'il te plaît. 🙂"},
                _user("Grüße! 你好，世界 — «ça va?» עברית 👋🏽 e\u0301 \u00a0nbsp"),
            ]
        },
        200,
    ),
    ("whitespace", {"messages": [_user("  leading\n\n\ttabs   and trailing  \n")]}, 200),
    (
        "special_token_text_is_text",
        {"messages": [_user("Say <|end|> and <|start|>assistant literally.")]},
        200,
    ),
    ("long_content_uncached", {"messages": [_user(LONG_TEXT)]}, 200),
    ("user_name_ignored", {"messages": [{"role": "user", "content": "Hi", "name": "bob"}]}, 200),
    ("add_generation_prompt_false_ignored", {"messages": [_user("Hi")], "add_generation_prompt": False}, 200),
    (
        "continue_final_message_ignored",
        {
            "messages": [_user("Hi"), {"role": "assistant", "content": "Partial answer"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        200,
    ),
    ("add_special_tokens_ignored", {"messages": [_user("Hi")], "add_special_tokens": True}, 200),
    # -- assistant reasoning --
    (
        "reasoning_history_dropped",
        {
            "messages": [
                _user("Hi"),
                {"role": "assistant", "content": "Hello", "reasoning": "greet back"},
                _user("More"),
                {"role": "assistant", "content": "Sure", "reasoning_content": "agree"},
                _user("Last"),
            ]
        },
        200,
    ),
    (
        "reasoning_after_last_final_kept",
        {
            "messages": [
                _user("Q"),
                {"role": "assistant", "content": "A", "reasoning": None, "reasoning_content": "RC"},
                _user("Q2"),
                {"role": "assistant", "reasoning_content": "still thinking"},
            ]
        },
        200,
    ),
    (
        "reasoning_wins_over_reasoning_content",
        {"messages": [_user("Q"), {"role": "assistant", "reasoning": "R1", "reasoning_content": "RC1"}]},
        200,
    ),
    (
        "thinking_field_ignored",
        {"messages": [_user("Q"), {"role": "assistant", "content": "A", "thinking": "T"}]},
        200,
    ),
    # -- tools --
    ("tools_weather", {"messages": [_user("Weather in Oslo?")], "tools": [WEATHER_TOOL]}, 200),
    (
        "tools_with_instructions",
        {
            "messages": [{"role": "developer", "content": "Use tools."}, _user("Time?")],
            "tools": [TIME_TOOL, PING_TOOL],
        },
        200,
    ),
    (
        "tools_with_empty_instructions",
        {"messages": [{"role": "system", "content": ""}, _user("Q")], "tools": [PING_TOOL]},
        200,
    ),
    ("tools_nested_schema", {"messages": [_user("Find docs")], "tools": [SEARCH_TOOL, ANY_TOOL]}, 200),
    (
        "tool_choice_none_keeps_tools",
        {"messages": [_user("Q")], "tools": [WEATHER_TOOL], "tool_choice": "none"},
        200,
    ),
    (
        "tool_choice_required",
        {"messages": [_user("Q")], "tools": [WEATHER_TOOL], "tool_choice": "required"},
        200,
    ),
    (
        "tool_choice_named",
        {
            "messages": [_user("Q")],
            "tools": [WEATHER_TOOL, TIME_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        },
        200,
    ),
    ("tool_call_history", {"messages": WEATHER_CALL_HISTORY, "tools": [WEATHER_TOOL]}, 200),
    (
        "tool_call_then_final",
        {
            "messages": [
                *WEATHER_CALL_HISTORY,
                {"role": "assistant", "content": "It is 18 °C and cloudy.", "reasoning": "Report it."},
                _user("And tomorrow?"),
                {
                    "role": "assistant",
                    "reasoning": "Call again.",
                    "tool_calls": [_call("call_2", "get_weather", '{"city":"Paris"}')],
                },
                {"role": "tool", "tool_call_id": "call_2", "content": ""},
            ],
            "tools": [WEATHER_TOOL],
        },
        200,
    ),
    (
        "parallel_calls_and_odd_tool_messages",
        {
            "messages": [
                _user("Q"),
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "P1"}, {"type": "text", "text": "P2"}],
                    "tool_calls": [_call("a", "get_time", '{"timezone": "UTC"}'), _call("b", "ping", "")],
                },
                {
                    "role": "tool",
                    "tool_call_id": "b",
                    "content": [{"type": "text", "text": "po"}, {"type": "text", "text": "ng"}],
                },
                {"role": "tool", "tool_call_id": "unknown", "content": "orphan"},
                {"role": "tool", "content": "no id"},
            ]
        },
        200,
    ),
    (
        "trailing_tool_call",
        {"messages": [_user("Q"), {"role": "assistant", "tool_calls": [_call("x", "ping", "{}")]}]},
        200,
    ),
    (
        "arguments_not_json",
        {"messages": [_user("Q"), {"role": "assistant", "tool_calls": [_call("x", "ping", "not json")]}]},
        200,
    ),
    (
        "empty_tool_calls_list",
        {
            "messages": [
                _user("Q"),
                {"role": "assistant", "content": "Answer", "reasoning": "R", "tool_calls": []},
                _user("Z"),
            ]
        },
        200,
    ),
    (
        "tool_calls_null",
        {"messages": [_user("Q"), {"role": "assistant", "content": "C", "tool_calls": None}]},
        200,
    ),
    (
        "developer_tools_field_ignored",
        {"messages": [{"role": "developer", "content": "D", "tools": [PING_TOOL]}, _user("Q")]},
        200,
    ),
    (
        "long_conversation",
        {
            "messages": [
                {"role": "system", "content": "You are a counting assistant."},
                *(
                    message
                    for turn in range(8)
                    for message in (
                        _user(f"Count to {turn}."),
                        {"role": "assistant", "content": " ".join(map(str, range(turn + 1)))},
                    )
                ),
                _user("Now backwards."),
            ],
            "reasoning_effort": "low",
        },
        200,
    ),
    # -- what vLLM refuses --
    ("tools_empty_list", {"messages": [_user("Q")], "tools": []}, 400),
    ("tool_choice_without_tools", {"messages": [_user("Q")], "tool_choice": "auto"}, 400),
    (
        "tool_choice_unknown_name",
        {
            "messages": [_user("Q")],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        400,
    ),
    (
        "tool_call_without_id",
        {
            "messages": [
                _user("Q"),
                {
                    "role": "assistant",
                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
            ]
        },
        400,
    ),
    (
        "tool_call_without_type",
        {
            "messages": [
                _user("Q"),
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": "{}"}}],
                },
            ]
        },
        400,
    ),
    (
        "tool_call_arguments_object",
        {
            "messages": [
                _user("Q"),
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "x", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
                    ],
                },
            ]
        },
        400,
    ),
    (
        "tool_call_without_arguments",
        {
            "messages": [
                _user("Q"),
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f"}}],
                },
            ]
        },
        400,
    ),
    ("function_role", {"messages": [{"role": "function", "name": "f", "content": "x"}]}, 400),
    ("user_null_content", {"messages": [_user(None)]}, 400),
    ("system_null_content", {"messages": [{"role": "system", "content": None}, _user("Hi")]}, 400),
    ("text_part_without_text", {"messages": [_user([{"type": "text"}])]}, 400),
    ("input_text_part", {"messages": [_user([{"type": "input_text", "text": "x"}])]}, 400),
    ("string_parts", {"messages": [_user(["a", "b"])]}, 400),
    (
        "continue_with_generation_prompt",
        {"messages": [_user("Q")], "add_generation_prompt": True, "continue_final_message": True},
        400,
    ),
]

COMPLETION_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("text", {"prompt": "The capital of France is"}, 200),
    ("texts", {"prompt": ["One", "Two words", "Grüße 👋"]}, 200),
    ("harmony_text", {"prompt": "<|start|>user<|message|>Hi<|end|><|start|>assistant"}, 200),
    ("token_ids", {"prompt": [200006, 1428, 200008, 12194, 200007]}, 200),
    ("suffix", {"prompt": "def f(", "suffix": "return x"}, 400),
]

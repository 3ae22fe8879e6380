"""Request bodies for vLLM's scale-out render protocol (docs/contract.md §11): /tokenize, /detokenize, Anthropic Messages and
OpenAI Responses, and the chat normalization rules vLLM's request models apply (tools, tool calls, messages). Shared by the tests (tests/renderer) and by `benchmarks/compare_vllm_protocol.py`, which sends
each to vLLM 0.33's render server and to tokenfront and compares the answers.

Every body is for the Qwen3 fixture checkpoint with the `qwen3` reasoning parser and `hermes` tool calls; none
sends `model` except the Anthropic ones, which must (the compare script sends both servers the same served name).
"""

from __future__ import annotations

from typing import Any

MODEL = "qwen3"

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}},
    "required": ["city"],
}

# -- /tokenize ---------------------------------------------------------------------------------------------

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather.", "parameters": WEATHER_PARAMETERS},
}
# No description, keys out of vLLM's order, `strict: null`: the template sees vLLM's dump of it.
BARE_TOOL: dict[str, Any] = {"function": {"parameters": {"type": "object"}, "name": "ping", "strict": None}}

TOKENIZE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("text", {"prompt": "The capital of France is"}),
    ("text_no_special_tokens", {"prompt": "The capital of France is", "add_special_tokens": False}),
    (
        "text_special_tokens_and_strs",
        {"prompt": "Hello<|im_end|>\n<|im_start|>user 你好 🌍", "return_token_strs": True},
    ),
    ("text_empty", {"prompt": ""}),
    ("chat", {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi!"}]}),
    (
        "chat_tools_and_history",
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
            ],
            "tools": [WEATHER_TOOL, BARE_TOOL],
            "return_token_strs": True,
        },
    ),
    ("chat_tools_empty", {"messages": [{"role": "user", "content": "No tools."}], "tools": []}),
    (
        "chat_no_generation_prompt",
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "add_generation_prompt": False,
            "add_special_tokens": True,
        },
    ),
    (
        "chat_continue_final_message",
        {
            "messages": [{"role": "user", "content": "Count:"}, {"role": "assistant", "content": "1, 2,"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    (
        "chat_template_kwargs",
        {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": False}},
    ),
]

# -- /detokenize --------------------------------------------------------------------------------------------

DETOKENIZE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("chat_ids", {"tokens": [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]}),
    ("text_ids", {"tokens": [785, 6722, 315, 9625, 374]}),
    ("empty", {"tokens": []}),
    ("think_markers", {"tokens": [151667, 271, 151668, 271, 9707]}),
    # The first two bytes of a 4-byte emoji: an incomplete UTF-8 sequence.
    ("partial_utf8", {"tokens": [9707, 11162, 234]}),
]

# -- Anthropic Messages -------------------------------------------------------------------------------------

ANTHROPIC_TOOLS: list[dict[str, Any]] = [
    {"name": "get_weather", "description": "Current weather.", "input_schema": WEATHER_PARAMETERS},
    # No description and no schema type: vLLM renders `"description": null` and adds `"type": "object"` last.
    {"name": "get_time", "input_schema": {"properties": {"timezone": {"type": "string"}}}},
]

ANTHROPIC_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "system_and_text",
        {
            "model": MODEL,
            "max_tokens": 64,
            "system": "You are a helpful assistant.",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
        },
    ),
    (
        "system_blocks_multi_turn",
        {
            "model": MODEL,
            "max_tokens": 64,
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc123"},
                {"type": "text", "text": "You are terse. "},
                {"type": "text", "text": "Answer in French."},
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "Bonjour !"}]},
                {"role": "user", "content": "How are you?"},
            ],
        },
    ),
    (
        "tools_and_tool_use_history",
        {
            "model": MODEL,
            "max_tokens": 256,
            "tools": ANTHROPIC_TOOLS,
            "tool_choice": {"type": "auto"},
            "messages": [
                {"role": "user", "content": "Weather and time in Tokyo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me check both."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Tokyo"},
                        },
                        {
                            "type": "tool_use",
                            "id": "toolu_2",
                            "name": "get_time",
                            "input": {"timezone": "Asia/Tokyo"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "22 C, clear"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "content": [{"type": "text", "text": "21:04"}, {"type": "text", "text": "JST"}],
                        },
                        {"type": "text", "text": "Thanks!"},
                    ],
                },
            ],
        },
    ),
    (
        "thinking_history_thinking_disabled",
        {
            "model": MODEL,
            "max_tokens": 128,
            "thinking": {"type": "disabled"},
            "tools": ANTHROPIC_TOOLS[:1],
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "I should call get_weather.", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {
                            "type": "tool_use",
                            "id": "toolu_9",
                            "name": "get_weather",
                            "input": {"city": "Oslo"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "-3 C, snow"}],
                },
            ],
        },
    ),
    # Qwen3's template takes a system message anywhere, so vLLM keeps this one in place (a template that
    # refuses [system, user, system, user] gets it merged into the first: tests/core/test_requests_anthropic.py).
    (
        "inline_system_message",
        {
            "model": MODEL,
            "max_tokens": 64,
            "system": "Rule one. ",
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "system", "content": [{"type": "text", "text": "Reminder: be brief."}]},
                {"role": "user", "content": "Tell me a fact."},
            ],
        },
    ),
    (
        "named_tool_choice_effort_and_assistant_tool_result",
        {
            "model": MODEL,
            "max_tokens": 64,
            "tools": ANTHROPIC_TOOLS,
            "tool_choice": {"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
            "output_config": {"effort": "low"},
            "messages": [
                {"role": "user", "content": "Time?"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "x",
                            "content": [{"type": "text", "text": "old"}],
                        }
                    ],
                },
                {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "Now?"}]},
            ],
        },
    ),
    (
        "tools_empty_and_tool_addition",
        {
            "model": MODEL,
            "max_tokens": 64,
            "tools": [],
            "messages": [
                {
                    "role": "system",
                    "content": [
                        {
                            "type": "tool_addition",
                            "tool": {
                                "type": "tool_definition",
                                "definition": {"name": "lookup", "input_schema": {"type": "object"}},
                            },
                        }
                    ],
                },
                {"role": "user", "content": "Look something up."},
            ],
        },
    ),
]

# -- OpenAI Responses ---------------------------------------------------------------------------------------

RESPONSES_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather.",
        "parameters": WEATHER_PARAMETERS,
    },
    {
        "type": "function",
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}},
        "strict": True,
    },
]

RESPONSES_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "string_input_with_instructions",
        {"instructions": "You are a poet.", "input": "Write a haiku about rain."},
    ),
    (
        "message_items",
        {
            "input": [
                {"role": "system", "content": "Be concise."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Name a color."}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Blue.", "annotations": []}],
                },
                {"role": "user", "content": "Another?"},
            ]
        },
    ),
    (
        "function_call_history",
        {
            "instructions": "Use tools.",
            "tools": RESPONSES_TOOLS,
            "input": [
                {"role": "user", "content": "Weather in Lima?"},
                {
                    "type": "function_call",
                    "call_id": "call_a",
                    "name": "get_weather",
                    "arguments": '{"city": "Lima"}',
                },
                {"type": "function_call_output", "call_id": "call_a", "output": "22 C, humid"},
            ],
        },
    ),
    (
        "reasoning_items_and_effort",
        {
            "tools": RESPONSES_TOOLS,
            "reasoning": {"effort": "none"},
            "input": [
                {"role": "user", "content": "Time in Tokyo, then weather?"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Call get_time first."}],
                },
                {"type": "function_call", "call_id": "call_t", "name": "get_time", "arguments": "{}"},
                {
                    "type": "function_call",
                    "call_id": "call_w",
                    "name": "get_weather",
                    "arguments": '{"city": "Tokyo"}',
                },
                {"type": "function_call_output", "call_id": "call_t", "output": "21:04"},
                {"type": "function_call_output", "call_id": "call_w", "output": "22 C"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "21:04 and 22 C."}],
                },
                {"role": "user", "content": "Thanks. And Osaka?"},
            ],
        },
    ),
    (
        "custom_namespace_and_builtin_tools",
        {
            "tools": [
                {"type": "custom", "name": "run_sql", "description": "Run a SQL query."},
                {
                    "type": "namespace",
                    "name": "files",
                    "description": "File tools.",
                    "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
                },
                {"type": "web_search"},
            ],
            "input": [
                {"role": "user", "content": "How many users?"},
                {
                    "type": "custom_tool_call",
                    "call_id": "call_s",
                    "name": "run_sql",
                    "input": "SELECT count(*) FROM u",
                },
                {"type": "custom_tool_call_output", "call_id": "call_s", "output": "42"},
            ],
        },
    ),
    (
        "continue_in_progress_assistant",
        {
            "input": [
                {"role": "developer", "content": "Answer with numbers only."},
                {"role": "user", "content": "Count to five."},
                {"type": "message", "role": "assistant", "status": "in_progress", "content": "1, 2, 3,"},
            ]
        },
    ),
]


# -- chat normalization (/v1/chat/completions/render) --------------------------------------------------------
# The optional fields of tools, tool calls and messages that vLLM 0.33's request models fill in, drop or refuse.

_USER = {"role": "user", "content": "Weather in Paris?"}
_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}


def _with_call(call: dict[str, Any], **assistant: Any) -> dict[str, Any]:
    """A tool-calling turn: the user asks, the assistant calls, the tool answers (reasoning after it renders)."""
    turn = {"role": "assistant", "content": "", "tool_calls": [call], **assistant}
    return {"messages": [_USER, turn, _RESULT], "tools": [WEATHER_TOOL]}


def _tool(**function: Any) -> dict[str, Any]:
    return {"messages": [_USER], "tools": [{"type": "function", "function": {"name": "f", **function}}]}


NORMALIZATION_CASES: list[tuple[str, dict[str, Any]]] = [
    # tools: the template sees vLLM's dump of each
    ("tool_without_description", _tool(parameters={"type": "object"})),
    ("tool_name_only", _tool()),
    ("tool_strict_null_and_extra_keys", {"messages": [_USER], "tools": [{**BARE_TOOL, "cache_control": {}}]}),
    ("tool_strict_true", _tool(description="d", parameters={"type": "object"}, strict=True)),
    (
        "tool_keys_out_of_order_without_type",
        {
            "messages": [_USER],
            "tools": [{"function": {"parameters": WEATHER_PARAMETERS, "name": "get_weather"}}],
        },
    ),
    ("tool_defer_loading", {"messages": [_USER], "tools": [{**WEATHER_TOOL, "defer_loading": True}]}),
    # assistant reasoning: `reasoning`, else `reasoning_content`; `thinking` is no message field
    ("reasoning", _with_call(_CALL, reasoning="I should call get_weather.")),
    ("reasoning_content", _with_call(_CALL, reasoning_content="I should call get_weather.")),
    ("reasoning_over_reasoning_content", _with_call(_CALL, reasoning="A", reasoning_content="B")),
    ("thinking_field_dropped", _with_call(_CALL, thinking="not rendered")),
    ("reasoning_effort_none", {"messages": [_USER], "reasoning_effort": "none"}),
    # content parts
    (
        "text_part_null_skipped_empty_dropped",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": None},
                        {"type": "text", "text": ""},
                        {"type": "text", "text": "b"},
                    ],
                }
            ]
        },
    ),
    (
        "thinking_part_is_text",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "u"}],
                }
            ]
        },
    ),
    (
        "tool_reference_part",
        {
            "messages": [
                _USER,
                {"role": "assistant", "content": None, "tool_calls": [_CALL]},
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "content": [{"type": "tool_reference", "name": "get_weather"}],
                },
            ],
            "tools": [WEATHER_TOOL],
        },
    ),
    (
        "billing_header_line_dropped",
        {
            "messages": [
                {"role": "system", "content": "x-anthropic-billing-header: cch=1f2e\nYou are terse."},
                {"role": "user", "content": "Hi"},
            ]
        },
    ),
    (
        "tool_message_without_call_id",
        {
            "messages": [
                _USER,
                {"role": "assistant", "content": None, "tool_calls": [_CALL]},
                {"role": "tool", "content": "18 C"},
            ],
            "tools": [WEATHER_TOOL],
        },
    ),
]

# What vLLM's request models refuse (each a 400 on both servers).
NORMALIZATION_REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("tools_empty", {"messages": [_USER], "tools": []}),
    ("tool_choice_without_tools", {"messages": [_USER], "tool_choice": "auto"}),
    (
        "tool_choice_unknown_function",
        {
            "messages": [_USER],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "x"}},
        },
    ),
    (
        "call_arguments_object",
        _with_call({**_CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}),
    ),
    ("call_arguments_null", _with_call({**_CALL, "function": {"name": "get_weather", "arguments": None}})),
    ("call_without_id", _with_call({"type": "function", "function": _CALL["function"]})),
    ("call_without_type", _with_call({"id": "call_1", "function": _CALL["function"]})),
    ("user_content_null", {"messages": [{"role": "user", "content": None}]}),
    (
        "tool_content_null",
        {
            "messages": [
                _USER,
                {"role": "assistant", "tool_calls": [_CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": None},
            ],
            "tools": [WEATHER_TOOL],
        },
    ),
    ("input_text_part", {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}),
    ("part_without_type", {"messages": [{"role": "user", "content": [{"text": "x"}]}]}),
    ("string_part", {"messages": [{"role": "user", "content": ["x"]}]}),
    ("text_part_without_text", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    (
        "refusal_part_null",
        {"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": None}]}]},
    ),
]

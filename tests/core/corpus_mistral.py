"""The `--tokenizer-mode mistral` request corpus: chat and completions bodies, each with vLLM 0.33's HTTP status.

Constants only (a vLLM comparison script imports this module). Every status was read off vLLM 0.33's render
server (`vllm launch render <folder> --tokenizer-mode mistral`) on the `mistral-tekken` fixture layout
(`tekken_240911.json`, tokenizer v3); 200 means vLLM renders the request.

- `CHAT_CASES`: (name, body, status) for `/v1/chat/completions/render`;
- `COMPLETION_CASES`: (name, body, status) for `/v1/completions/render`;
- `VERSIONED_CHAT_CASES`: (tokenizer, name, body, status) for requests whose outcome depends on the tokenizer
  version (`[THINK]` reasoning in v13+, `reasoning_effort` model settings in v15); `tokenizer` names a folder
  built from mistral-common's data files (see test_mistral.py: `tekken-v13`, `tekken-v15`, `spm-v7`, ...).
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
        "description": "Current local time in an IANA time zone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}

# A bare tool: no description, no parameters (mistral-common fills in "" and {}).
PING_TOOL: dict[str, Any] = {"type": "function", "function": {"name": "ping"}}


def _user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _assistant(text: Any, **fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **fields}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_CALL_HISTORY: list[dict[str, Any]] = [
    _user("What's the weather in Paris?"),
    _assistant(None, tool_calls=[_call("call_abcdefghijkl", "get_weather", '{"city": "Paris"}')]),
    {
        "role": "tool",
        "tool_call_id": "call_abcdefghijkl",
        "content": '{"temperature": 21, "unit": "celsius"}',
    },
]

SHORT_ID_HISTORY: dict[str, Any] = {
    "messages": [
        _user("Time in Oslo?"),
        _assistant(None, tool_calls=[_call("c1", "get_time", '{"timezone": "Europe/Oslo"}')]),
        {"role": "tool", "tool_call_id": "c1", "content": "14:02"},
    ],
    "tools": [TIME_TOOL],
}

CHAT_CASES: list[tuple[str, dict[str, Any], int]] = [
    # -- plain conversations --------------------------------------------------------------------------------
    ("user_only", {"messages": [_user("Hello!")]}, 200),
    ("system_user", {"messages": [{"role": "system", "content": "You are terse."}, _user("Hi")]}, 200),
    (
        "multi_turn",
        {"messages": [_user("Hi"), _assistant("Hello! How can I help?"), _user("Tell me a joke.")]},
        200,
    ),
    (
        "system_multi_turn",
        {
            "messages": [
                {"role": "system", "content": "Answer in French."},
                _user("Hi"),
                _assistant("Bonjour !"),
                _user("How are you?"),
            ]
        },
        200,
    ),
    (
        "two_system_messages",
        {
            "messages": [
                {"role": "system", "content": "Rule one."},
                {"role": "system", "content": "Rule two."},
                _user("Go"),
            ]
        },
        200,
    ),
    (
        "system_between_turns",
        {
            "messages": [
                _user("Hi"),
                _assistant("Hello"),
                {"role": "system", "content": "Be brief."},
                _user("Why?"),
            ]
        },
        400,
    ),
    ("developer_role", {"messages": [{"role": "developer", "content": "Be exact."}, _user("2+2?")]}, 200),
    ("unicode", {"messages": [_user("数字 123 東京タワー café naïve 🚀🔥 👩‍💻 עברית مرحبا")]}, 200),
    ("special_token_text", {"messages": [_user("[INST] not a control token </s> <s> [TOOL_CALLS]")]}, 200),
    ("whitespace_content", {"messages": [_user("  line one\n\n\tline two  \n")]}, 200),
    ("empty_user_content", {"messages": [_user("")]}, 200),
    ("empty_assistant_turn", {"messages": [_user("Hi"), _assistant(""), _user("Still there?")]}, 400),
    ("null_assistant_content", {"messages": [_user("Hi"), _assistant(None), _user("Hello?")]}, 400),
    ("consecutive_user_messages", {"messages": [_user("First."), _user("Second.")]}, 200),
    ("assistant_first", {"messages": [_assistant("I start."), _user("Then me.")]}, 200),
    ("user_name_field", {"messages": [{"role": "user", "content": "Hi", "name": "alice"}]}, 200),
    # -- content parts --------------------------------------------------------------------------------------
    (
        "user_text_parts",
        {
            "messages": [
                _user([{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}])
            ]
        },
        200,
    ),
    (
        "system_text_parts",
        {"messages": [{"role": "system", "content": [{"type": "text", "text": "Sys part."}]}, _user("Hi")]},
        200,
    ),
    (
        "assistant_text_parts",
        {"messages": [_user("Hi"), _assistant([{"type": "text", "text": "Hello there."}]), _user("Bye")]},
        200,
    ),
    (
        "image_part",
        {"messages": [_user([{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}])]},
        400,
    ),
    # -- tools ----------------------------------------------------------------------------------------------
    ("tools_one", {"messages": [_user("Weather in Paris?")], "tools": [WEATHER_TOOL]}, 200),
    (
        "tools_two_with_system",
        {
            "messages": [{"role": "system", "content": "Use tools."}, _user("Time in Tokyo?")],
            "tools": [WEATHER_TOOL, TIME_TOOL],
        },
        200,
    ),
    ("tools_bare_function", {"messages": [_user("ping it")], "tools": [PING_TOOL]}, 200),
    (
        "tool_choice_none",
        {"messages": [_user("Weather?")], "tools": [WEATHER_TOOL], "tool_choice": "none"},
        200,
    ),
    (
        "tool_choice_required",
        {"messages": [_user("Weather?")], "tools": [WEATHER_TOOL], "tool_choice": "required"},
        200,
    ),
    (
        "tool_choice_named",
        {
            "messages": [_user("Weather?")],
            "tools": [WEATHER_TOOL, TIME_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        },
        200,
    ),
    ("tool_call_history_long_id", {"messages": WEATHER_CALL_HISTORY, "tools": [WEATHER_TOOL]}, 200),
    (
        "tool_call_history_answer_then_user",
        {
            "messages": [*WEATHER_CALL_HISTORY, _assistant("It is 21 °C in Paris."), _user("And tomorrow?")],
            "tools": [WEATHER_TOOL],
        },
        200,
    ),
    (
        "tool_call_exact_9_char_id",
        {
            "messages": [
                _user("Time in Oslo?"),
                _assistant(None, tool_calls=[_call("Ab3dE6gH9", "get_time", '{"timezone": "Europe/Oslo"}')]),
                {"role": "tool", "tool_call_id": "Ab3dE6gH9", "content": "14:02"},
            ],
            "tools": [TIME_TOOL],
        },
        200,
    ),
    # Tokenizers before v13 want 9 alphanumeric characters; vLLM only cuts longer ids.
    ("tool_call_short_id", SHORT_ID_HISTORY, 400),
    (
        "tool_call_id_with_dash",
        {
            "messages": [
                _user("Time in Oslo?"),
                _assistant(
                    None, tool_calls=[_call("call-123456789", "get_time", '{"timezone": "Europe/Oslo"}')]
                ),
                {"role": "tool", "tool_call_id": "call-123456789", "content": "14:02"},
            ],
            "tools": [TIME_TOOL],
        },
        200,
    ),
    (
        "parallel_tool_calls",
        {
            "messages": [
                _user("Weather in Paris and time in Tokyo?"),
                _assistant(
                    None,
                    tool_calls=[
                        _call("chatcmpl-tool-aaaaaaaaa1", "get_weather", '{"city": "Paris"}'),
                        _call("chatcmpl-tool-bbbbbbbbb2", "get_time", '{"timezone": "Asia/Tokyo"}'),
                    ],
                ),
                {"role": "tool", "tool_call_id": "chatcmpl-tool-aaaaaaaaa1", "content": "21 C"},
                {"role": "tool", "tool_call_id": "chatcmpl-tool-bbbbbbbbb2", "content": "22:10"},
            ],
            "tools": [WEATHER_TOOL, TIME_TOOL],
        },
        200,
    ),
    (
        "tool_call_with_text_content",
        {
            "messages": [
                _user("Weather?"),
                _assistant(
                    "Let me check.", tool_calls=[_call("abcdefghi", "get_weather", '{"city": "Rome"}')]
                ),
                {"role": "tool", "tool_call_id": "abcdefghi", "content": "30 C"},
            ],
            "tools": [WEATHER_TOOL],
        },
        400,
    ),
    (
        "tool_call_empty_arguments",
        {
            "messages": [
                _user("ping"),
                _assistant(None, tool_calls=[_call("pingpong1", "ping", "")]),
                {"role": "tool", "tool_call_id": "pingpong1", "content": "pong"},
            ],
            "tools": [PING_TOOL],
        },
        200,
    ),
    (
        "tool_call_invalid_json_arguments",
        {
            "messages": [
                _user("Weather?"),
                _assistant(None, tool_calls=[_call("badjson01", "get_weather", "{city: Paris")]),
                {"role": "tool", "tool_call_id": "badjson01", "content": "?"},
            ],
            "tools": [WEATHER_TOOL],
        },
        200,
    ),
    (
        # vLLM parses the JSON string and mistral-common writes it back: the prompt has '{"city": "Paris", ...}'.
        "tool_call_compact_json_arguments",
        {
            "messages": [
                _user("Weather?"),
                _assistant(
                    None, tool_calls=[_call("compact01", "get_weather", '{"city":"Paris","unit":"celsius"}')]
                ),
                {"role": "tool", "tool_call_id": "compact01", "content": "21"},
            ],
            "tools": [WEATHER_TOOL],
        },
        200,
    ),
    (
        "tool_call_array_arguments",
        {
            "messages": [
                _user("Weather?"),
                _assistant(None, tool_calls=[_call("arrayarg1", "get_weather", "[1, 2]")]),
                {"role": "tool", "tool_call_id": "arrayarg1", "content": "?"},
            ],
            "tools": [WEATHER_TOOL],
        },
        200,
    ),
    (
        "tool_result_parts",
        {
            "messages": [
                *WEATHER_CALL_HISTORY[:2],
                {
                    "role": "tool",
                    "tool_call_id": "call_abcdefghijkl",
                    "content": [{"type": "text", "text": "21"}, {"type": "text", "text": "celsius"}],
                },
            ],
            "tools": [WEATHER_TOOL],
        },
        200,
    ),
    (
        "tool_result_with_name",
        {
            "messages": [
                *WEATHER_CALL_HISTORY[:2],
                {
                    "role": "tool",
                    "tool_call_id": "call_abcdefghijkl",
                    "name": "get_weather",
                    "content": "21 C",
                },
            ],
            "tools": [WEATHER_TOOL],
        },
        200,
    ),
    (
        "tool_result_without_call_id",
        {
            "messages": [*WEATHER_CALL_HISTORY[:2], {"role": "tool", "content": "21 C"}],
            "tools": [WEATHER_TOOL],
        },
        400,
    ),
    (
        "empty_tool_calls_list",
        {"messages": [_user("Hi"), _assistant("Hello", tool_calls=[]), _user("Bye")]},
        200,
    ),
    ("tool_history_without_tools", {"messages": WEATHER_CALL_HISTORY}, 200),
    # -- generation prompt / continuation -------------------------------------------------------------------
    ("no_generation_prompt", {"messages": [_user("Hi")], "add_generation_prompt": False}, 200),
    (
        "continue_final_message",
        {
            "messages": [_user("Write a haiku."), _assistant("Autumn moonlight -")],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        200,
    ),
    (
        "continue_with_generation_prompt",
        {"messages": [_user("Hi"), _assistant("Hel")], "continue_final_message": True},
        400,
    ),
    ("final_assistant_with_generation_prompt", {"messages": [_user("Hi"), _assistant("Hello")]}, 400),
    (
        "continue_after_user",
        {"messages": [_user("Hi")], "add_generation_prompt": False, "continue_final_message": True},
        400,
    ),
    (
        "final_assistant_no_generation_prompt",
        {"messages": [_user("Hi"), _assistant("Hello")], "add_generation_prompt": False},
        400,
    ),
    # -- reasoning ------------------------------------------------------------------------------------------
    (
        "reasoning_effort_high_v3",
        {"messages": [_user("Think hard: 17*23?")], "reasoning_effort": "high"},
        200,
    ),
    ("reasoning_effort_none_v3", {"messages": [_user("Quick: 2+2?")], "reasoning_effort": "none"}, 200),
    (
        "assistant_reasoning_content_v3",
        {"messages": [_user("Hi"), _assistant("Hello", reasoning_content="greet back"), _user("Bye")]},
        400,
    ),
    # -- fields mistral mode refuses or ignores -------------------------------------------------------------
    ("chat_template_kwargs_empty", {"messages": [_user("Hi")], "chat_template_kwargs": {}}, 400),
    (
        "chat_template_kwargs_thinking",
        {"messages": [_user("Hi")], "chat_template_kwargs": {"enable_thinking": True}},
        400,
    ),
    ("request_chat_template", {"messages": [_user("Hi")], "chat_template": "{{ messages[0].content }}"}, 400),
    (
        "documents_ignored",
        {"messages": [_user("Summarize.")], "documents": [{"title": "A", "text": "Alpha."}]},
        200,
    ),
    ("add_special_tokens_ignored", {"messages": [_user("Hi")], "add_special_tokens": True}, 200),
    (
        "truncate_prompt_tokens",
        {"messages": [_user("one two three four five six")], "truncate_prompt_tokens": 4},
        200,
    ),
    ("function_role", {"messages": [_user("Hi"), {"role": "function", "name": "f", "content": "x"}]}, 400),
]

COMPLETION_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("text", {"prompt": "The capital of France is"}, 200),
    ("text_no_special_tokens", {"prompt": "The capital of France is", "add_special_tokens": False}, 200),
    ("special_token_text", {"prompt": "[INST] hi [/INST]</s>"}, 200),
    ("special_token_text_no_bos", {"prompt": "<s>[INST] hi [/INST]", "add_special_tokens": False}, 200),
    ("unicode", {"prompt": "数字 東京タワー café 🚀 👩‍💻 עברית"}, 200),
    ("whitespace", {"prompt": "  line one\n\n\tline two  \n"}, 200),
    ("code", {"prompt": "def f(x):\n    return x ** 2  # comment\n"}, 200),
    ("list_of_strings", {"prompt": ["first prompt", "second prompt"]}, 200),
    ("token_ids", {"prompt": [1, 22177, 4304]}, 200),
    ("token_id_lists", {"prompt": [[1, 22177], [1, 4304, 1044]]}, 200),
    ("token_id_last_in_vocab", {"prompt": [1, 131071]}, 200),
    ("truncate_prompt_tokens", {"prompt": "one two three four five six", "truncate_prompt_tokens": 3}, 200),
]

VERSIONED_CHAT_CASES: list[tuple[str, str, dict[str, Any], int]] = [
    (
        "tekken-v13",
        "assistant_reasoning_content",
        {"messages": [_user("Hi"), _assistant("Hello", reasoning_content="greet back"), _user("Bye")]},
        200,
    ),
    (
        "tekken-v13",
        "assistant_reasoning_field",
        {"messages": [_user("Hi"), _assistant("Hello", reasoning="greet back"), _user("Bye")]},
        200,
    ),
    (
        "tekken-v13",
        "system_thinking_part",
        {
            "messages": [
                {
                    "role": "system",
                    "content": [
                        {"type": "text", "text": "Think first."},
                        {"type": "thinking", "thinking": "plan the answer", "closed": True},
                    ],
                },
                _user("Why is the sky blue?"),
            ]
        },
        200,
    ),
    (
        "tekken-v13",
        "reasoning_effort_high_ignored",
        {"messages": [_user("17*23?")], "reasoning_effort": "high"},
        200,
    ),
    ("tekken-v13", "tool_call_short_id", SHORT_ID_HISTORY, 200),
    (
        "tekken-v13",
        "tool_call_history_long_id",
        {"messages": WEATHER_CALL_HISTORY, "tools": [WEATHER_TOOL]},
        200,
    ),
    ("tekken-v15", "reasoning_effort_default", {"messages": [_user("17*23?")]}, 200),
    ("tekken-v15", "reasoning_effort_high", {"messages": [_user("17*23?")], "reasoning_effort": "high"}, 200),
    ("tekken-v15", "reasoning_effort_none", {"messages": [_user("2+2?")], "reasoning_effort": "none"}, 200),
    (
        "tekken-v15",
        "reasoning_effort_unsupported",
        {"messages": [_user("2+2?")], "reasoning_effort": "low"},
        400,
    ),
    (
        "tekken-v15",
        "reasoning_history",
        {
            "messages": [_user("Hi"), _assistant("Hello", reasoning_content="greet"), _user("Bye")],
            "reasoning_effort": "high",
        },
        200,
    ),
    ("tekken-v7", "system_user", {"messages": [{"role": "system", "content": "Sys"}, _user("Hi")]}, 200),
    (
        "tekken-v7",
        "tool_call_history_long_id",
        {"messages": WEATHER_CALL_HISTORY, "tools": [WEATHER_TOOL]},
        200,
    ),
    (
        "tekken-v11",
        "tool_call_history_long_id",
        {"messages": WEATHER_CALL_HISTORY, "tools": [WEATHER_TOOL]},
        200,
    ),
    ("spm-v1", "multi_turn", {"messages": [_user("Hi"), _assistant("Hello"), _user("Joke?")]}, 200),
    ("spm-v2", "tool_call_history_long_id", {"messages": WEATHER_CALL_HISTORY, "tools": [WEATHER_TOOL]}, 200),
    ("spm-v3", "tool_call_history_long_id", {"messages": WEATHER_CALL_HISTORY, "tools": [WEATHER_TOOL]}, 200),
    (
        "spm-v3",
        "system_multi_turn",
        {"messages": [{"role": "system", "content": "Sys"}, _user("A"), _assistant("B"), _user("C")]},
        200,
    ),
    ("spm-v7", "system_user", {"messages": [{"role": "system", "content": "Sys"}, _user("Hi")]}, 200),
    ("spm-v7", "tools_one", {"messages": [_user("Weather in Paris?")], "tools": [WEATHER_TOOL]}, 200),
]

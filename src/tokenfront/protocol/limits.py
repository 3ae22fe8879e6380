"""What one request may ask for: a `RequestLimits` value, passed to validation, never a module global.

A server builds one from its flags at start-up and validates every body with `validation_context(limits)`
(pydantic's validation context); the request models' before-validators read it back with `limits_of(info)`.
A body validated without a context (a library caller, a test) gets `DEFAULT_LIMITS`. The counts are checked
before the items are validated: validating 100,000 tools is one call that holds the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BeforeValidator, ValidationInfo

__all__ = [
    "BOUNDED_INPUT_ITEMS",
    "BOUNDED_MESSAGES",
    "BOUNDED_STOP",
    "BOUNDED_TOOLS",
    "DEFAULT_LIMITS",
    "MAX_MESSAGES",
    "MAX_SEQUENCES_PER_REQUEST",
    "MAX_STOP_CHARACTERS",
    "MAX_TOKENS_PER_REQUEST",
    "MAX_TOOLS",
    "RequestLimits",
    "check_message_count",
    "check_stop_strings",
    "check_tool_count",
    "limits_of",
    "validation_context",
]

# Messages (chat, /tokenize, Anthropic) or input items (Responses) in one request. Each costs validation,
# normalization and template work before the prompt's length can refuse it.
MAX_MESSAGES = 4096
# Tools in one request (chat, /tokenize, Anthropic, Responses). Each costs validation and template work before
# the prompt's length can refuse it, and validating a tool list is one call that holds the interpreter (100,000
# tools: over a second in which no other thread, the event loop's included, runs). 4096 tools are some 400k
# prompt tokens, more than any context holds; OpenAI takes 128, vLLM any number.
MAX_TOOLS = 4096
# The characters of one request's stop strings, summed: they become one automaton (core/output/stop_strings.py)
# whose size and build time grow with them; at this bound about 2.5 MB, built in 10-35 ms (so a server builds
# it where the request is, even on the event loop). OpenAI takes 4 stop strings, vLLM any number; no real use
# comes near this.
MAX_STOP_CHARACTERS = 16_384
# What one worker request may ask the engine for (`--max-sequences-per-request`, `--max-tokens-per-request`;
# checked by worker.sampling). Sequences: prompts x n (n alone is at most 128). Tokens: over all its sequences,
# prompt ids plus the generation budget (max_tokens, else the context's room): 128 sequences of a 128k context
# fit.
MAX_SEQUENCES_PER_REQUEST = 1024
MAX_TOKENS_PER_REQUEST = 1 << 24


@dataclass(frozen=True)
class RequestLimits:
    """The bounds a server holds one request to (`--max-messages`; the worker's `--max-sequences-per-request`
    and `--max-tokens-per-request`); the rest are fixed."""

    max_messages: int = MAX_MESSAGES
    max_tools: int = MAX_TOOLS
    max_stop_characters: int = MAX_STOP_CHARACTERS
    max_sequences_per_request: int = MAX_SEQUENCES_PER_REQUEST
    max_tokens_per_request: int = MAX_TOKENS_PER_REQUEST


DEFAULT_LIMITS = RequestLimits()


def validation_context(limits: RequestLimits) -> dict[str, Any]:
    """The pydantic validation context that holds a body to `limits` (`Model.model_validate(body, context=...)`)."""
    return {"limits": limits}


def limits_of(info: ValidationInfo) -> RequestLimits:
    """The limits a validation was given (`validation_context`), else the defaults."""
    context = info.context
    limits = context.get("limits") if isinstance(context, dict) else None
    return limits if isinstance(limits, RequestLimits) else DEFAULT_LIMITS


def _at_most(value: Any, limit: int, items: str, advice: str) -> Any:
    if isinstance(value, list) and len(value) > limit:
        raise ValueError(
            f"{len(value)} {items} are more than this server accepts in one request ({limit}): {advice}"
        )
    return value


def check_message_count(value: Any, limits: RequestLimits, field: str = "messages") -> Any:
    """A 400 for more than `limits.max_messages` items, checked before the items are validated (a
    before-validator)."""
    return _at_most(value, limits.max_messages, field, "shorten the conversation")


def check_tool_count(value: Any, limits: RequestLimits) -> Any:
    """A 400 for more than `limits.max_tools` tools, checked before the tools are validated (a
    before-validator)."""
    return _at_most(value, limits.max_tools, "tools", "send the tools this conversation may call")


def check_stop_strings(value: Any, limits: RequestLimits) -> Any:
    """A 400 for stop strings of more than `limits.max_stop_characters` characters in all, checked before the
    strings are validated (a before-validator)."""
    strings = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    total = sum(len(s) for s in strings if isinstance(s, str))
    if total > limits.max_stop_characters:
        raise ValueError(
            f"the stop strings add up to {total:,} characters ({len(strings):,} strings); at most "
            f"{limits.max_stop_characters:,} are accepted: send fewer or shorter ones"
        )
    return value


# The checks as field annotations (`Annotated[list[Tool] | None, BOUNDED_TOOLS]`): before-validators that read
# the limits the body is validated with, so every request model bounds its lists the one same way.
def _messages(value: Any, info: ValidationInfo) -> Any:
    return check_message_count(value, limits_of(info))


def _input_items(value: Any, info: ValidationInfo) -> Any:
    return check_message_count(value, limits_of(info), "input items")


def _tools(value: Any, info: ValidationInfo) -> Any:
    return check_tool_count(value, limits_of(info))


def _stop(value: Any, info: ValidationInfo) -> Any:
    return check_stop_strings(value, limits_of(info))


BOUNDED_MESSAGES = BeforeValidator(_messages)
BOUNDED_INPUT_ITEMS = BeforeValidator(_input_items)
BOUNDED_TOOLS = BeforeValidator(_tools)
BOUNDED_STOP = BeforeValidator(_stop)

"""The output core: generated token ids into an OpenAI answer. Knows no HTTP.

Everything in tokenfront that turns ids back into an answer calls this package: the worker (its own
engine's ids), the derender routes (ids a client sends) and the router (ids a vLLM worker's
`/inference/v1/generate` streams). One choice is read by one `ChoiceParser`:

    ids -> detokenizer.IncrementalDetokenizer -> stop_strings.StopStringMatcher
        -> reasoning.ReasoningStream -> calls.ToolCallHold | calls.ForcedToolCall
        (or harmony.HarmonyStream for gpt-oss, whose channels say what is reasoning, content and a call)

and `formatting` shapes the result as OpenAI objects (`ChatFormatter`, `CompletionFormatter`). What a
model writes (its markers, its call syntax, its forced-call prefix) is defined by the parsers in
`core.reasoning` and `core.tool_calls`; this package only follows them through a stream.

Three ways to drive a choice, all giving the same text (the parser moves one id at a time, so chunking
never changes the result):

- token by token, as the worker does: `parser.push(id)` per generated id, `parser.finish(reason)` last;
- a whole output, as non-streaming derender does: `parse_output(config, tokenizer, ids, reason)`, equal
  to the concatenated deltas of the same ids streamed;
- resumed across calls, as streaming derender does (the client carries `stream_state` between calls):
  `ChoiceParser.resume(config, tokenizer, state)`, then `push_ids(chunk)` (and `finish` on the last
  chunk), then `parser.state()` goes back to the client.

The carried state (`ChoiceParser.state()`) is JSON data, versioned, holding only what the output so far
leaves behind: the detokenizer's window (the last few ids and how many of them are shown), text held back
for a stop string, the reasoning phase and the few characters that could start a marker, the content a
tool-call parser reads at the end (only when the request takes calls), Harmony's message state. Its size
is bounded by the window and the markers, except for that content. The configuration is never in it: each
call rebuilds the same `OutputConfig` from the request (`OutputConfig.for_chat(request, ...)` /
`for_completion`), so a state cannot change how output is read. The prompt is needed only on the first
call (`context_ids`, and the reasoning start read off its tail); afterwards both live in the state.
vLLM's own `stream_state` replays all output ids on every call instead; a derender route can accept that
form too, since `ChoiceParser(config, tokenizer, context_ids=...).push_ids(output_token_ids)` rebuilds
the same state. What a response needs across chunks beyond parsing (whether the role was sent, logprob
offsets) is the route's to carry, next to this state.
"""

from __future__ import annotations

from tokenfront.core.output.choice import (
    STATE_VERSION,
    ChoiceParser,
    OutputConfig,
    OutputDelta,
    OutputStateError,
    TokenDecoder,
    parse_output,
    resolve_finish_reason,
)
from tokenfront.core.output.formatting import (
    AnswerHead,
    ChatFormatter,
    CompletionFormatter,
    FinishedChoice,
    ResponseFormatter,
    SampledToken,
    chat_logprobs,
    completion_logprobs,
    usage,
    vllm_usage,
)

__all__ = [
    "STATE_VERSION",
    "AnswerHead",
    "ChatFormatter",
    "ChoiceParser",
    "CompletionFormatter",
    "FinishedChoice",
    "OutputConfig",
    "OutputDelta",
    "OutputStateError",
    "ResponseFormatter",
    "SampledToken",
    "TokenDecoder",
    "chat_logprobs",
    "completion_logprobs",
    "parse_output",
    "resolve_finish_reason",
    "usage",
    "vllm_usage",
]

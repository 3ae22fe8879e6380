"""Prompt preparation: the ids a chat or completions request gives the engine, and how usage counts them.

Chat `messages` are rendered by the shared `RenderPipeline` (the renderer's, so ids match), with the
forced-call prefix of a named tool_choice rendered into the prompt by the pipeline itself; `prompt_token_ids`
and id prompts are taken as given (validated against the vocabulary, never rendered).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenfront.core.families import ModelFamily, family_for
from tokenfront.core.reasoning import reasoning_ended
from tokenfront.core.render import RenderPipeline
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest, check_tools
from tokenfront.server.errors import APIError
from tokenfront.worker.metrics import WorkerMetrics

__all__ = ["NAMED_TOOL_WITH_IDS", "PromptBuilder", "PromptInput", "usage_prompt_tokens"]

# Prompt ids decoded to find the reasoning mode of an id prompt: markers are a few tokens at most.
_PROMPT_TAIL_TOKENS = 16
NAMED_TOOL_WITH_IDS = (
    "named tool_choice cannot be used with prompt_token_ids: the worker must render the prompt itself to "
    "append the forced tool-call prefix; send `messages` without prompt_token_ids instead"
)


@dataclass(frozen=True)
class PromptInput:
    """A prompt ready for the engine.

    `usage_tokens` is what `usage.prompt_tokens` reports (the family may exclude a rendered tail); `text` the
    text the ids were encoded from (None for given chat ids; a completions id prompt's decoded text when the
    request asks for echo, else None); `source` "rendered" or "token_ids"; `reasoning_ended` the prompt's
    reasoning mode, read only for a parser that takes it from the prompt.

    The ids are a tuple: a prompt lives as long as its request, and a tuple of ints leaves the garbage
    collector's lists once it survives a collection, where a list's every id is walked again at each full
    collection (thousands of long prompts in flight in a simulated fleet made those pauses last seconds).
    """

    token_ids: tuple[int, ...]
    usage_tokens: int
    source: str
    text: str | None = None
    reasoning_ended: bool | None = None


def usage_prompt_tokens(
    family: ModelFamily, rendered_text: str, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str]
) -> int:
    """`usage.prompt_tokens` of a prompt the worker rendered: its length minus what the family excludes."""
    excluded = family.usage_excluded_prompt_tokens(rendered_text, token_ids, decode)
    return len(token_ids) - max(0, min(excluded, len(token_ids)))


class PromptBuilder:
    """Turns a request into `PromptInput`s, counting each prompt in the metrics by its source."""

    def __init__(self, pipeline: RenderPipeline, metrics: WorkerMetrics) -> None:
        self.pipeline = pipeline
        self.metrics = metrics
        self.family = family_for(pipeline.checkpoint.model_type)

    def forced_tool(self, request: ChatCompletionRequest) -> str | None:
        """The function a named tool_choice forces, checked: the worker can force it for this request."""
        name = request.named_tool
        if name is None:
            return None
        if request.prompt_token_ids is not None:
            raise APIError(400, NAMED_TOOL_WITH_IDS, param="tool_choice", code="named_tool_choice_with_ids")
        if self.pipeline.tool_call_parser is None:
            raise APIError(
                400,
                "a named tool_choice needs a tool-call parser to force the call: start the worker with "
                "--tool-call-parser (e.g. hermes), or use tool_choice auto",
                param="tool_choice",
            )
        # The request model refuses a tool_choice without its tool already; checked again with the same rule
        # (and message, the renderer's) for a request built without validation.
        check_tools(request.tools, request.tool_choice)
        return name

    def chat(self, request: ChatCompletionRequest, *, forced_tool: str | None = None) -> PromptInput:
        """The prompt of a chat request: its `prompt_token_ids`, or its messages rendered (with the
        forced-call prefix of `forced_tool`, from `forced_tool()`)."""
        parser = self.pipeline.reasoning_parser
        reads_mode = parser is not None and parser.reads_mode_from_prompt
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            self._check_ids(ids, "prompt_token_ids")
            self.metrics.prompt("chat", "token_ids", ids)
            ended = None
            if reads_mode:
                # Only the tail tells the mode: decode the last few ids (special tokens are markers too).
                ended = reasoning_ended(parser, self._decode_raw(ids[-_PROMPT_TAIL_TOKENS:]))
            return PromptInput(tuple(ids), len(ids), "token_ids", reasoning_ended=ended)
        rendered = self.pipeline.render_chat(request, forced_tool=forced_tool)
        self.metrics.prompt("chat", "rendered", rendered.token_ids)
        text, ids = rendered.prompt_text or "", rendered.token_ids
        usage = usage_prompt_tokens(self.family, text, ids, self._decode_raw)
        ended = rendered.reasoning_ended if reads_mode else None
        return PromptInput(tuple(ids), usage, "rendered", text=text, reasoning_ended=ended)

    def completion(self, request: CompletionRequest) -> list[PromptInput]:
        """The prompts of a completions request, one per item: text rendered, ids as given (their text decoded
        only for `echo`, its one reader: a long id prompt's decode costs more than the rest of the request)."""
        prompts = []
        for item in self.pipeline.render_completion(request):
            source = "token_ids" if item.prompt_text is None else "rendered"
            self.metrics.prompt("completion", source, item.token_ids)
            text = item.prompt_text
            if text is None and request.echo:
                text = self._decode(item.token_ids)
            prompts.append(PromptInput(tuple(item.token_ids), len(item.token_ids), source, text))
        return prompts

    def _check_ids(self, ids: list[int], param: str) -> None:
        if not ids:
            raise APIError(400, f"{param} is empty: send at least one token id", param=param)
        self.pipeline.validate_token_ids(ids, param=param)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.pipeline.tokenizer.decode(list(ids), skip_special_tokens=True))

    def _decode_raw(self, ids: Sequence[int]) -> str:
        return str(self.pipeline.tokenizer.decode(list(ids), skip_special_tokens=False))

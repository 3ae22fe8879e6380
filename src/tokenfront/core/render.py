"""The one rendering pipeline: an OpenAI chat or completions request in, prompt token ids out.

The renderer, the worker and the router all call `RenderPipeline.render_chat` / `render_completion`; nothing
else in tokenfront turns a request into ids. Anthropic Messages and OpenAI Responses bodies are converted to
the chat request vLLM builds from them (`core/requests/`) and rendered as chats (`render_messages`,
`render_responses`). It is also the library (docs/python-api.md): everything a server needs to know about a
loaded checkpoint is derived here, once, never cached by a route.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from tokenfront.core import derender
from tokenfront.core.checkpoint import Checkpoint, load_checkpoint
from tokenfront.core.context_length import max_model_len
from tokenfront.core.errors import CheckpointError, RenderError
from tokenfront.core.families import ChatFormat, chat_format_for
from tokenfront.core.fingerprint import Fingerprint, build_fingerprint
from tokenfront.core.messages import normalize_messages
from tokenfront.core.reasoning import ReasoningParser, get_reasoning_parser, reasoning_ended
from tokenfront.core.requests import anthropic, responses
from tokenfront.core.templates import ChatTemplate, compile_template
from tokenfront.core.tokenization import TokenizerBackend, backend_for
from tokenfront.core.tokenizer_files import tokenizer_source_file
from tokenfront.core.tool_calls import ToolCallParser, get_tool_call_parser
from tokenfront.options import RenderOptions
from tokenfront.protocol import (
    DEFAULT_LIMITS,
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    CompletionRequest,
    RequestLimits,
    ResponsesRequest,
)
from tokenfront.protocol.vllm import ChatDerenderRequest, CompletionDerenderRequest

log = logging.getLogger(__name__)

# Template variables the pipeline sets itself; chat_template_kwargs may not replace them.
# Also transformers' own apply_chat_template parameters: passed as kwargs they would change what
# transformers does (or make it raise), so a request may not smuggle them in as template variables.
_RESERVED_TEMPLATE_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "conversation",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


@dataclass(frozen=True)
class RenderedPrompt:
    """One rendered prompt.

    `prompt_text` is the text that was tokenized (None for id prompts); `chat_template_kwargs` the kwargs a
    chat prompt was rendered with; `prompt` a completions item's own prompt, as the client gave it.
    """

    token_ids: list[int]
    prompt_text: str | None
    reasoning_ended: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    prompt: str | list[int] | None = None


class RenderPipeline:
    """A loaded rendering configuration: checkpoint, template, tokenizer backend, parsers and fingerprint."""

    def __init__(
        self, checkpoint: Checkpoint, options: RenderOptions, *, build_backend_in_background: bool = False
    ) -> None:
        """`build_backend_in_background`: a server that must be ready fast builds its fast tokenizer backend
        in a background thread, started by `start_backend_build` (once it listens, say), encoding with the
        tokenizer itself (the reference: the same ids, slower) until it is ready; `wait_until_ready` waits for
        it. The fingerprint is computed on first use."""
        self.checkpoint = checkpoint
        self.options = options
        self.tokenizer = checkpoint.tokenizer
        self.backend: TokenizerBackend = backend_for(
            checkpoint.tokenizer,
            options.tokenizer_backend,  # type: ignore[arg-type]
            background=build_backend_in_background,
            start=False,
        )
        self.reasoning_parser: ReasoningParser | None = _parser_or_startup_error(
            get_reasoning_parser, options.reasoning_parser, "--reasoning-parser"
        )
        self.tool_call_parser: ToolCallParser | None = _parser_or_startup_error(
            get_tool_call_parser, options.tool_call_parser, "--tool-call-parser"
        )
        self.vocab_size = len(checkpoint.tokenizer)
        self.served_model_names = options.served_model_name or (checkpoint.default_name,)
        self._special_tokens = dict(checkpoint.tokenizer.special_tokens_map)
        # Harmony (gpt-oss) and mistral-common build chat prompts themselves; every other model, its template.
        self.chat_format: ChatFormat | None = chat_format_for(checkpoint)
        self._fingerprint: Fingerprint | None = None
        self._fingerprint_lock = threading.Lock()
        self._backend_name = self.backend.name  # the one chosen (a deferred one's target), as info reports it
        # Compile the checkpoint's templates now: a broken template is a start-up error, not a per-request one.
        self._templates = {
            name: compile_template(text)
            for name, text in (
                checkpoint.chat_templates.templates if checkpoint.chat_templates else {}
            ).items()
        }

    @classmethod
    def load(
        cls,
        options: RenderOptions,
        *,
        build_backend_in_background: bool = False,
        transformers_tokenizer: bool = False,
    ) -> RenderPipeline:
        """Load the checkpoint named in the options (tokenizer, config, template; never weights).

        The tokenizer is transformers' own object when `transformers_tokenizer` (a worker running the model
        with transformers) or `--tokenizer-backend transformers` asks for it; otherwise, where tokenfront knows
        how transformers builds the tokenizer's class, it is built without importing transformers
        (`core/direct_tokenizer.py`: the same tokenizer, the same ids and fingerprint)."""
        checkpoint = load_checkpoint(
            options.model,
            tokenizer=options.tokenizer,
            chat_template=options.chat_template,
            trust_remote_code=options.trust_remote_code,
            tokenizer_mode=options.tokenizer_mode,
            transformers_tokenizer=transformers_tokenizer or options.tokenizer_backend == "transformers",
        )
        return cls(checkpoint, options, build_backend_in_background=build_backend_in_background)

    def start_backend_build(self) -> None:
        """Start building the fast backend in the background (`build_backend_in_background`), if not yet."""
        start = getattr(self.backend, "start", None)
        if start is not None:
            start()

    def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Block until a backend being built in the background has taken over, and a fingerprint being computed
        in another thread is done (neither is started here); False on timeout, or when the build was never
        started."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = getattr(self.backend, "wait", None)
        if wait is not None and not wait(timeout):
            return False
        left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._fingerprint_lock.acquire(timeout=left):
            return False
        self._fingerprint_lock.release()
        return True

    @property
    def fingerprint(self) -> Fingerprint:
        """The rendering fingerprint (docs/fingerprint.md), computed on first use: hashing the tokenizer takes
        ~0.5 s of CPU for a 150k vocabulary, which a server spends once it is up (see `fingerprint_ready`).
        A caller meanwhile waits for it."""
        if self._fingerprint is None:
            with self._fingerprint_lock:
                if self._fingerprint is None:
                    self._fingerprint = self._build_fingerprint()
        return self._fingerprint

    def fingerprint_ready(self) -> bool:
        """Whether `fingerprint` answers at once (it has been computed)."""
        return self._fingerprint is not None

    # -- chat ------------------------------------------------------------------------------------------------

    def render_chat(
        self,
        request: ChatCompletionRequest,
        *,
        body: dict[str, Any] | None = None,
        forced_tool: str | None = None,
    ) -> RenderedPrompt:
        """Render a chat request into the ids a worker would compute from it.

        `body` is the JSON object `request` was validated from, when the caller has it: its `messages`,
        `tools` and `documents` are then read as sent, saving a dump of the model (validation is strict, so
        they hold the same values).

        `forced_tool` (a named tool_choice, when the caller generates): the tool-call parser's forced-call
        prefix for that function is appended to the rendered text before it is encoded, so the model's
        continuation is the call's arguments; truncation applies to the whole. The render routes leave it
        out, as vLLM's render does (vLLM forces a named call by constraining the output, not the prompt).
        """
        if request.add_generation_prompt and request.continue_final_message:
            raise RenderError(
                "continue_final_message leaves the final message open, which conflicts with "
                "add_generation_prompt (true by default): set add_generation_prompt to false",
                param="continue_final_message",
            )
        kwargs = self._template_kwargs(request)
        if body is None:
            body = request.model_dump(exclude_unset=True)
        prefix = self._forced_call_prefix(forced_tool)
        if self.chat_format is not None:
            return self._render_chat_format(self.chat_format, request, body, kwargs, prefix)
        template = self._template_for(request)
        messages = normalize_messages(
            body["messages"],
            content_format=template.content_format,
            template_knows_developer=template.knows_developer_role,
        )
        text = template.render(
            messages,
            tools=body.get("tools"),
            documents=body.get("documents"),
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            variables={**self._special_tokens, **kwargs} if kwargs else self._special_tokens,
        )
        # The prefix joins the text, not the ids: token boundaries are those the template would give had it
        # written the prefix itself (encoding it alone and concatenating ids could differ).
        text += prefix
        add_special = bool(request.add_special_tokens)
        ids = self._encode(text, add_special_tokens=add_special, param="messages")
        return RenderedPrompt(
            token_ids=self._truncate(
                ids, request.truncate_prompt_tokens, text=text, add_special_tokens=add_special
            ),
            prompt_text=text,
            reasoning_ended=reasoning_ended(self.reasoning_parser, text),
            chat_template_kwargs=kwargs,
        )

    def _render_chat_format(
        self,
        chat_format: ChatFormat,
        request: ChatCompletionRequest,
        body: dict[str, Any],
        kwargs: dict[str, Any],
        prefix: str,
    ) -> RenderedPrompt:
        if request.chat_template is not None:
            raise RenderError(
                f"this model's chat prompts are built by {chat_format.name}, not by a chat template: "
                "remove chat_template",
                param="chat_template",
            )
        formatted = chat_format.render_chat(request, body, kwargs)
        ids, text = formatted.token_ids, formatted.prompt_text
        if prefix:
            # These prompts end with a special token (Harmony's <|start|>assistant role, Mistral's [/INST]),
            # and so do the prefixes start: the prefix's ids follow the format's own.
            ids = [*ids, *self._encode_control_text(prefix)]
            text += prefix
        # vLLM 0.33 does not truncate Harmony chat prompts (it never reads truncate_prompt_tokens there).
        keep = request.truncate_prompt_tokens if chat_format.truncates_prompt else None
        return RenderedPrompt(
            token_ids=self._truncate(ids, keep),
            prompt_text=text,
            reasoning_ended=reasoning_ended(self.reasoning_parser, text),
            chat_template_kwargs=kwargs,
        )

    def _encode_control_text(self, text: str) -> list[int]:
        """Ids of text the server writes (a forced-call prefix): its special tokens are tokens even where the
        tokenizer never reads them out of text (mistral-common's `[TOOL_CALLS]`)."""
        specials = sorted(
            {t for t in self.tokenizer.all_special_tokens if t and t in text}, key=len, reverse=True
        )
        ids: list[int] = []
        at = 0
        for match in re.finditer("|".join(map(re.escape, specials)), text) if specials else ():
            if match.start() > at:
                ids += self._encode(text[at : match.start()], add_special_tokens=False, param="tool_choice")
            ids.append(int(self.tokenizer.convert_tokens_to_ids(match.group())))
            at = match.end()
        if at < len(text):
            ids += self._encode(text[at:], add_special_tokens=False, param="tool_choice")
        return ids

    def _forced_call_prefix(self, forced_tool: str | None) -> str:
        if forced_tool is None:
            return ""
        if self.tool_call_parser is None:
            raise RenderError(
                "a named tool_choice needs a tool-call parser to force the call: start the server with "
                "--tool-call-parser (e.g. hermes), or use tool_choice auto",
                param="tool_choice",
            )
        return self.tool_call_parser.forced_call_prefix(forced_tool)

    def _template_for(self, request: ChatCompletionRequest) -> ChatTemplate:
        if request.chat_template is not None:
            if not self.options.allow_request_chat_template:
                raise RenderError(
                    "per-request chat_template is not allowed on this server; remove the field, or start the "
                    "server with --allow-request-chat-template",
                    param="chat_template",
                    code="chat_template_not_allowed",
                )
            if request.chat_template in self._templates:  # a template name, as transformers accepts
                return self._templates[request.chat_template]
            return compile_template(request.chat_template)
        source = self.checkpoint.chat_templates
        # `tools: []` still picks the tool_use template, as transformers does (it tests `is not None`).
        name = source.name_for(has_tools=request.tools is not None) if source is not None else ""
        template = self._templates.get(name)
        if template is None:
            raise RenderError(
                "this model has no chat template, so chat requests cannot be rendered; start the server with "
                "--chat-template, or use /v1/completions",
                param="messages",
                code="no_chat_template",
            )
        return template

    def _template_kwargs(self, request: ChatCompletionRequest) -> dict[str, Any]:
        given = request.chat_template_kwargs
        if not given:  # most requests
            return dict(self.options.default_chat_template_kwargs)
        reserved = sorted(_RESERVED_TEMPLATE_VARIABLES & set(given))
        if reserved:
            raise RenderError(
                f"chat_template_kwargs may not set {', '.join(reserved)}: use the request fields of that name",
                param="chat_template_kwargs",
            )
        return {**self.options.default_chat_template_kwargs, **given}

    # -- the other APIs' bodies, as chats ---------------------------------------------------------------------

    @functools.cached_property
    def anthropic_traits(self) -> anthropic.AnthropicTemplateTraits:
        """What vLLM finds out about the chat template for the Messages API (whether inline system messages
        merge, what disabled thinking becomes), probed by rendering on first use and kept."""
        return anthropic.AnthropicTemplateTraits.probe(self)

    def messages_chat_request(
        self, request: AnthropicMessagesRequest, *, limits: RequestLimits = DEFAULT_LIMITS
    ) -> ChatCompletionRequest:
        """The chat request vLLM builds from an Anthropic Messages body (RenderError on what it refuses), held
        to `limits` (a server's: those its bodies were validated with)."""
        return anthropic.to_chat_request(request, self.anthropic_traits, limits)

    def render_messages(
        self, request: AnthropicMessagesRequest, *, limits: RequestLimits = DEFAULT_LIMITS
    ) -> RenderedPrompt:
        """Render an Anthropic Messages body: the ids of the conversation vLLM builds from it."""
        return self.render_chat(self.messages_chat_request(request, limits=limits))

    def render_responses(
        self, request: ResponsesRequest, *, limits: RequestLimits = DEFAULT_LIMITS
    ) -> RenderedPrompt:
        """Render an OpenAI Responses body: the ids of the conversation vLLM builds from it."""
        return self.render_chat(responses.to_chat_request(request, limits))

    # -- derender: output ids back into an OpenAI answer -----------------------------------------------------

    @functools.cached_property
    def output_reader(self) -> derender.OutputReader:
        """How this pipeline reads output ids (its EOS ids, its parsers), made once."""
        return derender.OutputReader(self)

    def derender_chat(self, body: ChatDerenderRequest) -> dict[str, Any]:
        """vLLM's chat derender: a generate answer's ids as the `chat.completion` vLLM builds from them, or
        with `stream: true` one chunk as `{"chunk", "stream_state"}` (docs/contract.md §11). RenderError (a 400)
        for what vLLM refuses."""
        read = derender.derender_chat_chunk if body.stream else derender.derender_chat
        return read(self.output_reader, body)

    def derender_completion(self, body: CompletionDerenderRequest) -> dict[str, Any]:
        """vLLM's completions derender: each generate answer's ids as a `text_completion` choice, or with
        `stream: true` one chunk as `{"chunk", "stream_state"}`."""
        read = derender.derender_completion_chunk if body.stream else derender.derender_completion
        return read(self.output_reader, body)

    # -- completions -----------------------------------------------------------------------------------------

    def render_completion(self, request: CompletionRequest) -> list[RenderedPrompt]:
        """Render every prompt of a completions request (a string, strings, an id list or id lists)."""
        if request.suffix:
            raise RenderError("suffix is not supported", param="suffix")
        add_special = True if request.add_special_tokens is None else request.add_special_tokens
        prompts = _prompt_items(request.prompt)
        # Id lists sent as a list of lists are named as the client wrote them (`prompt[0][2]`), even one.
        nested = not isinstance(request.prompt, str) and not all(isinstance(i, int) for i in request.prompt)
        rendered = []
        for index, prompt in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt[{index}]"
            if isinstance(prompt, str):
                ids = self._encode(prompt, add_special_tokens=add_special, param=param)
                text: str | None = prompt
            else:
                self.validate_token_ids(prompt, param=param, name=f"prompt[{index}]" if nested else param)
                ids, text = list(prompt), None
            if not ids:
                raise RenderError(f"{param} renders to no tokens; send some text", param=param)
            rendered.append(
                RenderedPrompt(
                    token_ids=self._truncate(
                        ids, request.truncate_prompt_tokens, text=text, add_special_tokens=add_special
                    ),
                    prompt_text=text,
                    prompt=prompt,
                )
            )
        return rendered

    # -- shared ----------------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """The ids of plain text (`/tokenize` with a `prompt`), as a completions prompt is encoded."""
        return self._encode(text, add_special_tokens=add_special_tokens, param="prompt")

    def detokenize(self, ids: list[int]) -> str:
        """The text of ids (`/detokenize`), as transformers' `decode` gives it; ids outside the vocabulary are
        a 400."""
        self.validate_token_ids(ids, param="tokens")
        return str(self.tokenizer.decode(ids))

    def validate_token_ids(self, ids: list[int], *, param: str, name: str | None = None) -> None:
        """Reject ids outside the vocabulary `[0, vocab_size)` with a 400 that names the first bad one (as
        `name[position]`; `name` defaults to `param`)."""
        for position, token_id in enumerate(ids):
            if not 0 <= token_id < self.vocab_size:
                raise RenderError(
                    f"{name or param}[{position}] = {token_id} is not a token id of this model "
                    f"(valid ids are 0 to {self.vocab_size - 1})",
                    param=param,
                    code="token_id_out_of_vocabulary",
                )

    def _encode(self, text: str, *, add_special_tokens: bool, param: str) -> list[int]:
        try:
            return self.backend.encode(text, add_special_tokens=add_special_tokens)
        except Exception as exc:  # e.g. a regex resource limit on adversarial text: the client's input
            log.warning("tokenizer failed on %d characters of %s: %s", len(text), param, exc)
            raise RenderError(
                f"the tokenizer could not encode {param} ({type(exc).__name__}: {exc})", param=param
            ) from exc

    @functools.cached_property
    def max_model_len(self) -> int:
        """The model's context length from its config (vLLM's `max_model_len`), found on first use."""
        return max_model_len(self.checkpoint.config)

    def serves(self, model: str | None) -> bool:
        """Whether `model` (absent means the served model) names this model."""
        return model is None or model in self.served_model_names

    def _truncate(
        self, ids: list[int], keep: int | None, *, text: str | None = None, add_special_tokens: bool = False
    ) -> list[int]:
        """`truncate_prompt_tokens`: keep the last `keep` ids (-1: the model's maximum length).

        As the tokenizer truncates (transformers' `truncation_side="left"`, which vLLM uses): the ids the
        tokenizer adds around encoded text (BOS, EOS) stay, and the text's own ids are cut to make room, so a
        BOS-adding tokenizer keeps BOS plus the last `keep - 1` ids of the text.
        """
        if keep is None:
            return ids
        if keep == -1:
            keep = int(getattr(self.tokenizer, "model_max_length", 0) or 0) or len(ids)
        if len(ids) <= keep:
            return ids
        if text is not None and add_special_tokens:
            plain = self._encode(text, add_special_tokens=False, param="prompt")
            added = len(ids) - len(plain)
            for start in range(added + 1) if added > 0 else ():
                if ids[start : start + len(plain)] == plain:
                    prefix, suffix = ids[:start], ids[start + len(plain) :]
                    room = max(keep - added, 0)
                    return [*prefix, *(plain[-room:] if room else []), *suffix]
        return ids[-keep:]

    def _build_fingerprint(self) -> Fingerprint:
        parser = self.reasoning_parser
        chat_format = self.chat_format
        # A chat format replaces the template: the folder's template (gpt-oss ships one) decides nothing.
        templates = self.checkpoint.chat_templates if chat_format is None else None
        return build_fingerprint(
            model_type=self.checkpoint.model_type,
            processor=self.checkpoint.processor,
            chat_templates=templates.templates if templates else None,
            tokenizer=self.tokenizer,
            prompt_mode_reasoning_parser=parser.name if parser and parser.reads_mode_from_prompt else None,
            forced_tool_call_prefix=self.tool_call_parser.fingerprint_component()
            if self.tool_call_parser
            else None,
            default_chat_template_kwargs=dict(self.options.default_chat_template_kwargs),
            remote_code=self.checkpoint.remote_code,
            chat_format=chat_format.fingerprint_component() if chat_format else None,
            tokenizer_part=chat_format.tokenizer_components() if chat_format else None,
            info={
                "versions": _library_versions(),
                "tokenizer_backend": self._backend_name,
                "reasoning_parser": self.options.reasoning_parser,
                "tool_call_parser": self.options.tool_call_parser,
                "model_path": str(self.checkpoint.model_path) if self.checkpoint.model_path else None,
                "tokenizer_path": str(self.checkpoint.tokenizer_path)
                if self.checkpoint.tokenizer_path
                else None,
                "chat_template_origin": templates.origin if templates else None,
                "tokenizer_mode": self.checkpoint.tokenizer_mode,
                "tokenizer_file": _file_name(tokenizer_source_file(self.tokenizer)),
            },
        )


def _file_name(path: Any) -> str | None:
    return path.name if path is not None else None


def _prompt_items(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(item, int) for item in prompt):
        return [list(prompt)]
    return list(prompt)


def _parser_or_startup_error(lookup: Any, name: str | None, option: str) -> Any:
    if name is None:
        return None
    try:
        return lookup(name)
    except ValueError as exc:
        raise CheckpointError(f"{option} {name!r}: {exc}") from exc


def _library_versions() -> dict[str, str]:
    versions = {}
    for package in ("tokenfront", "transformers", "tokenizers", "jinja2"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return versions

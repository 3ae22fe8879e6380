"""Chat templates: the Jinja2 sandbox with the Hugging Face template contract, and content-format detection.

The environment mirrors what `transformers.apply_chat_template` gives a template (same globals, filters,
extensions and whitespace options), so the text rendered here is the text transformers renders.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenfront.core.errors import TemplateRenderError

ContentFormat = Literal["string", "openai"]

# transformers marks the end of the message to continue with this tag, then cuts the text there.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Names a message's reasoning is passed under; templates read the first, gpt-oss templates read `thinking`.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering ignores it."""

    tags = {"generation"}  # noqa: RUF012 - jinja reads a class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes HTML characters; the HF contract does not, and exposes json.dumps options.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` without the attribute access a real `dict` type would give a hostile template."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names, which could reach interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as Jinja's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace (got {name!r})"
            )


# Attribute names a plain dict has (methods): `message.items` is the method, `message.role` the key.
_DICT_ATTRIBUTES = frozenset(dir(dict))
# str methods that neither format nor reach internals: the sandbox would allow each after its checks.
_PLAIN_STR_METHODS = frozenset(
    {
        "strip",
        "lstrip",
        "rstrip",
        "split",
        "rsplit",
        "splitlines",
        "startswith",
        "endswith",
        "lower",
        "upper",
        "title",
        "capitalize",
        "replace",
        "find",
        "rfind",
        "count",
        "join",
        "isspace",
        "isdigit",
    }
)


_LOOP_ATTRIBUTES = frozenset(
    {"index", "index0", "first", "last", "length", "revindex", "revindex0", "depth", "depth0"}
)


class _ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with a fast path for what chat templates read most.

    Each fast path returns what the sandbox's full path returns, without its checks where they cannot fail:
    - `message.role` on a plain dict ends, after the checks, in `message["role"]` (a dict has no attribute
      `role`): for names that are not dict attributes, go there directly (same value or same undefined);
    - the listed str methods (safe, and not `format`), `loop.index0` and the like, and `ns.name` on a
      template namespace (never an underscore name) are returned as the sandbox returns them.
    Everything else takes the full path.
    """

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if (kind is str and attribute in _PLAIN_STR_METHODS) or (
            kind is jinja2.runtime.LoopContext and attribute in _LOOP_ATTRIBUTES
        ):
            return getattr(obj, attribute)
        if kind is _TemplateNamespace and not attribute.startswith("_"):
            try:
                return getattr(obj, attribute)
            except AttributeError:  # a namespace has no items either
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = _ChatTemplateEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


_ENVIRONMENT = _make_environment()


class ChatTemplate:
    """One compiled chat template and what was learned from its syntax tree once."""

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._compiled = _ENVIRONMENT.from_string(source)
            tree = _ENVIRONMENT.parse(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateRenderError(
                f"the chat template is not valid Jinja: {exc.message} (line {exc.lineno})",
                param="chat_template",
            ) from exc
        self.content_format: ContentFormat = "openai" if _loops_over_message_content(tree) else "string"
        # A template that never names the "developer" role (quoted, as vLLM checks: a `developer_preamble`
        # variable does not count) cannot tell developer messages from system ones.
        self.knows_developer_role = '"developer"' in source or "'developer'" in source

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        documents: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        variables: dict[str, Any],
    ) -> str:
        """Render the prompt text exactly as `apply_chat_template(..., tokenize=False)` would.

        `variables` holds the special tokens (bos_token, ...) overridden by the chat_template_kwargs.
        """
        chat = [_alias_reasoning(_drop_none(message)) for message in messages]
        if continue_final_message:
            final_text = self._tag_final_message(chat)
        try:
            text = self._compiled.render(
                messages=chat,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.TemplateError as exc:
            # raise_exception() from the template itself, or a sandbox / undefined-variable failure.
            raise TemplateRenderError(f"the chat template rejected the request: {exc}") from exc
        except (
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            ArithmeticError,
            RecursionError,
        ) as exc:
            raise TemplateRenderError(
                f"the chat template failed on this request ({type(exc).__name__}: {exc}); "
                "check the message fields the template expects"
            ) from exc
        if continue_final_message:
            text = self._cut_after_final_message(text, final_text)
        return text

    def _tag_final_message(self, chat: list[dict[str, Any]]) -> str:
        final = chat[-1]
        content = final.get("content")
        if content is None:
            raise TemplateRenderError(
                'continue_final_message is set but the final message has no "content" to continue',
                param="continue_final_message",
            )
        if "content" not in self.source:
            raise TemplateRenderError(
                "continue_final_message is set but this chat template never reads a message's content",
                param="continue_final_message",
            )
        if isinstance(content, list):
            for part in reversed(content):
                if isinstance(part, dict) and "text" in part:
                    text = part["text"]
                    part["text"] = text + _CONTINUE_TAG
                    return str(text)
            raise TemplateRenderError(
                "continue_final_message is set but the final message has no text to continue",
                param="continue_final_message",
            )
        final["content"] = content + _CONTINUE_TAG
        return str(content)

    @staticmethod
    def _cut_after_final_message(text: str, final_text: str) -> str:
        tag = _CONTINUE_TAG.strip()
        if final_text.strip() not in text or tag not in text:
            raise TemplateRenderError(
                "continue_final_message is set but the chat template does not render the final message as "
                "given (it changes or drops part of it), so it cannot be left open",
                param="continue_final_message",
            )
        at = text.rindex(tag)
        if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return text[:at]
        # The template trimmed the message's trailing space together with the tag's.
        return text[:at].rstrip()


def _drop_none(message: dict[str, Any]) -> dict[str, Any]:
    # transformers drops None-valued keys: templates handle a missing key better than a literal None.
    return {key: value for key, value in message.items() if value is not None}


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


@lru_cache(maxsize=64)
def compile_template(source: str) -> ChatTemplate:
    """Compile a chat template once; the same text always gives the same compiled template."""
    return ChatTemplate(source)


# Content-format detection (the rule of vLLM's `_detect_content_format`): a template that loops over the
# `content` of a message variable gets OpenAI-style content parts; any other template gets one string.


def _is_name(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_item(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            _is_name(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _accesses(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    """Whether `node` is `name` (or `name[key]`), possibly through filters, tests or slices."""
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _accesses(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _accesses(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _accesses(node.node, name, key)
    return _is_item(node, name, key) if key else _is_name(node, name)


def _aliases(root: jinja2.nodes.Template, name: str) -> Iterator[str]:
    """`name` and every variable assigned from it (`{% set msgs = messages %}`), transitively."""
    seen = {name}
    yield name
    pending = deque([name])
    while pending:
        current = pending.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            target = assign.target
            # `seen` also ends cycles (`{% set a = b %}{% set b = a %}`) that a hostile template could build.
            if (
                isinstance(target, jinja2.nodes.Name)
                and target.name not in seen
                and _accesses(assign.node, current)
            ):
                seen.add(target.name)
                yield target.name
                pending.append(target.name)


def _loop_targets(root: jinja2.nodes.Template, iterables: list[str], key: str | None) -> Iterator[str]:
    for loop in root.find_all(jinja2.nodes.For):
        if any(_accesses(loop.iter, name, key) for name in iterables) and isinstance(
            loop.target, jinja2.nodes.Name
        ):
            yield loop.target.name


def _loops_over_message_content(root: jinja2.nodes.Template) -> bool:
    message_lists = list(_aliases(root, "messages"))
    message_vars = list(_loop_targets(root, message_lists, None))
    return next(_loop_targets(root, message_vars, "content"), None) is not None

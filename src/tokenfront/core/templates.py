"""Chat templates: the Jinja2 sandbox with the Hugging Face template contract.

The environment mirrors what `transformers.apply_chat_template` gives a template (same globals, filters,
extensions and whitespace options), so the text rendered here is the text transformers renders. It also holds
every template to the limits of `template_limits` (source size; render time, steps and characters; sizes of the
values it builds), which no real template meets: see that module for what each is and why.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache, update_wrapper
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from tokenfront.core import template_limits as limits
from tokenfront.core.content_format import ContentFormat, detect_content_format
from tokenfront.core.errors import TemplateRenderError
from tokenfront.core.native_templates import DECLINE, native_template

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
    limits.current_budget().check_text(message, "an error message")
    raise jinja2.exceptions.TemplateError(message)


# Jinja's own tojson escapes HTML characters; the HF contract does not, and exposes json.dumps options.
_tojson = limits.bounded_tojson


def _strftime_now(format: str) -> str:
    limits.check_strftime_format(format)
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` without the attribute access a real `dict` type would give a hostile template."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        if 1 <= len(args) <= 2 and not kwargs:
            args = limits.checked_fromkeys(*args)
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
    """The immutable sandbox, held to the template limits, with a fast path for what chat templates read most.

    Limits (`template_limits`): the arithmetic operators go through `call_binop`, which refuses a result over a
    limit before computing it; calls go through `call` (string methods that pad, repeat, join or replace are
    checked first, and what a call built is counted); `str.format` through a bounded formatter. Filters and
    globals are wrapped in `make_environment`, loops and macros counted by `_Instrument`.

    Each fast path returns what the sandbox's full path returns, without its checks where they cannot fail:
    - `message.role` on a plain dict ends, after the checks, in `message["role"]` (a dict has no attribute
      `role`): for names that are not dict attributes, go there directly (same value or same undefined);
    - the listed str methods (safe, and not `format`), `loop.index0` and the like, and `ns.name` on a
      template namespace (never an underscore name) are returned as the sandbox returns them.
    Everything else takes the full path.
    """

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

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

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        budget = _current_budget() or limits.current_budget()
        if operator == "+" and type(left) is str and type(right) is str:  # most operations in chat templates
            size = len(left) + len(right)
            if size > budget.value_chars:
                budget.check_chars(size, "a string")
            budget.work += size
            if budget.work > budget.work_chars:
                budget.charge(0)  # over the limit (or the request's allowance is due)
            return left + right
        if (
            type(left) is int
            and type(right) is int
            and operator != "**"
            and -(1 << 62) < left < 1 << 62
            and -(1 << 62) < right < 1 << 62
        ):  # counting: loop.index0 - 1
            return self.binop_table[operator](left, right)
        return limits.binop(budget, operator, left, right, self.binop_table)

    def call(self, context: jinja2.runtime.Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        # Methods of strings, bytes, ints and dicts may build big values: checked, and what they build counted.
        # Anything else callable returns what exists (a namespace, a cycler's item), or builds its value through
        # outputs and operations counted on their own (macros, `caller()`, `str.format`, the globals).
        owner = getattr(obj, "__self__", None)
        budget = _current_budget() or limits.current_budget()
        if type(obj) is not types.BuiltinMethodType or type(owner) not in _METHOD_OWNERS:
            # Methods of Markup and other subclasses: checked and counted the same way, called as the sandbox does.
            if owner is not None and isinstance(owner, (str, bytes, int, dict)):
                args = limits.check_method_call(budget, obj, owner, args, kwargs)
                result = super().call(context, obj, *args, **kwargs)
                limits.charge_result(budget, result, owner)
                return result
            budget.tick()
            return super().call(context, obj, *args, **kwargs)
        # A built-in method of a str, bytes, int or dict: what the sandbox's call does for it (such a method is
        # always safely callable, takes no context, and drops the loop and block variables the code passes).
        kwargs.pop("_loop_vars", None)
        kwargs.pop("_block_vars", None)
        args = limits.check_method_call(budget, obj, owner, args, kwargs)
        result = obj(*args, **kwargs)
        limits.charge_result(budget, result, owner)
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """The sandbox's `str.format` / `str.format_map` wrapper, with the bounded formatters."""
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        f_self: Any = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type: type[str] = type(f_self)
        is_format_map = value.__name__ == "format_map"
        formatter: limits.BoundedFormatter | limits.BoundedEscapeFormatter
        if isinstance(f_self, Markup):
            formatter = limits.BoundedEscapeFormatter(self, escape=f_self.escape)
        else:
            formatter = limits.BoundedFormatter(self)
        vformat = formatter.vformat

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs = args[0]
                args = ()
            text = str_type(vformat(f_self, args, kwargs))
            limits.charge_result(limits.current_budget(), text)
            return text

        return update_wrapper(wrapper, value)


_METHOD_OWNERS = frozenset({str, bytes, int, dict})
_current_budget = limits.CURRENT.get  # the render's budget, or None (then `limits.current_budget()`)


@jinja2.pass_context
def _finalize(context: jinja2.runtime.Context, value: Any) -> Any:
    """Every `{{ ... }}` output passes here (which also keeps Jinja from evaluating outputs while compiling): its
    characters are counted, and a list or mapping is refused before `str()` writes a text over the limit. The
    compiled code applies `str()` (or `escape()`) to what this returns, as it would have without it."""
    budget = _current_budget() or limits.current_budget()
    if type(value) is str:
        budget.charge(len(value) + limits.OUTPUT_OVERHEAD_CHARS)
        return value
    budget.charge(budget.check_text(value, "an output") + limits.OUTPUT_OVERHEAD_CHARS)
    if context.eval_ctx.autoescape:
        return value  # escape() follows
    return str(value)


# Names of the filters the instrumented code calls (`_Instrument`): not names a template can write (the lexer
# never reads a `:` into a filter name), so a template can neither call nor replace them.
_STEP = "tokenfront:step"
_CONCAT = "tokenfront:concat"
_SLICED = "tokenfront:sliced"
_AT_RENDER = "tokenfront:at_render"


def _step(chars: int) -> None:
    (_current_budget() or limits.current_budget()).step(chars)


def _concat(parts: tuple[Any, ...], escaping: bool) -> str:
    """`a ~ b ~ c`: checked before joining, counted after (`escaping`: Jinja would use markup_join here)."""
    budget = limits.current_budget()
    size = sum(budget.text_size(part, budget.value_chars) for part in parts)
    budget.check_chars(6 * size if escaping else size, "a string (~)")
    text = jinja2.runtime.markup_join(parts) if escaping else jinja2.runtime.str_join(parts)
    budget.charge(len(text))
    return text


@jinja2.pass_context
def _at_render(context: jinja2.runtime.Context, value: Any) -> Any:
    """The value itself; taking the context keeps Jinja from computing it while compiling."""
    return value


def _sliced(value: Any) -> Any:
    """A slice (`text[1:]`, `messages[::-1]`) is a new copy: counted."""
    limits.charge_result(limits.current_budget(), value)
    return value


class _Instrument(NodeTransformer):
    """Rewrites a parsed template so the render budget sees it run (the output is unchanged):
    - each loop iteration, macro call and `{% call %}` body starts with a step, which also counts the template
      text that body writes (its own, not its nested loops' or macros'); an item a loop's `if` skips is a step;
    - `a ~ b` checks its parts' sizes before joining them;
    - slices are counted;
    - `{% autoescape %}` expressions that call filters are computed when rendering, not while compiling;
    - constant outputs (`{{ '<|im_start|>' }}`, which chat templates write everywhere) become template text, as
      Jinja would have made them while compiling had `finalize` not stopped it (so they cost nothing to render,
      and count as template text).

    `_escaping` follows `{% autoescape %}` blocks: True where autoescape is known on at compile time, False where
    known off, None where only known at render time (Jinja compiles each case differently)."""

    def __init__(self, environment: jinja2.Environment) -> None:
        self._environment = environment
        self._escaping: list[bool | None] = [bool(environment.autoescape)]

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        if self._escaping[-1] is False:
            node.nodes = [
                nodes.TemplateData(str(child.value), lineno=child.lineno)
                if type(child) is nodes.Const and isinstance(child.value, (str, int, float, bool, type(None)))
                else child
                for child in node.nodes
            ]
        return node

    def _counted(self, node: nodes.For | nodes.Macro | nodes.CallBlock) -> nodes.Node:
        self.generic_visit(node)
        step = nodes.Filter(nodes.Const(_static_chars(node.body)), _STEP, [], [], None, None)
        node.body.insert(0, nodes.ExprStmt(step, lineno=node.lineno))
        if isinstance(node, nodes.For) and node.test is not None:
            # `{% for x in items if test %}`: the items the test skips are steps too (`step(0) or test` is the
            # test's own value: the step returns None).
            skipped = nodes.Filter(nodes.Const(0), _STEP, [], [], None, None, lineno=node.lineno)
            node.test = nodes.Or(skipped, node.test, lineno=node.lineno)
        return node

    visit_For = visit_Macro = visit_CallBlock = _counted

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load", lineno=node.lineno)
        escaping = nodes.Const(self._escaping[-1] is True)
        return nodes.Filter(parts, _CONCAT, [escaping], [], None, None, lineno=node.lineno)

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.arg, nodes.Slice):
            return nodes.Filter(node, _SLICED, [], [], None, None, lineno=node.lineno)
        return node

    def visit_ScopedEvalContextModifier(self, node: nodes.ScopedEvalContextModifier) -> nodes.Node:
        # `{% autoescape %}`: Jinja joins `~` with markup_join where autoescape is known on at compile time, and
        # with str_join everywhere else (a runtime-only value included).
        escaping = self._escaping[-1]
        for keyword in node.options:
            # Jinja evaluates these while compiling when it can (`as_const`), filters included: an expression
            # that calls anything is evaluated when rendering instead, where the limits apply.
            if any(keyword.value.find_all((nodes.Filter, nodes.Test, nodes.Call))):
                keyword.value = nodes.Filter(
                    keyword.value, _AT_RENDER, [], [], None, None, lineno=node.lineno
                )
            if keyword.key == "autoescape":
                try:
                    escaping = bool(keyword.value.as_const(nodes.EvalContext(self._environment)))
                except Exception:
                    escaping = None
        self._escaping.append(escaping)
        try:
            self.generic_visit(node)
        finally:
            self._escaping.pop()
        return node


def _static_chars(body: list[nodes.Node]) -> int:
    """Characters of template text a body writes itself (in nested loops and macros: counted there)."""
    total = 0
    pending: list[nodes.Node] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, nodes.TemplateData):
            total += len(node.data)
        elif isinstance(node, nodes.For):
            pending.extend(node.else_)
        elif not isinstance(node, (nodes.Macro, nodes.CallBlock)):
            pending.extend(node.iter_child_nodes())
    return total


def make_environment() -> ImmutableSandboxedEnvironment:
    """A new instance of the sandboxed Jinja environment every chat template is compiled in: HF's contract
    (filters, `raise_exception`, `strftime_now`, `namespace`, the generation tag) with every output, loop and
    filter bounded."""
    # optimized=False: Jinja's optimizer folds constant expressions while compiling, so `{{ 'x' * 10**10 }}`
    # would be built by the compiler, before any limit could see it; `finalize` (which takes the context) stops
    # the same folding of outputs. Neither changes what a template renders.
    env = _ChatTemplateEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        optimized=False,
        finalize=_finalize,
    )
    env.filters = {name: limits.bounded_filter(name, function) for name, function in env.filters.items()}
    env.filters["tojson"] = _tojson
    env.filters[_STEP] = _step
    env.filters[_CONCAT] = _concat
    env.filters[_SLICED] = _sliced
    env.filters[_AT_RENDER] = _at_render
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    env.globals["lipsum"] = limits.bounded_lipsum
    return env


# The one environment every chat template is compiled in.
ENVIRONMENT = make_environment()
# Longest message of a template's own error passed on to the client (raise_exception text, a TypeError...).
_MAX_ERROR_CHARS = 2000


def _short(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "..."


def _compile_error(exc: Exception) -> TemplateRenderError:
    """Any failure to compile a template is the template's: a 400 saying why."""
    if isinstance(exc, TemplateRenderError):
        return exc
    if isinstance(exc, jinja2.TemplateSyntaxError):
        message = f"the chat template is not valid Jinja: {_short(exc.message or '')} (line {exc.lineno})"
    elif isinstance(exc, RecursionError):
        message = "the chat template nests expressions or blocks too deeply to compile (RecursionError)"
    elif isinstance(exc, SyntaxError):  # from Python's compiler: "too many statically nested blocks"...
        message = f"the chat template nests blocks too deeply to compile ({type(exc).__name__}: {exc.msg})"
    elif isinstance(exc, MemoryError):
        message = "the chat template is too large to compile (MemoryError)"
    else:
        message = f"the chat template could not be compiled ({type(exc).__name__}: {_short(str(exc))})"
    return TemplateRenderError(message, param="chat_template")


class ChatTemplate:
    """One compiled chat template and what was learned from its syntax tree once."""

    def __init__(self, source: str) -> None:
        limits.check_source_length(source)
        self.source = source
        env = ENVIRONMENT
        try:
            tree = env.parse(source)
            # Read before instrumenting: the detection looks at the template as written.
            self.content_format: ContentFormat = detect_content_format(tree)
            tree = _Instrument(env).visit(tree)
            tree.set_environment(env)
            self._compiled = env.template_class.from_code(
                env, env.compile(tree), env.make_globals(None), None
            )
        except Exception as exc:  # RecursionError, Python's SyntaxError, MemoryError... all the template's
            raise _compile_error(exc) from exc
        # A template that never names the "developer" role (quoted, as vLLM checks: a `developer_preamble`
        # variable does not count) cannot tell developer messages from system ones.
        self.knows_developer_role = '"developer"' in source or "'developer'" in source
        # The same template written in Python, when this is a widely served one (`core.native_templates`).
        self.native = native_template(source)

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
        chat = [_as_template_sees(message) for message in messages]
        if continue_final_message:
            chat[-1] = dict(chat[-1])  # tagged below: the caller's message stays as it was
            final_text = self._tag_final_message(chat)
        text = self._render(chat, tools, documents, add_generation_prompt, variables)
        if continue_final_message:
            text = self._cut_after_final_message(text, final_text)
        return text

    def _render(
        self,
        chat: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        documents: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        variables: dict[str, Any],
    ) -> str:
        if self.native is not None:
            text = self.native(chat, tools, add_generation_prompt, variables)
            if text is not DECLINE:
                return text
        budget = limits.start_budget(limits.RenderBudget((chat, tools, documents, variables)))
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
            raise TemplateRenderError(f"the chat template rejected the request: {_short(str(exc))}") from exc
        except (
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            ArithmeticError,
            RecursionError,
            MemoryError,
        ) as exc:
            raise TemplateRenderError(
                f"the chat template failed on this request ({type(exc).__name__}: {_short(str(exc))}); "
                "check the message fields the template expects"
            ) from exc
        finally:
            limits.end_budget(budget)
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


def _as_template_sees(message: dict[str, Any]) -> dict[str, Any]:
    """A message as templates receive it: None-valued keys dropped, reasoning under each of its names."""
    if len(message) == 2 and message.get("content") is not None and message.get("role") is not None:
        return message  # most messages: a role and a content, nothing to drop or alias
    return _alias_reasoning(_drop_none(message))


def _drop_none(message: dict[str, Any]) -> dict[str, Any]:
    # transformers drops None-valued keys: templates handle a missing key better than a literal None.
    return {key: value for key, value in message.items() if value is not None}


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def compile_template(source: str) -> ChatTemplate:
    """Compile a chat template once; the same text always gives the same compiled template, or the same error
    (a template that fails to compile is not compiled again: a client resending it costs a lookup)."""
    limits.check_source_length(source)  # before the cache: it keeps no oversized text
    compiled = _compile_cached(source)
    if isinstance(compiled, TemplateRenderError):
        raise copy.copy(compiled)
    return compiled


def compile_cache_info() -> Any:
    """`compile_template`'s cache statistics (functools' `CacheInfo`: hits, misses, maxsize, currsize)."""
    return _compile_cached.cache_info()


@lru_cache(maxsize=64)
def _compile_cached(source: str) -> ChatTemplate | TemplateRenderError:
    try:
        return ChatTemplate(source)
    except TemplateRenderError as exc:
        return copy.copy(exc)  # without the traceback, which holds the compiler's frames

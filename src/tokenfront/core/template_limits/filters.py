"""Jinja's filters, bounded: each filter that pads, repeats, joins, replaces, wraps or formats is checked
before it runs, and the filters that iterate big sequences check the clock as they go."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

import jinja2
import jinja2.runtime
import jinja2.utils

from tokenfront.core.template_limits.bounds import (
    MAX_TEXT_FILTER_CHARS,
    MAX_TOJSON_INDENT,
    TICK_ITEMS,
    TemplateLimitError,
)
from tokenfront.core.template_limits.budget import (
    CURRENT,
    RenderBudget,
    charge_result,
    current_budget,
    ticked,
)
from tokenfront.core.template_limits.operators import check_percent_format

# A check takes the budget, the environment (None for filters that are not given one) and the filter's own
# arguments as the filter takes them (the value first); it refuses by raising, and returns the value to call the
# filter with: the same, or the items of an iterable it had to read (a list), or the same items read with clock
# checks in between (a generator). Arguments that do not fit the filter's signature are left to the filter, which
# raises its own TypeError.


def checked_width(budget: RenderBudget, width: Any, what: str = "a padded string") -> int:
    if isinstance(width, int):
        budget.check_int(width.bit_length())
        budget.check_chars(width, what)
        return max(width, 0)
    return 0


def _length(budget: RenderBudget, value: Any) -> int:
    return len(value) if isinstance(value, str) else budget.text_size(value, budget.value_chars)


def _check_center(budget: RenderBudget, env: Any, value: Any, width: Any = 80) -> Any:
    checked_width(budget, width)
    return value


def _check_indent(
    budget: RenderBudget, env: Any, s: Any, width: Any = 4, first: Any = False, blank: Any = False
) -> Any:
    prefix = len(width) if isinstance(width, str) else checked_width(budget, width)
    lines = s.count("\n") + 1 if isinstance(s, str) else _length(budget, s)
    budget.check_chars(_length(budget, s) + lines * prefix, "an indented string")
    return s


def _check_replace(budget: RenderBudget, env: Any, s: Any, old: Any, new: Any, count: Any = None) -> Any:
    check_replacement(budget, s, old, new, -1 if count is None else count)
    return s


def check_replacement(budget: RenderBudget, s: Any, old: Any, new: Any, count: Any) -> None:
    new_size = _length(budget, new)
    old_size = _length(budget, old)
    if new_size <= old_size:
        return
    size = _length(budget, s)
    found = size + 1  # at most one replacement per character, and one more (for an empty `old`)
    if isinstance(s, str) and isinstance(old, str) and old:
        found = s.count(old)
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    budget.check_chars(size + found * (new_size - old_size), "a string (replace)")


def _check_join(budget: RenderBudget, env: Any, value: Any, d: Any = "", attribute: Any = None) -> Any:
    items = iterated_items(budget, value)
    if attribute is not None and env is not None and isinstance(items, list):
        getter = jinja2.filters.make_attrgetter(env, attribute)
        check_joined(budget, [getter(item) for item in items], d)
    else:
        check_joined(budget, items, d)
    return items


def iterated_items(budget: RenderBudget, value: Any) -> Any:
    """A list of the items of an iterable that is not a sequence (read with clock checks); others as they are."""
    if isinstance(value, (list, tuple, str, dict, jinja2.Undefined)) or not hasattr(value, "__iter__"):
        return value
    return list(ticked(budget, value))


def check_joined(budget: RenderBudget, items: Any, separator: Any) -> None:
    """Check `separator.join(items)` (items a sequence)."""
    separator_size = _length(budget, separator)
    if isinstance(items, str):
        budget.check_chars(len(items) + max(len(items) - 1, 0) * separator_size, "a joined string")
    elif isinstance(items, (list, tuple)):
        size = budget.text_size(items, budget.value_chars) - 2 * len(items)
        budget.check_chars(size + max(len(items) - 1, 0) * separator_size, "a joined string")


def _check_wordwrap(
    budget: RenderBudget,
    env: Any,
    s: Any,
    width: Any = 79,
    break_long_words: Any = True,
    wrapstring: Any = None,
    break_on_hyphens: Any = True,
) -> Any:
    size = _length(budget, s)
    _check_text_filter(budget, size, "wordwrap")
    wrap = len(wrapstring) if isinstance(wrapstring, str) else 1
    budget.check_chars(size + (size + 1) * wrap if wrap > 1 else 2 * size, "a wrapped string")
    return s


def _check_batch(budget: RenderBudget, env: Any, value: Any, linecount: Any, fill_with: Any = None) -> Any:
    _check_fill(budget, linecount, fill_with)
    return _ticked_sequence(budget, value)


def _check_slice(budget: RenderBudget, env: Any, value: Any, slices: Any, fill_with: Any = None) -> Any:
    _check_fill(budget, slices, fill_with)
    return _ticked_sequence(budget, value)


def _check_fill(budget: RenderBudget, count: Any, fill_with: Any) -> None:
    if isinstance(count, int):
        budget.check_int(count.bit_length())
        budget.check_items(count)
        if fill_with is not None:
            budget.check_chars(count * (budget.text_size(fill_with, budget.value_chars) + 2), "a list")


def _check_sum(budget: RenderBudget, env: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    if not isinstance(start, (list, tuple, str)):
        return _ticked_sequence(budget, iterable)
    # Adding sequences copies the running total each time: refuse when that copying would exceed the limit.
    items = iterated_items(budget, iterable)
    if attribute is not None and env is not None and isinstance(items, (list, tuple)):
        getter = jinja2.filters.make_attrgetter(env, attribute)
        added: Any = [getter(item) for item in items]
    else:
        added = items
    total = len(start)
    copied = 0
    for item in added if isinstance(added, (list, tuple)) else ():
        total += len(item) if isinstance(item, (list, tuple, str)) else 1
        copied += total
    budget.check_chars(copied, "a sum of lists")
    return items


def _check_format(budget: RenderBudget, env: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    check_percent_format(budget, value if isinstance(value, str) else "", kwargs or args)
    budget.check_text(value)
    return value


def _check_urlize(
    budget: RenderBudget,
    env: Any,
    value: Any,
    trim_url_limit: Any = None,
    nofollow: Any = False,
    target: Any = None,
    rel: Any = None,
    extra_schemes: Any = None,
) -> Any:
    size = _length(budget, value)
    _check_text_filter(budget, size, "urlize")
    extra = 80 + (len(target) if isinstance(target, str) else 0) + (len(rel) if isinstance(rel, str) else 0)
    budget.check_chars(3 * size + (size // 4 + 1) * extra, "a string (urlize)")
    return value


def _check_text_filter(budget: RenderBudget, size: int, name: str) -> None:
    if size > MAX_TEXT_FILTER_CHARS:
        raise TemplateLimitError(
            f"the chat template passes {size} characters to {name}, over the limit of {MAX_TEXT_FILTER_CHARS} "
            "characters for wordwrap, urlize and pprint"
        )


def _check_pprint(budget: RenderBudget, env: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    _check_text_filter(budget, _length(budget, value), "pprint")
    return value


class _Growth:
    """The check of filters whose output is at most `factor` times their input's text (case mapping, escaping);
    `bounded_filter` applies it inline."""

    def __init__(self, factor: int) -> None:
        self.factor = factor


def _iterating(budget: RenderBudget, env: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    return _ticked_sequence(budget, value)


def _ticked_sequence(budget: RenderBudget, value: Any) -> Any:
    # Only long lists and tuples: a generator iterates them the same way, with clock checks between items.
    if type(value) in (list, tuple) and len(value) > TICK_ITEMS:
        return ticked(budget, value)
    return value


_FILTER_CHECKS: dict[str, Callable[..., Any] | _Growth] = {
    "center": _check_center,
    "indent": _check_indent,
    "replace": _check_replace,
    "join": _check_join,
    "wordwrap": _check_wordwrap,
    "batch": _check_batch,
    "slice": _check_slice,
    "sum": _check_sum,
    "format": _check_format,
    "urlize": _check_urlize,
    "upper": _Growth(3),
    "lower": _Growth(3),
    "title": _Growth(3),
    "capitalize": _Growth(3),
    "escape": _Growth(6),
    "e": _Growth(6),
    "forceescape": _Growth(6),
    "xmlattr": _Growth(6),
    "urlencode": _Growth(12),
    "pprint": _check_pprint,
    "string": _Growth(1),
    "safe": _Growth(1),
    "trim": _Growth(1),
    "truncate": _Growth(1),
    "striptags": _Growth(1),
    "wordcount": _Growth(1),
    "map": _iterating,
    "select": _iterating,
    "reject": _iterating,
    "selectattr": _iterating,
    "rejectattr": _iterating,
    "sort": _iterating,
    "unique": _iterating,
    "groupby": _iterating,
    "list": _iterating,
    "min": _iterating,
    "max": _iterating,
}


def is_binding_error(exc: TypeError) -> bool:
    """Whether `exc` was raised by the call itself (its arguments did not fit the signature), not inside it."""
    return exc.__traceback__ is not None and exc.__traceback__.tb_next is None


def bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (the filter `name`) with its size checks before the call and its result counted after."""
    check = _FILTER_CHECKS.get(name)
    passes = getattr(function, "jinja_pass_arg", None)
    skip = 0 if passes is None else 1

    if check is None:

        @wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            result = function(*args, **kwargs)
            charge_result(CURRENT.get() or current_budget(), result, args[skip] if len(args) > skip else None)
            return result

        return counted

    if isinstance(check, _Growth):
        factor = check.factor

        @wraps(function)
        def grown(*args: Any, **kwargs: Any) -> Any:
            budget = CURRENT.get() or current_budget()
            value: Any = args[skip] if len(args) > skip else None
            if type(value) is str:  # the common case, inline
                if factor > 1 and factor * len(value) > budget.value_chars:
                    budget.check_chars(factor * len(value), "a string")
            else:
                budget.check_chars(factor * _length(budget, value), "a string")
            result = function(*args, **kwargs)
            charge_result(budget, result, value)
            return result

        return grown

    if check is _iterating:

        @wraps(function)
        def iterating(*args: Any, **kwargs: Any) -> Any:
            budget = CURRENT.get() or current_budget()
            value: Any = args[skip] if len(args) > skip else None
            kind = type(value)
            if (kind is list or kind is tuple or kind is str) and len(value) > TICK_ITEMS:
                if len(value) > budget.value_chars >> 4:  # sort, groupby...: Python code per item, unchecked
                    budget.check_items(len(value), f"a list ({name})")
                if kind is not str:
                    args = (*args[:skip], ticked(budget, value), *args[skip + 1 :])
            result = function(*args, **kwargs)
            charge_result(budget, result, value)
            return result

        return iterating

    checker = check

    @wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = CURRENT.get() or current_budget()
        if len(args) <= skip:
            budget.tick()
            return function(*args, **kwargs)
        value = args[skip]
        env = None
        if passes is jinja2.utils._PassArg.eval_context:
            env = args[0].environment
        elif passes is jinja2.utils._PassArg.environment:
            env = args[0]
        try:
            checked = checker(budget, env, *args[skip:], **kwargs)
        except TypeError as exc:
            if not is_binding_error(exc):
                raise
            checked = value  # the arguments do not fit: the filter raises its own error
        if checked is not value:
            args = (*args[:skip], checked, *args[skip + 1 :])
        result = function(*args, **kwargs)
        charge_result(budget, result, value)
        return result

    return bounded


def bounded_tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """The HF contract's `tojson` (`json.dumps` with its options, no HTML escaping), bounded: `indent` at most
    `MAX_TOJSON_INDENT`, and the output counted as it is written, refused past the value limit."""
    budget = CURRENT.get() or current_budget()
    budget.tick()
    if isinstance(indent, int) and indent > MAX_TOJSON_INDENT:
        raise TemplateLimitError(
            f"tojson indent={indent} is over the limit of {MAX_TOJSON_INDENT} for tojson's indent"
        )
    if isinstance(indent, str) and len(indent) > MAX_TOJSON_INDENT:
        raise TemplateLimitError(
            f"tojson's indent string is {len(indent)} characters, over the limit of {MAX_TOJSON_INDENT} for "
            "tojson's indent"
        )
    # JSON writes a character as at most 6 (`\u0000`): small values take json.dumps' C encoder directly.
    if (
        indent is None
        and separators is None
        and 6 * budget.text_size(x, budget.value_chars) <= budget.value_chars
    ):
        text = json.dumps(x, ensure_ascii=ensure_ascii, sort_keys=sort_keys)
    else:
        # The same encoder json.dumps uses (with an indent it is this Python one anyway), chunk by chunk.
        encoder = json.JSONEncoder(
            ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )
        chunks = []
        size = 0
        for chunk in encoder.iterencode(x):
            size += len(chunk)
            if size > budget.value_chars:
                budget.check_chars(size, "tojson output")
            chunks.append(chunk)
            if not len(chunks) % TICK_ITEMS:
                budget.check_time()
        text = "".join(chunks)
    budget.charge(len(text))
    return text

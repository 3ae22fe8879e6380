"""Calls from template code: the methods of strings, bytes, ints and dicts that grow their result, and the
globals (`lipsum`, `strftime`, `dict.fromkeys`), checked before they run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jinja2
import jinja2.runtime
import jinja2.utils

from tokenfront.core.template_limits.budget import RenderBudget, current_budget
from tokenfront.core.template_limits.filters import (
    check_joined,
    check_replacement,
    checked_width,
    is_binding_error,
    iterated_items,
)

# A method check takes the budget, the method's object and the call's arguments; it refuses by raising, and returns
# the positional arguments to call with (None: as given).


def _method_width(budget: RenderBudget, owner: Any, width: Any, *rest: Any) -> None:
    checked_width(budget, width)


def _method_expandtabs(budget: RenderBudget, owner: Any, tabsize: Any = 8) -> None:
    if isinstance(owner, (str, bytes)) and isinstance(tabsize, int) and tabsize > 1:
        tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
        budget.check_chars(len(owner) + tabs * checked_width(budget, tabsize), "a string (expandtabs)")


def _method_replace(budget: RenderBudget, owner: Any, old: Any, new: Any, count: Any = -1) -> None:
    check_replacement(budget, owner, old, new, count)


def _method_join(budget: RenderBudget, owner: Any, iterable: Any) -> tuple[Any, ...] | None:
    if not isinstance(owner, (str, bytes)):
        return None
    items = iterated_items(budget, iterable)
    check_joined(budget, items, owner)
    return (items,)


def _method_translate(budget: RenderBudget, owner: Any, table: Any) -> None:
    if not isinstance(owner, (str, bytes)):
        return
    if isinstance(table, dict):
        values: Iterable[Any] = table.values()
    elif isinstance(table, (list, tuple, str, bytes)):
        values = table
    else:
        values = ()
    longest = max((len(value) for value in values if isinstance(value, (str, bytes))), default=1)
    budget.check_chars(len(owner) * max(longest, 1), "a string (translate)")


def _method_growth(factor: int) -> Callable[..., None]:
    def check(budget: RenderBudget, owner: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(owner, (str, bytes)):
            budget.check_chars(factor * len(owner), "a string")

    return check


def _method_encode(budget: RenderBudget, owner: Any, encoding: Any = "utf-8", errors: Any = "strict") -> None:
    if not isinstance(owner, str):
        return
    # An error handler writes at most ~10 characters for one (`\U0010ffff`, `&#1114111;`); `namereplace` a name.
    budget.check_chars(len(owner) * (100 if errors == "namereplace" else 10), "an encoded string")


def _method_to_bytes(budget: RenderBudget, owner: Any, length: Any = 1, *args: Any, **kwargs: Any) -> None:
    if isinstance(owner, int):
        checked_width(budget, length, "a byte string")


def _method_fromkeys(
    budget: RenderBudget, owner: Any, iterable: Any, value: Any = None
) -> tuple[Any, ...] | None:
    return checked_fromkeys(iterable, value) if isinstance(owner, dict) else None


# By name; each check looks at its method's object only if it is a string or bytes (or an int for to_bytes, a
# dict for fromkeys), the kinds that have such a method.
_METHOD_CHECKS: dict[str, Callable[..., tuple[Any, ...] | None]] = {
    "center": _method_width,
    "ljust": _method_width,
    "rjust": _method_width,
    "zfill": _method_width,
    "expandtabs": _method_expandtabs,
    "replace": _method_replace,
    "join": _method_join,
    "translate": _method_translate,
    "encode": _method_encode,
    "decode": _method_growth(4),
    "hex": _method_growth(3),
    "upper": _method_growth(3),
    "lower": _method_growth(3),
    "title": _method_growth(3),
    "capitalize": _method_growth(3),
    "casefold": _method_growth(3),
    "swapcase": _method_growth(3),
    "to_bytes": _method_to_bytes,
    "fromkeys": _method_fromkeys,
}


def check_method_call(
    budget: RenderBudget, function: Any, owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """Check a call of a method of `owner` (a string, bytes, an int or a dict) from template code before it runs;
    returns the positional arguments to call it with."""
    check = _METHOD_CHECKS.get(function.__name__)
    if check is None:
        return args
    if "_loop_vars" in kwargs or "_block_vars" in kwargs:  # passed by the compiled code, not the template
        kwargs = {key: value for key, value in kwargs.items() if key not in ("_loop_vars", "_block_vars")}
    try:
        checked = check(budget, owner, *args, **kwargs)
    except TypeError as exc:
        if not is_binding_error(exc):
            raise
        return args  # the arguments do not fit: the method raises its own error
    return args if checked is None else checked


def bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> Any:
    """Jinja's `lipsum()` global: `n` paragraphs of up to `max` words (~12 characters each, with markup)."""
    budget = current_budget()
    if isinstance(n, int) and isinstance(max, int):
        checked_width(budget, n, "lorem ipsum")
        budget.check_chars(n * (abs(max) + 1) * 12, "lorem ipsum")
    text = jinja2.utils.generate_lorem_ipsum(n=n, html=html, min=min, max=max)
    budget.charge(len(text))
    return text


def check_strftime_format(format: Any) -> None:
    if isinstance(format, str):
        current_budget().check_chars(16 * len(format), "a date string")


def checked_fromkeys(iterable: Any, value: Any = None) -> tuple[Any, ...]:
    """Check `dict.fromkeys(iterable, value)`; returns the arguments to call it with."""
    budget = current_budget()
    items = iterated_items(budget, iterable)
    size = len(items) if isinstance(items, (list, tuple, str, dict)) else 0
    budget.check_items(size, "a mapping")
    budget.check_chars(size * (budget.text_size(value, budget.value_chars) + 4), "a mapping")
    return (items, value)

"""The arithmetic and formatting operators of template code (`+`, `*`, `**`, `%`, `~`, `str.format`), each
checked against the budget before it builds its result."""

from __future__ import annotations

import math
import re
from typing import Any

from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from markupsafe import Markup

from tokenfront.core.template_limits.budget import RenderBudget, charge_result, current_budget


def binop(budget: RenderBudget, operator: str, left: Any, right: Any, table: dict[str, Any]) -> Any:
    """`left <operator> right` (computed by `table[operator]`), refused before computing it if its result would
    exceed a limit, counted after."""
    left_kind = type(left)
    right_kind = type(right)
    if left_kind is str and right_kind is str and operator == "+":  # most operations in chat templates
        size = len(left) + len(right)
        if size > budget.value_chars:
            budget.check_chars(size, "a string")
        budget.charge(size)
        return left + right
    if (
        left_kind is int
        and right_kind is int
        and operator != "**"
        and left.bit_length() < 64
        and right.bit_length() < 64
    ):
        budget.tick()
        return table[operator](left, right)
    check_binop(budget, operator, left, right)
    result = table[operator](left, right)
    charge_result(budget, result, left, right)
    return result


def check_binop(budget: RenderBudget, operator: str, left: Any, right: Any) -> None:
    """Refuse `left <operator> right` if its result would exceed a limit, before computing it."""
    if isinstance(left, int) and isinstance(right, int):
        budget.check_int(max(left.bit_length(), right.bit_length()))
        if operator == "*":
            budget.check_int(left.bit_length() + right.bit_length())
        elif operator == "**" and right > 0 and abs(left) > 1:
            # |left| ** right has right * log2|left| bits (so right itself is at most MAX_INT_BITS).
            budget.check_int(right)
            budget.check_int(int(right * math.log2(abs(left))) + 1)
        return
    if operator == "*":
        if isinstance(right, int) and isinstance(left, (str, bytes, list, tuple)):
            _check_repeat(budget, left, right)
        elif isinstance(left, int) and isinstance(right, (str, bytes, list, tuple)):
            _check_repeat(budget, right, left)
    elif operator == "+":
        if isinstance(left, (str, bytes)) and isinstance(right, (str, bytes)):
            # Markup escapes the other operand: up to 6 characters for one (`'` -> `&#39;`).
            factor = 6 if isinstance(left, Markup) or isinstance(right, Markup) else 1
            budget.check_chars(factor * (len(left) + len(right)), "a string")
        elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            size = budget.text_size(left, budget.value_chars) + budget.text_size(right, budget.value_chars)
            budget.check_chars(size, "a list")
    elif operator == "%" and isinstance(left, str):
        check_percent_format(budget, left, right)


def _check_repeat(budget: RenderBudget, sequence: Any, count: int) -> None:
    if count <= 0:
        return
    budget.check_int(count.bit_length())
    if isinstance(sequence, (str, bytes)):
        budget.check_chars(len(sequence) * count, "a string")
    else:
        budget.check_items(len(sequence) * count)
        size = budget.text_size(sequence, budget.value_chars)
        budget.check_chars(max(size - 2, len(sequence)) * count, "a list")


# `%`-formatting conversion specifiers: a width and a precision each a number or `*` (taken from the arguments).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?.", re.DOTALL)


def check_percent_format(budget: RenderBudget, template: str, arguments: Any) -> None:
    """`template % arguments` (and the `format` filter): the widths and precisions it pads to, and the text of
    its arguments, must fit the value limit."""
    padding = 0
    stars = False
    for match in _PERCENT_SPEC.finditer(template):
        for number in match.groups():
            if number == "*":
                stars = True
            elif number:
                padding += _spec_number(budget, number)
    if stars and isinstance(arguments, tuple):
        padding += sum(item for item in arguments if isinstance(item, int) and item > 0)
    size = len(template) + padding + budget.text_size(arguments, budget.value_chars)
    budget.check_chars(6 * size if isinstance(template, Markup) else size, "a formatted string")


def _spec_number(budget: RenderBudget, digits: str) -> int:
    if len(digits) > 12:  # also keeps int() below Python's own digit limit
        budget.check_chars(10**12, "a padded or formatted field")
    return int(digits)


_FORMAT_NUMBERS = re.compile(r"\d+")


class _BoundedFormatterMixin:
    """`str.format` fields: each field's text, and the widths and precisions in its format spec (after nested
    `{}` are filled in), add up against the value limit before the field is formatted."""

    _total = 0

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        budget = current_budget()
        budget.check_text(value, "a formatted string")
        return super().convert_field(value, conversion)  # type: ignore[misc]

    def format_field(self, value: Any, format_spec: str) -> Any:
        budget = current_budget()
        size = budget.text_size(value, budget.value_chars)
        for digits in _FORMAT_NUMBERS.findall(format_spec):
            size += _spec_number(budget, digits)
        self._total += size
        budget.check_chars(self._total, "a formatted string")
        return super().format_field(value, format_spec)  # type: ignore[misc]


class BoundedFormatter(_BoundedFormatterMixin, SandboxedFormatter):
    """The sandbox's `str.format` formatter, bounded."""


class BoundedEscapeFormatter(_BoundedFormatterMixin, SandboxedEscapeFormatter):
    """The sandbox's `Markup.format` formatter, bounded."""

"""What a chat template may cost: its size, and the time, steps and characters of one render.

A chat template is code, and with `--allow-request-chat-template` any client sends some. Jinja's sandbox keeps a
template away from interpreter internals; it does nothing about one that exhausts the machine
(`{{ 'x' * 10**10 }}`, `{{ 10**(10**8) }}`, loops nested six deep over `range(100000)`). These limits do: a
template that exceeds one is refused with a `TemplateLimitError` (a 400 naming the limit) and the server keeps
serving. Every value is far above what a real chat template needs (the largest of the ~70 real templates in
the test corpus is 17 KB; rendering a chat is a few hundred loop iterations and about twice the request's
characters), so no real template meets them.

How they are enforced (`templates.py` wires these into the environment and the compiled code):
- compile: a bounded source length; nothing of the template runs while compiling (no constant folding);
- render, per value: every operation that builds a string, a list or an integer from others checks the size of
  the result BEFORE building it (`+`, `*`, `**`, `%`, `~`, slices, the filters and string methods that pad,
  repeat, join, replace or format, `tojson`), so no single value outgrows `RenderBudget.value_chars`;
- render, in total: the characters written out and built by those operations, and the loop iterations and macro
  calls, are counted against per-render budgets, and the clock against `RENDER_SECONDS`; the count and the
  clock are checked at every loop iteration, macro call, output, filter and call (and every 4096 items inside
  filters that iterate big sequences), so no template runs long between two checks.
What is left: a single C-level operation on a value within the limits (sorting a list of millions of items,
say) runs to its end before the next check; it is bounded by the value limit, not interrupted.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from typing import Any

import jinja2
import jinja2.runtime
import jinja2.utils
from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from markupsafe import Markup

from tokenfront.core.errors import TemplateRenderError

# -- the limits ------------------------------------------------------------------------------------------------

MAX_TEMPLATE_CHARS = 128 * 1024
"""Longest chat template source accepted (characters).

Compiling is the one step no budget can interrupt (Jinja's lexer, parser and code generator, then Python's
compiler), and it is about linear in the source: the worst sources measured at this size (~15,000 `{{ x }}` or
`{% for %}` statements) take 1 to 1.5 s and ~170 MB at peak to compile (twice that at 256 KiB), and keep ~2.6 MB
while cached; real templates are at most ~17 KB, an eighth of this. A longer one is refused before it is
parsed."""

RENDER_SECONDS = 10.0
"""Longest a render may run (wall clock). Real templates render a chat in well under 10 ms; a 100,000-message
request, the largest a 16 MB body holds in practice, in about a second."""

MAX_RENDER_STEPS = 4_000_000
"""Most loop iterations plus macro calls in one render. Real templates take a few per message (a 100,000-
message chat with tools takes ~200,000 with Qwen3's template); an empty loop reaches it in about a second, so the
limit, not the clock, stops nested `range()` loops, and at the same point on any machine."""

VALUE_CHARS = 16 * 1024 * 1024
"""Largest string a render may build, and largest text (as `str()` would write it) of a list or mapping it
converts to a string, in characters, before the allowance for a large request (next). 16 Mi characters are
16 to 64 MB of memory; a real template's largest value is its whole prompt.

A list the template builds (a filter's, a method's, `*` or `+`) may have at most a sixteenth as many items
(1 Mi): each item costs tens of bytes, and filters like `sort` or `groupby` call Python code per item with no
check in between (sorting a million strings takes one to three seconds)."""

VALUE_CHARS_PER_INPUT_CHAR = 2
"""Extra characters a single value may have per character of the request (messages, tools, documents and
template variables), so a request larger than `VALUE_CHARS` still renders: its prompt is about its size plus
the template's markup."""

WORK_CHARS = 64 * 1024 * 1024
"""Characters a render may write out and build in total (every output, and every string built by the operations
above; freed or not), before the allowance for a large request (next). This bounds what a render allocates over
its life, so no loop can pile up values within `VALUE_CHARS` each until the process runs out of memory. Real
templates use two to ten times the request's size."""

WORK_CHARS_PER_INPUT_CHAR = 16
"""Extra characters of `WORK_CHARS` per character of the request."""

OUTPUT_OVERHEAD_CHARS = 32
"""What each `{{ ... }}` output counts against `WORK_CHARS` on top of its characters: a render keeps every piece it
writes until the end (a string object of ~50 bytes and a list slot), so a loop writing millions of `{{ i }}` costs
memory its few characters do not show. Real templates write a piece or a few per message (Qwen3's template on a
100,000-message chat with tools: ~100,000 pieces; ~30 Mi characters counted in all, of the 64 Mi allowed)."""

MAX_INT_BITS = 16384
"""Largest integer (in bits, about 4,900 decimal digits) a template may compute or compute with. `10**(10**8)`
would take minutes and 40 MB; templates count messages. Checked from the operands' sizes before computing, so
`x ** y` never starts a computation it would refuse. (Python itself refuses to print integers over 4,300
digits.)"""

MAX_TEXT_FILTER_CHARS = 1024 * 1024
"""Longest input of the filters that process text word by word in Python (`wordwrap`, `urlize`, `pprint`): they
run to their end between two checks, ~0.6 s for this much (5 s for 8 Mi characters). Templates wrap or link a
message at most."""

MAX_TOJSON_INDENT = 64
"""Largest `indent` `tojson` accepts (spaces, or characters of an indent string); templates use 2 or 4. Each
nesting level of the output repeats it on every line."""

# How many items a filter iterates between two clock checks, and the smallest sequence worth checking.
_TICK_ITEMS = 4096
# The clock is read every this many events (each a bounded amount of work), and after any event of more than
# this many characters.
_CLOCK_EVENTS = 64
_CLOCK_CHARS = 1 << 20


class TemplateLimitError(TemplateRenderError):
    """A chat template exceeded one of the limits above: a 400 that names the limit."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="chat_template_limit")


def check_source_length(source: str) -> None:
    """Refuse a template source longer than `MAX_TEMPLATE_CHARS`, before anything parses it."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateLimitError(
            f"the chat template is {len(source)} characters long, over the limit of {MAX_TEMPLATE_CHARS} "
            "characters for a chat template",
            param="chat_template",
        )


# -- the budget of one render ------------------------------------------------------------------------------------


class RenderBudget:
    """The clock, step count and character counts of one render, and the limits they are held to.

    The limits start at their floors (`VALUE_CHARS`, `WORK_CHARS`); the request's size is measured (a walk of its
    messages, tools, ...) only when a count would exceed a floor, so renders that stay below pay nothing for it.
    """

    __slots__ = ("_events", "_inputs", "_sizes", "deadline", "steps", "value_chars", "work", "work_chars")

    def __init__(self, inputs: tuple[Any, ...] = (), *, timed: bool = True) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS if timed else float("inf")
        self.steps = 0
        self.work = 0
        self.value_chars = VALUE_CHARS
        self.work_chars = WORK_CHARS
        self._inputs: tuple[Any, ...] | None = inputs or None
        self._sizes: dict[int, tuple[Any, int]] = {}  # id -> (the object, kept alive; its text size)
        self._events = 0

    # The checks ------------------------------------------------------------------------------------------------

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(
                f"the chat template ran longer than {RENDER_SECONDS:g} s, the render time limit"
            )

    def tick(self) -> None:
        """An event (an operation, a call...): the clock is read every `_CLOCK_EVENTS` of them (reading it costs
        more than most events), so it is read at least every few milliseconds of rendering."""
        self._events += 1
        if not self._events % _CLOCK_EVENTS:
            self.check_time()

    def step(self, chars: int = 0) -> None:
        """One loop iteration or macro call, which writes `chars` characters of the template's own text."""
        self.steps += 1
        if self.steps > MAX_RENDER_STEPS:
            raise TemplateLimitError(
                f"the chat template ran more than {MAX_RENDER_STEPS} loop iterations and macro calls, the "
                "render step limit"
            )
        self.charge(chars)

    def charge(self, chars: int) -> None:
        """`chars` more characters written out or built (an event)."""
        self.work += chars
        if self.work > self.work_chars:
            self._over_work()
        self._events += 1
        if not self._events % _CLOCK_EVENTS or chars > _CLOCK_CHARS:
            self.check_time()

    def _over_work(self) -> None:
        if not self._grow() or self.work > self.work_chars:
            raise TemplateLimitError(
                f"the chat template wrote and built more than {self.work_chars} characters, the render work "
                f"limit ({WORK_CHARS} plus {WORK_CHARS_PER_INPUT_CHAR} per character of the request)"
            )

    def check_chars(self, chars: int, what: str) -> None:
        """Refuse building a value of `chars` characters (`what` says which, for the message)."""
        if chars > self.value_chars and not (self._grow() and chars <= self.value_chars):
            raise TemplateLimitError(
                f"the chat template would build {what} of {chars} characters, over the value size limit of "
                f"{self.value_chars} characters ({VALUE_CHARS} plus {VALUE_CHARS_PER_INPUT_CHAR} per character "
                "of the request)"
            )

    def check_text(self, value: Any, what: str = "a string") -> int:
        """The text size of `value` (see `text_size`), refused over the value limit; returns it."""
        size = self.text_size(value, self.value_chars)
        if size > self.value_chars:
            self.check_chars(size, what)
        return size

    def check_items(self, items: int, what: str = "a list") -> None:
        """Refuse building a list of `items` items (the limit is `value_chars / 16`)."""
        if items > self.value_chars >> 4 and not (self._grow() and items <= self.value_chars >> 4):
            raise TemplateLimitError(
                f"the chat template would build {what} of {items} items, over the list size limit of "
                f"{self.value_chars >> 4} items (a sixteenth of the value size limit)"
            )

    def check_int(self, bits: int) -> None:
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(
                f"the chat template would compute an integer of about {bits} bits, over the integer size limit "
                f"of {MAX_INT_BITS} bits"
            )

    def _grow(self) -> bool:
        """Raise the limits by the request's allowance (once); False if it was already granted."""
        if self._inputs is None:
            return False
        chars = _input_chars(self._inputs)
        self._inputs = None
        self.value_chars += VALUE_CHARS_PER_INPUT_CHAR * chars
        self.work_chars += WORK_CHARS_PER_INPUT_CHAR * chars
        return True

    # Text sizes -------------------------------------------------------------------------------------------------

    def text_size(self, value: Any, limit: int) -> int:
        """About `len(str(value))`, without building it: a string's length, an integer's digits, and for lists,
        tuples, mappings and namespaces the sum over their items (strings counted without repr escapes).

        Shared items count every time they appear, as `str()` writes them; sizes of containers are remembered
        for the render, so a structure that repeats one list (`[a, a]`, then `[b, b]`...) costs one visit per
        distinct list. Stops counting past `limit`."""
        kind = type(value)
        if kind is str:
            return len(value)
        if kind is int:
            return _int_digits(value)
        if kind is float or value is None or kind is bool:
            return 24
        if isinstance(value, str):
            return len(value)
        if isinstance(value, int):
            return _int_digits(value)
        if kind is dict or kind is list or kind is tuple:
            size = _plain_size(value, limit)
            if size is not None:
                return size
        if isinstance(value, (list, tuple, dict, set, frozenset, jinja2.utils.Namespace)):
            return self._container_size(value, limit)
        if isinstance(value, (bytes, bytearray)):
            return 4 * len(value) + 3
        return 64  # other objects (loops, cyclers, ranges, undefined...) print as a short repr

    def _container_size(self, value: Any, limit: int) -> int:
        key = id(value)
        known = self._sizes.get(key)
        if known is not None and known[0] is value:
            return known[1]
        namespace = isinstance(value, jinja2.utils.Namespace)
        if namespace:
            if key in self._sizes:  # a namespace holding itself: `str()` would recurse forever
                raise TemplateLimitError("the chat template nests a namespace inside itself")
            self._sizes[key] = (value, limit + 1)  # while counting: a cycle back here is refused above
            items: Any = value._Namespace__attrs  # type: ignore[attr-defined]
        else:
            items = value
        total = 16 if namespace else 2
        try:
            if isinstance(items, dict):
                for item_key, item in items.items():
                    total += self.text_size(item_key, limit) + self.text_size(item, limit) + 4
                    if total > limit:
                        return total
                    self._visit()
            else:
                for item in items:
                    total += self.text_size(item, limit) + 2
                    if total > limit:
                        return total
                    self._visit()
        finally:
            if namespace:
                del self._sizes[key]
        # Namespaces change; lists, tuples and mappings cannot (the sandbox is immutable): remember those.
        if not namespace and len(items) > 1:
            if len(self._sizes) >= 65536:
                self._sizes.clear()
            self._sizes[key] = (value, total)
        return total

    def _visit(self) -> None:
        self._events += 1
        if not self._events % _TICK_ITEMS:
            self.check_time()


CURRENT: contextvars.ContextVar[RenderBudget | None] = contextvars.ContextVar(
    "tokenfront_template_budget", default=None
)


def current_budget() -> RenderBudget:
    """The budget of the render running in this thread; outside a render (a filter folded at compile time, a
    test calling a filter), a fresh one with no clock."""
    return CURRENT.get() or RenderBudget(timed=False)


def start_budget(budget: RenderBudget) -> contextvars.Token[RenderBudget | None]:
    return CURRENT.set(budget)


def end_budget(token: contextvars.Token[RenderBudget | None]) -> None:
    CURRENT.reset(token)


# Most values converted are small trees of dicts, lists and strings (a tool, a message): `_plain_size` counts them
# in one loop, and hands anything larger or unusual to the remembering walk.
_PLAIN_NODES = 2048


def _plain_size(value: Any, limit: int) -> int | None:
    """`RenderBudget.text_size` of plain data of at most `_PLAIN_NODES` items, or None for the full walk."""
    total = 0
    nodes = 0
    pending = [value]
    pop = pending.pop
    push = pending.extend
    while pending:
        item = pop()
        kind = type(item)
        if kind is str:
            total += len(item) + 4
        elif kind is dict:
            try:
                total += len("".join(item)) + 8 * len(item) + 2  # the keys, if all are strings (C-level)
            except TypeError:
                return None
            push(item.values())
            nodes += len(item)
        elif kind is list or kind is tuple:
            total += 2
            push(item)
            nodes += len(item)
        elif kind is int:
            total += _int_digits(item) + 2
        elif kind is float or kind is bool or item is None:
            total += 26
        else:
            return None
        if nodes > _PLAIN_NODES:
            return None
        if total > limit:
            return total
    return total


def _int_digits(value: int) -> int:
    return (value.bit_length() * 1233 >> 12) + 2  # log10(2) ~ 1233/4096


def _input_chars(inputs: Iterable[Any]) -> int:
    """Characters of the request's strings (and 8 per other item), walked without recursion."""
    total = 0
    pending = list(inputs)
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        else:
            total += 8
    return total


def _ticked(budget: RenderBudget, items: Iterable[Any]) -> Iterator[Any]:
    """`items`, checking the clock every `_TICK_ITEMS` items."""
    for count, item in enumerate(items, 1):
        if not count % _TICK_ITEMS:
            budget.check_time()
        yield item


def charge_result(budget: RenderBudget, result: Any, source: Any = None, other: Any = None) -> None:
    """Count what an operation built from `source` (and `other`): a new string's characters, a new list's items
    (and its strings' characters)."""
    kind = type(result)
    if kind is str or (kind is not list and kind is not tuple and isinstance(result, str)):
        if result is source or result is other:
            return budget.tick()
        size = len(result)
        if size > budget.value_chars:
            budget.check_chars(size, "a string")
        return budget.charge(size)
    if kind is list or kind is tuple:
        if result is source or result is other:
            return budget.tick()
        if len(result) > budget.value_chars >> 4:
            budget.check_items(len(result))
        chars = 0
        if result and isinstance(result[0], str):
            with contextlib.suppress(TypeError):
                chars = sum(map(len, result))  # C-level: lists of strings (split, partition...)
        return budget.charge(len(result) + chars)
    return budget.tick()


# -- operators -------------------------------------------------------------------------------------------------


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


# -- filters -----------------------------------------------------------------------------------------------------

# A check takes the budget, the environment (None for filters that are not given one) and the filter's own
# arguments as the filter takes them (the value first); it refuses by raising, and returns the value to call the
# filter with: the same, or the items of an iterable it had to read (a list), or the same items read with clock
# checks in between (a generator). Arguments that do not fit the filter's signature are left to the filter, which
# raises its own TypeError.


def _width(budget: RenderBudget, width: Any, what: str = "a padded string") -> int:
    if isinstance(width, int):
        budget.check_int(width.bit_length())
        budget.check_chars(width, what)
        return max(width, 0)
    return 0


def _length(budget: RenderBudget, value: Any) -> int:
    return len(value) if isinstance(value, str) else budget.text_size(value, budget.value_chars)


def _check_center(budget: RenderBudget, env: Any, value: Any, width: Any = 80) -> Any:
    _width(budget, width)
    return value


def _check_indent(
    budget: RenderBudget, env: Any, s: Any, width: Any = 4, first: Any = False, blank: Any = False
) -> Any:
    prefix = len(width) if isinstance(width, str) else _width(budget, width)
    lines = s.count("\n") + 1 if isinstance(s, str) else _length(budget, s)
    budget.check_chars(_length(budget, s) + lines * prefix, "an indented string")
    return s


def _check_replace(budget: RenderBudget, env: Any, s: Any, old: Any, new: Any, count: Any = None) -> Any:
    _check_replacement(budget, s, old, new, -1 if count is None else count)
    return s


def _check_replacement(budget: RenderBudget, s: Any, old: Any, new: Any, count: Any) -> None:
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
    items = _items(budget, value)
    if attribute is not None and env is not None and isinstance(items, list):
        getter = jinja2.filters.make_attrgetter(env, attribute)
        _joined(budget, [getter(item) for item in items], d)
    else:
        _joined(budget, items, d)
    return items


def _items(budget: RenderBudget, value: Any) -> Any:
    """A list of the items of an iterable that is not a sequence (read with clock checks); others as they are."""
    if isinstance(value, (list, tuple, str, dict, jinja2.Undefined)) or not hasattr(value, "__iter__"):
        return value
    return list(_ticked(budget, value))


def _joined(budget: RenderBudget, items: Any, separator: Any) -> None:
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
    items = _items(budget, iterable)
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
    if type(value) in (list, tuple) and len(value) > _TICK_ITEMS:
        return _ticked(budget, value)
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


def _binding_error(exc: TypeError) -> bool:
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
            if (kind is list or kind is tuple or kind is str) and len(value) > _TICK_ITEMS:
                if len(value) > budget.value_chars >> 4:  # sort, groupby...: Python code per item, unchecked
                    budget.check_items(len(value), f"a list ({name})")
                if kind is not str:
                    args = (*args[:skip], _ticked(budget, value), *args[skip + 1 :])
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
            if not _binding_error(exc):
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
            if not len(chunks) % _TICK_ITEMS:
                budget.check_time()
        text = "".join(chunks)
    budget.charge(len(text))
    return text


# -- calls: methods and globals ----------------------------------------------------------------------------------

# A method check takes the budget, the method's object and the call's arguments; it refuses by raising, and returns
# the positional arguments to call with (None: as given).


def _method_width(budget: RenderBudget, owner: Any, width: Any, *rest: Any) -> None:
    _width(budget, width)


def _method_expandtabs(budget: RenderBudget, owner: Any, tabsize: Any = 8) -> None:
    if isinstance(owner, (str, bytes)) and isinstance(tabsize, int) and tabsize > 1:
        tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
        budget.check_chars(len(owner) + tabs * _width(budget, tabsize), "a string (expandtabs)")


def _method_replace(budget: RenderBudget, owner: Any, old: Any, new: Any, count: Any = -1) -> None:
    _check_replacement(budget, owner, old, new, count)


def _method_join(budget: RenderBudget, owner: Any, iterable: Any) -> tuple[Any, ...] | None:
    if not isinstance(owner, (str, bytes)):
        return None
    items = _items(budget, iterable)
    _joined(budget, items, owner)
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
        _width(budget, length, "a byte string")


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
        if not _binding_error(exc):
            raise
        return args  # the arguments do not fit: the method raises its own error
    return args if checked is None else checked


def bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> Any:
    """Jinja's `lipsum()` global: `n` paragraphs of up to `max` words (~12 characters each, with markup)."""
    budget = current_budget()
    if isinstance(n, int) and isinstance(max, int):
        _width(budget, n, "lorem ipsum")
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
    items = _items(budget, iterable)
    size = len(items) if isinstance(items, (list, tuple, str, dict)) else 0
    budget.check_items(size, "a mapping")
    budget.check_chars(size * (budget.text_size(value, budget.value_chars) + 4), "a mapping")
    return (items, value)

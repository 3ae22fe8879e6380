"""The budget of one render: the clock, the steps and the characters a render has spent, checked against the
limits (`bounds`) at every loop iteration, macro call, output, filter and call; the sizes of values."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterable, Iterator
from typing import Any

import jinja2
import jinja2.runtime
import jinja2.utils

from tokenfront.core.template_limits.bounds import (
    CLOCK_CHARS,
    CLOCK_EVENTS,
    MAX_INT_BITS,
    MAX_RENDER_STEPS,
    RENDER_SECONDS,
    TICK_ITEMS,
    VALUE_CHARS,
    VALUE_CHARS_PER_INPUT_CHAR,
    WORK_CHARS,
    WORK_CHARS_PER_INPUT_CHAR,
    TemplateLimitError,
)


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
        """An event (an operation, a call...): the clock is read every `CLOCK_EVENTS` of them (reading it costs
        more than most events), so it is read at least every few milliseconds of rendering."""
        self._events += 1
        if not self._events % CLOCK_EVENTS:
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
        if not self._events % CLOCK_EVENTS or chars > CLOCK_CHARS:
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
        if not self._events % TICK_ITEMS:
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


def ticked(budget: RenderBudget, items: Iterable[Any]) -> Iterator[Any]:
    """`items`, checking the clock every `TICK_ITEMS` items."""
    for count, item in enumerate(items, 1):
        if not count % TICK_ITEMS:
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

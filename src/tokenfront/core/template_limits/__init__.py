"""What a chat template may cost: its size, and the time, steps and characters of one render.

A chat template is code, and with `--allow-request-chat-template` any client sends some. Jinja's sandbox keeps a
template away from interpreter internals; it does nothing about one that exhausts the machine
(`{{ 'x' * 10**10 }}`, `{{ 10**(10**8) }}`, loops nested six deep over `range(100000)`). These limits do: a
template that exceeds one is refused with a `TemplateLimitError` (a 400 naming the limit) and the server keeps
serving. Every value is far above what a real chat template needs (the largest of the ~70 real templates in
the test corpus is 17 KB; rendering a chat is a few hundred loop iterations and about twice the request's
characters), so no real template meets them.

How they are enforced (`templates.py` wires these into the environment and the compiled code), one module
each: `bounds` (the limits), `budget` (one render's spending), `operators`, `filters`, `calls`:
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

from tokenfront.core.template_limits.bounds import (
    CLOCK_CHARS,
    CLOCK_EVENTS,
    MAX_INT_BITS,
    MAX_RENDER_STEPS,
    MAX_TEMPLATE_CHARS,
    MAX_TEXT_FILTER_CHARS,
    MAX_TOJSON_INDENT,
    OUTPUT_OVERHEAD_CHARS,
    RENDER_SECONDS,
    TICK_ITEMS,
    VALUE_CHARS,
    VALUE_CHARS_PER_INPUT_CHAR,
    WORK_CHARS,
    WORK_CHARS_PER_INPUT_CHAR,
    TemplateLimitError,
    check_source_length,
)
from tokenfront.core.template_limits.budget import (
    CURRENT,
    RenderBudget,
    charge_result,
    current_budget,
    end_budget,
    start_budget,
)
from tokenfront.core.template_limits.calls import (
    bounded_lipsum,
    check_method_call,
    check_strftime_format,
    checked_fromkeys,
)
from tokenfront.core.template_limits.filters import bounded_filter, bounded_tojson
from tokenfront.core.template_limits.operators import BoundedEscapeFormatter, BoundedFormatter, binop

__all__ = [
    "CLOCK_CHARS",
    "CLOCK_EVENTS",
    "CURRENT",
    "MAX_INT_BITS",
    "MAX_RENDER_STEPS",
    "MAX_TEMPLATE_CHARS",
    "MAX_TEXT_FILTER_CHARS",
    "MAX_TOJSON_INDENT",
    "OUTPUT_OVERHEAD_CHARS",
    "RENDER_SECONDS",
    "TICK_ITEMS",
    "VALUE_CHARS",
    "VALUE_CHARS_PER_INPUT_CHAR",
    "WORK_CHARS",
    "WORK_CHARS_PER_INPUT_CHAR",
    "BoundedEscapeFormatter",
    "BoundedFormatter",
    "RenderBudget",
    "TemplateLimitError",
    "binop",
    "bounded_filter",
    "bounded_lipsum",
    "bounded_tojson",
    "charge_result",
    "check_method_call",
    "check_source_length",
    "check_strftime_format",
    "checked_fromkeys",
    "current_budget",
    "end_budget",
    "start_budget",
]

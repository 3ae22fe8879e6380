"""The limits of one chat template: its source length, and what one render may spend (time, steps, characters,
sizes), each a constant with why it is that value; `TemplateLimitError` is the 400 that names the one hit."""

from __future__ import annotations

from tokenfront.core.errors import TemplateRenderError

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
TICK_ITEMS = 4096
# The clock is read every this many events (each a bounded amount of work), and after any event of more than
# this many characters.
CLOCK_EVENTS = 64
CLOCK_CHARS = 1 << 20


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

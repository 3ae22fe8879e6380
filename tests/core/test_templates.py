"""The template sandbox: its fast attribute path must answer exactly what Jinja's immutable sandbox answers,
for ordinary template reads and for hostile ones alike."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenfront.core import templates

MESSAGE = {"role": "user", "content": "  Hello World  ", "items": "a key named like a dict method"}

# Expressions a chat template may evaluate: reads of message keys, str methods, loop and namespace fields,
# missing keys, and escapes the sandbox must stop.
EXPRESSIONS = [
    "message.role",
    "message.content",
    "message.missing is defined",
    "message.missing | default('fallback')",
    "message['role']",
    "message.items is callable",  # the dict method wins over the key, as in Jinja
    "message.items() | list | length",
    "message.get('role')",
    "message.keys() | list",
    "message.content.strip()",
    "message.content.lstrip().split(' ')",
    "message.content.startswith('  He')",
    "message.content.replace('World', 'there')",
    "message.content.upper().lower().title()",
    "'{}-{}'.format(1, 2)",
    "message.content.__class__",
    "message.__class__",
    "message.__class__.__mro__",
    "message.update",
    "message.__init__",
    "''.__class__.__base__.__subclasses__",
    "message.content.format_map",
    "ns.seen",
    "ns.missing is defined",
    "ns.__dict__",
    "ns._Namespace__attrs",
    "ns.__class__",
]


def _environments() -> tuple[jinja2.Environment, jinja2.Environment]:
    ours = templates.make_environment()
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    plain.globals.update(ours.globals)
    plain.filters.update(ours.filters)
    return ours, plain


def _outcome(env: jinja2.Environment, expression: str) -> Any:
    source = (
        "{% set ns = namespace(seen=3) %}"
        "{% for message in messages %}{{ loop.index0 }}|{{ loop.first }}|{{ loop.last }}|"
        "{{ loop.length }}|{{ loop.revindex }}|{{ " + expression + " }}{% endfor %}"
    )
    try:
        return ("ok", env.from_string(source).render(messages=[MESSAGE, dict(MESSAGE, role="assistant")]))
    except Exception as exc:  # the sandbox's refusal is part of what must match
        return ("error", type(exc).__name__)


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_fast_path_matches_the_plain_sandbox(expression: str) -> None:
    ours, plain = _environments()
    assert _outcome(ours, expression) == _outcome(plain, expression)


def test_the_sandbox_still_refuses_escapes_and_mutation() -> None:
    ours, _ = _environments()
    escapes = [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages[0].__class__.__init__.__globals__ }}",
        "{% for m in messages %}{{ m.update({'role': 'x'}) }}{% endfor %}",
        "{{ messages.append(1) }}",
    ]
    refused = 0
    for source in escapes:
        with pytest.raises(jinja2.exceptions.SecurityError):
            ours.from_string(source).render(messages=[dict(MESSAGE)])
        refused += 1
    assert refused == len(escapes)
    # A format string reaching for internals gets nothing (the sandbox's formatter reads it as undefined).
    assert ours.from_string("{{ '{0.__class__}'.format(messages) }}").render(messages=[]) == ""

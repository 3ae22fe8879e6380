"""Content-format detection: whether a chat template reads each message's content as OpenAI-style parts or
as one string.

The rule of vLLM's `_detect_content_format`: a template that loops over the `content` of a message variable
gets OpenAI-style content parts (`"openai"`); any other template gets one string (`"string"`). The messages are
normalized to that format before the template sees them (`core.messages`). The detection reads the template's
syntax tree as written, once, when it is compiled (`core.templates.ChatTemplate`), in linear time: a hostile
template of thousands of `{% set %}` cannot make it quadratic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Literal

import jinja2.nodes

__all__ = ["ContentFormat", "detect_content_format"]

ContentFormat = Literal["string", "openai"]


def detect_content_format(root: jinja2.nodes.Template) -> ContentFormat:
    """`"openai"` when the template (its syntax tree, as written) loops over the `content` of a message
    variable, else `"string"`."""
    return "openai" if _loops_over_message_content(root) else "string"


def _accessed(node: jinja2.nodes.Node, key: str | None = None) -> str | None:
    """The variable `node` is (or whose `[key]` / `.key` it is), possibly through filters, tests or slices; None if
    it is no such access. (One name per node: the detection below looks each up once, in linear time, as a
    hostile template of thousands of `{% set %}` could otherwise make it quadratic.)"""
    while True:
        if isinstance(node, jinja2.nodes.Filter):
            if node.node is None:
                return None
            node = node.node
        elif isinstance(node, jinja2.nodes.Test) or (
            isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)
        ):
            node = node.node
        else:
            break
    if key is not None:
        if isinstance(node, jinja2.nodes.Getitem):
            if not (isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key):
                return None
        elif not (isinstance(node, jinja2.nodes.Getattr) and node.attr == key):
            return None
        node = node.node
    if isinstance(node, jinja2.nodes.Name) and node.ctx == "load":
        return str(node.name)
    return None


def _aliases(root: jinja2.nodes.Template, name: str) -> Iterator[str]:
    """`name` and every variable assigned from it (`{% set msgs = messages %}`), transitively."""
    assigned: dict[str, list[str]] = {}  # a name -> the variables assigned from it, in template order
    for assign in root.find_all(jinja2.nodes.Assign):
        source = _accessed(assign.node)
        if source is not None and isinstance(assign.target, jinja2.nodes.Name):
            assigned.setdefault(source, []).append(assign.target.name)
    seen = {name}
    yield name
    pending = deque([name])
    while pending:
        for target in assigned.get(pending.popleft(), ()):
            # `seen` also ends cycles (`{% set a = b %}{% set b = a %}`) that a hostile template could build.
            if target not in seen:
                seen.add(target)
                yield target
                pending.append(target)


def _loop_targets(root: jinja2.nodes.Template, iterables: list[str], key: str | None) -> Iterator[str]:
    names = set(iterables)
    for loop in root.find_all(jinja2.nodes.For):
        if isinstance(loop.target, jinja2.nodes.Name) and _accessed(loop.iter, key) in names:
            yield loop.target.name


def _loops_over_message_content(root: jinja2.nodes.Template) -> bool:
    message_lists = list(_aliases(root, "messages"))
    message_vars = list(_loop_targets(root, message_lists, None))
    return next(_loop_targets(root, message_vars, "content"), None) is not None

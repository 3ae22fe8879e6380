"""What one JSON schema may ask of the grammar compiler, checked before xgrammar sees it.

Every schema the worker constrains a generation with (today: the `parameters` of the function a named
`tool_choice` forces; see guided.py) comes from a client. xgrammar compiles what it is given, and some small
schemas cost it without bound: `{"$ref": "#"}` in a required property has no finite instance, and finding the
text such a grammar forces (`find_jump_forward_string`, which the closing plan of guided.py calls) grows
without end — the worker went past 6 GB in 6.5 s; an `enum` of 200,000 strings took 53 s and 1.2 GB to
compile; 1,000 optional properties in one object 3.9 s (the cost is about quadratic in an object's
properties); `minProperties` over 256 optional properties more than a minute. `check_schema` walks the schema
(iteratively, so a deep one cannot exhaust the stack) and refuses, with a `RenderError` (400,
code `schema_limit`) naming the limit and the schema path, whatever is over one of the `SchemaLimits` below.
The compile itself then runs off the event loop within a time and a memory budget (guided.py).

Every value was measured with xgrammar 0.2.9 on SmolLM2's 49k-token vocabulary on a 2-core machine (the
"measured" notes; docs/robustness.md#grammar-limits has the table), and each is far above what real tool
schemas use (tens of properties, a few levels, enums of tens of values). On a 151k-token vocabulary (Qwen3)
the same shapes cost up to 2.6x as much (formats; less for the rest): still within the compile budget.

What the minimal instance is. `max_minimal_instance_bytes` bounds the shortest compact JSON the schema
allows, counting the text the schema fixes — braces, brackets, separators, required keys, `const` and
`enum` values, `minItems` copies of an item, the shortest text a `pattern` matches — and not the free
characters of a string (`minLength` text is the model's choice, never forced), for the root and for every
subschema an instance can reach (an optional one is forced once the model starts it). It bounds any text the
grammar can force in one run, which is what `find_jump_forward_string` walks (measured: quadratic
in the forced length, 0.14 s and +33 MB at 14 KB, 1.8 s and +190 MB at 42 KB). A `$ref` cycle through
required properties (or `minItems`, or `allOf`) makes it infinite: refused, naming the `$ref`. A recursion
through something optional (`{"$ref": "#"}` in an optional property, in `anyOf` beside a finite branch, in
array items without `minItems`) is allowed: it has finite instances, the grammar is a plain recursive rule
(compiles in milliseconds), the closing plan closes it (it tries `}` and `]` first), and the generation is
bounded by the token budget like any other.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tokenfront.core.errors import RenderError

try:  # the standard library's regular-expression parser: the shortest text a `pattern` matches
    import re._parser as _regex_parser  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # Python 3.10
    import sre_parse as _regex_parser  # type: ignore[no-redef, unused-ignore]

__all__ = ["SCHEMA_LIMITS", "SCHEMA_LIMIT_CODE", "SchemaLimits", "check_schema"]

SCHEMA_LIMIT_CODE = "schema_limit"


@dataclass(frozen=True)
class SchemaLimits:
    """The bounds of one schema and of its compilation (each value's reason in the field's comment).

    Figures are CPU seconds of one compile (wall-clock ones were 2-3x that on the loaded machine).
    """

    # JSON nesting levels of the schema document (every object and array counts one). 64 levels (31 nested
    # objects with two properties each): 0.03 s. OpenAI's structured outputs take 10 levels of objects. Also
    # what keeps the JSON encoder and this module's own walk far from Python's recursion limit.
    max_depth: int = 64
    # JSON values in the schema document (objects, arrays, strings, numbers...): bounds the walk, the JSON
    # text compiled and everything the other limits do not name. 2,400 integer ranges in one anyOf (9,600
    # values): 1.7 s, +210 MB.
    max_nodes: int = 10_000
    # Properties of one object (its `properties`, or its `required` keys if more). The compile is about
    # quadratic in an object's properties: 128 optional ones 0.04 s; 1,000 took 3.9 s, 20,000 required 12.8 s.
    max_object_properties: int = 128
    # Properties of all objects together: 8 objects of 127 optional properties, 0.4 s.
    max_properties: int = 1_024
    # Properties of an object that also sets `minProperties` or `maxProperties`, whose counting multiplies
    # the grammar's states: 16 properties, 0.01 s; 100, 2.4 s; 256, over a minute.
    max_counted_properties: int = 16
    # Values of one `enum`: 1,024 short strings 0.01 s; 10,000 took 0.7 s, 200,000 53 s and +1.2 GB.
    max_enum_values: int = 1_024
    # Characters of the text the grammar spells out, over the whole schema: property names, `enum` and
    # `const` values (as JSON), patterns. OpenAI's structured outputs allow 120,000 (names, enum and const
    # values); 3 enums of 1,024 values, 60,000 characters in all: 0.06 s.
    max_literal_chars: int = 65_536
    # `pattern`s, `format`s and `patternProperties` keys in the whole schema: each is a regular expression
    # for xgrammar, some large (`format: "uri-template"` costs 70 ms on a 49k vocabulary and 175 ms on a
    # 151k one, `email` or `uri` 20 ms, a pattern with a `{1,1000}` 50 ms, a plain one 2 ms). 8 uri-templates:
    # 0.5 s (1.4 s on the 151k vocabulary); 3,000 formats went past 4 GB.
    max_patterns: int = 8
    # Characters of one pattern. Real patterns are tens of characters.
    max_pattern_chars: int = 1_000
    # The largest repetition count in a pattern (`a{1000}`, `[0-9]{1,1000}`), and all counts summed over the
    # schema. xgrammar expands counted repetitions: `a{100000}` compiled in 1 s and then cost 385 ms per
    # generated token (`a{1000}`: 2.5 ms); counts summing to 24,000 in 8 patterns took 0.8 s.
    max_pattern_repeat: int = 1_000
    max_pattern_repeats: int = 4_096
    # Numbers and integers with a `minimum`, `maximum` or exclusive bound: each is a range expression
    # (2,400 number ranges: 4 s, +490 MB; 256: 0.15 s).
    max_bounded_numbers: int = 256
    # The minimal instance's fixed text, in bytes (see the module docstring); infinite is a required
    # recursion. 4 KiB of forced text costs the closing plan 30-40 ms; 14 KB took 0.14 s, 140 KB 3 GB.
    max_minimal_instance_bytes: int = 4_096
    # Wall-clock seconds one compile may take, from the request's wait for the compile thread to the
    # compiled grammar (a 400 `grammar_compile_timeout` past it; the grammar is then discarded, not cached).
    # The largest schema within all the limits above (benchmarks/grammar_schemas.py) compiles in 1.1 s of
    # CPU on a 49k vocabulary and 2.0 s on a 151k one; 2-4x that in wall-clock time on a loaded machine.
    compile_seconds: float = 10.0
    # Memory one compiled grammar may hold (xgrammar's `memory_size_bytes`), and all cached ones together.
    # The largest within the limits measured 8.7 MB (12 MB on a 151k vocabulary); one over the first is
    # refused and discarded.
    max_grammar_bytes: int = 64 * 1024 * 1024
    max_cached_grammar_bytes: int = 256 * 1024 * 1024


SCHEMA_LIMITS = SchemaLimits()
"""The worker's limits (constants: no flag sets them)."""

# A counted repetition in a regular expression: `{3}`, `{1,5}`, `{2,}`. An escaped brace (`\{3\}`) counts
# too: the scan is textual, so it errs on the side of refusing.
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
# Keywords whose value is one subschema, a list of subschemas, or a map of name to subschema.
_ONE = ("additionalProperties", "propertyNames", "unevaluatedProperties", "additionalItems", "contains",
        "unevaluatedItems", "not", "if", "then", "else")  # fmt: skip
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
_OBJECT_HINTS = ("properties", "required", "additionalProperties", "patternProperties", "minProperties")
_ARRAY_HINTS = ("items", "prefixItems", "minItems", "maxItems", "contains")
_STRING_HINTS = ("pattern", "minLength", "maxLength", "format")
# The whole-schema totals: the limit's field and what the count is.
_TOTALS = {
    "properties": ("max_properties", "the properties of all objects"),
    "literal characters": (
        "max_literal_chars",
        "property names, enum and const values (as JSON) and patterns",
    ),
    "patterns and formats": ("max_patterns", "each pattern, format and patternProperties key is a regex"),
    "pattern repetitions": ("max_pattern_repeats", "the counts of {n} and {n,m} in all patterns, added up"),
    "bounded numbers": ("max_bounded_numbers", "numbers with a minimum or maximum, each a range to compile"),
}
_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_FIXED_WIDTH = {"boolean": 4, "null": 4, "integer": 1, "number": 1}  # "true", "null", "0"


def check_schema(schema: Any, where: str, limits: SchemaLimits = SCHEMA_LIMITS) -> None:
    """Refuse a schema over one of `limits` with a `RenderError` (400, code `schema_limit`).

    `schema` is the JSON value as the client sent it (after the root is made an object schema); `where`
    names it in the request (`tools[0].function.parameters`), and messages name the path inside it.
    """
    _check_size(schema, where, limits)
    _Walk(schema, where, limits).run()


def _refuse(message: str, where: str) -> RenderError:
    return RenderError(message, param=where, code=SCHEMA_LIMIT_CODE)


def _check_size(schema: Any, where: str, limits: SchemaLimits) -> None:
    """Depth and node count, iteratively, in at most `max_nodes` steps (a 16 MB body holds millions)."""
    # Paths are linked (parent, key) pairs, spelled out only for the message.
    stack: list[tuple[Any, int, Any]] = [(schema, 1, None)]
    seen = 0
    while stack:
        value, depth, link = stack.pop()
        seen += 1
        if depth > limits.max_depth:
            raise _refuse(
                f"{_spelled(where, link)} is nested {depth} levels deep; the worker compiles schemas nested at "
                f"most {limits.max_depth} levels: flatten the schema, or move repeated parts to $defs",
                where,
            )
        if isinstance(value, dict):
            children: Any = value.items()
        elif isinstance(value, list):
            children = enumerate(value)
        else:
            continue
        # Everything on the stack is counted once popped: refuse as soon as the total is known to be over.
        if seen + len(stack) + len(value) > limits.max_nodes:
            raise _refuse(
                f"{where} has more than {limits.max_nodes} JSON values (objects, arrays, strings, numbers); "
                "the worker compiles schemas of at most that many: simplify the schema",
                where,
            )
        stack.extend((child, depth + 1, (link, key)) for key, child in children)


def _spelled(where: str, link: Any) -> str:
    """The path a linked (parent, key) chain names, its middle elided when long."""
    keys: list[Any] = []
    while link is not None:
        link, key = link
        keys.append(key)
    path = where
    for key in reversed(keys):
        path = f"{path}[{key}]" if isinstance(key, int) else _join(path, key)
    return _shown(path)


def _shown(path: str) -> str:
    return path if len(path) <= 200 else f"{path[:90]}...{path[-90:]}"


def _join(path: str, key: str) -> str:
    return (
        f"{path}.{key}" if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_$-]*", key) else f"{path}[{json.dumps(key)}]"
    )


def _json_length(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))


@dataclass
class _Node:
    """One subschema in the minimal-instance graph: SUM (`base` + children x count) or MIN (over children)."""

    path: str
    is_min: bool = False
    base: int = 0
    # (child, count): a SUM node's required children (count copies each), a MIN node's alternatives.
    children: list[tuple[int, int]] = field(default_factory=list)
    # Every subschema an instance may contain (optional ones too): what the recursion check walks.
    reaches: list[int] = field(default_factory=list)
    ref: str | None = None


class _Walk:
    """One pass over the schema's subschemas: the counting limits, then the minimal instance."""

    def __init__(self, root: Any, where: str, limits: SchemaLimits) -> None:
        self.root = root
        self.where = where
        self.limits = limits
        self.nodes: list[_Node] = []
        self.ids: dict[int, int] = {}  # id(subschema) -> node index, so a $ref target is one node
        self.pending: list[tuple[int, Any]] = []
        self.totals: dict[str, int] = {}  # of `_TOTALS`

    def run(self) -> None:
        root = self._node(self.root, self.where)
        while self.pending:
            index, schema = self.pending.pop()
            self._fill(index, schema)
        self._check_minimal_instance(root)

    # -- building the graph ------------------------------------------------------------------------------

    def _node(self, schema: Any, path: str) -> int:
        """The node of a subschema, made (and queued for filling) on first sight."""
        key = id(schema)
        if key in self.ids:
            return self.ids[key]
        index = len(self.nodes)
        self.nodes.append(_Node(path))
        self.ids[key] = index
        if isinstance(schema, dict):
            self.pending.append((index, schema))
        else:  # true: any value ("0"); false (nothing matches) and the rest are xgrammar's to refuse
            self.nodes[index].base = 1 if schema is True else 0
        return index

    def _fill(self, index: int, schema: dict[str, Any]) -> None:
        node = self.nodes[index]
        path = node.path
        for name in _MAP:
            members = schema.get(name)
            if isinstance(members, dict):
                for key, child in members.items():
                    member = self._node(child, _join(_join(path, name), key))
                    if name not in ("$defs", "definitions"):  # definitions are reached through $ref only
                        node.reaches.append(member)
        for name in _LIST:
            members = schema.get(name)
            if isinstance(members, list):
                for i, child in enumerate(members):
                    node.reaches.append(self._node(child, f"{_join(path, name)}[{i}]"))
        for name in (*_ONE, "items"):
            child = schema.get(name)
            if isinstance(child, (dict, bool)):
                node.reaches.append(self._node(child, _join(path, name)))
            elif name == "items" and isinstance(child, list):  # draft-4 tuple items
                for i, item in enumerate(child):
                    node.reaches.append(self._node(item, f"{_join(path, name)}[{i}]"))
        self._count(schema, path)
        ref = schema.get("$ref")
        if isinstance(ref, str):
            node.ref = ref
            target = self._resolve(ref)
            if target is not None:
                child = self._node(target, ref)
                node.is_min, node.children = True, [(child, 1)]
                node.reaches.append(child)
            return  # an unresolvable $ref is xgrammar's to refuse; siblings of $ref are not compiled
        if "const" in schema:
            node.base = _json_length(schema["const"])
            return
        enum = schema.get("enum")
        if isinstance(enum, list):
            node.base = min((_json_length(value) for value in enum), default=0)
            return
        self._fill_structure(node, schema)

    def _fill_structure(self, node: _Node, schema: dict[str, Any]) -> None:
        """A SUM node: the type's fixed text, plus anyOf / oneOf (one branch each) and allOf (every branch)."""
        declared = schema.get("type")
        types = declared if isinstance(declared, list) else [declared] if isinstance(declared, str) else []
        combined = any(isinstance(schema.get(name), list) for name in ("anyOf", "oneOf", "allOf"))
        if not types:
            types = [_inferred_type(schema)] if not combined else []
        shapes = [self._shape(schema, kind, node.path) for kind in types]
        if len(shapes) == 1:
            node.base, node.children = shapes[0]
        elif shapes:  # a list of types: the cheapest
            node.children.append(
                (self._min_node([self._sum_node(*shape, node.path) for shape in shapes], node.path), 1)
            )
        for name in ("anyOf", "oneOf"):
            branches = schema.get(name)
            if isinstance(branches, list) and branches:
                alternatives = [self.ids[id(branch)] for branch in branches]
                node.children.append((self._min_node(alternatives, node.path), 1))
        branches = schema.get("allOf")
        if isinstance(branches, list):
            node.children.extend((self.ids[id(branch)], 1) for branch in branches)

    def _shape(self, schema: dict[str, Any], kind: Any, path: str) -> tuple[int, list[tuple[int, int]]]:
        """(fixed bytes, required children) of a value of type `kind` under `schema`."""
        if kind == "object":
            required = schema.get("required")
            keys = (
                list(dict.fromkeys(k for k in required if isinstance(k, str)))
                if isinstance(required, list)
                else []
            )
            declared = schema.get("properties")
            properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
            fallback = schema.get("additionalProperties")
            base = 2 + max(0, 2 * (len(keys) - 1))  # {} and the ", " between members
            children = []
            for key in keys:
                base += _json_length(key) + 2  # "key": (the value is the child)
                child = properties.get(key, fallback if isinstance(fallback, dict) else True)
                children.append((self._node(child, _join(_join(path, "properties"), key)), 1))
            return base, children
        if kind == "array":
            minimum = _count_value(schema.get("minItems"))
            prefix = schema.get("prefixItems")
            items = schema.get("items")
            if isinstance(items, list):  # draft-4 tuple items
                prefix, items = items, schema.get("additionalItems", True)
            prefix = prefix if isinstance(prefix, list) else []
            base = 2 + max(0, 2 * (minimum - 1))
            children = [(self.ids[id(item)], 1) for item in prefix[:minimum]]
            rest = minimum - len(prefix)
            if rest > 0:
                item_schema = items if isinstance(items, (dict, bool)) else True
                children.append((self._node(item_schema, _join(path, "items")), rest))
            return base, children
        if kind == "string":
            pattern = schema.get("pattern")
            return 2 + (_pattern_min_width(pattern) if isinstance(pattern, str) else 0), []
        return _FIXED_WIDTH.get(kind, 1) if isinstance(kind, str) else 1, []

    def _sum_node(self, base: int, children: list[tuple[int, int]], path: str) -> int:
        self.nodes.append(_Node(path, base=base, children=children))
        return len(self.nodes) - 1

    def _min_node(self, alternatives: list[int], path: str) -> int:
        self.nodes.append(_Node(path, is_min=True, children=[(a, 1) for a in alternatives]))
        return len(self.nodes) - 1

    def _resolve(self, ref: str) -> Any:
        """The subschema a local `$ref` (`#`, `#/$defs/name`, any JSON pointer into the root) names."""
        if not ref.startswith("#"):
            return None
        target = self.root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        return target

    # -- the counting limits -----------------------------------------------------------------------------

    def _count(self, schema: dict[str, Any], path: str) -> None:
        limits = self.limits
        path = _shown(path)
        properties = schema.get("properties")
        required = schema.get("required")
        names = set(properties) if isinstance(properties, dict) else set()
        if isinstance(required, list):
            names |= {key for key in required if isinstance(key, str)}
        count = len(names)
        if count > limits.max_object_properties:
            raise self._over(
                f"{path} has {count} properties; the worker compiles objects of at most "
                f"{limits.max_object_properties} (the compile cost grows with the square of an object's "
                "properties): split the object"
            )
        self._tally("properties", count, path)
        counted = [name for name in ("minProperties", "maxProperties") if name in schema]
        if counted and count > limits.max_counted_properties:
            raise self._over(
                f"{path} sets {counted[0]} on an object of {count} properties; the worker compiles "
                f"{counted[0]} only on objects of at most {limits.max_counted_properties} properties: drop "
                f"{counted[0]}, or mark the properties required"
            )
        self._tally("literal characters", sum(len(name) for name in names), path)
        enum = schema.get("enum")
        if isinstance(enum, list):
            if len(enum) > limits.max_enum_values:
                raise self._over(
                    f"{_join(path, 'enum')} has {len(enum)} values; the worker compiles enums of at most "
                    f"{limits.max_enum_values}: use a string with a pattern, or split the choice"
                )
            self._tally("literal characters", sum(_json_length(value) for value in enum), path)
        if "const" in schema:
            self._tally("literal characters", _json_length(schema["const"]), path)
        patterns = [(schema.get("pattern"), _join(path, "pattern"))]
        keyed = schema.get("patternProperties")
        if isinstance(keyed, dict):
            patterns += [(key, _join(path, "patternProperties")) for key in keyed]
        for pattern, where in patterns:
            if isinstance(pattern, str):
                self._check_pattern(pattern, where)
        if isinstance(schema.get("format"), str):
            self._tally("patterns and formats", 1, _join(path, "format"))
        if any(name in schema for name in _NUMBER_BOUNDS):
            self._tally("bounded numbers", 1, path)

    def _check_pattern(self, pattern: str, path: str) -> None:
        limits = self.limits
        self._tally("patterns and formats", 1, path)
        if len(pattern) > limits.max_pattern_chars:
            raise self._over(
                f"{path} is {len(pattern)} characters long; the worker compiles patterns of at most "
                f"{limits.max_pattern_chars}"
            )
        self._tally("literal characters", len(pattern), path)
        for match in _REPEAT.finditer(pattern):
            count = max(int(match.group(1)), int(match.group(2) or 0))
            if count > limits.max_pattern_repeat:
                raise self._over(
                    f"{path} repeats {match.group(0)} times; the worker compiles repetition counts of at most "
                    f"{limits.max_pattern_repeat} (use + or * for an unbounded repetition)"
                )
            self._tally("pattern repetitions", count, path)

    def _tally(self, what: str, amount: int, path: str) -> None:
        """Count `amount` more of a whole-schema total (`_TOTALS`); refuse once it is over its limit."""
        total = self.totals.get(what, 0) + amount
        self.totals[what] = total
        limit = getattr(self.limits, _TOTALS[what][0])
        if total > limit:
            raise self._over(
                f"{self.where} has more than {limit} {what} in all (at {path}): {_TOTALS[what][1]}; the worker "
                "compiles schemas of at most that many"
            )

    def _over(self, message: str) -> RenderError:
        return _refuse(message, self.where)

    # -- the minimal instance ----------------------------------------------------------------------------

    def _check_minimal_instance(self, root: int) -> None:
        """Knuth's generalization of Dijkstra's algorithm: the least fixed point of SUM / MIN over the graph.

        A node's value is final when popped (SUM values are at least any child's, so the heap pops them in
        order); nodes never popped have no finite instance (a recursion every instance must take).
        """
        nodes = self.nodes
        parents: list[list[tuple[int, int]]] = [[] for _ in nodes]
        waiting = [0] * len(nodes)  # a SUM node's distinct children not yet final
        total = [node.base for node in nodes]
        for index, node in enumerate(nodes):
            children: dict[int, int] = {}
            for child, count in node.children:
                if count > 0:
                    children[child] = children.get(child, 0) + count
            for child, count in children.items():
                parents[child].append((index, count))
            waiting[index] = len(children)
        final: list[int | None] = [None] * len(nodes)
        heap = [(node.base, i) for i, node in enumerate(nodes) if not node.is_min and not waiting[i]]
        heapq.heapify(heap)
        pushed = [False] * len(nodes)
        for _, i in heap:
            pushed[i] = True
        while heap:
            value, index = heapq.heappop(heap)
            if final[index] is not None:
                continue
            final[index] = value
            for parent, count in parents[index]:
                if nodes[parent].is_min:
                    if not pushed[parent]:
                        pushed[parent] = True
                        heapq.heappush(heap, (value, parent))
                    continue
                total[parent] += count * value
                waiting[parent] -= 1
                if not waiting[parent]:
                    pushed[parent] = True
                    heapq.heappush(heap, (total[parent], parent))
        endless = self._first_endless(root, final)
        if endless is not None:
            node = nodes[endless]
            raise self._over(
                f"{_shown(node.path)} ($ref {json.dumps(node.ref)}) contains itself in every match: no finite JSON "
                "matches it (a recursion through required properties, minItems or allOf); make the recursive "
                "part optional"
            )
        # Every reachable subschema, not only the root: once the model enters an optional one, the grammar
        # forces that one's fixed text.
        limit = self.limits.max_minimal_instance_bytes
        for index in self._breadth_first(root):
            size = final[index]
            if size is not None and size > limit:
                raise self._over(
                    f"the shortest JSON {_shown(nodes[index].path)} allows has about {size} bytes of fixed text "
                    "(required keys, const and enum values, minItems copies, pattern text); the worker compiles "
                    f"schemas whose every part's shortest instance has at most {limit}: lower minItems or make "
                    "parts optional"
                )

    def _first_endless(self, root: int, final: list[int | None]) -> int | None:
        """The shallowest subschema an instance can reach that has no finite instance, preferring a $ref
        (the recursion's own spelling); None when every reachable one has a finite instance."""
        endless: int | None = None
        for index in self._breadth_first(root):
            if final[index] is None:
                if self.nodes[index].ref is not None:
                    return index
                endless = index if endless is None else endless
        return endless

    def _breadth_first(self, root: int) -> Iterator[int]:
        """The nodes an instance can reach from `root` (optional subschemas too), shallowest first."""
        seen = {root}
        queue = [root]
        for index in queue:  # grows while it is walked
            yield index
            node = self.nodes[index]
            for child in [*node.reaches, *(child for child, _ in node.children)]:
                if child not in seen:
                    seen.add(child)
                    queue.append(child)


def _inferred_type(schema: dict[str, Any]) -> str:
    """The type an untyped schema describes, from its keywords (as xgrammar infers it); "any" otherwise."""
    for kind, hints in (("object", _OBJECT_HINTS), ("array", _ARRAY_HINTS), ("string", _STRING_HINTS)):
        if any(hint in schema for hint in hints):
            return kind
    return "any"


def _count_value(value: Any) -> int:
    """A schema's count keyword (minItems) as a count: 0 unless a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _pattern_min_width(pattern: str) -> int:
    """The length of the shortest text `pattern` matches (an estimate when Python cannot parse it)."""
    try:
        return int(_regex_parser.parse(pattern).getwidth()[0])
    except Exception:  # ECMA-only syntax (\\p{L}, ...): every repetition count taken once
        counts = [max(int(m.group(1)), int(m.group(2) or 0)) for m in _REPEAT.finditer(pattern)]
        return len(pattern) * max([1, *counts])

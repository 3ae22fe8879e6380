"""Grammar-constrained decoding for a named ``tool_choice`` (docs/contract.md §7), on xgrammar.

When a request names the function to call, the worker renders the prompt, appends the tool-call parser's
``forced_call_prefix(name)`` (hermes: ``<tool_call>\\n{"name": "get_weather", "arguments": ``) and lets the
model write only the arguments object, constrained to that tool's ``parameters`` JSON schema. The engine
consults the constraint at every step (``TokenConstraint`` in engine.py) and ends the sequence with finish
reason "stop" as soon as ``is_finished()``; the worker then parses ``prefix + generated + suffix`` with the
tool-call parser. Even a random-weight model returns a call that parses and matches the schema.

How the grammar ends. The root is always a JSON object and the grammar has no free whitespace, so once the
root's closing ``}`` is accepted nothing but a stop token could follow: ``is_finished()`` turns true right
then and the engine stops without sampling a stop token (none is emitted, no EOS text reaches the output).
Before that point stop tokens are masked off, so the model cannot end inside the JSON. Special tokens
(``<|im_start|>``, ...) are never allowed: inside a JSON string they would be valid text to xgrammar.

What bounds the length. Compact JSON (fixed ``", "`` / ``": "`` separators, no optional whitespace) keeps a
weak model from emitting endless spaces or newlines. But a string, number or array the schema leaves
unbounded is unbounded in the grammar too, and a weak model happily writes one forever. Given the
sequence's token budget (``json_schema(schema, max_tokens=...)``, the request's max_tokens), the constraint
closes the JSON in time: it keeps a shortest-way-to-finish plan (``"`` to end a string, ``}`` / ``]`` to end
containers, required keys and enum values as the grammar forces them) and, once the budget left is about
the plan's length, allows only tokens that follow the plan. Without a budget the engine's ``max_tokens``
is the only bound: a sequence cut off there ends with finish reason "length" and its arguments are
incomplete JSON (the worker reports no call).

What bounds the compile. The schema is a client's: before xgrammar sees it, ``schema_limits.check_schema``
refuses what would cost the compiler (or the closing plan) without bound — depth, size, properties, enum
values, patterns, a recursion every instance must take — with a 400 ``schema_limit``. The worker compiles
with ``compile_off_loop``: the check in a thread, the compile on this object's one compile thread (so
concurrent requests do not multiply its memory), the whole within ``SchemaLimits.compile_seconds`` (past
it a 400 ``grammar_compile_timeout``, and the grammar, when it comes, is discarded). A compiled grammar over
``max_grammar_bytes`` is refused too; the cache keeps at most ``max_cached_grammar_bytes`` of them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import xgrammar as xgr

from tokenfront.core.checkpoint import transformers_tokenizer
from tokenfront.core.errors import RenderError
from tokenfront.worker.schema_limits import SCHEMA_LIMIT_CODE, SCHEMA_LIMITS, SchemaLimits, check_schema

__all__ = ["COMPILE_TIMEOUT_CODE", "GuidedDecoding", "JsonSchemaConstraint"]

COMPILE_TIMEOUT_CODE = "grammar_compile_timeout"

# As json.dumps writes them, and as the forced-call prefix (``{"name": "f", "arguments": ``) and the chat
# templates' ``tojson`` write tool calls: the model continues in the style it was shown. Fixed separators
# and any_whitespace=False leave no whitespace to the model's choice outside strings.
_SEPARATORS = (", ", ": ")

# Compiled grammars kept per GuidedDecoding: tool schemas repeat across requests, but a client could send
# a new one each time, so the cache is a bounded LRU.
_DEFAULT_CACHE_SIZE = 128

# xgrammar's C++ errors start with a log header ("[07:29:01] /project/cpp/json_schema_converter.cc:5082: ").
_XGR_LOG_HEADER = re.compile(r"^\s*\[[0-9:.]+\]\s+\S+:\d+:\s*")

# Closing the JSON within a token budget (see the module docstring).
# Tokens of headroom: forcing starts once the budget left is within this many tokens of the plan, since
# the model's next free token can still lengthen the plan (open a string, an object...).
_CLOSE_SLACK = 8
# The plan is recomputed every step once the budget left is within this many tokens of its last length,
# and otherwise every _REPLAN_EVERY tokens (it costs well under a millisecond for ordinary schemas).
_REPLAN_WINDOW = 24
_REPLAN_EVERY = 16
# Longest plan worth computing, in bytes: past this the budget cannot be met anyway.
_PLAN_LIMIT = 2048
# Longest token used to spell a plan: plans are short structural text ('", "unit": "c"}'), and checking
# every longer token at every offset would cost more than it saves.
_CLOSING_TOKEN_BYTES = 16
# Which single byte to try first when the grammar forces nothing: inside a string, the closing quote;
# elsewhere, whatever closes a container, then "," (rather than lengthen a number), then the shortest
# values ("" 0 [] {} null false true). Never a control character (see _control_free_tokens).
_STRING_ORDER = b'"' + bytes(range(0x61, 0x7B)) + bytes(range(0x30, 0x3A)) + bytes(range(0x41, 0x5B)) + b" "
_VALUE_ORDER = b'}],"0123456789[{nft-.eE+'
_ALL_BYTES = bytes(range(0x20, 0x100))


def _xgrammar_message(error: Exception) -> str:
    """xgrammar's error message without its C++ log header, on one line."""
    text = _XGR_LOG_HEADER.sub("", str(error)).strip()
    return " ".join(text.split()) or type(error).__name__


def _object_schema(schema: Any) -> dict[str, Any]:
    """The schema to compile: always one describing a JSON object (tool arguments are an object).

    ``None``, ``{}`` and ``true`` mean any object. A schema without ``type`` gets ``"type": "object"``: an
    untyped schema would otherwise let the root be any JSON value. An explicit non-object type is refused.
    """
    if schema is None or schema is True:
        return {"type": "object"}
    if not isinstance(schema, dict):
        raise RenderError(
            f"the function's parameters must be a JSON Schema object, got {type(schema).__name__}",
            code="invalid_json_schema",
        )
    declared = schema.get("type")
    if declared is None or (isinstance(declared, list) and "object" in declared):
        return {**schema, "type": "object"}
    if declared != "object":
        raise RenderError(
            f'the function\'s parameters must describe a JSON object ("type": "object"), got "type": '
            f"{json.dumps(declared)}",
            code="invalid_json_schema",
        )
    return schema


def _scan_json(data: bytes, in_string: bool, escaped: bool) -> tuple[bool, bool]:
    """Advance a JSON lexer over ``data``: whether it ends inside a string, and right after a backslash."""
    for byte in data:
        if escaped:
            escaped = False
        elif in_string and byte == 0x5C:  # backslash
            escaped = True
        elif byte == 0x22:  # double quote
            in_string = not in_string
    return in_string, escaped


def _set_bits(words: torch.Tensor, token_ids: list[int]) -> None:
    """Set the bits of ``token_ids`` in int32 bitmask ``words`` (1-D)."""
    by_word: dict[int, int] = {}
    for token_id in token_ids:
        word, bit = divmod(token_id, 32)
        by_word[word] = by_word.get(word, 0) | (1 << bit)
    for word, bits in by_word.items():
        value = (int(words[word]) | bits) & 0xFFFFFFFF
        # Back to int32's signed range.
        words[word] = value - (1 << 32) if value >= 1 << 31 else value


class _Vocabulary:
    """What the closing logic needs to know about the tokens, built once per GuidedDecoding."""

    def __init__(self, decoded: list[bytes], excluded: set[int], vocab_size: int) -> None:
        self.token_bytes = decoded
        self.by_bytes: dict[bytes, list[int]] = {}
        self.byte_token: list[int | None] = [None] * 256
        lengths: list[set[int]] = [set() for _ in range(256)]
        for token_id, data in enumerate(decoded[:vocab_size]):
            if not data or token_id in excluded:
                continue
            self.by_bytes.setdefault(data, []).append(token_id)
            if len(data) == 1 and self.byte_token[data[0]] is None:
                self.byte_token[data[0]] = token_id
            if len(data) <= _CLOSING_TOKEN_BYTES:
                lengths[data[0]].add(len(data))
        # The lengths of the tokens starting with each byte: spelling a plan tries only those.
        self.lengths_from = [tuple(sorted(found)) for found in lengths]

    def tokens_needed(self, text: bytes) -> list[int]:
        """For each offset into ``text``, the fewest tokens that spell the rest of it (a large number if
        none do). Tokens longer than _CLOSING_TOKEN_BYTES are left out, so it may overestimate a little."""
        needed = [1 << 30] * len(text) + [0]
        for start in range(len(text) - 1, -1, -1):
            best = needed[start]
            for length in self.lengths_from[text[start]]:
                end = start + length
                if end > len(text):
                    break
                if 1 + needed[end] < best and text[start:end] in self.by_bytes:
                    best = 1 + needed[end]
            needed[start] = best
        return needed


class JsonSchemaConstraint:
    """One sequence's grammar state: the output must be one JSON object matching a compiled schema.

    Implements the engine's ``TokenConstraint``. Not thread-safe: one sequence, driven by one engine loop.
    """

    def __init__(
        self,
        compiled: xgr.CompiledGrammar,
        vocab_size: int,
        ordinary_tokens: torch.Tensor,
        stop_tokens: torch.Tensor,
        control_free: torch.Tensor,
        vocabulary: _Vocabulary,
        max_tokens: int | None,
    ) -> None:
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.tokens_accepted = 0
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        # Bitmask words: every id below vocab_size that is not a stop token; the stop tokens.
        self._ordinary_tokens = ordinary_tokens
        self._stop_tokens = stop_tokens
        self._control_free = control_free
        self._vocabulary = vocabulary
        # The bitmask is for the matcher's current state; accept() makes it stale. is_finished() and
        # mask_logits() both need it for the same state, so it is filled once per step.
        self._mask_fresh = False
        # Lexer state of the output so far, for the closing plan's choices.
        self._in_string = False
        self._escaped = False
        # Closing: the planned rest of the output once forcing started (None before), the length of the
        # last plan computed (-1: none found), and when it was computed (so that the first step plans).
        self._closing_plan: bytes | None = None
        self._plan_length = -1
        self._planned_at = -_REPLAN_EVERY

    def _fill(self) -> torch.Tensor:
        if not self._mask_fresh:
            self._matcher.fill_next_token_bitmask(self._bitmask)
            self._bitmask &= self._control_free
            self._mask_fresh = True
        return self._bitmask

    def mask_logits(self, logits: torch.Tensor) -> None:
        """Set the logits of tokens the grammar forbids next to -inf, in place.

        ``logits`` is a 1-D float tensor (float32, bfloat16 or float16) of the model's full width,
        ``vocab_size``: padded rows past the tokenizer's vocabulary are always masked.
        """
        if logits.dim() != 1 or logits.shape[0] != self.vocab_size:
            raise ValueError(
                f"expected 1-D logits of width {self.vocab_size}, got shape {tuple(logits.shape)}"
            )
        bitmask = self._fill()
        if self.max_tokens is not None:
            bitmask = self._closing_mask(bitmask)
        if logits.device.type == "cpu":
            if logits.is_contiguous():
                xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size)
            else:
                # xgrammar's CPU kernel assumes unit stride along the vocabulary.
                dense = logits.contiguous()
                xgr.apply_token_bitmask_inplace(dense, bitmask, vocab_size=self.vocab_size)
                logits.copy_(dense)
        else:
            # The plain torch kernel works on any device without triton or a CUDA build of xgrammar.
            xgr.apply_token_bitmask_inplace(
                logits,
                bitmask.to(logits.device, non_blocking=True),
                vocab_size=self.vocab_size,
                backend="torch_native",
            )

    def accept(self, token_id: int) -> None:
        """Advance past the chosen token. Raises RuntimeError if the grammar forbids it here.

        That only happens when the engine chose a token without applying ``mask_logits`` (or after
        ``is_finished()``): the sequence can no longer match the schema, so it is an engine bug.
        """
        token_id = int(token_id)
        if not self._matcher.accept_token(token_id):
            state = "after the grammar finished" if self._matcher.is_terminated() else "at this point"
            raise RuntimeError(
                f"token {token_id} is not allowed by the JSON schema grammar {state} (after "
                f"{self.tokens_accepted} accepted tokens): the engine must apply mask_logits before choosing"
            )
        self.tokens_accepted += 1
        self._mask_fresh = False
        data = self._vocabulary.token_bytes[token_id] if token_id < len(self._vocabulary.token_bytes) else b""
        self._in_string, self._escaped = _scan_json(data, self._in_string, self._escaped)
        if self._closing_plan is not None:
            # Forcing allows only tokens the plan starts with, so the plan just moves on.
            plan = self._closing_plan
            self._closing_plan = plan[len(data) :] if data and plan.startswith(data) else None

    def is_finished(self) -> bool:
        """Whether the JSON object is complete: nothing but a stop token could follow.

        True as soon as the root object closes (the stop token itself is never needed), or once a stop
        token was accepted.
        """
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        # Complete, but might the grammar go on (only for roots that are not a closed object)? Finished
        # when the next mask allows no ordinary token, only stop tokens.
        return not bool(torch.any(self._fill()[0] & self._ordinary_tokens))

    # -- closing the JSON within the token budget ------------------------------------------------------

    def _closing_mask(self, grammar_mask: torch.Tensor) -> torch.Tensor:
        """The grammar mask, narrowed to the closing plan's tokens once the budget left requires it."""
        assert self.max_tokens is not None
        left = self.max_tokens - self.tokens_accepted
        if self._closing_plan is None:
            near = self._plan_length >= 0 and left <= self._plan_length + _REPLAN_WINDOW
            if near or self.tokens_accepted - self._planned_at >= _REPLAN_EVERY:
                plan = self._plan()
                self._planned_at = self.tokens_accepted
                self._plan_length = -1 if plan is None else self._vocabulary.tokens_needed(plan)[0]
                if plan is not None and left <= self._plan_length + _CLOSE_SLACK:
                    self._closing_plan = plan
        if self._closing_plan is None:
            return grammar_mask
        plan = self._closing_plan
        if not plan:
            # Complete, yet the grammar could go on (a root that is not a closed object): end it here.
            narrowed = grammar_mask & self._stop_tokens.unsqueeze(0)
        else:
            # Any token the plan starts with, if the rest of the plan still fits the budget after it (the
            # model keeps its choice of tokenization); when nothing fits, those of a shortest tokenization.
            needed = self._vocabulary.tokens_needed(plan)
            fits = max(left, needed[0])
            allowed: list[int] = []
            for length in self._vocabulary.lengths_from[plan[0]]:
                if length <= len(plan) and 1 + needed[length] <= fits:
                    allowed.extend(self._vocabulary.by_bytes.get(plan[:length], ()))
            words = torch.zeros_like(grammar_mask[0])
            _set_bits(words, allowed)
            narrowed = grammar_mask & words.unsqueeze(0)
        if not bool(torch.any(narrowed)):
            # Cannot happen for a plan the grammar accepted; never leave the model with no token at all.
            self._closing_plan = None
            return grammar_mask
        return narrowed

    def _plan(self) -> bytes | None:
        """A short text that completes the JSON from here, or None if none was found within the limit.

        Greedy, on a fork of the matcher: take what the grammar forces (required keys, the rest of an enum
        value); otherwise the first single-byte token the grammar accepts, in an order that closes strings
        and containers first. Not always the shortest, always valid.
        """
        matcher = self._matcher.fork()
        in_string, escaped = self._in_string, self._escaped
        byte_token = self._vocabulary.byte_token
        plan = bytearray()
        while not matcher.is_completed():
            if len(plan) > _PLAN_LIMIT:
                return None
            forced = matcher.find_jump_forward_string().encode()
            if forced and matcher.accept_string(forced):
                chosen = forced
            else:
                for byte in (_STRING_ORDER if in_string else _VALUE_ORDER) + _ALL_BYTES:
                    token_id = byte_token[byte]
                    if token_id is not None and matcher.accept_token(token_id):
                        chosen = bytes((byte,))
                        break
                else:
                    return None
            plan += chosen
            in_string, escaped = _scan_json(chosen, in_string, escaped)
        return bytes(plan)


class GuidedDecoding:
    """Builds grammar constraints for one model's tokenizer: made once per worker, shared by requests.

    Thread-safe: ``compile`` and ``json_schema`` may be called from any thread (an ordinary schema compiles in
    milliseconds to tens of milliseconds on a cache miss); the worker's requests use ``compile_off_loop``.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        *,
        cache_size: int = _DEFAULT_CACHE_SIZE,
        limits: SchemaLimits = SCHEMA_LIMITS,
    ) -> None:
        """``tokenizer`` is the model's tokenizer (transformers' object is read: `transformers_tokenizer`);
        ``vocab_size`` its logits width.

        ``vocab_size`` (config.vocab_size) may exceed ``len(tokenizer)``: the padded ids are never allowed.
        Building the vocabulary index is the slow part (about 1 s for 49k tokens, 2 s for 150k: once per worker).
        ``limits`` bound every schema and its compile (schema_limits.py).
        """
        self.vocab_size = vocab_size
        self.limits = limits
        tokenizer = transformers_tokenizer(tokenizer)
        detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.stop_token_ids: tuple[int, ...] = tuple(detected.stop_token_ids)
        # xgrammar treats a special token like <|im_start|> as its literal text, valid inside a JSON
        # string. Rebuilt with those entries empty, xgrammar never allows them (as for padded ids).
        # The stop tokens stay: xgrammar knows them by id and allows them once the JSON is complete.
        special = self._special_token_ids(tokenizer) - set(self.stop_token_ids)
        encoded = [""] * vocab_size
        for token, token_id in tokenizer.get_vocab().items():
            if token_id < vocab_size and token_id not in special:
                encoded[token_id] = token
        self._info = xgr.TokenizerInfo(
            encoded,
            detected.vocab_type,
            vocab_size=vocab_size,
            stop_token_ids=list(self.stop_token_ids),
            add_prefix_space=detected.add_prefix_space,
        )
        # xgrammar's own compile cache is unbounded; ours (below) is bounded and counts compilations.
        self._compiler = xgr.GrammarCompiler(
            self._info, max_threads=max(1, min(8, os.cpu_count() or 1)), cache_enabled=False
        )
        # Keyed by the schema's digest (a schema may carry megabytes of descriptions), bounded in entries and
        # in the grammars' bytes.
        self._cache: OrderedDict[bytes, xgr.CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._cache_bytes = 0
        self._lock = threading.Lock()
        # One compile at a time: what a compile holds at its peak is then the worker's, not times the clients.
        self._compile_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenfront-grammar")
        self.compilations = 0
        excluded = special | set(self._info.special_token_ids) | set(self.stop_token_ids)
        self._vocabulary = _Vocabulary(self._info.decoded_vocab, excluded, vocab_size)
        self._stop_tokens = torch.zeros_like(xgr.allocate_token_bitmask(1, vocab_size)[0])
        _set_bits(self._stop_tokens, [i for i in self.stop_token_ids if 0 <= i < vocab_size])
        self._ordinary_tokens = self._valid_token_words() & ~self._stop_tokens
        self._control_free = self._control_free_tokens(self._info.decoded_vocab)

    @staticmethod
    def _special_token_ids(tokenizer: Any) -> set[int]:
        ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
        for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(added, "special", False):
                ids.add(int(token_id))
        return ids

    def _control_free_tokens(self, decoded: list[bytes]) -> torch.Tensor:
        """Bitmask words with the bit of every token set except those holding a control character.

        Compact JSON never contains one (no newlines or tabs between tokens; inside strings they must be
        escaped), yet xgrammar lets a string with minLength/maxLength hold raw ones, which json.loads
        (and so the tool-call parser) rejects. Masking them for every state keeps the output parseable.
        """
        words = xgr.allocate_token_bitmask(1, self.vocab_size)[0]
        control = bytes(range(0x20))
        banned = [
            i
            for i, data in enumerate(decoded[: self.vocab_size])
            if data and data != data.translate(None, control)
        ]
        cleared = torch.zeros_like(words)
        _set_bits(cleared, banned)
        return words & ~cleared

    def _valid_token_words(self) -> torch.Tensor:
        """Bitmask words with the bit of every id below vocab_size set (not the bits past it)."""
        words = xgr.allocate_token_bitmask(1, self.vocab_size)[0]
        tail = self.vocab_size % 32
        if tail:
            words[-1] = (1 << tail) - 1
        return words

    def json_schema(
        self, schema: dict[str, Any] | None, *, max_tokens: int | None = None, where: str = "parameters"
    ) -> JsonSchemaConstraint:
        """A fresh constraint for one sequence: one JSON object matching ``schema`` (None or {}: any object).

        The output is compact JSON with ``", "`` and ``": "`` separators, properties in the schema's order,
        no properties the schema does not declare (unless it allows them). ``max_tokens``, the sequence's
        token budget, makes the constraint close the JSON before the budget runs out (best effort: a
        budget smaller than the shortest valid object cannot be met). An invalid or unsupported schema
        raises ``RenderError`` (a 400) naming the problem; one over the limits, naming the limit and its path
        from ``where`` (the field that holds the schema). Compiles on the calling thread.
        """
        return self.constraint(self.compile(schema, where=where), max_tokens=max_tokens)

    def constraint(
        self, compiled: xgr.CompiledGrammar, *, max_tokens: int | None = None
    ) -> JsonSchemaConstraint:
        """A fresh constraint for one sequence on a grammar from ``compile`` or ``compile_off_loop``."""
        return JsonSchemaConstraint(
            compiled,
            self.vocab_size,
            self._ordinary_tokens,
            self._stop_tokens,
            self._control_free,
            self._vocabulary,
            max_tokens,
        )

    @property
    def cached_grammars(self) -> int:
        """How many compiled grammars the cache holds."""
        with self._lock:
            return len(self._cache)

    def wait_for_compiles(self) -> None:
        """Return once every compile queued so far has ended (one past its budget included)."""
        self._compile_thread.submit(lambda: None).result()

    def compile(self, schema: Any, *, where: str = "parameters") -> xgr.CompiledGrammar:
        """The compiled grammar of ``schema``, checked, from the cache or compiled on the calling thread.

        The compile budget holds here too: a grammar that took longer than ``limits.compile_seconds`` is
        discarded and refused (the calling thread waited for it: ``compile_off_loop`` does not).
        """
        key, text = self._checked(schema, where)
        compiled = self._cached(key)
        return compiled if compiled is not None else self._compile(key, text, where, time.monotonic())

    async def compile_off_loop(self, schema: Any, *, where: str = "parameters") -> xgr.CompiledGrammar:
        """``compile`` without blocking the event loop: the check in a thread, the compile on the compile
        thread, both within ``limits.compile_seconds`` (a 400 ``grammar_compile_timeout`` past it)."""
        started = time.monotonic()
        key, text = await asyncio.to_thread(self._checked, schema, where)
        compiled = self._cached(key)
        if compiled is not None:
            return compiled
        budget = self.limits.compile_seconds
        job = self._compile_thread.submit(self._compile, key, text, where, started)
        try:
            # On time-out the job is cancelled if it has not started; a running compile cannot be stopped, and
            # `_compile` discards its grammar when it ends past the budget.
            return await asyncio.wait_for(
                asyncio.wrap_future(job), max(0.0, budget - (time.monotonic() - started))
            )
        except asyncio.TimeoutError:
            raise self._over_time(where) from None

    def _checked(self, schema: Any, where: str) -> tuple[bytes, str]:
        """The schema as the compiler gets it (a JSON text) and its cache key, after the limits' check."""
        normalized = _object_schema(schema)
        check_schema(normalized, where, self.limits)
        try:
            # Keys keep their order: property order is the order the grammar generates them in, so two
            # schemas that differ only in order are different grammars.
            text = json.dumps(normalized, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise RenderError(
                f"the function's parameters are not a JSON Schema: {error}", code="invalid_json_schema"
            ) from None
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest(), text

    def _cached(self, key: bytes) -> xgr.CompiledGrammar | None:
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
            return compiled

    def _compile(self, key: bytes, text: str, where: str, started: float) -> xgr.CompiledGrammar:
        """Compile (a cache miss), refuse what is over the time or memory budget, keep the rest."""
        try:
            compiled = self._compiler.compile_json_schema(
                text, any_whitespace=False, separators=_SEPARATORS, strict_mode=True
            )
        except (RuntimeError, ValueError) as error:
            raise RenderError(
                f"invalid JSON schema for the function's parameters: {_xgrammar_message(error)}",
                code="invalid_json_schema",
            ) from None
        if time.monotonic() - started > self.limits.compile_seconds:
            raise self._over_time(where)  # the request already had its 400 (or has it now): not cached
        size = int(compiled.memory_size_bytes)
        if size > self.limits.max_grammar_bytes:
            raise RenderError(
                f"the grammar of {where} takes {size} bytes; the worker keeps grammars of at most "
                f"{self.limits.max_grammar_bytes}: simplify the schema",
                param=where,
                code=SCHEMA_LIMIT_CODE,
            )
        with self._lock:
            # Two threads missing on one schema both compile; the second result replaces the first.
            self.compilations += 1
            previous = self._cache.pop(key, None)
            if previous is not None:
                self._cache_bytes -= int(previous.memory_size_bytes)
            self._cache[key] = compiled
            self._cache_bytes += size
            while len(self._cache) > self._cache_size or (
                self._cache_bytes > self.limits.max_cached_grammar_bytes and len(self._cache) > 1
            ):
                _, evicted = self._cache.popitem(last=False)
                self._cache_bytes -= int(evicted.memory_size_bytes)
        return compiled

    def _over_time(self, where: str) -> RenderError:
        return RenderError(
            f"compiling the grammar of {where} took more than {self.limits.compile_seconds:g} s (the worker's "
            "compile budget; it compiles one schema at a time): simplify the schema, or retry later",
            param=where,
            code=COMPILE_TIMEOUT_CODE,
        )

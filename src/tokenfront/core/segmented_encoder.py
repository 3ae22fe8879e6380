"""The incremental segment encoder: a growing conversation costs its new text.

`SegmentedEncoder` (over a tokenizer backend; `tokenization.backend_for` puts it over `tokenizers`) cuts a prompt
at added tokens where `tokenizers` provably encodes each side on its own, and keeps the ids of the pieces in a
bounded cache; `segment_plan` says where one tokenizer may be cut, `incremental` puts the layer over a backend
once it has checked itself against whole-text encoding.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import unicodedata
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import add
from typing import TYPE_CHECKING, Any

from tokenfront.core.tokenizer_files import has_rust_model, splits_special_tokens

if TYPE_CHECKING:
    from tokenfront.core.tokenization import TokenizerBackend

__all__ = [
    "INCREMENTAL_CACHE_BYTES",
    "INCREMENTAL_MIN_CHARS",
    "SegmentPlan",
    "SegmentedEncoder",
    "incremental",
    "segment_plan",
    "split_clean_tokens",
]

log = logging.getLogger(__name__)

INCREMENTAL_CACHE_BYTES = 64 * 1024 * 1024  # SegmentedEncoder's cache of segment text -> ids
# Below this many characters a prompt is encoded whole: cutting and looking up costs more than it saves.
INCREMENTAL_MIN_CHARS = 512

# -- where a prompt may be cut -------------------------------------------------------------------------------
#
# `tokenizers` encodes a text in this order (tokenizer/mod.rs, added_vocabulary.rs):
#   1. AddedVocabulary, first pass: an Aho-Corasick scan (leftmost-longest) of the raw text for the added
#      tokens with `normalized: false`. Each match is dropped when it is a special token and
#      `encode_special_tokens` (split_special_tokens) is on, or when `single_word` and a word character
#      touches it; `lstrip` widens it left over whitespace, but never before the previous split's end;
#      `rstrip` widens it right over whitespace, with no limit.
#   2. Each piece between those splits is normalized on its own, then scanned for the `normalized: true`
#      tokens, then pre-tokenized (Metaspace `prepend_scheme: "first"` looks at whether a piece starts at
#      offset 0 of the input) and run through the model word by word.
#   3. The post-processor adds BOS/EOS/CLS/SEP around the whole (add_special_tokens=True).
# So if a text is cut just before an occurrence of an added token T that step 1 keeps, exactly as
# matched, the ids are the ids of the two sides, each encoded on its own with its leading T, provided:
#   a. the occurrence is a match of the scan whatever comes before it: no added-token pattern can start
#      earlier and overlap it, and none starting at the same place is longer ("clean", checked for all
#      patterns at load time) -- then the scan of each side is the scan of the whole, restricted;
#   b. T has no lstrip/rstrip/single_word (its span would depend on its neighbours), is not special when
#      split_special_tokens is on (it would not split at all), and its content is not shared by another
#      added token;
#   c. if some kept token has `rstrip`, T does not start with whitespace (that token could absorb across the
#      cut); if some kept token has `single_word`, T does not start with a word character (a token ending
#      at the cut would see it). `lstrip` never reaches before the previous split, so it needs nothing;
#   d. each side keeps T at its start, so every piece but the first sits at a non-zero offset in both the
#      side and the whole (Metaspace "first"); the first side starts at offset 0 in both;
#   e. the model is deterministic (no BPE dropout) and the post-processor only adds ids around the whole,
#      which we add ourselves (and check against the backend at start-up).
# Pieces themselves are encoded by the backend; nothing else about the tokenizer needs to be known, but
# normalizers, pre-tokenizers and models outside the known list switch the layer off all the same.

_NORMALIZERS = frozenset(
    {
        "BertNormalizer",
        "Strip",
        "StripAccents",
        "NFC",
        "NFD",
        "NFKC",
        "NFKD",
        "Lowercase",
        "Nmt",
        "Precompiled",
        "Replace",
        "Prepend",
        "ByteLevel",
    }
)
_PRE_TOKENIZERS = frozenset(
    {
        "BertPreTokenizer",
        "ByteLevel",
        "CharDelimiterSplit",
        "Metaspace",
        "Whitespace",
        "WhitespaceSplit",
        "Split",
        "Punctuation",
        "Digits",
        "UnicodeScripts",
        "FixedLength",
    }
)
_MODELS = frozenset({"BPE", "WordPiece", "WordLevel", "Unigram"})
# Unicode categories with no character that Rust's `\w` (Alphabetic, M, Nd, Pc, Join_Control) matches.
_NON_WORD_CATEGORIES = frozenset(
    {"Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "Zs", "Zl", "Zp", "Cc"}
)


@dataclass(frozen=True)
class SegmentPlan:
    """Where one tokenizer's input may be cut so that ids(text) is the concatenation of ids(pieces).

    `cut_tokens`: added-token contents before whose occurrences a text may be cut (none: no cutting);
    `wrap`: the ids the post-processor puts before and after a text with add_special_tokens=True, or None
    when that is not known (texts with add_special_tokens=True are then encoded whole);
    `notes`: why the plan is narrower than it could be (logged at debug level).
    """

    cut_tokens: tuple[str, ...]
    wrap: tuple[tuple[int, ...], tuple[int, ...]] | None
    notes: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.cut_tokens)

    def cut_pattern(self) -> re.Pattern[str] | None:
        """A regex finding every cut token (they never overlap: see `_clean`)."""
        if not self.cut_tokens:
            return None
        return re.compile(_literal_trie(self.cut_tokens))


def _component_spec(component: Any) -> Any:
    if component is None:
        return None
    return json.loads(component.__getstate__())


def _unknown_types(spec: Any, known: frozenset[str], children: str) -> list[str]:
    if spec is None:
        return []
    kind = spec.get("type")
    if kind == "Sequence":
        return [t for child in spec.get(children) or [] for t in _unknown_types(child, known, children)]
    return [] if kind in known else [str(kind)]


def _maybe_space(char: str) -> bool:
    # Python's isspace covers Unicode White_Space (Rust's `\s`) and a few more: erring towards "space".
    return char.isspace() or char in "\u180e\u200b"


def _maybe_word_char(char: str) -> bool:
    return unicodedata.category(char) not in _NON_WORD_CATEGORIES


def split_clean_tokens(candidates: Iterable[str], patterns: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split candidates into those every occurrence of which the first-pass scan matches, whatever precedes
    it, and the rest: no pattern starts inside it or overlaps its start, and no longer pattern starts with it."""
    candidates = list(candidates)
    ordered = sorted(set(patterns))
    firsts = {c[0] for c in candidates}
    # Proper suffixes of every pattern that start with a candidate's first character.
    suffixes: dict[str, list[str]] = defaultdict(list)
    for pattern in ordered:
        for char in firsts:
            at = pattern.find(char, 1)
            while at != -1:
                suffixes[char].append(pattern[at:])
                at = pattern.find(char, at + 1)
    clean: list[str] = []
    unclean: list[str] = []
    for content in candidates:
        after = bisect_right(ordered, content)
        extended = after < len(ordered) and ordered[after].startswith(content)
        straddled = any(s.startswith(content) or content.startswith(s) for s in suffixes.get(content[0], ()))
        (unclean if extended or straddled else clean).append(content)
    return clean, unclean


def _post_processor_wrap(spec: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids a post-processor adds before and after a single sequence; None for kinds not known here."""
    if spec is None:
        return (), ()
    kind = spec.get("type")
    if kind == "ByteLevel":  # offsets only
        return (), ()
    if kind in ("RobertaProcessing", "BertProcessing"):
        return (int(spec["cls"][1]),), (int(spec["sep"][1]),)
    if kind == "TemplateProcessing":
        before: list[int] = []
        after: list[int] = []
        seen_sequence = False
        for item in spec.get("single") or []:
            if "Sequence" in item and item["Sequence"].get("id") == "A" and not seen_sequence:
                seen_sequence = True
            elif "SpecialToken" in item:
                ids = spec["special_tokens"][item["SpecialToken"]["id"]]["ids"]
                (after if seen_sequence else before).extend(int(i) for i in ids)
            else:
                return None
        return (tuple(before), tuple(after)) if seen_sequence else None
    if kind == "Sequence":  # each processor wraps what the previous one returned
        outer_before: tuple[int, ...] = ()
        outer_after: tuple[int, ...] = ()
        for processor in spec.get("processors") or []:
            wrap = _post_processor_wrap(processor)
            if wrap is None:
                return None
            outer_before, outer_after = wrap[0] + outer_before, outer_after + wrap[1]
        return outer_before, outer_after
    return None


def segment_plan(tokenizer: Any) -> SegmentPlan:
    """Decide, from the tokenizer transformers runs, where its input may be cut (see the notes above)."""
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is None or not has_rust_model(tokenizer):
        return SegmentPlan((), None, ("no Rust tokenizer (or a remote-code class): encoded whole",))
    model = type(rust.model).__name__
    if model not in _MODELS:
        return SegmentPlan((), None, (f"model {model} is not known here: encoded whole",))
    if model == "BPE" and getattr(rust.model, "dropout", None):
        return SegmentPlan((), None, ("BPE dropout makes ids random: encoded whole",))
    unknown = _unknown_types(_component_spec(rust.normalizer), _NORMALIZERS, "normalizers")
    unknown += _unknown_types(_component_spec(rust.pre_tokenizer), _PRE_TOKENIZERS, "pretokenizers")
    if unknown:
        return SegmentPlan((), None, (f"{', '.join(unknown)} not known here: encoded whole",))

    notes: list[str] = []
    split_special = splits_special_tokens(tokenizer)
    added = list(rust.get_added_tokens_decoder().values())
    first_pass = [token for token in added if token.content and not token.normalized]
    kept = [token for token in first_pass if not (split_special and token.special)]
    if split_special and len(kept) < len(first_pass):
        notes.append("split_special_tokens: special tokens are text, not cut points")
    shared = {content for content, n in Counter(t.content for t in first_pass).items() if n > 1}
    absorbs_right = any(token.rstrip for token in kept)
    word_bounded = any(token.single_word for token in kept)
    candidates = []
    for token in kept:
        content = token.content
        if token.lstrip or token.rstrip or token.single_word:
            notes.append(f"{content!r} has lstrip/rstrip/single_word: not a cut point")
        elif content in shared:
            notes.append(f"{content!r} is the content of several added tokens: not a cut point")
        elif absorbs_right and _maybe_space(content[0]):
            notes.append(f"{content!r} starts with whitespace an rstrip token may absorb: not a cut point")
        elif word_bounded and _maybe_word_char(content[0]):
            notes.append(
                f"{content!r} starts with a word character a single_word token sees: not a cut point"
            )
        else:
            candidates.append(content)
    cut_tokens, unclean = split_clean_tokens(candidates, [token.content for token in first_pass])
    if unclean:
        notes.append(f"{len(unclean)} added tokens overlap others (e.g. {unclean[0]!r}): not cut points")
    wrap = _post_processor_wrap(_component_spec(rust.post_processor))
    if wrap is None:
        notes.append("post-processor not known here: add_special_tokens=True texts are encoded whole")
    return SegmentPlan(tuple(sorted(cut_tokens)), wrap, tuple(notes))


def _literal_trie(words: Iterable[str]) -> str:
    """A regex alternation of literal words, as a trie (so a scan tries one branch per character, not one per
    word); the words must be prefix-free."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        if len(branches) == 1:
            return branches[0]
        return "(?:" + "|".join(branches) + ")"

    return build(root)


class SegmentedEncoder:
    """Incremental encoding over any backend: a prompt is cut before its safe added tokens (`segment_plan`),
    each segment's ids come from a cache of segment text -> ids, and only segments not seen before are
    encoded. The ids are the backend's for the whole text, cold or warm. Texts shorter than `min_chars`,
    texts without a cut point and texts whose post-processor ids are not known are encoded whole.

    The cache is an approximate LRU in two generations, within `cache_bytes` (text, id pointers and entry
    overhead, approximately): new segments go to the young one; when it reaches half the budget it becomes the
    old one and the previous old one is dropped; a segment found in the old one moves back to the young one.
    A hit costs one dict lookup done in C (no bookkeeping); cached ids share one int object per id (8 bytes
    each, none to build on reuse). Thread-safe: lookups read a dict, changes happen under a lock (the
    hit/miss counters are approximate under concurrency).
    """

    def __init__(
        self,
        backend: TokenizerBackend,
        tokenizer: Any,
        *,
        cache_bytes: int = INCREMENTAL_CACHE_BYTES,
        min_chars: int = INCREMENTAL_MIN_CHARS,
        plan: SegmentPlan | None = None,
    ) -> None:
        self.backend = backend
        self.name = backend.name
        self.cache_bytes = cache_bytes
        self.min_chars = min_chars
        self._vocab_size = len(tokenizer)
        self._ints: tuple[int, ...] | None = None  # one int object per id, shared by every cached segment
        self._lock = threading.Lock()
        self.plan = plan if plan is not None else segment_plan(tokenizer)
        self.clear()

    @property
    def plan(self) -> SegmentPlan:
        return self._plan

    @plan.setter
    def plan(self, plan: SegmentPlan) -> None:
        self._plan = plan
        pattern = plan.cut_pattern()
        # One capturing group: split() returns [head, token, text, token, text, ...], built in C.
        self._splitter = re.compile(f"({pattern.pattern})") if pattern is not None else None

    def clear(self) -> None:
        """Empty the cache and its counters."""
        with self._lock:
            self._young: dict[str, tuple[int, ...]] = {}
            self._old: dict[str, tuple[int, ...]] = {}
            self._young_bytes = 0
            self._old_bytes = 0
            self.hits = 0
            self.misses = 0
            self.whole = 0  # texts encoded whole (short, no cut point, or no known wrap)
            self.evictions = 0

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        splitter = self._splitter
        wrap = self._plan.wrap
        if splitter is None or len(text) < self.min_chars or (add_special_tokens and wrap is None):
            self.whole += 1
            return self.backend.encode(text, add_special_tokens=add_special_tokens)
        parts = splitter.split(text)
        if len(parts) == 1:
            self.whole += 1
            return self.backend.encode(text, add_special_tokens=add_special_tokens)
        # Each segment is a cut token and the text up to the next one; the head (maybe empty) has no token.
        segments = list(map(add, parts[1::2], parts[2::2]))
        if parts[0]:
            segments.insert(0, parts[0])
        found: list[tuple[int, ...] | None] = list(map(self._young.get, segments))
        if None in found:
            self._fill(segments, found)
        else:
            self.hits += len(segments)
        out: list[int] = list(wrap[0]) if add_special_tokens and wrap is not None else []
        for ids in found:
            out += ids  # type: ignore[arg-type]  # filled above; list += tuple is a bulk copy
        if add_special_tokens and wrap is not None:
            out += wrap[1]
        return out

    def _fill(self, segments: list[str], found: list[tuple[int, ...] | None]) -> None:
        misses = 0
        for index, segment in enumerate(segments):
            if found[index] is not None:
                continue
            with self._lock:
                ids = self._young.get(segment)  # stored meanwhile (a repeat within this text, another thread)
                if ids is None:
                    ids = self._old.pop(segment, None)
                    if ids is not None:  # seen before the last generation change: young again
                        self._old_bytes -= _entry_bytes(segment, ids)
                        self._store(segment, ids)
            if ids is None:
                misses += 1
                ids = self._encode_segment(segment)
            found[index] = ids
        self.hits += len(segments) - misses
        self.misses += misses

    def _encode_segment(self, segment: str) -> tuple[int, ...]:
        ids = self.backend.encode(segment, add_special_tokens=False)
        if self._ints is None:
            self._ints = tuple(range(self._vocab_size))
        try:  # 8 bytes per cached id instead of 36, and no int objects to build when a segment is reused
            shared = tuple(map(self._ints.__getitem__, ids))
        except IndexError:  # an id beyond the vocabulary size: keep the backend's own objects
            shared = tuple(ids)
        with self._lock:
            self._store(segment, shared)
        return shared

    def _store(self, segment: str, ids: tuple[int, ...]) -> None:
        # Called with the lock held.
        size = _entry_bytes(segment, ids)
        half = self.cache_bytes // 2
        if size > half or segment in self._young:
            return  # too big to keep (it would flush everything else), or another thread stored it
        if self._young_bytes + size > half:
            self.evictions += len(self._old)
            self._old, self._old_bytes = self._young, self._young_bytes
            self._young, self._young_bytes = {}, 0
        self._young[segment] = ids
        self._young_bytes += size

    def cache_info(self) -> dict[str, int]:
        """Counters and size of the segment cache."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "whole": self.whole,
                "evictions": self.evictions,
                "entries": len(self._young) + len(self._old),
                "bytes": self._young_bytes + self._old_bytes,
                "max_bytes": self.cache_bytes,
            }


def _entry_bytes(segment: str, ids: tuple[int, ...]) -> int:
    # The text, the tuple of shared int pointers, and the dict entry (approximately).
    return sys.getsizeof(segment) + sys.getsizeof(ids) + 100


def _plan_self_check(encoder: SegmentedEncoder, tokenizer: Any) -> str | None:
    """Cut a few texts built around the plan's cut tokens both ways; a difference means the plan is wrong for
    this tokenizer (it should not happen: the property tests prove the rule on every fixture)."""
    plan = encoder.plan
    special = set(map(str, getattr(tokenizer, "all_special_tokens", [])))
    sample = [token for token in plan.cut_tokens if token in special] or list(plan.cut_tokens)
    sample = sample[:4]
    filler = "Some text, 12 numbers\n  and  spaces \t"
    pieces = [f"{filler}{token} {filler}{token}\n" for token in sample]
    text = "".join(pieces) * max(1, encoder.min_chars // max(1, len("".join(pieces))) + 1)
    for add_special in (False, True):
        if encoder.encode(text, add_special_tokens=add_special) != encoder.backend.encode(
            text, add_special_tokens=add_special
        ):
            return f"add_special_tokens={add_special}"
    return None


def incremental(backend: TokenizerBackend, tokenizer: Any, **options: Any) -> TokenizerBackend:
    """`backend` under a `SegmentedEncoder` when the tokenizer allows cutting; else `backend` itself."""
    encoder = SegmentedEncoder(backend, tokenizer, **options)
    for note in encoder.plan.notes:
        log.debug("incremental tokenization: %s", note)
    if not encoder.plan.enabled:
        return backend
    if encoder.plan.wrap is not None:
        # The post-processor's ids, read from its spec, must be what the backend adds.
        for text in ("", "probe text", *encoder.plan.cut_tokens[:2]):
            plain = backend.encode(text, add_special_tokens=False)
            wrapped = backend.encode(text, add_special_tokens=True)
            if wrapped != [*encoder.plan.wrap[0], *plain, *encoder.plan.wrap[1]]:
                log.debug("incremental tokenization: post-processor ids not as read; whole texts for them")
                encoder.plan = SegmentPlan(encoder.plan.cut_tokens, None, encoder.plan.notes)
                break
    problem = _plan_self_check(encoder, tokenizer)
    if problem is not None:
        log.warning("incremental tokenization disagrees with whole-text encoding (%s); not used", problem)
        return backend
    encoder.clear()
    return encoder

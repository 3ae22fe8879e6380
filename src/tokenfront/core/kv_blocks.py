"""Prefix block hashes: how a prompt's KV cache is named, shared by the worker (what it stores) and the router
(what it looks up), so both compute the same names for the same ids.

A prompt is cut into full blocks of `tokens_per_block` ids. A block's hash is XXH3-64 of its ids (packed as
little-endian unsigned 32-bit integers) seeded with its parent's hash, so a hash names the whole prefix up to
that block. The first block's parent is the root hash, XXH3-64 of a fixed string with `cache_salt` mixed in,
so prompts with different salts never share blocks. The ids are packed once per prompt and each block is one
C call: a 32k-token prompt hashes in about 0.26-0.3 ms of CPU, half of it the packing (docs/benchmarks.md,
"KV index", measured on 8fdc511 with benchmarks/kv_decision.py).

Names are 64 bits, and so is the chain's state: two prefixes share a name only by a 64-bit collision, which
can misdirect a routing decision but never serve wrong KV (the worker's cache compares the ids it holds).
"""

from __future__ import annotations

import functools
import itertools
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence

import xxhash

__all__ = [
    "KV_CACHE_HASH",
    "block_hash_array",
    "block_hashes",
    "next_block_hash",
    "root_hash",
]

# Published as `kv_cache_hash` on /server_info: routers hash the same way only when the names match.
KV_CACHE_HASH = "xxh3-64-chained-v2"

_ROOT = b"tokenfront-kv-v2"
_MAX_HASH = (1 << 64) - 1
# array's unsigned typecodes have platform sizes: take the 32-bit one, and the 64-bit one for the names.
_U32 = next(code for code in "IL" if array(code).itemsize == 4)
_U64 = next(code for code in "LQ" if array(code).itemsize == 8)
_SWAP = sys.byteorder == "big"  # the packed ids are little-endian everywhere, so names agree across machines

_xxh3 = xxhash.xxh3_64_intdigest
_CHUNK_BLOCKS = 64  # blocks unpacked by one struct call (1,024 ids at 16 a block)


def root_hash(cache_salt: str | None) -> int:
    """The parent of a prompt's first block."""
    if cache_salt is None:
        return _xxh3(_ROOT)
    return _xxh3(_ROOT + b"|salt|" + cache_salt.encode("utf-8"))


def next_block_hash(parent: int, token_ids: Sequence[int]) -> int:
    """One step of the chain: a block's hash from its parent's hash and its own ids."""
    if not 0 <= parent <= _MAX_HASH:
        raise ValueError(f"a block hash is an unsigned 64-bit integer, got {parent!r}")
    return _xxh3(_pack(token_ids).tobytes(), parent)


def block_hashes(token_ids: Sequence[int], tokens_per_block: int, cache_salt: str | None = None) -> list[int]:
    """The chained hashes of every full block of `token_ids`, first block first."""
    if tokens_per_block < 1:
        raise ValueError("tokens_per_block must be at least 1")
    n_blocks = len(token_ids) // tokens_per_block
    if not n_blocks:
        return []
    # One pass packs the ids (the ones after the last full block too: cheaper than slicing them off), and
    # struct cuts the blocks in C; each block is then one XXH3 call in a comprehension, its result the next
    # block's seed (the walrus keeps the chain: ~45 ns a block where a loop with an append took ~60).
    parent = root_hash(cache_salt)
    return [
        parent := _xxh3(block, parent)
        for block in _blocks(memoryview(_pack(token_ids)).cast("B"), 4 * tokens_per_block, n_blocks)
    ]


def block_hash_array(token_ids: Sequence[int], tokens_per_block: int, cache_salt: str | None = None) -> array:
    """``block_hashes`` as an array of unsigned 64-bit integers (``numpy.frombuffer(..., numpy.uint64)`` reads
    it without a copy)."""
    return array(_U64, block_hashes(token_ids, tokens_per_block, cache_salt))


def _pack(token_ids: Iterable[int]) -> array:
    try:
        packed = array(_U32, token_ids)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token ids are integers from 0 to 2**32 - 1 ({exc})") from exc
    if _SWAP:
        packed.byteswap()
    return packed


def _blocks(packed: memoryview, block_bytes: int, n_blocks: int) -> Iterator[bytes]:
    """The first ``n_blocks`` blocks of ``block_bytes`` bytes of ``packed``, as bytes.

    Unpacked ``_CHUNK_BLOCKS`` at a time: one tuple of many blocks per struct call, where a tuple a block
    (``iter_unpack`` of one block's format) cost as much as the hashing. The chunk's format is compiled once
    per block size, the last chunk's once per size and count (both cached)."""
    whole = n_blocks - n_blocks % _CHUNK_BLOCKS
    chunks = _blocks_format(block_bytes, _CHUNK_BLOCKS).iter_unpack(packed[: whole * block_bytes])
    rest = _blocks_format(block_bytes, n_blocks - whole).unpack_from(packed, whole * block_bytes)
    return itertools.chain(itertools.chain.from_iterable(chunks), rest)


@functools.lru_cache(maxsize=256)
def _blocks_format(block_bytes: int, count: int) -> struct.Struct:
    return struct.Struct(f"{block_bytes}s" * count)

"""Prefix block hashes: how a prompt's KV cache is named, shared by the worker (what it stores) and the router
(what it looks up), so both compute the same names for the same ids.

A prompt is cut into full blocks of `tokens_per_block` ids. Each block's hash covers its parent's hash and its
own ids, so a hash names the whole prefix up to that block; `cache_salt` is mixed into the root, so prompts
with different salts never share blocks.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

# Published as `kv_cache_hash` on /server_info: routers hash the same way only when the names match.
KV_CACHE_HASH = "sha256-u64-chained-v1"

_ROOT = b"tokenfront-kv-v1"


def root_hash(cache_salt: str | None) -> bytes:
    """The parent of a prompt's first block."""
    if cache_salt is None:
        return hashlib.sha256(_ROOT).digest()
    return hashlib.sha256(_ROOT + b"|salt|" + cache_salt.encode("utf-8")).digest()


def block_digest(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """One step of the chain: the full digest of a block from its parent's full digest and its own ids."""
    return hashlib.sha256(parent + struct.pack(f"<{len(token_ids)}I", *token_ids)).digest()


def as_int(digest: bytes) -> int:
    """A block hash as it is published: the first 8 bytes, big-endian, as an unsigned integer."""
    return int.from_bytes(digest[:8], "big")


def block_hashes(token_ids: Sequence[int], tokens_per_block: int, cache_salt: str | None = None) -> list[int]:
    """The chained hashes of every full block of `token_ids`, first block first."""
    if tokens_per_block < 1:
        raise ValueError("tokens_per_block must be at least 1")
    hashes = []
    parent = root_hash(cache_salt)
    for start in range(0, len(token_ids) - tokens_per_block + 1, tokens_per_block):
        parent = block_digest(parent, token_ids[start : start + tokens_per_block])
        hashes.append(as_int(parent))
    return hashes

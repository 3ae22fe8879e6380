"""Prefix block hashes (`core.kv_blocks`): the scheme `kv_cache_hash` names, shared by workers and routers."""

from __future__ import annotations

import struct

import pytest
import xxhash

from tokenfront.core.kv_blocks import (
    KV_CACHE_HASH,
    block_hash_array,
    block_hashes,
    next_block_hash,
    root_hash,
)


def test_the_scheme_is_xxh3_chained_from_a_salted_root() -> None:
    """Written out by hand: what another implementation must compute to share tokenfront's names."""
    ids = [(7919 * i) % 151_000 for i in range(50)]  # 3 full blocks of 16 and 2 spare ids
    parent = xxhash.xxh3_64_intdigest(b"tokenfront-kv-v2")
    expected = []
    for start in range(0, 48, 16):
        parent = xxhash.xxh3_64_intdigest(struct.pack("<16I", *ids[start : start + 16]), seed=parent)
        expected.append(parent)
    assert KV_CACHE_HASH == "xxh3-64-chained-v2"
    assert block_hashes(ids, 16) == expected
    assert list(block_hash_array(ids, 16)) == expected
    salted_root = xxhash.xxh3_64_intdigest(b"tokenfront-kv-v2|salt|tenant-a")
    assert root_hash("tenant-a") == salted_root
    assert block_hashes(ids, 16, "tenant-a")[0] == xxhash.xxh3_64_intdigest(
        struct.pack("<16I", *ids[:16]), seed=salted_root
    )


def test_long_prompts_chain_every_block_whatever_the_block_size() -> None:
    """Blocks are cut many at a time: every length around those cuts names each block as the scheme does."""
    ids = [(104_729 * i + 13) % 151_000 for i in range(16 * 200 + 9)]
    for tokens_per_block in (1, 3, 16):
        for n_blocks in (1, 63, 64, 65, 128, 130, 200):
            prompt = ids[: (n_blocks + 1) * tokens_per_block - 1]  # and the ids of a block not full
            parent = xxhash.xxh3_64_intdigest(b"tokenfront-kv-v2|salt|t")
            expected = []
            for start in range(0, n_blocks * tokens_per_block, tokens_per_block):
                block = struct.pack(f"<{tokens_per_block}I", *prompt[start : start + tokens_per_block])
                parent = xxhash.xxh3_64_intdigest(block, seed=parent)
                expected.append(parent)
            assert block_hashes(prompt, tokens_per_block, "t") == expected, (tokens_per_block, n_blocks)


def test_one_step_continues_the_chain_from_a_name() -> None:
    ids = list(range(1000, 1040))
    hashes = block_hashes(ids, 8, "s")
    name = root_hash("s")
    for index, expected in enumerate(hashes):
        name = next_block_hash(name, ids[8 * index : 8 * (index + 1)])
        assert name == expected
    assert len(hashes) == 5


def test_names_depend_on_the_whole_prefix_the_salt_and_the_block_size() -> None:
    ids = list(range(64))
    base = block_hashes(ids, 16)
    changed = block_hashes([99, *ids[1:]], 16)
    assert all(
        a != b for a, b in zip(base, changed, strict=True)
    )  # a change in block 1 renames every later block
    assert block_hashes(ids, 16, "") != base != block_hashes(ids, 16, "x")
    assert block_hashes(ids[:32], 16) == base[:2]  # a prefix keeps its names
    assert set(block_hashes(ids, 8)).isdisjoint(base)
    assert block_hashes(ids[:15], 16) == [] and block_hashes([], 4) == []


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="tokens_per_block"):
        block_hashes([1, 2], 0)
    for bad in ([-1, 2], [2**32, 2], [1.5, 2]):
        with pytest.raises(ValueError, match="token ids"):
            block_hashes(bad, 2)
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        next_block_hash(-1, [1])

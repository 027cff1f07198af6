"""compute_block_hashes and matched_prefix_tokens: pure behaviour (no vLLM import)."""

from __future__ import annotations

import hashlib
import pickle
import random

import pytest

from agentkv import ConfigError, compute_block_hashes, matched_prefix_tokens
from agentkv.prefix._blockhash import DEFAULT_NONE_HASH_SEED, cbor_bytes, none_hash
from tests.support.requires import require_module


def test_only_full_blocks_are_hashed() -> None:
    assert compute_block_hashes(list(range(15)), 16) == []
    assert len(compute_block_hashes(list(range(16)), 16)) == 1
    assert len(compute_block_hashes(list(range(47)), 16)) == 2


def test_first_block_matches_the_documented_formula() -> None:
    tokens = list(range(100, 116))
    parent = hashlib.sha256(pickle.dumps(DEFAULT_NONE_HASH_SEED, protocol=5)).digest()
    expected = hashlib.sha256(pickle.dumps((parent, tuple(tokens), None), protocol=5)).digest()
    assert compute_block_hashes(tokens, 16) == [expected]
    assert none_hash() == parent


def test_chain_depends_on_every_earlier_token() -> None:
    a = list(range(64))
    b = [*a[:5], 999, *a[6:]]
    ha, hb = compute_block_hashes(a, 16), compute_block_hashes(b, 16)
    assert all(x != y for x, y in zip(ha, hb, strict=True))


def test_cache_salt_changes_every_hash_but_only_enters_the_first_block() -> None:
    tokens = list(range(64))
    plain = compute_block_hashes(tokens, 16)
    salted = compute_block_hashes(tokens, 16, cache_salt="tenant-a")
    other = compute_block_hashes(tokens, 16, cache_salt="tenant-b")
    assert len({*plain, *salted, *other}) == 12  # chained: all differ
    # the second block's key carries no salt, only the (salted) parent
    second = hashlib.sha256(
        pickle.dumps((salted[0], tuple(tokens[16:32]), None), protocol=5)
    ).digest()
    assert salted[1] == second
    assert compute_block_hashes(tokens, 16, cache_salt="") == plain  # empty = no salt


def test_lora_key_enters_every_block() -> None:
    tokens = list(range(32))
    hashes = compute_block_hashes(tokens, 16, lora=("adapter", "/path"))
    key = (("lora", "adapter", "/path"),)
    first = hashlib.sha256(pickle.dumps((none_hash(), tuple(tokens[:16]), key), protocol=5))
    second = hashlib.sha256(pickle.dumps((first.digest(), tuple(tokens[16:]), key), protocol=5))
    assert hashes == [first.digest(), second.digest()]


def test_hash_seed_replaces_the_default_seed() -> None:
    tokens = list(range(16))
    assert compute_block_hashes(tokens, 16, hash_seed="42") != compute_block_hashes(tokens, 16)
    assert compute_block_hashes(tokens, 16, hash_seed=DEFAULT_NONE_HASH_SEED) == (
        compute_block_hashes(tokens, 16)
    )


def test_cbor_encoder_matches_cbor2_canonical() -> None:
    cbor2 = require_module("cbor2")
    rng = random.Random(7)
    samples = [
        None,
        True,
        False,
        0,
        23,
        24,
        255,
        256,
        65535,
        65536,
        2**32 - 1,
        2**32,
        2**64 - 1,
        -1,
        -24,
        -25,
        -(2**64),
        "",
        "héllo",
        "x" * 300,
        b"",
        b"\x00" * 70000,
        (b"\x01" * 32, tuple(rng.randrange(0, 2**20) for _ in range(128)), None),
        (b"p", (1, 2), (("lora", "a", "b"), ("cache_salt", "s"))),
        [1, [2, [3]]],
    ]
    for sample in samples:
        assert cbor_bytes(sample) == cbor2.dumps(sample, canonical=True), sample


def test_sha256_cbor_differs_from_sha256() -> None:
    tokens = list(range(32))
    assert compute_block_hashes(tokens, 16, algo="sha256_cbor") != compute_block_hashes(tokens, 16)


def test_bad_arguments_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="block_size"):
        compute_block_hashes([1, 2], 0)
    with pytest.raises(ConfigError, match="unknown block-hash algo"):
        compute_block_hashes([1, 2], 1, algo="md5")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="PYTHONHASHSEED"):
        compute_block_hashes([1, 2], 1, algo="xxhash")
    with pytest.raises(ConfigError, match="block_size"):
        matched_prefix_tokens([1], [1], -1)


def test_xxhash_needs_its_package_or_works() -> None:
    try:
        import xxhash  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="pip install xxhash"):
            compute_block_hashes([1, 2], 1, algo="xxhash", hash_seed="0")
    else:
        assert len(compute_block_hashes([1, 2], 1, algo="xxhash", hash_seed="0")) == 2


# --- matched_prefix_tokens -------------------------------------------------------------------


def test_matched_prefix_counts_whole_blocks() -> None:
    prev = list(range(100))
    new = [*prev[:40], -1, *prev[41:], 7, 8]
    assert matched_prefix_tokens(prev, new, 16) == 32  # diverges inside the 3rd block


def test_matched_prefix_is_capped_at_len_new_minus_one() -> None:
    prompt = list(range(64))
    # resending the identical prompt: the last token is recomputed, so the last block misses
    assert matched_prefix_tokens(prompt, prompt, 16) == 48
    assert matched_prefix_tokens(prompt, [*prompt, 1], 16) == 64
    assert matched_prefix_tokens(prompt, prompt[:16], 16) == 0


def test_matched_prefix_limited_by_previous_length() -> None:
    assert matched_prefix_tokens(list(range(20)), list(range(100)), 16) == 16
    assert matched_prefix_tokens([], list(range(100)), 16) == 0


def test_matched_prefix_equals_block_hash_comparison_on_random_inputs() -> None:
    rng = random.Random(3)
    for _ in range(200):
        block = rng.choice([1, 4, 16])
        prev = [rng.randrange(5) for _ in range(rng.randrange(0, 80))]
        cut = rng.randrange(0, len(prev) + 1)
        new = prev[:cut] + [rng.randrange(5) for _ in range(rng.randrange(0, 40))]
        hp = compute_block_hashes(prev, block)
        max_blocks = max(len(new) - 1, 0) // block
        hn = compute_block_hashes(new, block)[:max_blocks]
        hits = 0
        for a, b in zip(hp, hn, strict=False):
            if a != b:
                break
            hits += 1
        assert matched_prefix_tokens(prev, new, block) == hits * block

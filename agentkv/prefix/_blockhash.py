"""Client-side prefix-cache block hashes, byte-identical to vLLM 0.32.

vLLM's automatic prefix caching splits a request's tokens into fixed-size blocks and
names each *full* block by a chained hash::

    hash[0] = H((NONE_HASH, tuple(tokens[0:B]), extra_keys[0]))
    hash[i] = H((hash[i-1], tuple(tokens[i*B:(i+1)*B]), extra_keys[i]))

where ``NONE_HASH = H(seed)``, the seed being the fixed string ``"vllm-none-hash"``
unless the server process has ``PYTHONHASHSEED`` set (then that string). ``extra_keys``
is ``None`` for a plain text request; a LoRA request adds ``("lora", name, path)`` to
every block, and ``cache_salt`` adds ``("cache_salt", salt)`` to the first block only.
``H`` is ``sha256(pickle.dumps(x, protocol=5))`` for ``algo="sha256"`` (vLLM's default),
``sha256(canonical CBOR(x))`` for ``"sha256_cbor"``, and xxh3-128 over the same bytes for
the ``xxhash`` variants. This module recomputes that chain without importing vLLM, so a
client can tell how many tokens of a prompt the server can serve from cache.

A lookup stops at the first block whose hash is missing, and vLLM always recomputes the
last prompt token (it needs its logits), so at most ``len(prompt) - 1`` tokens — rounded
down to whole blocks — can be a hit: :func:`matched_prefix_tokens` applies that cap.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any, Literal

from agentkv._errors import ConfigError

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "HashAlgo",
    "cbor_bytes",
    "compute_block_hashes",
    "matched_prefix_tokens",
    "none_hash",
]

HashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]

#: The seed vLLM 0.32 derives the first block's parent hash from (cryptographic algos).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

_PICKLE_PROTOCOL = 5  # pickle.HIGHEST_PROTOCOL on Python 3.8+; what vLLM uses


def _pickle_bytes(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)


def cbor_bytes(obj: Any) -> bytes:
    """Encode ``obj`` as canonical CBOR (RFC 8949 §4.2.1, as cbor2's ``canonical=True``).

    Only the types that appear in block-hash keys are supported: None, bool, int, str,
    bytes, tuple and list.
    """
    out = bytearray()
    _cbor_encode(obj, out)
    return bytes(out)


def _cbor_head(major: int, value: int, out: bytearray) -> None:
    if value < 24:
        out.append((major << 5) | value)
    elif value < 0x100:
        out.append((major << 5) | 24)
        out.append(value)
    elif value < 0x10000:
        out.append((major << 5) | 25)
        out += struct.pack(">H", value)
    elif value < 0x100000000:
        out.append((major << 5) | 26)
        out += struct.pack(">I", value)
    else:
        out.append((major << 5) | 27)
        out += struct.pack(">Q", value)


def _cbor_encode(obj: Any, out: bytearray) -> None:
    if obj is None:
        out.append(0xF6)
    elif obj is True:
        out.append(0xF5)
    elif obj is False:
        out.append(0xF4)
    elif isinstance(obj, int):
        if obj >= 0:
            if obj >= 2**64:
                raise ConfigError(f"integer {obj} is too large for the CBOR block-hash encoder")
            _cbor_head(0, obj, out)
        else:
            if -obj - 1 >= 2**64:
                raise ConfigError(f"integer {obj} is too small for the CBOR block-hash encoder")
            _cbor_head(1, -obj - 1, out)
    elif isinstance(obj, (bytes, bytearray)):
        _cbor_head(2, len(obj), out)
        out += obj
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        _cbor_head(3, len(data), out)
        out += data
    elif isinstance(obj, (tuple, list)):
        _cbor_head(4, len(obj), out)
        for item in obj:
            _cbor_encode(item, out)
    else:
        raise ConfigError(f"a {type(obj).__name__} cannot appear in a block-hash key")


def _xxhash_digest(data: bytes) -> bytes:
    try:
        import xxhash
    except ImportError as exc:
        raise ConfigError(
            "algo='xxhash*' needs the xxhash package: pip install xxhash "
            "(or use the server's default algo, 'sha256')"
        ) from exc
    digest: bytes = xxhash.xxh3_128_digest(data)
    return digest


def _hash_fn(algo: str) -> Callable[[Any], bytes]:
    if algo == "sha256":
        return lambda obj: hashlib.sha256(_pickle_bytes(obj)).digest()
    if algo == "sha256_cbor":
        return lambda obj: hashlib.sha256(cbor_bytes(obj)).digest()
    if algo == "xxhash":
        return lambda obj: _xxhash_digest(_pickle_bytes(obj))
    if algo == "xxhash_cbor":
        return lambda obj: _xxhash_digest(cbor_bytes(obj))
    raise ConfigError(
        f"unknown block-hash algo {algo!r}; use one of sha256, sha256_cbor, xxhash, "
        "xxhash_cbor (the server's --prefix-caching-hash-algo)"
    )


def none_hash(algo: HashAlgo = "sha256", *, hash_seed: str | None = None) -> bytes:
    """Return vLLM's ``NONE_HASH``: the parent hash of every prefix's first block.

    ``hash_seed`` is the server's ``PYTHONHASHSEED`` if it sets one; otherwise leave it
    ``None`` (the fixed ``"vllm-none-hash"`` seed). The xxhash algorithms use a random
    per-process seed unless the server sets ``PYTHONHASHSEED``, so they need it here.
    """
    if hash_seed is None:
        if algo.startswith("xxhash"):
            raise ConfigError(
                f"algo={algo!r} seeds its hashes randomly per server process unless the "
                "server sets PYTHONHASHSEED; pass hash_seed=<the server's PYTHONHASHSEED>"
            )
        hash_seed = DEFAULT_NONE_HASH_SEED
    return _hash_fn(algo)(hash_seed)


def compute_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    cache_salt: str | None = None,
    algo: HashAlgo = "sha256",
    lora: tuple[str, str] | None = None,
    hash_seed: str | None = None,
) -> list[bytes]:
    """Return the chained prefix-cache hashes of the full blocks of ``token_ids``.

    The bytes equal what vLLM 0.32 stores in ``request.block_hashes`` for a text prompt
    with the same tokens, block size, ``cache_salt`` and hash algorithm (the server's
    ``--prefix-caching-hash-algo``, default ``sha256``). A trailing partial block has no
    hash. ``lora`` is ``(lora_name, lora_path)`` for a request served through a LoRA
    adapter. ``hash_seed`` is the server's ``PYTHONHASHSEED`` if it sets one.

    Raises:
        ConfigError: ``block_size`` is not positive, ``algo`` is unknown, or an xxhash
            algorithm is asked for without its package or without ``hash_seed``.
    """
    if not isinstance(block_size, int) or block_size <= 0:
        raise ConfigError(f"block_size must be a positive int (tokens), got {block_size!r}")
    hash_fn = _hash_fn(algo)
    parent = none_hash(algo, hash_seed=hash_seed)
    lora_keys: list[tuple[str, str, str]] = [("lora", lora[0], lora[1])] if lora else []
    plain_extra: tuple[Any, ...] | None = tuple(lora_keys) if lora_keys else None
    tokens = token_ids if isinstance(token_ids, tuple) else tuple(token_ids)  # slices are tuples
    num_full_tokens = len(tokens) - len(tokens) % block_size
    if num_full_tokens == 0:
        return []
    first_extra = (*lora_keys, ("cache_salt", cache_salt)) if cache_salt else plain_extra
    parent = hash_fn((parent, tokens[:block_size], first_extra))
    hashes = [parent]
    if algo == "sha256":  # the server default: the same calls as hash_fn, inlined
        sha256, dumps = hashlib.sha256, pickle.dumps
        for start in range(block_size, num_full_tokens, block_size):
            parent = sha256(
                dumps((parent, tokens[start : start + block_size], plain_extra), 5)
            ).digest()
            hashes.append(parent)
        return hashes
    for start in range(block_size, num_full_tokens, block_size):
        parent = hash_fn((parent, tokens[start : start + block_size], plain_extra))
        hashes.append(parent)
    return hashes


def matched_prefix_tokens(prev_ids: Sequence[int], new_ids: Sequence[int], block_size: int) -> int:
    """Return how many tokens of ``new_ids`` vLLM can serve from ``prev_ids``' cache.

    ``prev_ids`` are the tokens whose full blocks are cached (a previous prompt, plus its
    output if the server cached that too); ``new_ids`` is the next prompt, sent with the
    same model, ``cache_salt`` and adapter. The answer counts whole matching blocks and is
    capped as vLLM caps it: the last prompt token is always recomputed, so it is at most
    ``len(new_ids) - 1`` rounded down to a multiple of ``block_size``. Because each block's
    hash covers every token before it, this equals comparing the two chains of
    :func:`compute_block_hashes` block by block.

    Raises:
        ConfigError: ``block_size`` is not a positive int.
    """
    if not isinstance(block_size, int) or block_size <= 0:
        raise ConfigError(f"block_size must be a positive int (tokens), got {block_size!r}")
    limit = min(len(prev_ids), len(new_ids) - 1)
    if limit < block_size:
        return 0
    prev = prev_ids if isinstance(prev_ids, list) else list(prev_ids)
    new = new_ids if isinstance(new_ids, list) else list(new_ids)
    common = 0
    while common + block_size <= limit:  # whole blocks only; slices compare at C speed
        end = common + block_size
        if prev[common:end] != new[common:end]:
            break
        common = end
    return common

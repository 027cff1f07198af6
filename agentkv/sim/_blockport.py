"""The simulator's pool behind the residency controller's :class:`BlockPort`.

Block hashes are the simulator's integer content keys as 8 little-endian bytes (what the
engine hands the book), so the controller sees the same shape of data as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentkv.sim._pool import BlockPool

__all__ = ["SimBlockPort", "hash_of", "key_of"]


def hash_of(key: int) -> bytes:
    """The block hash the book keeps for content key ``key``."""
    return key.to_bytes(8, "little")


def key_of(block_hash: bytes) -> int:
    """The content key of a block hash from :func:`hash_of`."""
    return int.from_bytes(block_hash, "little")


class SimBlockPort:
    """:class:`~agentkv.residency.BlockPort` over a simulator pool (one KV-cache group)."""

    blocks_per_hash = 1

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool

    def reload_s_per_block(self) -> float | None:
        """Seconds to load one block back from the lower tier (None: no tier)."""
        tier = self.pool.lower_tier
        if tier is None or tier.bandwidth_bytes_per_s <= 0:
            return None
        return tier.block_bytes / tier.bandwidth_bytes_per_s

    def tier_holds(self, hashes: Sequence[bytes]) -> int:
        """How many leading hashes of ``hashes`` the lower tier holds (0 without one)."""
        keys = [key_of(h) for h in hashes]
        return self.pool.match_lower(keys, 0, len(keys))

    def num_free(self) -> int:
        """Blocks the pool can hand out now."""
        return self.pool.num_free

    def cached_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest cached prefix of ``hashes``."""
        keys = [key_of(h) for h in hashes]
        return self.pool.lookup(keys, len(keys))

    def take(self, blocks: list[int]) -> None:
        """One more reference on each block."""
        self.pool.take(blocks)

    def free(self, blocks: list[int]) -> None:
        """Drop one reference on each block, deepest first."""
        self.pool.free_blocks(blocks[::-1])

    def demote(self, hashes: Sequence[bytes]) -> int:
        """Move the free cached blocks of ``hashes`` (deepest first) to the eviction head."""
        cached, pool = self.pool.cached, self.pool
        blocks = [b for h in reversed(hashes) if (b := cached.get(key_of(h))) is not None]
        moved = sum(1 for b in blocks if pool.refcount(b) == 0)
        pool.demote(blocks)
        return moved

    def offload(self, hashes: Sequence[bytes]) -> None:
        """Write the blocks' content keys to the lower tier now (most recent last)."""
        tier = self.pool.lower_tier
        if tier is not None:
            for h in hashes:
                tier.store(key_of(h))

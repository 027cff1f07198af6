"""vLLM's block pool behind the residency controller's :class:`BlockPort`.

The one place that touches vLLM's ``BlockPool`` for residency: cached-block lookups
(``get_cached_block``, no side effects), references (``touch`` takes one and pulls a
cached block out of the free queue; ``free_blocks`` drops one and appends it there),
and the free queue itself for demotion (``remove``, ``prepend_n``). vLLM 0.32 and 0.33
share these calls; a version that moves them changes this module only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["VllmBlockPort"]


class VllmBlockPort:
    """:class:`~agentkv.residency.BlockPort` over a vLLM ``BlockPool``, for the
    KV-cache groups ``group_ids`` (every hash stands for one block in each)."""

    def __init__(self, pool: Any, group_ids: Sequence[int]) -> None:
        self.pool = pool
        self.group_ids = list(group_ids)
        self.blocks_per_hash = max(1, len(self.group_ids))

    def num_free(self) -> int:
        """Blocks the pool can hand out now (cached free blocks included)."""
        return int(self.pool.get_num_free_blocks())

    def cached_prefix(self, hashes: Sequence[bytes]) -> list[Any]:
        """Blocks still cached for the longest prefix of ``hashes`` (all groups)."""
        out: list[Any] = []
        for h in hashes:
            got = self.pool.get_cached_block(h, self.group_ids)
            if not got:
                break
            out.extend(got)
        return out

    def cached_count(self, hashes: Sequence[Any], start: int = 0) -> int:
        """Length of the longest cached prefix of ``hashes`` (in every group), walking
        from ``start`` (the caller knows the first ``start`` are cached)."""
        pool, groups = self.pool, self.group_ids
        n = start
        while n < len(hashes) and pool.get_cached_block(hashes[n], groups):
            n += 1
        return n

    def is_cached(self, block_hash: Any) -> bool:
        """Is ``block_hash`` cached in every group?"""
        return bool(self.pool.get_cached_block(block_hash, self.group_ids))

    def take(self, blocks: list[Any]) -> None:
        """One more reference on each block (cached free ones leave the free queue)."""
        self.pool.touch(blocks)

    def free(self, blocks: list[Any]) -> None:
        """Drop one reference on each block, deepest first (evicted first)."""
        self.pool.free_blocks(reversed(blocks))

    def demote(self, hashes: Sequence[bytes]) -> int:
        """Move the free cached blocks of ``hashes`` (deepest first) to the head of the
        free queue, in that order; returns how many moved."""
        queue = self.pool.free_block_queue
        demoted: list[Any] = []
        for h in hashes:
            for block in self.pool.get_cached_block(h, self.group_ids) or ():
                if block.ref_cnt == 0 and not block.is_null and block.prev_free_block is not None:
                    queue.remove(block)
                    demoted.append(block)
        if demoted:
            queue.prepend_n(demoted)
        return len(demoted)

    def offload(self, hashes: Sequence[bytes]) -> None:
        """Nothing to do: vLLM's offloading connector stores every computed block."""

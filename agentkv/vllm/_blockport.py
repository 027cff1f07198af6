"""vLLM's block pool behind the residency controller's :class:`BlockPort`.

The one place that touches vLLM's ``BlockPool`` for residency: cached-block lookups
(``get_cached_block``, no side effects), references (``touch`` takes one and pulls a
cached block out of the free queue; ``free_blocks`` drops one and appends it there),
and the free queue itself for demotion (``remove``, ``prepend_n``). vLLM 0.32 and 0.33
share these calls; a version that moves them changes this module only.

:class:`OffloadIndex` answers which blocks vLLM's native offloading connector already
stored in its CPU tier. The connector's scheduler side keeps an ``OffloadingManager``
(``connector.connector_scheduler.manager``) whose ``lookup(key, req_context)`` says
whether a chunk is stored (``HIT``), being stored (``HIT_PENDING``) or not (``MISS``);
a chunk is ``hashes_per_chunk`` blocks and its key is the chunk's last block hash
followed by the KV-cache group index as 4 big-endian bytes
(``vllm.v1.kv_offload.base.make_offload_key``). The CPU manager's lookup reads a dict
and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["OffloadIndex", "ShadowPort", "VllmBlockPort"]

#: Lookup results that mean the tier holds the chunk (or is writing it now).
_HELD = frozenset({"HIT", "HIT_PENDING"})


class OffloadIndex:
    """What vLLM's offloading connector stored, by block hash (see the module docstring).

    ``manager``: the connector's ``OffloadingManager``; ``hashes_per_chunk``: blocks per
    offloaded chunk; ``group_idx``: the KV-cache group whose keys are looked up.
    """

    def __init__(self, manager: Any, hashes_per_chunk: int, group_idx: int = 0) -> None:
        self.manager = manager
        self.hashes_per_chunk = max(1, int(hashes_per_chunk))
        self.suffix = int(group_idx).to_bytes(4, "big", signed=False)

    @classmethod
    def from_scheduler(cls, scheduler: Any) -> OffloadIndex | None:
        """The index of ``scheduler``'s offloading connector (None: it has none, or a
        connector this module does not know)."""
        connector = getattr(scheduler, "connector", None)
        candidates = [connector, *getattr(connector, "_connectors", ())]
        for c in candidates:
            side = getattr(c, "connector_scheduler", None)
            manager = getattr(side, "manager", None)
            groups = getattr(getattr(side, "config", None), "kv_group_configs", None)
            if manager is None or not callable(getattr(manager, "lookup", None)) or not groups:
                continue
            first = groups[0]
            return cls(
                manager,
                int(getattr(first, "hashes_per_chunk", 1)),
                int(getattr(first, "group_idx", 0)),
            )
        return None

    def held_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many leading hashes of ``hashes`` lie in chunks the tier holds (whole
        chunks only: a partial chunk is never stored)."""
        k = self.hashes_per_chunk
        held = 0
        for end in range(k - 1, len(hashes), k):
            result = self.manager.lookup(bytes(hashes[end]) + self.suffix, None)
            if getattr(result, "name", str(result)) not in _HELD:
                break
            held = end + 1
        return held


class VllmBlockPort:
    """:class:`~agentkv.residency.BlockPort` over a vLLM ``BlockPool``, for the
    KV-cache groups ``group_ids`` (every hash stands for one block in each)."""

    def __init__(
        self, pool: Any, group_ids: Sequence[int], offloaded: OffloadIndex | None = None
    ) -> None:
        self.pool = pool
        self.group_ids = list(group_ids)
        self.blocks_per_hash = max(1, len(self.group_ids))
        self.offloaded = offloaded
        self.reload_s: float | None = None  # learned from the connector's load counters

    def reload_s_per_block(self) -> float | None:
        """Seconds to load one block back from the CPU tier (None: not measured yet)."""
        return self.reload_s

    def tier_holds(self, hashes: Sequence[bytes]) -> int:
        """How many leading hashes of ``hashes`` the offloading connector stored."""
        return 0 if self.offloaded is None else self.offloaded.held_prefix(hashes)

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


class ShadowPort:
    """vLLM's block pool as the policy sees it in shadow mode: it reads the real pool
    (free blocks, cached prefixes, the tier) and changes nothing in it. A lease taken
    through it holds no reference, a free drops none, and a demotion moves no block (it
    returns how many free cached blocks it would have moved), so the engine behaves as
    stock vLLM while the policy's decisions are made and counted."""

    def __init__(self, port: VllmBlockPort) -> None:
        self.port = port

    @property
    def blocks_per_hash(self) -> int:
        """Blocks one hash stands for (KV-cache groups)."""
        return self.port.blocks_per_hash

    def reload_s_per_block(self) -> float | None:
        """The real port's reload cost."""
        return self.port.reload_s_per_block()

    def tier_holds(self, hashes: Sequence[bytes]) -> int:
        """How many leading hashes the lower tier holds (read from the real tier)."""
        return self.port.tier_holds(hashes)

    def num_free(self) -> int:
        """Free blocks of the real pool."""
        return self.port.num_free()

    def cached_prefix(self, hashes: Sequence[bytes]) -> list[Any]:
        """The real pool's cached blocks of the longest cached prefix of ``hashes``."""
        return self.port.cached_prefix(hashes)

    def take(self, blocks: list[Any]) -> None:
        """No reference is taken."""

    def free(self, blocks: list[Any]) -> None:
        """No reference is dropped (none was taken)."""

    def demote(self, hashes: Sequence[bytes]) -> int:
        """Moves nothing; returns how many free cached blocks a demotion would move."""
        pool = self.port.pool
        groups = self.port.group_ids
        return sum(
            1
            for h in hashes
            for block in pool.get_cached_block(h, groups) or ()
            if block.ref_cnt == 0 and not block.is_null
        )

    def offload(self, hashes: Sequence[bytes]) -> None:
        """Nothing to do."""

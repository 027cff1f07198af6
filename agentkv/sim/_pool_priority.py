"""The per-block pool behind priority-ordered eviction (the oracle and KVFlow policies).

It keeps the invariants of :mod:`agentkv.sim._pool_lru` block by block: ``ref[b]``
counts holders, a block whose count drops to 0 keeps its content key and joins the free
queue (unkeyed or duplicate-key blocks go to the empty stack), and the free queue evicts
the lowest priority first, ties in push order, so a chain freed deepest first loses its
deepest block first. Build it directly or as ``make_pool(n, priority_queue=True)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from agentkv.sim._pool_common import LowerTier, PrefixReads

__all__ = ["PriorityBlockPool", "PriorityFreeQueue"]


class PriorityFreeQueue:
    """A free queue that evicts the lowest priority first, ties in push order.

    Removal is lazy: an entry is stale once its block left the queue or was pushed again.
    """

    __slots__ = ("_gen", "_head_seq", "_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int]] = []
        self._gen: dict[int, int] = {}  # block -> seq of its live entry
        self._seq = 0
        self._head_seq = 0  # decreasing: the latest push_head is evicted first
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def push(self, block: int, priority: float = 0.0) -> None:
        """Queue ``block``; a lower ``priority`` is evicted sooner."""
        self._seq += 1
        if block not in self._gen:
            self._live += 1
        self._gen[block] = self._seq
        heapq.heappush(self._heap, (priority, self._seq, block))

    def push_head(self, block: int) -> None:
        """Queue ``block`` to be evicted before every other block."""
        self._head_seq -= 1
        if block not in self._gen:
            self._live += 1
        self._gen[block] = self._head_seq
        heapq.heappush(self._heap, (float("-inf"), self._head_seq, block))

    def remove(self, block: int) -> None:
        """Take ``block`` out of the queue."""
        del self._gen[block]
        self._live -= 1

    def pop(self) -> int:
        """Remove and return the block to evict next."""
        heap, gen = self._heap, self._gen
        while True:
            _, seq, block = heapq.heappop(heap)
            if gen.get(block) == seq:
                del gen[block]
                self._live -= 1
                return block


class PriorityBlockPool(PrefixReads):
    """A block pool whose free queue evicts by priority (see the module docstring)."""

    def __init__(self, num_blocks: int, *, lower_tier: LowerTier | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("a pool needs at least one block")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self.key: list[int] = [0] * num_blocks  # 0: no content key
        self.cached: dict[int, int] = {}  # content key -> block
        self.empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self.free = PriorityFreeQueue()
        self.lower_tier = lower_tier
        self.num_evictions = 0

    @property
    def ref(self) -> list[int]:
        """Each block's reference count (the live list)."""
        return self._ref

    def refcount(self, block: int) -> int:
        """How many requests or leases hold ``block``."""
        return self._ref[block]

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (empty plus evictable cached ones)."""
        return len(self.empty) + len(self.free)

    def take(self, blocks: list[int]) -> None:
        """Take a reference on ``blocks`` (cached or held ones)."""
        ref, free = self._ref, self.free
        for b in blocks:
            if ref[b] == 0:
                free.remove(b)
            ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """Hand out ``n`` blocks with ref 1, evicting the free queue's head; None if short."""
        if n <= 0:
            return []
        if len(self.empty) + len(self.free) < n:
            return None
        out: list[int] = []
        empty, free, key, cached, ref = self.empty, self.free, self.key, self.cached, self._ref
        tier = self.lower_tier
        while len(out) < n:
            if empty:
                b = empty.pop()
            else:
                b = free.pop()
                k = key[b]
                if cached.get(k) == b:
                    del cached[k]
                    if tier is not None:
                        tier.store(k)
                key[b] = 0
                self.num_evictions += 1
            ref[b] = 1
            out.append(b)
        return out

    def assign_keys(self, blocks: Sequence[int], keys: Iterable[int]) -> None:
        """Give full blocks their content keys (first holder of a key keeps the map entry)."""
        key, cached = self.key, self.cached
        for b, k in zip(blocks, keys, strict=False):
            key[b] = k
            if k not in cached:
                cached[k] = b

    def free_blocks(self, blocks: Sequence[int], priority: float = 0.0) -> None:
        """Drop one reference on each block, in the order given (pass deepest first)."""
        ref, key, cached, free, empty = self._ref, self.key, self.cached, self.free, self.empty
        for b in blocks:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                k = key[b]
                if k and cached.get(k) == b:
                    free.push(b, priority)
                else:
                    key[b] = 0
                    empty.append(b)

    def demote(self, blocks: Sequence[int]) -> None:
        """Move the unreferenced ones of ``blocks`` to the head of the free queue, deepest first."""
        ref, free, key, cached = self._ref, self.free, self.key, self.cached
        for b in blocks:  # pushing to the head: the last pushed (deepest) is evicted first
            if ref[b] == 0 and key[b] and cached.get(key[b]) == b:
                free.remove(b)
                free.push_head(b)

    def check(self) -> None:
        """Assert the pool's invariants (for tests)."""
        in_free = sum(1 for b in range(self.num_blocks) if self._ref[b] == 0)
        assert in_free == self.num_free, (in_free, self.num_free)
        for k, b in self.cached.items():
            assert self.key[b] == k
        assert all(r >= 0 for r in self._ref)

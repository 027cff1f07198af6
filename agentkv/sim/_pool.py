"""A block-level KV pool with vLLM's prefix-caching semantics, and an optional lower tier.

Invariants (the same as vLLM 0.32's ``BlockPool`` and ``FreeKVCacheBlockQueue``):

- A block holds ``block_size`` tokens. A *full* block gets a content key; keys chain: the
  key of block ``j`` stands for ``(key of block j-1, tokens of block j)``, so two prompts
  share block ``j`` only if they share every token up to its end. The simulator gives
  each distinct chained content a fresh integer (see :class:`KeyChain`).
- ``ref[b]`` counts the requests (and leases) holding block ``b``. A block with
  ``ref > 0`` is never evicted. Blocks shared by several requests have ``ref > 1``.
- A block whose count drops to 0 keeps its content and stays findable (a cache hit
  revives it) until it is evicted. Blocks without a key go to the *empty* stack and are
  reused first; keyed blocks join the free queue.
- The free queue evicts from its head. In LRU order a request's blocks are freed in
  reverse (deepest first), so the deepest block of a chain is evicted before its parents.
  :class:`PriorityFreeQueue` instead evicts the lowest priority first (then the deepest);
  policies use it to express Belady- or step-graph-ordered eviction.
- Demotion moves blocks to the head of the free queue (evicted first, still findable).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["BlockPool", "KeyChain", "LRUFreeQueue", "LowerTier", "PriorityFreeQueue"]


class KeyChain:
    """Hands out chained content keys: one fresh integer per distinct chained block.

    A trajectory's context is a list of keys; the next turn keeps the keys of the blocks
    that lie wholly inside the shared prefix and gets fresh keys for the rest (their
    parent chain differs, so their hash differs).
    """

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 1

    def extend(
        self, keys: list[int], shared_tokens: int, total_tokens: int, block_size: int
    ) -> list[int]:
        """Return the keys of a context of ``total_tokens`` that shares ``shared_tokens`` with ``keys``."""
        keep = min(len(keys), shared_tokens // block_size)
        want = total_tokens // block_size
        if want <= keep:
            return keys[:want]
        start = self._next
        self._next = start + (want - keep)
        return keys[:keep] + list(range(start, self._next))


class LRUFreeQueue:
    """The stock free queue: append at the tail, evict from the head (O(1) each)."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._q)

    def push(self, block: int, priority: float = 0.0) -> None:
        """Append ``block`` at the tail (evicted last); ``priority`` is ignored."""
        self._q[block] = None

    def push_head(self, block: int) -> None:
        """Put ``block`` at the head (evicted first)."""
        self._q[block] = None
        self._q.move_to_end(block, last=False)

    def remove(self, block: int) -> None:
        """Take ``block`` out of the queue (a cache hit revived it)."""
        del self._q[block]

    def pop(self) -> int:
        """Remove and return the block to evict next."""
        return self._q.popitem(last=False)[0]


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


@dataclass
class LowerTier:
    """A second KV tier (CPU DRAM behind a GPU): LRU over content keys, with a transfer cost.

    Blocks evicted from the pool are written here (the write overlaps compute and costs
    no time); a later prefix hit here loads them back at ``bandwidth_bytes_per_s`` after
    ``latency_s`` instead of recomputing them.
    """

    capacity_blocks: int
    bandwidth_bytes_per_s: float = 16e9
    latency_s: float = 0.0005
    block_bytes: int = 0

    def __post_init__(self) -> None:
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def store(self, key: int) -> None:
        """Keep ``key`` (most recently used); evict the oldest key when full."""
        if self.capacity_blocks <= 0:
            return
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) > self.capacity_blocks:
            self._keys.popitem(last=False)

    def touch(self, key: int) -> None:
        """Mark ``key`` as just used."""
        if key in self._keys:
            self._keys.move_to_end(key)

    def load_time_s(self, num_blocks: int) -> float:
        """Seconds to bring ``num_blocks`` back into the pool."""
        if num_blocks <= 0:
            return 0.0
        return self.latency_s + num_blocks * self.block_bytes / self.bandwidth_bytes_per_s


class BlockPool:
    """``num_blocks`` KV blocks with ref counts, a content-key map and a free queue.

    See the module docstring for the invariants. ``lower_tier`` (optional) receives every
    keyed block the pool evicts.
    """

    def __init__(
        self,
        num_blocks: int,
        *,
        priority_queue: bool = False,
        lower_tier: LowerTier | None = None,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("a pool needs at least one block")
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.key: list[int] = [0] * num_blocks  # 0: no content key
        self.cached: dict[int, int] = {}  # content key -> block
        self.empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self.free: LRUFreeQueue | PriorityFreeQueue = (
            PriorityFreeQueue() if priority_queue else LRUFreeQueue()
        )
        self.lower_tier = lower_tier
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (empty plus evictable cached ones)."""
        return len(self.empty) + len(self.free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced (cached blocks with ref 0 count as free, as in vLLM)."""
        return 1.0 - self.num_free / self.num_blocks

    def match(self, keys: Sequence[int], max_blocks: int) -> int:
        """How many leading ``keys`` (at most ``max_blocks``) are cached in the pool."""
        cached = self.cached
        n = 0
        limit = min(max_blocks, len(keys))
        while n < limit and keys[n] in cached:
            n += 1
        return n

    def match_lower(self, keys: Sequence[int], start: int, max_blocks: int) -> int:
        """How many keys from ``start`` on are held by the lower tier (0 without one)."""
        tier = self.lower_tier
        if tier is None:
            return 0
        n = start
        limit = min(max_blocks, len(keys))
        while n < limit and keys[n] in tier:
            n += 1
        return n - start

    def touch(self, keys: Sequence[int]) -> list[int]:
        """Take a reference on the cached blocks of ``keys`` (all must be cached)."""
        ref, free = self.ref, self.free
        blocks = list(map(self.cached.__getitem__, keys))
        if isinstance(free, LRUFreeQueue):
            q = free._q
            for b in blocks:
                if ref[b] == 0:
                    del q[b]
                ref[b] += 1
        else:
            for b in blocks:
                if ref[b] == 0:
                    free.remove(b)
                ref[b] += 1
        return blocks

    def allocate(self, n: int) -> list[int] | None:
        """Hand out ``n`` blocks with ref 1, evicting the free queue's head; None if short."""
        if n <= 0:
            return []
        if len(self.empty) + len(self.free) < n:
            return None
        out: list[int] = []
        empty, free, key, cached, ref = self.empty, self.free, self.key, self.cached, self.ref
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
        ref, key, cached, free, empty = self.ref, self.key, self.cached, self.free, self.empty
        lru = free._q if isinstance(free, LRUFreeQueue) else None
        for b in blocks:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                k = key[b]
                if k and cached.get(k) == b:
                    if lru is not None:
                        lru[b] = None
                    else:
                        free.push(b, priority)
                else:
                    key[b] = 0
                    empty.append(b)

    def demote(self, blocks: Sequence[int]) -> None:
        """Move the unreferenced ones of ``blocks`` to the head of the free queue, deepest first."""
        ref, free, key, cached = self.ref, self.free, self.key, self.cached
        for b in blocks:  # pushing to the head: the last pushed (deepest) is evicted first
            if ref[b] == 0 and key[b] and cached.get(key[b]) == b:
                free.remove(b)
                free.push_head(b)

    def check(self) -> None:
        """Assert the pool's invariants (for tests)."""
        in_free = sum(1 for b in range(self.num_blocks) if self.ref[b] == 0)
        assert in_free == self.num_free, (in_free, self.num_free)
        for k, b in self.cached.items():
            assert self.key[b] == k
        assert all(r >= 0 for r in self.ref)

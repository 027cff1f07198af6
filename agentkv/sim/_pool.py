"""The simulator's KV block pools: one interface, two implementations, one factory.

:class:`BlockPool` is what the engine needs from a pool: vLLM's prefix-caching
semantics over ``num_blocks`` blocks (reference counts, chained content keys, a free
queue evicted from its head, demotion to that head, an optional lower tier). Two
siblings implement it:

- :class:`~agentkv.sim._pool_lru.LRUBlockPool` evicts in LRU order (vLLM's own), and
  keeps blocks in runs so that the agent pattern costs O(new blocks) per call;
- :class:`~agentkv.sim._pool_priority.PriorityBlockPool` evicts the lowest priority
  first, for policies that order eviction (the oracle, KVFlow).

:func:`make_pool` picks one from what the policy asks for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from agentkv.sim._pool_common import KeyChain, LowerTier
from agentkv.sim._pool_lru import LRUBlockPool
from agentkv.sim._pool_priority import PriorityBlockPool

__all__ = ["BlockPool", "KeyChain", "LRUBlockPool", "LowerTier", "PriorityBlockPool", "make_pool"]


class BlockPool(Protocol):
    """A KV block pool with vLLM's prefix-caching semantics (see the module docstring).

    ``key[b]`` is block ``b``'s content key (0: none); ``cached`` maps a content key to
    its block; ``lower_tier`` receives every keyed block the pool evicts.
    """

    num_blocks: int
    num_evictions: int
    key: list[int]
    cached: dict[int, int]
    lower_tier: LowerTier | None

    @property
    def ref(self) -> list[int]:
        """Every block's reference count."""

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (empty plus evictable cached ones)."""

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced."""

    def refcount(self, block: int) -> int:
        """How many requests or leases hold ``block``."""

    def match(self, keys: Sequence[int], max_blocks: int) -> int:
        """How many leading ``keys`` (at most ``max_blocks``) are cached."""

    def lookup(self, keys: Sequence[int], max_blocks: int) -> list[int]:
        """The cached blocks of the longest cached prefix of ``keys``."""

    def match_lower(self, keys: Sequence[int], start: int, max_blocks: int) -> int:
        """How many keys from ``start`` on the lower tier holds."""

    def touch(self, keys: Sequence[int]) -> list[int]:
        """Take a reference on the cached blocks of ``keys``."""

    def take(self, blocks: list[int]) -> None:
        """Take a reference on ``blocks``."""

    def allocate(self, n: int) -> list[int] | None:
        """Hand out ``n`` blocks with ref 1, evicting from the free queue; None if short."""

    def assign_keys(self, blocks: Sequence[int], keys: Iterable[int]) -> None:
        """Give full blocks their content keys."""

    def free_blocks(self, blocks: Sequence[int], priority: float = 0.0) -> None:
        """Drop one reference on each block, in the order given (deepest first)."""

    def demote(self, blocks: Sequence[int]) -> None:
        """Move the unreferenced ones of ``blocks`` to the head of the free queue."""

    def check(self) -> None:
        """Assert the pool's invariants (for tests)."""


def make_pool(
    num_blocks: int, *, priority_queue: bool = False, lower_tier: LowerTier | None = None
) -> BlockPool:
    """A pool of ``num_blocks``: priority-ordered eviction when ``priority_queue``, else LRU."""
    if priority_queue:
        return PriorityBlockPool(num_blocks, lower_tier=lower_tier)
    return LRUBlockPool(num_blocks, lower_tier=lower_tier)

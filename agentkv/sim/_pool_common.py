"""What both simulator pools share: content keys, the lower tier and prefix lookups.

:class:`KeyChain` hands out chained content keys (a block's key stands for its tokens and
every token before them); :class:`LowerTier` is the second KV tier behind a pool;
:class:`PrefixReads` is the read side both pools implement the same way over their
``cached`` map and ``lower_tier``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KeyChain", "LowerTier", "PrefixReads"]


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
        self.stored_blocks = 0  # writes of a block the tier did not hold

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def store(self, key: int) -> None:
        """Keep ``key`` (most recently used); evict the oldest key when full."""
        if self.capacity_blocks <= 0:
            return
        if key not in self._keys:
            self.stored_blocks += 1
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


class PrefixReads:
    """Prefix lookups over a pool's ``cached`` map (content key -> block) and lower tier.

    A pool using it provides ``cached``, ``lower_tier``, ``num_blocks``, ``num_free``
    and ``take``.
    """

    cached: dict[int, int]
    lower_tier: LowerTier | None
    num_blocks: int

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (empty plus evictable cached ones)."""
        raise NotImplementedError

    def take(self, blocks: list[int]) -> None:
        """Take a reference on ``blocks`` (cached or held ones)."""
        raise NotImplementedError

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced (cached blocks with ref 0 count as free, as in vLLM)."""
        return 1.0 - self.num_free / self.num_blocks

    def match(self, keys: Sequence[int], max_blocks: int) -> int:
        """How many leading ``keys`` (at most ``max_blocks``) are cached in the pool."""
        return len(self.lookup(keys, max_blocks))

    def lookup(self, keys: Sequence[int], max_blocks: int) -> list[int]:
        """The cached blocks of the longest cached prefix of ``keys`` (at most ``max_blocks``)."""
        limit = min(max_blocks, len(keys))
        cached = self.cached
        if limit <= 0 or keys[0] not in cached:
            return []
        blocks = list(map(cached.get, keys[:limit]))
        if blocks[-1] is not None and None not in blocks:
            return blocks  # type: ignore[return-value]
        del blocks[blocks.index(None) :]
        return blocks  # type: ignore[return-value]

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
        blocks = list(map(self.cached.__getitem__, keys))
        self.take(blocks)
        return blocks

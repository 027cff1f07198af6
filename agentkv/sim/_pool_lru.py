"""The LRU simulator pool: vLLM's prefix-caching semantics, kept cheap with runs of blocks.

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
  The sibling :class:`~agentkv.sim._pool_priority.PriorityBlockPool` instead evicts the
  lowest priority first (then the deepest); policies use it to express Belady- or
  step-graph-ordered eviction. :func:`agentkv.sim._pool.make_pool` picks one.
- Demotion moves blocks to the head of the free queue (evicted first, still findable).

How the LRU pool stays cheap: it keeps blocks in *runs* rather than one by one. A run is
a list of blocks in chain order (root first) that share one reference count; a free run
sits in the free queue (a linked list of runs) as one entry, evicted from its deep end,
so its eviction order is exactly the blocks' reversed order. A request that frees its
whole context frees one run; the next call of the same trajectory takes the run's
root-side blocks back with one slice. Operations on blocks that do not line up with
runs split them (down to single blocks), so any sequence of calls gives vLLM's order;
the agent pattern just costs O(new blocks) per call instead of O(context).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from agentkv.sim._pool_common import LowerTier, PrefixReads

__all__ = ["LRUBlockPool"]


class _Run:
    """Blocks in chain order (root first) sharing one reference count; see the module doc."""

    __slots__ = ("blocks", "next", "odd", "prev", "ref")

    def __init__(self, blocks: list[int], ref: int) -> None:
        self.blocks = blocks
        self.ref = ref
        self.odd = 0  # blocks without a findable key (unkeyed or a duplicate key)
        self.prev: _Run = self
        self.next: _Run = self


class LRUBlockPool(PrefixReads):
    """``num_blocks`` KV blocks with ref counts, a content-key map and an LRU free queue.

    See the module docstring for the invariants. ``lower_tier`` (optional) receives every
    keyed block the pool evicts.
    """

    def __init__(self, num_blocks: int, *, lower_tier: LowerTier | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("a pool needs at least one block")
        self.num_blocks = num_blocks
        self.key: list[int] = [0] * num_blocks  # 0: no content key
        self.cached: dict[int, int] = {}  # content key -> block
        self.empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self.lower_tier = lower_tier
        self.num_evictions = 0
        self._run_of: list[_Run | None] = [None] * num_blocks
        self._odd: set[int] = set()
        self._queue = _Run([], 0)  # sentinel of the free queue: .next is evicted first
        self._num_queued = 0

    # -- reading ---------------------------------------------------------------------
    @property
    def ref(self) -> list[int]:
        """A snapshot of every block's reference count (O(pool); for tests and reports)."""
        return [0 if r is None else r.ref for r in self._run_of]

    def refcount(self, block: int) -> int:
        """How many requests or leases hold ``block``."""
        r = self._run_of[block]
        return 0 if r is None else r.ref

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (empty plus evictable cached ones)."""
        return len(self.empty) + self._num_queued

    # -- runs --------------------------------------------------------------------------
    def _link_before(self, run: _Run, at: _Run) -> None:
        run.prev = at.prev
        run.next = at
        at.prev.next = run
        at.prev = run

    def _unlink(self, run: _Run) -> None:
        run.prev.next = run.next
        run.next.prev = run.prev
        run.prev = run.next = run

    def _segment(self, blocks: list[int], i: int) -> tuple[_Run | None, int, int]:
        """The run holding ``blocks[i]``, its index there, and how many of ``blocks[i:]``
        follow it in that run's order."""
        b = blocks[i]
        run = self._run_of[b]
        if run is None:
            return None, 0, 1
        rb = run.blocks
        j = 0 if rb[0] == b else rb.index(b)
        lim = min(len(rb) - j, len(blocks) - i)
        if rb[j : j + lim] == blocks[i : i + lim]:
            return run, j, lim
        c = 1
        while rb[j + c] == blocks[i + c]:
            c += 1
        return run, j, c

    def _split(self, run: _Run, i: int) -> _Run:
        """Move ``run.blocks[i:]`` to a new run (evicted just before ``run`` if free)."""
        tail = _Run(run.blocks[i:], run.ref)
        del run.blocks[i:]
        run_of = self._run_of
        for b in tail.blocks:
            run_of[b] = tail
        if run.odd:
            odd = self._odd
            tail.odd = sum(1 for b in tail.blocks if b in odd)
            run.odd -= tail.odd
        if run.ref == 0:
            self._link_before(tail, run)
        return tail

    def _isolate(self, run: _Run, j: int, c: int) -> _Run:
        """Split ``run`` so that ``run.blocks[j:j+c]`` is a run of its own; return it."""
        if j + c < len(run.blocks):
            self._split(run, j + c)
        return self._split(run, j) if j else run

    def _drop_odd(self, run: _Run) -> None:
        """Send a freed run's blocks that have no findable key to the empty stack."""
        odd, rb = self._odd, run.blocks
        if run.odd == 1 and rb[-1] in odd:
            dropped = [rb.pop()]
        else:
            dropped = [b for b in rb if b in odd]
            run.blocks = [b for b in rb if b not in odd]
        run.odd = 0
        key, run_of, empty = self.key, self._run_of, self.empty
        for b in reversed(dropped):  # deepest first, as freed
            odd.discard(b)
            key[b] = 0
            run_of[b] = None
            empty.append(b)

    # -- operations --------------------------------------------------------------------
    def take(self, blocks: list[int]) -> None:
        """Take a reference on ``blocks`` (cached or held ones, e.g. from :meth:`lookup`)."""
        i, n = 0, len(blocks)
        while i < n:
            run, j, c = self._segment(blocks, i)
            assert run is not None, "take() needs cached or held blocks"
            run = self._isolate(run, j, c)
            if run.ref == 0:
                self._unlink(run)
                self._num_queued -= c
            run.ref += 1
            i += c

    def allocate(self, n: int) -> list[int] | None:
        """Hand out ``n`` blocks with ref 1, evicting the free queue's head; None if short."""
        if n <= 0:
            return []
        empty = self.empty
        if len(empty) + self._num_queued < n:
            return None
        take = min(n, len(empty))
        out = empty[len(empty) - take :]
        out.reverse()
        del empty[len(empty) - take :]
        evict = n - take
        if evict:
            head, key, cached, tier = self._queue, self.key, self.cached, self.lower_tier
            for _ in range(evict):
                run = head.next
                b = run.blocks.pop()
                if not run.blocks:
                    self._unlink(run)
                k = key[b]
                del cached[k]
                if tier is not None:
                    tier.store(k)
                key[b] = 0
                out.append(b)
            self._num_queued -= evict
            self.num_evictions += evict
        run = _Run(out, 1)
        run.odd = n
        self._odd.update(out)
        run_of = self._run_of
        for b in out:
            run_of[b] = run
        return list(out)

    def assign_keys(self, blocks: Sequence[int], keys: Iterable[int]) -> None:
        """Give full blocks their content keys (first holder of a key keeps the map entry)."""
        key, cached, odd, run_of = self.key, self.cached, self._odd, self._run_of
        for b, k in zip(blocks, keys, strict=False):
            key[b] = k
            if k not in cached:
                cached[k] = b
                if b in odd:
                    odd.discard(b)
                    run = run_of[b]
                    assert run is not None
                    run.odd -= 1

    def free_blocks(self, blocks: Sequence[int], priority: float = 0.0) -> None:
        """Drop one reference on each block, in the order given (pass deepest first).

        Blocks whose count reaches 0 join the free queue's tail in the order given (or
        the empty stack when they have no findable key). ``priority`` is for priority
        pools and is ignored here.
        """
        chain = list(blocks)
        chain.reverse()  # root first: the order runs keep
        freed: list[_Run] = []
        joined = False  # the previous segment was freed too: merge into it
        run_of = self._run_of
        i, n = 0, len(chain)
        while i < n:
            run, j, c = self._segment(chain, i)
            i += c
            if run is None:
                joined = False
                continue
            run = self._isolate(run, j, c)
            run.ref -= 1
            if run.ref:
                joined = False
                continue
            if run.odd:
                self._drop_odd(run)
            if not run.blocks:
                continue
            if joined:
                last = freed[-1]
                for b in run.blocks:
                    run_of[b] = last
                last.blocks += run.blocks
            else:
                freed.append(run)
            joined = True
        queue = self._queue
        for run in reversed(freed):  # the deepest run was given first: it goes first
            self._link_before(run, queue)
            self._num_queued += len(run.blocks)

    def demote(self, blocks: Sequence[int]) -> None:
        """Move the unreferenced ones of ``blocks`` to the head of the free queue, deepest first."""
        chain = list(blocks)
        i, n = 0, len(chain)
        while i < n:
            run, j, c = self._segment(chain, i)
            i += c
            if run is not None and run.ref == 0:
                run = self._isolate(run, j, c)
                self._unlink(run)
                self._link_before(run, self._queue.next)

    def check(self) -> None:
        """Assert the pool's invariants (for tests)."""
        queued: list[int] = []
        run = self._queue.next
        while run is not self._queue:
            assert run.ref == 0 and run.blocks and run.odd == 0
            assert run.next.prev is run
            queued += run.blocks
            run = run.next
        assert len(queued) == len(set(queued)) == self._num_queued
        for b in queued:
            assert self.cached.get(self.key[b]) == b, b
        ref = self.ref
        assert sum(1 for r in ref if r == 0) == self.num_free
        assert sorted(queued + self.empty) == [b for b in range(self.num_blocks) if ref[b] == 0]
        runs: dict[int, Any] = {}
        for b, r in enumerate(self._run_of):
            if r is not None:
                assert b in r.blocks
                runs[id(r)] = r
        for r in runs.values():
            assert r.odd == sum(1 for b in r.blocks if b in self._odd)
        for k, b in self.cached.items():
            assert self.key[b] == k
        assert all(r >= 0 for r in ref)

"""Interned block hashes of every tracked trajectory, under one global budget (pure).

A trajectory remembers the block hashes its last request covered (to find its cached
prefix, to lease it, to demote it on release, and to know which blocks another
trajectory shares). Two trajectories on the same 64k-token prompt would otherwise keep
two copies of every hash: the hashes come from separate requests, as separate objects.

Invariants:

- each distinct hash value is held once, as the first object seen with that value; a
  trajectory's tuple holds references to these interned objects;
- :meth:`HashIndex.count` is the number of trajectories whose tuple contains the hash
  (a trajectory counts once, however often the hash recurs in its tuple); an interned
  value is dropped when its count reaches zero;
- :attr:`HashIndex.refs`, the total length of all tuples, never exceeds
  :attr:`HashIndex.max_refs`: the book frees room (idle trajectories' hashes, least
  recently seen first) or truncates the new tuple to a prefix that fits.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["HashIndex"]


class HashIndex:
    """Interned hash values with per-value trajectory counts (see the module docstring)."""

    def __init__(self, max_refs: int) -> None:
        self.max_refs = max(0, int(max_refs))
        self.refs = 0
        self._canon: dict[bytes, bytes] = {}
        self._count: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._canon)

    def count(self, block_hash: bytes) -> int:
        """How many trajectories cover ``block_hash``."""
        return self._count.get(block_hash, 0)

    def room(self) -> int:
        """References that can still be added under the budget."""
        return max(0, self.max_refs - self.refs)

    def replace(self, old: Sequence[bytes], new: Sequence[bytes]) -> tuple[bytes, ...]:
        """Swap one trajectory's ``old`` tuple for ``new`` (already cut to fit the budget);
        returns ``new`` as interned objects."""
        canon, count = self._canon, self._count
        for h in set(old):
            n = count.get(h, 0) - 1
            if n > 0:
                count[h] = n
            else:
                count.pop(h, None)
                canon.pop(h, None)
        self.refs -= len(old)
        out: list[bytes] = []
        seen: set[bytes] = set()
        for h in new:
            c = canon.get(h)
            if c is None:
                canon[h] = c = h
            if c not in seen:
                seen.add(c)
                count[c] = count.get(c, 0) + 1
            out.append(c)
        self.refs += len(out)
        return tuple(out)

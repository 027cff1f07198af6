"""When new advice tells a server nothing new (pure)."""

from __future__ import annotations

__all__ = ["UNCHANGED_WITHIN", "unchanged"]

#: Two advice figures within this share of the larger one tell a server nothing new.
UNCHANGED_WITHIN = 0.25


def unchanged(a: float | None, b: float | None) -> bool:
    """True when figure ``b`` (a TTL or gap) is close enough to ``a`` that a client does
    not post it again (both None counts as unchanged)."""
    if a is None or b is None:
        return a == b
    return abs(a - b) <= UNCHANGED_WITHIN * max(a, b)

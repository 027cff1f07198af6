"""The lag of lifecycle events (emitted by the client to received by the server)."""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import deque

__all__ = ["LAG_BUCKETS_S", "LagStats"]

#: Upper bounds (seconds) of the lag histogram's buckets (``+Inf`` is implied).
LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class LagStats:
    """A running histogram of every lag recorded, and the median of the recent ones."""

    def __init__(self, recent: int = 1024) -> None:
        self._recent_ms: deque[float] = deque(maxlen=recent)
        self._counts = [0] * (len(LAG_BUCKETS_S) + 1)  # per bucket, the last is +Inf
        self._sum_s = 0.0

    def record_ms(self, lag_ms: float) -> None:
        """Record one lag in milliseconds (negative counts as 0; NaN is ignored)."""
        if math.isfinite(lag_ms):
            lag_ms = max(0.0, lag_ms)
            self._recent_ms.append(lag_ms)
            self._counts[bisect.bisect_left(LAG_BUCKETS_S, lag_ms / 1000.0)] += 1
            self._sum_s += lag_ms / 1000.0

    def median_ms(self) -> float:
        """The median of the recent lags, ms (0 before any)."""
        return statistics.median(self._recent_ms) if self._recent_ms else 0.0

    def histogram(self) -> dict[str, object]:
        """Every lag recorded, as a cumulative histogram in seconds: ``buckets`` is
        ``[[upper bound, count at or below it], ...]`` ending with ``+Inf``."""
        bounds = [*(str(b) for b in LAG_BUCKETS_S), "+Inf"]
        counts = itertools.accumulate(self._counts)
        return {
            "buckets": [[le, n] for le, n in zip(bounds, counts, strict=True)],
            "sum_s": self._sum_s,
            "count": sum(self._counts),
        }

"""A paused trajectory's forecast return: quantiles of its idle gap (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Forecast"]

#: z(0.99) / z(0.9) of the standard normal: a log-normal's p99 from its p50 and p90.
_Z99_OVER_Z90 = 2.3263478740408408 / 1.2815515655446004


@dataclass(frozen=True, slots=True)
class Forecast:
    """When a paused trajectory is expected back: quantiles of its idle gap, in seconds."""

    p50_s: float
    p90_s: float
    p99_s: float

    @staticmethod
    def from_ttl_ms(ttl_ms: int) -> Forecast:
        """A forecast from a TTL alone: the TTL is read as the gap's high quantile."""
        s = max(0.0, ttl_ms / 1000.0)
        return Forecast(s / 2, s, 2 * s)

    @staticmethod
    def from_hint_ms(
        gap_ms: float | None,
        gap_p90_ms: float | None = None,
        gap_p99_ms: float | None = None,
        ttl_ms: float | None = None,
    ) -> Forecast | None:
        """A forecast from what a client sent: its gap quantiles (ms) where given, else
        its TTL alone (:meth:`from_ttl_ms`); None when it sent neither.

        Quantiles are made monotone. A missing p90 is the TTL (or the p50); a missing
        p99 extends the log-normal through p50 and p90 (a p90/p50 spread of at most 100).
        """
        if gap_ms is None or not math.isfinite(gap_ms):
            return Forecast.from_ttl_ms(int(ttl_ms)) if ttl_ms is not None else None
        p50 = max(0.0, gap_ms / 1000.0)
        if gap_p90_ms is not None and math.isfinite(gap_p90_ms):
            p90 = max(p50, gap_p90_ms / 1000.0)
        elif ttl_ms is not None:
            p90 = max(p50, ttl_ms / 1000.0)
        else:
            p90 = p50
        if gap_p99_ms is not None and math.isfinite(gap_p99_ms):
            p99 = max(p90, gap_p99_ms / 1000.0)
        elif p50 > 0:
            # p50 * (p90/p50)^z = p90 * (p90/p50)^(z-1); the spread is capped so that a
            # near-zero median cannot extrapolate an absurd tail.
            p99 = p90 * min(p90 / p50, 100.0) ** (_Z99_OVER_Z90 - 1)
        else:
            p99 = p90
        return Forecast(p50, p90, max(p90, p99))

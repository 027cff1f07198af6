"""A server's load as the client sees it: parsed from ``/metrics`` or the control route's
stats, and the latest snapshot kept for the Advisor (refreshed off the call path)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agentkv._clock import Clock, as_clock
from agentkv.advice._costmodel import LoadSnapshot

__all__ = ["LoadTracker", "load_from_stats", "parse_prometheus_load"]


def parse_prometheus_load(text: str, *, has_lower_tier: bool = False) -> LoadSnapshot:
    """Read ``vllm:kv_cache_usage_perc`` and ``vllm:num_requests_waiting`` from ``/metrics``.

    Samples with several label sets (one per engine) are averaged (usage) or summed
    (waiting). Missing metrics read as an idle server. The text is read with
    ``prometheus_client``'s parser.
    """
    from agentkv._prometheus import iter_samples

    usage: list[float] = []
    waiting = 0.0
    for name, _labels, value in iter_samples(text):
        if name == "vllm:kv_cache_usage_perc":
            usage.append(value / 100.0 if value > 1.0 else value)
        elif name == "vllm:num_requests_waiting":
            waiting += value
    return LoadSnapshot(
        kv_usage=min(max(sum(usage) / len(usage), 0.0), 1.0) if usage else 0.0,
        num_waiting=max(int(waiting), 0),
        has_lower_tier=has_lower_tier,
    )


def load_from_stats(stats: Mapping[str, Any], *, has_lower_tier: bool = False) -> LoadSnapshot:
    """Build a snapshot from a control-route stats object (``kv_usage``, ``num_waiting``)."""
    usage = stats.get("kv_usage", stats.get("kv_cache_usage", 0.0))
    waiting = stats.get("num_waiting", stats.get("num_requests_waiting", 0))
    try:
        u = float(usage)
        w = int(waiting)
    except (TypeError, ValueError):
        return LoadSnapshot(has_lower_tier=has_lower_tier)
    if not math.isfinite(u):
        u = 0.0
    return LoadSnapshot(min(max(u, 0.0), 1.0), max(w, 0), has_lower_tier)


class LoadTracker:
    """The latest load snapshot of one server, with its age (cached briefly).

    Readers never block on I/O: they get the last snapshot (an idle default before the
    first one). A background refresher calls :meth:`needs_refresh` and :meth:`update`.
    """

    def __init__(
        self, *, max_age_s: float = 1.0, has_lower_tier: bool = False, clock: Clock | None = None
    ) -> None:
        self.max_age_s = max_age_s
        self._clock = as_clock(clock)
        self._snapshot = LoadSnapshot(has_lower_tier=has_lower_tier)
        self._updated_ns: int | None = None

    def get(self) -> LoadSnapshot:
        """The latest snapshot (possibly stale; never blocks)."""
        return self._snapshot

    def update(self, snapshot: LoadSnapshot, *, now_ns: int | None = None) -> None:
        """Store a fresh snapshot."""
        self._snapshot = snapshot
        self._updated_ns = self._now_ns() if now_ns is None else now_ns

    def needs_refresh(self, *, now_ns: int | None = None) -> bool:
        """True when the snapshot is older than ``max_age_s`` (or missing)."""
        if self._updated_ns is None:
            return True
        now = self._now_ns() if now_ns is None else now_ns
        return (now - self._updated_ns) / 1e9 >= self.max_age_s

    def _now_ns(self) -> int:
        return int(self._clock.monotonic() * 1e9)

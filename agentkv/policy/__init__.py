"""Policy (pure, no I/O): the advisor, the retention cost model, KV sizes, and the lease,
pressure, admission and priority core shared by the vLLM plugin and the simulator
(:class:`PolicyCore`) with its settings."""

from __future__ import annotations

from agentkv.policy._book import Counters, Forecast, Lease, TrajectoryBook, TrajState
from agentkv.policy._core import PolicyCore
from agentkv.policy._settings import PolicySettings, Retention

__all__ = [
    "Counters",
    "Forecast",
    "Lease",
    "PolicyCore",
    "PolicySettings",
    "Retention",
    "TrajState",
    "TrajectoryBook",
]

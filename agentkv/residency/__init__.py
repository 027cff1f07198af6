"""Server-side residency policy (pure, no I/O): which paused contexts keep their KV blocks,
which lease gives way under pressure, which waiting turn is admitted, at what priority.

The vLLM scheduler plugin and the simulator drive the same code; see
:mod:`agentkv.residency._core` for the decisions and :mod:`agentkv.residency._book` for the
bookkeeping and its invariants.
"""

from __future__ import annotations

from agentkv.residency._book import Counters, Lease, TrajectoryBook, TrajState
from agentkv.residency._core import PolicyCore
from agentkv.residency._forecast import Forecast
from agentkv.residency._settings import PolicySettings, Retention

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

"""When paused trajectories are expected back, as one server sees it (pure; time passed in).

A client forecasts each pause (quantiles of the idle gap, :class:`Forecast`); the server
reads those forecasts through two corrections it learns itself:

- **return lag**: the client forecasts the gap it sees (answer received to next call
  sent); the server's pause also holds the time the answer and the next call spend
  between engine and client, a fixed cost per call on a given machine. The median lag of
  returns against their forecast median is learned here and forecasts are shifted by it
  (``return_lag``). The lag is never negative: that time cannot be. A median below zero
  says the forecasts run long (a cold gap model's priors, before it has seen this
  workload's gaps), an error of the forecasts, not of transit; shifting every forecast
  down by it would make the short ones "due now" and hold turns for contexts that are
  not coming back yet;
- **affinity** (:mod:`agentkv.residency._affinity`): behind a router that scatters a
  trajectory's turns over replicas, a trajectory whose calls do not keep arriving here
  is not expected back here at all (``affinity``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from agentkv.residency._affinity import Affinity
from agentkv.residency._book import Counters, TrajState
from agentkv.residency._settings import PolicySettings

__all__ = ["ReturnForecaster"]


class ReturnForecaster:
    """Expected returns of paused trajectories (see the module docstring)."""

    #: Returns a lag estimate needs before it shifts forecasts.
    MIN_LAG_SAMPLES = 8

    def __init__(self, settings: PolicySettings, counters: Counters) -> None:
        self._learn_lag = settings.return_lag
        self._track_affinity = settings.affinity
        self._counters = counters
        self._lags_s: deque[float] = deque(maxlen=256)  # return - (pause + forecast p50)
        self.return_lag_s = 0.0  # median of those, at least 0: what forecasts are shifted by
        self.affinity = Affinity(settings.affinity_min_rate)

    def on_return(self, st: TrajState[Any], now_s: float, turn: int | None) -> None:
        """A call of ``st`` arrived (its pause, if any, is over): learn whether its calls
        keep arriving here (``turn``: the call's turn id, None unknown) and how late it
        came back against its forecast's median."""
        if turn is not None and self._track_affinity:
            self._counters.turns_roaming += self.affinity.observe(st, turn)
        if st.paused_at_s is not None and st.forecast is not None and self._learn_lag:
            self._lags_s.append(now_s - st.paused_at_s - st.forecast.p50_s)
            if len(self._lags_s) >= self.MIN_LAG_SAMPLES:
                self.return_lag_s = max(0.0, statistics.median(self._lags_s))

    def on_settled(self, st: TrajState[Any], ok: bool) -> None:
        """``st``'s call ran (``ok``) or was dropped before it ran: its return counts in
        the affinity rate only in the first case."""
        if self._track_affinity:
            self.affinity.settle(st, ok)

    def due_here(self, st: TrajState[Any]) -> bool:
        """Is ``st``'s next call expected at this replica (not roaming, and the routing
        in front of it keeps trajectories together)?"""
        return self.affinity.due_here(st)

    def shifted(self, gap_s: float) -> float:
        """A forecast gap as this server sees it: shifted by the learned return lag."""
        return max(0.0, gap_s + self.return_lag_s)

    def expected_return_s(self, st: TrajState[Any], now_s: float) -> float:
        """When ``st`` is expected to need its context again (now, if it is not paused).

        The first of pause + p50, p90, p99 that lies in the future: a trajectory already
        out longer than its median gap is probably in a slow tool. Past p99 the forecast
        is believed no more: it is expected back no sooner than it has already been away
        (and at least another p99 later), so a stale or made-up short forecast cannot keep
        a lease "due now" forever. Without a forecast, the lease deadline stands in.
        A roaming trajectory is not expected back here: never (``inf``), so its lease
        goes first, turns that do not fit may take it, and no turn is held for it.
        """
        if st.paused_at_s is None:
            return now_s
        if not self.due_here(st):
            return math.inf
        f = st.forecast
        if f is None:
            return st.lease.deadline_s if st.lease is not None else now_s
        for q in (f.p50_s, f.p90_s, f.p99_s):
            t = st.paused_at_s + self.shifted(q)
            if t > now_s:
                return t
        return now_s + max(self.shifted(f.p99_s), now_s - st.paused_at_s)

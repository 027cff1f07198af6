"""Replica affinity: is a paused trajectory's next call expected at this server?

Behind a router that does not keep a trajectory's calls together (round robin, random,
a least-loaded pick), a replica's lease may wait for a call that goes to another
replica: the admission rule would hold waiting turns for a context that never comes
back. The policy core learns, from the turn ids of the calls it sees, which leases it
can count on (pure; no clock, no I/O):

- a trajectory *roams* when a call of it past turn 0 arrives that neither follows the
  last turn seen here (``turn = last + 1``) nor repeats it (a retry), or is the first
  call of it seen here; it is affine again once a turn follows its predecessor here,
  or a turn 0 starts a new run;
- the replica's *affinity rate* is the share of the last ``window`` calls past turn 0
  whose previous turn came here too, counting one more that did (so it reads 1.0 until
  a turn roams, and one roaming turn among few weighs less): 1.0 behind session
  affinity or on one server, about ``1/R`` behind round robin over ``R`` replicas.

A trajectory is due back here when it does not roam and the affinity rate is at least
``affinity_min_rate`` (a replica that sees trajectories' turns scattered cannot count on
any lease, even one whose last two turns happened to land together). On one server no
trajectory roams and the rate stays 1.0, so nothing changes there.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["Affinity"]


class Affinity:
    """Roaming trajectories and the replica's affinity rate (see the module docstring)."""

    def __init__(self, min_rate: float, window: int = 64) -> None:
        self.min_rate = min_rate
        self._returns: deque[bool] = deque(maxlen=max(1, window))
        self._hits = 0  # True entries of _returns

    def observe(self, st: Any, turn: int) -> bool:
        """A call of ``st`` (a :class:`~agentkv.residency._book.TrajState`) for turn
        ``turn`` arrived here: update ``st.last_turn`` and ``st.roaming``; return the
        latter."""
        last, st.last_turn = st.last_turn, turn
        st.roaming = turn > 0 and (last is None or not 0 <= turn - last <= 1)
        if turn > 0:  # did its previous turn come here?
            returns = self._returns
            if len(returns) == returns.maxlen:
                self._hits -= returns[0]
            returns.append(not st.roaming)
            self._hits += not st.roaming
        return bool(st.roaming)

    @property
    def rate(self) -> float:
        """Share of recent returns whose previous turn was here, counting one more that
        was (so 1.0 until a turn roams, and one roaming turn among few weighs less)."""
        return (self._hits + 1) / (len(self._returns) + 1)

    @property
    def keeps_together(self) -> bool:
        """Does the routing in front of this replica keep trajectories' turns together?"""
        return self.rate >= self.min_rate

    def due_here(self, st: Any) -> bool:
        """Is ``st``'s next call expected at this replica?"""
        return not st.roaming and self.keeps_together

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
- the replica's *affinity rate*, per tenant, is the share of that tenant's last
  ``window`` calls past turn 0 whose previous turn came here too, counting one more that
  did (so it reads 1.0 until a turn roams, and one roaming turn among few weighs less):
  1.0 behind session affinity or on one server, about ``1/R`` behind round robin over
  ``R`` replicas. A call counts only once the engine admitted it (:meth:`Affinity.settle`):
  requests aborted while they waited, which cost nothing to send, cannot drag the rate
  down, and one tenant's calls never move another's rate.

A trajectory is due back here when it does not roam and its tenant's affinity rate is at
least ``affinity_min_rate`` (a replica that sees trajectories' turns scattered cannot
count on any lease, even one whose last two turns happened to land together). On one
server no trajectory roams and the rate stays 1.0, so nothing changes there.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

__all__ = ["Affinity"]


class _Window:
    """The last ``window`` settled returns of one tenant."""

    __slots__ = ("hits", "returns")

    def __init__(self, window: int) -> None:
        self.returns: deque[bool] = deque(maxlen=window)
        self.hits = 0  # True entries of returns

    def add(self, came_back: bool) -> None:
        if len(self.returns) == self.returns.maxlen:
            self.hits -= self.returns[0]
        self.returns.append(came_back)
        self.hits += came_back

    @property
    def rate(self) -> float:
        return (self.hits + 1) / (len(self.returns) + 1)


class Affinity:
    """Roaming trajectories and the affinity rate per tenant (see the module docstring)."""

    #: Tenants whose windows are kept (least recently settled forgotten first).
    MAX_TENANTS = 1024

    def __init__(self, min_rate: float, window: int = 64) -> None:
        self.min_rate = min_rate
        self._window = max(1, window)
        self._tenants: OrderedDict[str, _Window] = OrderedDict()

    def observe(self, st: Any, turn: int) -> bool:
        """A call of ``st`` (a :class:`~agentkv.residency._book.TrajState`) for turn
        ``turn`` arrived here: update ``st.last_turn`` and ``st.roaming``; return the
        latter. Whether its previous turn came here counts once the call settles."""
        last, st.last_turn = st.last_turn, turn
        st.roaming = turn > 0 and (last is None or not 0 <= turn - last <= 1)
        st.unsettled_return = (not st.roaming) if turn > 0 else None
        return bool(st.roaming)

    def settle(self, st: Any, ok: bool) -> None:
        """``st``'s call was admitted (``ok``) or dropped before it ran: only the first
        counts its return in its tenant's rate."""
        came_back, st.unsettled_return = st.unsettled_return, None
        if came_back is None or not ok:
            return
        window = self._tenants.get(st.tenant)
        if window is None:
            window = self._tenants[st.tenant] = _Window(self._window)
            while len(self._tenants) > self.MAX_TENANTS:
                self._tenants.popitem(last=False)
        else:
            self._tenants.move_to_end(st.tenant)
        window.add(came_back)

    def rate_of(self, tenant: str) -> float:
        """Share of ``tenant``'s recent settled returns whose previous turn was here,
        counting one more that was (1.0 for a tenant with none)."""
        window = self._tenants.get(tenant)
        return 1.0 if window is None else window.rate

    @property
    def rate(self) -> float:
        """The same over every tenant's recent returns (for stats)."""
        hits = sum(w.hits for w in self._tenants.values())
        seen = sum(len(w.returns) for w in self._tenants.values())
        return (hits + 1) / (seen + 1)

    def due_here(self, st: Any) -> bool:
        """Is ``st``'s next call expected at this replica?"""
        return not st.roaming and self.rate_of(st.tenant) >= self.min_rate

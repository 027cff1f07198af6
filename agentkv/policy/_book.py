"""Per-trajectory state and lease bookkeeping (pure; no vLLM import, no clock).

This is the mechanical half of the policy core (:mod:`agentkv.policy._core` holds the
decisions). Blocks are opaque objects: the driver (the vLLM plugin or the simulator)
owns the block pool, takes a reference on the blocks it hands to a lease, and drops one
reference on every list :meth:`TrajectoryBook.drain_frees` returns. Time is passed in.
Invariants:

- every lease has a deadline no later than ``now + max_ttl_ms`` at the time it was set;
- the blocks held by all leases never exceed ``max_retained_fraction`` of the pool
  (a new lease is truncated to fit, keeping its prefix, and counted as capped);
- whenever a lease ends, or its tail is trimmed, the blocks it gives up are queued
  exactly once for the driver to drop (:meth:`TrajectoryBook.drain_frees`), and a lease
  ends exactly once, with one outcome;
- the trajectory index is bounded (least recently seen trajectories are forgotten,
  and their leases freed), so hostile traffic cannot grow memory without limit.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from agentkv.policy._settings import PolicySettings

__all__ = [
    "OUTCOMES",
    "Counters",
    "Forecast",
    "Lease",
    "TrajState",
    "TrajectoryBook",
    "bound_priority",
]

B = TypeVar("B")

#: z(0.99) / z(0.9) of the standard normal: a log-normal's p99 from its p50 and p90.
_Z99_OVER_Z90 = 2.3263478740408408 / 1.2815515655446004

OUTCOMES = ("reused", "expired", "pressure_released", "released", "replaced")


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


@dataclass
class Lease(Generic[B]):
    """Blocks held (one reference each) for a trajectory until ``deadline_s``."""

    blocks: list[B]
    deadline_s: float
    created_s: float
    rewarmed: int = 0  # trailing blocks recomputed ahead of the return (re-warm)


@dataclass
class TrajState(Generic[B]):
    """What the core knows about one trajectory."""

    trajectory_id: str
    last_seen_s: float
    hashes: list[bytes] = field(default_factory=list)
    lease: Lease[B] | None = None
    pending_deadline_s: float | None = None
    last_outcome: str | None = None
    attained_tokens: int = 0
    live_requests: set[str] = field(default_factory=set)
    paused_at_s: float | None = None  # its last turn finished then (None: running or new)
    forecast: Forecast | None = None  # expected idle gap of the current pause
    waiting_since_s: float | None = None  # a turn of it waits for admission since then
    held: bool = False  # admission held that turn back at the last decision
    running: bool = False  # a turn of it is admitted and not finished
    scheduled_at_s: float | None = None  # when its running turn was admitted
    context_blocks: int = 0  # blocks its context held when its last turn finished
    growth_blocks: int = 0  # how much its context grew over its last turn


@dataclass
class Counters:
    """Monotone counters exported by ``/agentkv/v1/stats`` and the simulator's results."""

    leases_created: int = 0
    leases_reused: int = 0
    leases_expired: int = 0
    leases_pressure_released: int = 0
    leases_released: int = 0
    leases_replaced: int = 0
    leases_capped: int = 0
    leases_declined: int = 0
    leases_trimmed: int = 0
    blocks_demoted: int = 0
    hints_received: int = 0
    hint_errors: int = 0
    events_received: int = 0
    priority_boosts: int = 0
    requests_aged: int = 0
    turns_held: int = 0
    holds_aged_out: int = 0
    forecasts_updated: int = 0
    offloads: int = 0
    rewarms: int = 0
    rewarm_blocks: int = 0
    rewarm_blocks_used: int = 0
    rewarm_blocks_wasted: int = 0


_OUTCOME_COUNTER = {
    "reused": "leases_reused",
    "expired": "leases_expired",
    "pressure_released": "leases_pressure_released",
    "released": "leases_released",
    "replaced": "leases_replaced",
}


def bound_priority(value: int, bound: int) -> int:
    """Clamp ``value`` into ``[-bound, bound]``."""
    return max(-bound, min(bound, value))


class TrajectoryBook(Generic[B]):
    """Lease and trajectory state for one scheduler (see the module docstring)."""

    def __init__(self, settings: PolicySettings, num_blocks: int) -> None:
        self.settings = settings
        self.num_blocks = max(1, num_blocks)
        self.counters = Counters()
        self._trajs: OrderedDict[str, TrajState[B]] = OrderedDict()
        self._interest: dict[bytes, int] = {}
        self._to_free: list[list[B]] = []
        self._lags_ms: deque[float] = deque(maxlen=1024)
        self._retained = 0

    # -- trajectory index ------------------------------------------------------------
    def get(self, trajectory_id: str) -> TrajState[B] | None:
        """Return the state of a known trajectory, or None."""
        return self._trajs.get(trajectory_id)

    def state(self, trajectory_id: str, now_s: float) -> TrajState[B]:
        """Return (creating if needed) a trajectory's state and mark it recently seen."""
        st = self._trajs.get(trajectory_id)
        if st is None:
            st = TrajState(trajectory_id=trajectory_id, last_seen_s=now_s)
            self._trajs[trajectory_id] = st
            while len(self._trajs) > self.settings.max_trajectories:
                _, old = self._trajs.popitem(last=False)
                self._forget(old)
        else:
            st.last_seen_s = now_s
            self._trajs.move_to_end(trajectory_id)
        return st

    def _forget(self, st: TrajState[B]) -> None:
        if st.lease is not None:
            self._end_lease(st, "expired")
        self.set_hashes(st, [])

    def states(self) -> list[TrajState[B]]:
        """Every tracked trajectory, least recently seen first."""
        return list(self._trajs.values())

    def __len__(self) -> int:
        return len(self._trajs)

    # -- shared-prefix interest --------------------------------------------------------
    def set_hashes(self, st: TrajState[B], hashes: list[bytes]) -> None:
        """Record the block hashes a trajectory's last request covered (bounded)."""
        new = hashes[: self.settings.max_hashes_per_trajectory]
        for h in set(st.hashes):
            n = self._interest.get(h, 0) - 1
            if n > 0:
                self._interest[h] = n
            else:
                self._interest.pop(h, None)
        for h in set(new):
            self._interest[h] = self._interest.get(h, 0) + 1
        st.hashes = new

    def shared_with_others(self, block_hash: bytes, st: TrajState[B]) -> bool:
        """True when a trajectory other than ``st`` also covers ``block_hash``."""
        mine = 1 if block_hash in st.hashes else 0
        return self._interest.get(block_hash, 0) - mine > 0

    def forget_trajectory(self, st: TrajState[B]) -> None:
        """Drop a finished trajectory entirely (its lease, if any, is ended as released)."""
        if st.lease is not None:
            self._end_lease(st, "released")
        self.set_hashes(st, [])
        self._trajs.pop(st.trajectory_id, None)

    # -- leases ----------------------------------------------------------------------
    def clamp_ttl_ms(self, ttl_ms: int | None) -> int:
        """Bound a requested TTL to ``[0, max_ttl_ms]`` (None means the maximum)."""
        if ttl_ms is None:
            return self.settings.max_ttl_ms
        return max(0, min(int(ttl_ms), self.settings.max_ttl_ms))

    @property
    def retained_blocks(self) -> int:
        """Blocks currently held by leases (a block held by two leases counts twice)."""
        return self._retained

    def leased_states(self) -> list[TrajState[B]]:
        """The trajectories that hold a lease now."""
        return [st for st in self._trajs.values() if st.lease is not None]

    @property
    def leases_active(self) -> int:
        """Number of trajectories holding a lease."""
        return sum(1 for st in self._trajs.values() if st.lease is not None)

    @property
    def retained_cap(self) -> int:
        """The most blocks all leases may hold together."""
        return int(self.settings.max_retained_fraction * self.num_blocks)

    def allowance(self, st: TrajState[B] | None = None) -> int:
        """How many more blocks a lease for ``st`` may hold under the retained cap."""
        mine = len(st.lease.blocks) if st is not None and st.lease is not None else 0
        return max(0, self.retained_cap - (self._retained - mine))

    def set_lease(self, st: TrajState[B], blocks: list[B], ttl_ms: int, now_s: float) -> None:
        """Give ``st`` a lease on ``blocks`` (references already taken by the caller).

        ``blocks`` must fit the allowance (callers size it with the core's plan). A
        previous lease of the same trajectory is ended (its blocks queued for freeing
        after the new references were taken, so no block is dropped in between).
        """
        if st.lease is not None:
            self._end_lease(st, "replaced")
        deadline = now_s + self.clamp_ttl_ms(ttl_ms) / 1000.0
        st.lease = Lease(blocks=list(blocks), deadline_s=deadline, created_s=now_s)
        self._retained += len(blocks)
        st.pending_deadline_s = None
        st.last_outcome = "leased"
        self.counters.leases_created += 1

    def extend_lease(self, st: TrajState[B], ttl_ms: int, now_s: float) -> None:
        """Move an existing lease's deadline to ``now + ttl`` (capped)."""
        if st.lease is not None:
            st.lease.deadline_s = now_s + self.clamp_ttl_ms(ttl_ms) / 1000.0

    def note_capped(self, st: TrajState[B]) -> None:
        """Record that a lease was truncated or refused by the retained cap."""
        self.counters.leases_capped += 1
        st.last_outcome = "capped"

    def _end_lease(self, st: TrajState[B], outcome: str) -> None:
        assert st.lease is not None
        if st.lease.rewarmed:
            used = "rewarm_blocks_used" if outcome == "reused" else "rewarm_blocks_wasted"
            setattr(self.counters, used, getattr(self.counters, used) + st.lease.rewarmed)
        self._retained -= len(st.lease.blocks)
        self._to_free.append(st.lease.blocks)
        st.lease = None
        st.last_outcome = outcome
        attr = _OUTCOME_COUNTER[outcome]
        setattr(self.counters, attr, getattr(self.counters, attr) + 1)

    def end_lease(self, st: TrajState[B], outcome: str) -> bool:
        """End ``st``'s lease with ``outcome``; False when it held none."""
        if st.lease is None:
            return False
        self._end_lease(st, outcome)
        return True

    def trim_lease(self, st: TrajState[B], keep: int) -> int:
        """Keep only the first ``keep`` blocks of ``st``'s lease (its prefix); return how
        many were given up. Trimming to nothing ends the lease as pressure-released."""
        lease = st.lease
        if lease is None:
            return 0
        if keep <= 0:
            n = len(lease.blocks)
            self._end_lease(st, "pressure_released")
            return n
        tail = lease.blocks[keep:]
        if not tail:
            return 0
        del lease.blocks[keep:]
        lost = min(lease.rewarmed, len(tail))  # re-warmed blocks are the tail
        lease.rewarmed -= lost
        self.counters.rewarm_blocks_wasted += lost
        self._retained -= len(tail)
        self._to_free.append(tail)
        self.counters.leases_trimmed += 1
        return len(tail)

    def expire(self, now_s: float) -> int:
        """End every lease whose deadline has passed; returns how many ended."""
        n = 0
        for st in self._trajs.values():
            if st.lease is not None and st.lease.deadline_s <= now_s:
                self._end_lease(st, "expired")
                n += 1
            if st.pending_deadline_s is not None and st.pending_deadline_s <= now_s:
                st.pending_deadline_s = None
        return n

    def release_all(self, outcome: str = "released") -> None:
        """End every lease (used before a prefix-cache reset)."""
        for st in self._trajs.values():
            if st.lease is not None:
                self._end_lease(st, outcome)

    def drain_frees(self) -> list[list[B]]:
        """Take the block lists whose references the driver must now drop (root first)."""
        out, self._to_free = self._to_free, []
        return out

    # -- lag and stats ---------------------------------------------------------------
    def record_lag_ms(self, lag_ms: float) -> None:
        """Record the delay between an event's emission and its receipt."""
        if math.isfinite(lag_ms):
            self._lags_ms.append(max(0.0, lag_ms))

    def stats(self) -> dict[str, float | int]:
        """Counters plus gauges, as served by ``GET /agentkv/v1/stats``."""
        out: dict[str, float | int] = {
            "leases_active": self.leases_active,
            "retained_blocks": self.retained_blocks,
            "trajectories_tracked": len(self._trajs),
        }
        out.update(vars(self.counters))
        out["hint_lag_ms_p50"] = statistics.median(self._lags_ms) if self._lags_ms else 0.0
        return out

"""The policy core: which blocks to lease, which lease to give up, which turn to admit.

One implementation, driven by the vLLM scheduler plugin and by the simulator alike. It
is pure: blocks are opaque, time is passed in, the driver owns the block pool and
applies what the core decides (see :mod:`agentkv.residency._book` for the bookkeeping and
its invariants). The decisions:

**Lease** (:meth:`PolicyCore.plan_lease`, when a turn finishes). Under ``retention =
"hint"`` a lease is granted when the client advised ``retain``. Under ``"predicted"``
every paused trajectory's context is a candidate (the advice's TTL still bounds it) and
the core declines, or shortens to a prefix, a lease that the pool could not keep: when
the pool is short of blocks for waiting work and this trajectory is the one expected
back last, its tail (or all of it) goes back to the pool at once. Either way a lease is
a prefix of the context, truncated to the retained cap.

**Pressure** (:meth:`PolicyCore.pressure_release`, when an allocation fails). ``"hint"``
ends the earliest deadline first (then the largest). ``"predicted"`` gives up blocks of
the lease furthest from its predicted return, deepest blocks first, only as many as the
allocation needs (Belady's rule on forecasts: on a cyclic return pattern the trajectory
that just paused comes back last, so a fixed subset stays resident).

**Admission** (:meth:`PolicyCore.plan_admission`, before each scheduling step, with
``admission`` on). A waiting turn is admitted when its trajectory's context is leased
(resident), when its missing blocks fit in the free pool beside the leases (minus a
reserve for running calls' growth), when nothing else would run (work-conserving), or
once it has waited :meth:`PolicyCore.hold_limit_s` (``aging_s``, or ``aging_turns`` mean
turn times when turns are slow: a bounded wait). Otherwise it is held back, so that turns
that cannot fit do not evict the resident contexts and thrash. While fewer than
``min_running`` calls run, a turn is held only when waiting for the context due back
first costs less than recomputing what admitting it would evict, at the prefill cost
learned from the engine's steps (:meth:`PolicyCore.observe_step`).

**Affinity** (:mod:`agentkv.residency._affinity`): behind a router that scatters a
trajectory's turns over replicas, a trajectory whose calls do not keep arriving here is
not expected back: its lease goes first and no turn is held for it.

**Priority** (:meth:`PolicyCore.assign_priority`): an offset inside a band of
``±priority_bound`` around the request's own priority; the advice, a step for resumed
turns with state and a cost for attained service move it inside the band; aging moves a
request that waited ``aging_s`` just ahead of its band, never across tiers.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from typing import TypeVar

from agentkv.residency._affinity import Affinity
from agentkv.residency._book import TrajectoryBook, TrajState, bound_priority
from agentkv.residency._forecast import Forecast
from agentkv.residency._settings import PolicySettings

__all__ = ["PolicyCore"]

B = TypeVar("B")


class PolicyCore(TrajectoryBook[B]):
    """The lease, pressure, admission and priority decisions (see the module docstring)."""

    #: Weight of the newest turn in the moving average of turn durations.
    TURN_ALPHA = 0.1

    #: Weight of the newest step in the decayed sums behind :attr:`prefill_s_per_block`.
    STEP_ALPHA = 0.05

    #: Returns a lag estimate needs before it shifts forecasts.
    MIN_LAG_SAMPLES = 8

    def __init__(self, settings: PolicySettings, num_blocks: int) -> None:
        super().__init__(settings, num_blocks)
        self.turn_s = 0.0  # moving average of admitted-to-finished time of a turn
        self._lags_s: deque[float] = deque(maxlen=256)  # return - (pause + forecast p50)
        self.return_lag_s = 0.0  # median of those: what forecasts are shifted by
        self._prefill_s = 0.0  # decayed sum of the wall time of steps that prefilled
        self._prefill_blocks = 0.0  # decayed sum of the blocks those steps prefilled
        self.affinity = Affinity(settings.affinity_min_rate)

    # -- turn lifecycle --------------------------------------------------------------
    def on_waiting(self, st: TrajState[B], now_s: float, turn: int | None = None) -> None:
        """A turn of ``st`` arrived and waits for admission (its pause is over); how late
        it came back against its forecast's median is learned (see :meth:`shifted`).

        ``turn`` (the call's turn id, None: unknown) tells whether the trajectory's calls
        keep arriving here (:mod:`agentkv.residency._affinity`); a roaming one is not
        expected back (:meth:`expected_return_s`).
        """
        if turn is not None and self.settings.affinity:
            self.counters.turns_roaming += self.affinity.observe(st, turn)
        if st.waiting_since_s is None:
            st.waiting_since_s = now_s
        if st.paused_at_s is not None and st.forecast is not None and self.settings.return_lag:
            self._lags_s.append(now_s - st.paused_at_s - st.forecast.p50_s)
            if len(self._lags_s) >= self.MIN_LAG_SAMPLES:
                self.return_lag_s = statistics.median(self._lags_s)
        st.paused_at_s = None

    def due_here(self, st: TrajState[B]) -> bool:
        """Is ``st``'s next call expected at this replica (not roaming, and the routing
        in front of it keeps trajectories together)? See :mod:`agentkv.residency._affinity`."""
        return self.affinity.due_here(st)

    def shifted(self, gap_s: float) -> float:
        """A forecast gap as this server sees it: the client forecasts the gap it sees
        (answer received to next call sent); the server's pause also holds the time the
        answer and the next call spend between engine and client (a fixed cost per call
        on a given machine), so forecasts are shifted by the median lag of returns
        against their forecast median, learned here (``return_lag``)."""
        return max(0.0, gap_s + self.return_lag_s)

    def on_scheduled(self, st: TrajState[B], now_s: float | None = None) -> None:
        """A turn of ``st`` was admitted: its lease (if any) is handed over to it."""
        self.end_lease(st, "reused")
        st.waiting_since_s = None
        st.held = False
        st.running = True
        st.scheduled_at_s = now_s

    def on_finished(
        self,
        st: TrajState[B],
        now_s: float,
        forecast: Forecast | None,
        context_blocks: int | None = None,
    ) -> None:
        """A turn of ``st`` finished; ``forecast`` is the expected idle gap (None: unknown),
        ``context_blocks`` the blocks its context holds now (its growth is learned)."""
        st.paused_at_s = now_s
        st.forecast = forecast
        st.running = False
        if st.scheduled_at_s is not None:
            d = max(0.0, now_s - st.scheduled_at_s)
            self.turn_s = (
                d if self.turn_s == 0.0 else self.turn_s + self.TURN_ALPHA * (d - self.turn_s)
            )
            st.scheduled_at_s = None
        if context_blocks is not None:
            if st.context_blocks:
                st.growth_blocks = max(0, context_blocks - st.context_blocks)
            st.context_blocks = context_blocks

    def observe_step(self, prefill_blocks: float, seconds: float) -> None:
        """An engine step took ``seconds`` and prefilled ``prefill_blocks`` blocks (in the
        unit of the admission's block counts); steps that prefilled nothing are ignored.

        The prefill cost per block is the ratio of decayed sums over such steps (large
        steps weigh most). It includes what the step spent on decodes beside the
        prefill, so it errs high: towards holding, as admission did before it was
        learned.
        """
        if prefill_blocks <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return
        keep = 1.0 - self.STEP_ALPHA
        self._prefill_s = keep * self._prefill_s + seconds
        self._prefill_blocks = keep * self._prefill_blocks + prefill_blocks

    @property
    def prefill_s_per_block(self) -> float:
        """Learned engine seconds to prefill one block (0.0: no prefill seen yet)."""
        return self._prefill_s / self._prefill_blocks if self._prefill_blocks > 0 else 0.0

    def update_forecast(self, st: TrajState[B], forecast: Forecast) -> bool:
        """A better forecast of ``st``'s current pause arrived (the tool that runs is now
        known); True when it applied (``st`` is paused). The pause start is kept: the
        quantiles are of the whole idle gap."""
        if st.paused_at_s is None:
            return False
        st.forecast = forecast
        return True

    def growth_reserve(self) -> int:
        """Blocks the active trajectories (running, or leased and due back here) are
        expected to add on their next turn: each grows by what it grew last time."""
        return sum(
            st.growth_blocks
            for st in self._trajs.values()
            if st.running or (st.lease is not None and self.due_here(st))
        )

    # -- forecasts -------------------------------------------------------------------
    def expected_return_s(self, st: TrajState[B], now_s: float) -> float:
        """When ``st`` is expected to need its context again (now, if it is not paused).

        The first of pause + p50, p90, p99 that lies in the future: a trajectory already
        out longer than its median gap is probably in a slow tool. Past p99 it is
        expected another p99 later. Without a forecast, the lease deadline stands in.
        A roaming trajectory (its calls go to other replicas too) is not expected back
        here: never (``inf``), so its lease goes first, turns that do not fit may take
        it, and no turn is held for it.
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
        return now_s + self.shifted(f.p99_s)

    def _victim_key(self, st: TrajState[B], now_s: float) -> tuple[float, int]:
        assert st.lease is not None
        if self.settings.retention == "hint":
            # Roaming first; then earliest deadline, then the largest: as many as possible go.
            due = -st.lease.deadline_s if self.due_here(st) else math.inf
            return (due, len(st.lease.blocks))
        return (self.expected_return_s(st, now_s), len(st.lease.blocks))

    def _victim(self, exclude: str | None, now_s: float) -> TrajState[B] | None:
        # Leases of tenants over their share of the retained cap go first (with one
        # tenant, as in the simulator, the order is the policy's own).
        share = self.tenant_share
        best: TrajState[B] | None = None
        best_key: tuple[bool, float, int] | None = None
        for st in self._trajs.values():
            if st.lease is None or st.trajectory_id == exclude:
                continue
            key = (self.tenant_retained(st.tenant) > share, *self._victim_key(st, now_s))
            if best_key is None or key > best_key:
                best, best_key = st, key
        return best

    # -- lease -----------------------------------------------------------------------
    @property
    def reserve_blocks(self) -> int:
        """Blocks kept free for running calls' growth when admitting non-resident turns."""
        return math.ceil(self.settings.reserve_fraction * self.num_blocks)

    def plan_lease(
        self,
        st: TrajState[B],
        wanted: int,
        now_s: float,
        *,
        advised: bool,
        free_blocks: int = 0,
        demand_blocks: int = 0,
    ) -> int:
        """How many blocks (a prefix of the ``wanted`` cached ones) to lease for ``st``.

        ``advised``: the client advised ``retain`` (or a pending retain is due);
        ``free_blocks``: blocks the pool can hand out now (leased ones excluded);
        ``demand_blocks``: blocks that admitted waiting work needs now. Counts a cap
        (``leases_capped``) or a decision to keep less (``leases_declined``).
        """
        if wanted <= 0 or (self.settings.retention == "hint" and not advised):
            return 0
        self.make_room(st, wanted)
        n = min(wanted, self.allowance(st))
        if n < wanted:
            self.note_capped(st)
        if self.settings.retention == "predicted" and self.settings.decline and n > 0:
            short = demand_blocks + self.reserve_blocks - free_blocks
            if short > 0 and self._returns_last(st, now_s) and not self.within_share(st, n):
                keep = max(0, n - short)
                if keep < n:
                    self.counters.leases_declined += 1
                    st.last_outcome = "declined"
                n = keep
        return n

    def _returns_last(self, st: TrajState[B], now_s: float) -> bool:
        mine = self.expected_return_s(st, now_s)
        return all(
            self.expected_return_s(o, now_s) <= mine
            for o in self._trajs.values()
            if o.lease is not None and o is not st
        )

    def pressure_release(
        self, exclude: str | None, now_s: float, need_blocks: int | None = None
    ) -> int:
        """Give up lease blocks for an allocation that failed; returns how many (0: none).

        Spares ``exclude`` (the trajectory the allocation is for) while any other lease
        is left; its own lease goes last (its cached prefix may no longer match, after a
        compaction). ``need_blocks``, when known, lets ``"predicted"`` trim just the
        victim's tail instead of ending it.
        """
        victim = self._victim(exclude, now_s)
        if victim is None and exclude is not None:
            victim = self._trajs.get(exclude)
        if victim is None or victim.lease is None:
            return 0
        size = len(victim.lease.blocks)
        if (
            self.settings.retention == "predicted"
            and self.settings.trim
            and need_blocks is not None
            and 0 < need_blocks < size
            and victim.trajectory_id != exclude
        ):
            return self.trim_lease(victim, size - need_blocks)
        self._end_lease(victim, "pressure_released")
        return size

    # -- admission -------------------------------------------------------------------
    def plan_admission(
        self,
        waiting: Iterable[tuple[TrajState[B], int]],
        now_s: float,
        *,
        free_blocks: int,
        num_running: int,
    ) -> set[str]:
        """The trajectories whose waiting turns are held back this step.

        ``waiting``: ``(state, blocks it must allocate)`` per waiting turn, in the
        order the scheduler would admit them; ``free_blocks``: blocks the pool can hand
        out without ending a lease; ``num_running``: calls running now.

        A turn that does not fit may still take the blocks of leases expected back
        later than its own trajectory would be after this turn (Belady's rule between
        a paused context and the one that wants to run): those leases are the ones the
        pressure override gives up first when its allocation runs short.
        """
        held: set[str] = set()
        if not self.settings.admission:
            return held
        budget = free_blocks - self.reserve_blocks - self.growth_reserve()
        running = num_running
        aging_s = self.hold_limit_s()
        leases = sorted(
            (
                (self.expected_return_s(st, now_s), len(st.lease.blocks), st.trajectory_id)
                for st in self._trajs.values()
                if st.lease is not None
            ),
            reverse=True,
        )
        taken = 0  # leading entries of ``leases`` already promised to admitted turns
        soonest = (leases[-1][0], leases[-1][1]) if leases else None  # due back first
        for st, need in waiting:
            waited = now_s - (st.waiting_since_s if st.waiting_since_s is not None else now_s)
            resident = st.lease is not None
            fits = need <= budget
            busy = running >= self.settings.min_running or (
                not (resident or fits) and self._worth_waiting(need - budget, soonest, now_s)
            )
            reclaimed = False
            if not (resident or fits) and busy and waited < aging_s:
                fits, budget, taken = self._reclaim(st, need, budget, now_s, leases, taken)
                reclaimed = fits
            if resident or fits or waited >= aging_s or not busy:
                if st.held:
                    self.counters.held_ms += round(waited * 1000.0)
                    if not resident and not fits and waited >= aging_s:
                        self.counters.holds_aged_out += 1
                st.held = False
                if not reclaimed:
                    budget -= max(0, need)
                running += 1
                continue
            if not st.held:
                self.counters.turns_held += 1
            st.held = True
            held.add(st.trajectory_id)
        return held

    def _worth_waiting(
        self, short_blocks: int, soonest: tuple[float, int] | None, now_s: float
    ) -> bool:
        """Below ``min_running``: is holding a turn that does not fit (by ``short_blocks``)
        cheaper than admitting it? ``soonest``: (expected return, size) of the lease due
        back first.

        Holding idles the engine until that context is back. Admitting evicts blocks
        that must be prefilled again: at least the shortfall, and the context due back
        itself when it is the one the pool gives up. So the turn is held when the context
        is due back within ``idle_wait_turns`` mean turn times and within the time to
        recompute the larger of the two at the prefill cost learned from the engine's
        steps (:meth:`observe_step`). Where prefill is cheap (a GPU) that is rarely worth
        a wait; where it is dear (a CPU) it nearly always is. Until a prefill step is
        seen, only the turn-time bound applies.
        """
        wait_s = self.settings.idle_wait_turns * self.turn_s
        if wait_s <= 0 or soonest is None:
            return False
        back_s, size = soonest
        per_block_s = self.prefill_s_per_block
        if per_block_s > 0:
            wait_s = min(wait_s, max(short_blocks, size) * per_block_s)
        return back_s <= now_s + wait_s

    def hold_limit_s(self) -> float:
        """How long admission may hold a turn back: ``aging_s``, or ``aging_turns`` mean
        turn times where turns take longer (a slow or loaded engine). A bound in seconds
        alone would release every hold within a fraction of a turn there, and the turns it
        lets in would thrash the resident contexts that admission protects."""
        return max(self.settings.aging_s, self.settings.aging_turns * self.turn_s)

    def _reclaim(
        self,
        st: TrajState[B],
        need: int,
        budget: int,
        now_s: float,
        leases: list[tuple[float, int, str]],
        taken: int,
    ) -> tuple[bool, int, int]:
        """Can ``st`` run on the free budget plus leases expected back after it would be?

        Returns (fits, new budget, leases taken so far).
        """
        # Without a forecast of its own return, only leases not due back here are later.
        f = st.forecast
        horizon = math.inf if f is None else now_s + self.turn_s + self.shifted(f.p50_s)
        extra, k = 0, taken
        while k < len(leases) and need > budget + extra:
            ret, size, tid = leases[k]
            if ret <= horizon and ret < math.inf:
                break
            if tid != st.trajectory_id:
                extra += size
            k += 1
        if need <= budget + extra:
            return True, budget + extra - need, k
        return False, budget, taken

    # -- re-warm (experimental) ---------------------------------------------------------
    def plan_rewarm(
        self,
        candidates: Iterable[tuple[TrajState[B], int]],
        now_s: float,
        *,
        free_blocks: int,
        num_waiting: int,
        num_running: int,
    ) -> TrajState[B] | None:
        """The paused trajectory whose evicted context to recompute now, or None.

        ``candidates``: ``(state, missing blocks)`` of paused trajectories whose context
        is not all cached. Only with ``rewarm`` on, when no turn waits and fewer than
        ``min_running`` calls run (the engine has spare compute), for the candidate
        expected back soonest, when that return lies within ``rewarm_horizon_turns``
        mean turn times and its missing blocks fit in the free pool beside the reserve
        and the active contexts' growth (a re-warm never evicts a lease).
        """
        s = self.settings
        if not s.rewarm or num_waiting > 0 or num_running >= s.min_running:
            return None
        horizon = now_s + s.rewarm_horizon_turns * self.turn_s
        room = free_blocks - self.reserve_blocks - self.growth_reserve()
        best: tuple[float, TrajState[B]] | None = None
        for st, missing in candidates:
            if st.paused_at_s is None or st.forecast is None or not 0 < missing <= room:
                continue
            back = self.expected_return_s(st, now_s)
            if back <= horizon and (best is None or back < best[0]):
                best = (back, st)
        return None if best is None else best[1]

    def note_rewarm(self, st: TrajState[B], recomputed: int) -> None:
        """``st``'s new lease holds ``recomputed`` re-warmed blocks at its tail."""
        if st.lease is not None and recomputed > 0:
            st.lease.rewarmed = min(recomputed, len(st.lease.blocks))
            self.counters.rewarms += 1
            self.counters.rewarm_blocks += st.lease.rewarmed

    def stats(self) -> dict[str, float | int]:
        """The book's counters and gauges, plus the learned return lag."""
        out = super().stats()
        out["return_lag_ms"] = round(self.return_lag_s * 1000.0, 1)
        return out

    # -- priority --------------------------------------------------------------------
    def assign_priority(self, st: TrajState[B] | None, advised: int | None, base: int) -> int:
        """Priority for a new request (lower runs sooner); counts the boosts it grants.

        The result stays inside a band of ``±bound`` around ``base``, the request's own
        priority (a gateway's tier or a batch job's value survives, whatever a client
        advises). Inside the band: the advised value, read as an offset and clamped;
        a resumed turn whose state is leased or cached gains one step; program-level
        attained service costs ``log2(1 + tokens / quantum)`` steps, so long programs
        cannot starve short ones by chaining calls.
        """
        b = self.settings.priority_bound
        p = bound_priority(advised if advised is not None else 0, b)
        if st is not None:
            if st.lease is not None or st.hashes:
                p -= 1
            quantum = max(1, self.settings.service_quantum_tokens)
            p += min(b, int(math.log2(1 + st.attained_tokens / quantum)))
        p = bound_priority(p, b)
        if p < 0:
            self.counters.priority_boosts += 1
        return base + p

    def aged_priority(self, base: int = 0) -> int:
        """Priority of a request of own priority ``base`` that waited longer than
        ``aging_s``: ahead of every hint in its own band, never ahead of another tier."""
        return base - self.settings.priority_bound - 1

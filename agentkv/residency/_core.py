"""The policy core: how much to lease, which lease gives way, which turn waits, priority.

Pure: blocks are opaque, time is passed in. The core owns the trajectory book
(:mod:`agentkv.residency._book`, the bookkeeping and its invariants), the reading of
forecasts (:mod:`agentkv.residency._returns`) and one choice of each interchangeable
part (:mod:`agentkv.residency._strategies`: victim order, lease sizing, admission). The
residency controller (:mod:`agentkv.residency._controller`) calls it at each lifecycle
moment; drivers never do.

**Lease** (:meth:`PolicyCore.plan_lease`): a prefix of the context, truncated to the
retained cap (tenants under their share take room back from tenants over it), then
fitted to the pool by the lease sizing.

**Pressure** (:meth:`PolicyCore.pressure_release`): the victim order picks the lease
that gives way (tenants over their share of the retained cap first; within a tenant,
lineage next: leases marked off the critical path first, a parent waiting on a child's
join last); it may give up only the blocks an allocation lacks.

**Admission** (:meth:`PolicyCore.plan_admission`): the admission part picks the waiting
turns to hold back this step; a turn on the critical path, or a parent's turn back from
a child's join, is never held and takes the room first (:meth:`PolicyCore.urgent`).
The prefill cost it weighs is learned from the engine's
steps (:meth:`PolicyCore.observe_step`), the turn time from admitted-to-finished turns.

**Priority** (:meth:`PolicyCore.assign_priority`): an offset inside a band of
``±priority_bound`` around the request's own priority; the advice, a step for resumed
turns with state and a cost for attained service move it inside the band; aging moves a
request that waited ``aging_s`` just ahead of its band, never across tiers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from agentkv.residency._book import Counters, TrajectoryBook, TrajState, bound_priority
from agentkv.residency._forecast import Forecast
from agentkv.residency._returns import ReturnForecaster
from agentkv.residency._settings import PolicySettings
from agentkv.residency._strategies import Strategies, make_strategies

__all__ = ["PolicyCore"]

B = TypeVar("B")


class PolicyCore(Generic[B]):
    """The lease, pressure, admission and priority decisions (see the module docstring)."""

    #: Weight of the newest turn in the moving average of turn durations.
    TURN_ALPHA = 0.1

    #: Weight of the newest step in the decayed sums behind :attr:`prefill_s_per_block`.
    STEP_ALPHA = 0.05

    def __init__(
        self,
        settings: PolicySettings,
        num_blocks: int,
        strategies: Strategies | None = None,
        counters: Counters | None = None,
    ) -> None:
        """``counters``: carry on counting into these (a driver that starts the policy
        afresh keeps its totals); default, new ones."""
        self.settings = settings
        self.book: TrajectoryBook[B] = TrajectoryBook(settings, num_blocks, counters)
        self.returns = ReturnForecaster(settings, self.book.counters)
        self.strategies = make_strategies(settings) if strategies is None else strategies
        self.turn_s = 0.0  # moving average of admitted-to-finished time of a turn
        self._tenant_turn_s: dict[str, float] = {}  # the same, per tenant
        # seconds to reload one block from the engine's lower tier (None: no tier)
        self.reload_s_per_block: float | None = None
        # share of a leased context's prefix the lower tier already holds (None: no
        # tier, or the engine cannot tell); set by the residency controller
        self.tier_share: Callable[[TrajState[B]], float] | None = None
        self._missing = 0.0  # decayed sum of blocks admitted turns missed in the pool
        self._reloaded = 0.0  # decayed sum of those the lower tier held
        self._prefill_s = 0.0  # decayed sum of the wall time of steps that prefilled
        self._prefill_blocks = 0.0  # decayed sum of the blocks those steps prefilled

    @property
    def counters(self) -> Counters:
        """The book's counters."""
        return self.book.counters

    @property
    def num_blocks(self) -> int:
        """Usable blocks in the pool."""
        return self.book.num_blocks

    # -- turn lifecycle --------------------------------------------------------------
    def on_waiting(self, st: TrajState[B], now_s: float, turn: int | None = None) -> None:
        """A turn of ``st`` arrived and waits for admission (its pause is over)."""
        self.returns.on_return(st, now_s, turn)
        if st.waiting_since_s is None:
            st.waiting_since_s = now_s
        if st.paused_at_s is not None and self.book.child_seen_since(st, st.paused_at_s):
            st.join_return = True  # a child ran while it was paused: back from the join
        st.paused_at_s = None

    def on_scheduled(self, st: TrajState[B], now_s: float | None = None) -> None:
        """A turn of ``st`` was admitted: its lease (if any) is handed over to it, and its
        return counts in the affinity rate (a request aborted while it waited never does)."""
        self.returns.on_settled(st, True)
        self.book.end_lease(st, "reused")
        st.waiting_since_s = None
        st.held = False
        st.join_return = False
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
        if not st.live_requests:  # no turn of it waits any more (an aborted one ended)
            st.waiting_since_s = None
            st.join_return = False
        if st.scheduled_at_s is not None:
            d = max(0.0, now_s - st.scheduled_at_s)
            self.turn_s = self._ewma(self.turn_s, d)
            mine = self._tenant_turn_s
            mine[st.tenant] = self._ewma(mine.get(st.tenant, 0.0), d)
            if len(mine) > 2 * self.book.num_tenants + 16:  # forget tenants no longer tracked
                for tenant in [t for t in mine if not self.book.tenant_size(t)]:
                    del mine[tenant]
            st.scheduled_at_s = None
        if context_blocks is not None:
            if st.context_blocks:
                st.growth_blocks = max(0, context_blocks - st.context_blocks)
            st.context_blocks = context_blocks

    def update_forecast(self, st: TrajState[B], forecast: Forecast) -> bool:
        """A better forecast of ``st``'s current pause arrived (the tool that runs is now
        known); True when it applied (``st`` is paused). The pause start is kept: the
        quantiles are of the whole idle gap."""
        if st.paused_at_s is None:
            return False
        st.forecast = forecast
        return True

    def _ewma(self, avg: float, sample: float) -> float:
        return sample if avg == 0.0 else avg + self.TURN_ALPHA * (sample - avg)

    def turn_s_for(self, tenant: str | None) -> float:
        """The mean turn time of ``tenant``'s trajectories (None, or none seen yet: all
        trajectories'): one tenant's long decodes do not stretch another's holds."""
        if tenant is None:
            return self.turn_s
        return self._tenant_turn_s.get(tenant) or self.turn_s

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

    def observe_reload(self, missing_blocks: int, reloaded_blocks: int) -> None:
        """An admitted turn lacked ``missing_blocks`` of its prompt in the pool and found
        ``reloaded_blocks`` of them in the lower tier: teaches how often an evicted block
        can be reloaded rather than recomputed (:attr:`tier_hit_rate`)."""
        if missing_blocks <= 0:
            return
        keep = 1.0 - self.STEP_ALPHA
        self._missing = keep * self._missing + missing_blocks
        self._reloaded = keep * self._reloaded + max(0, min(reloaded_blocks, missing_blocks))

    @property
    def tier_hit_rate(self) -> float:
        """Learned share of the blocks admitted turns missed in the pool that the lower
        tier still held (0.0 before any is seen, or without a tier)."""
        return self._reloaded / self._missing if self._missing > 0 else 0.0

    @property
    def eviction_s_per_block(self) -> float:
        """What evicting one block costs when its trajectory comes back: reloading it
        from the lower tier as often as the tier turned out to hold such blocks
        (:attr:`tier_hit_rate`, at :attr:`reload_s_per_block`), prefilling it again
        otherwise; 0.0 until a prefill step is seen."""
        prefill = self.prefill_s_per_block
        reload = self.reload_s_per_block
        if reload is None or prefill <= 0:
            return prefill
        p = self.tier_hit_rate
        return p * min(prefill, reload) + (1.0 - p) * prefill

    def block_cost_s(self, tier_share: float) -> float:
        """Seconds to bring one block of a context back once it is evicted, when the lower
        tier holds ``tier_share`` of it: a reload for that share (never dearer than a
        recompute), a recompute for the rest; the recompute alone without a tier; 0.0
        until a prefill step is seen."""
        prefill = self.prefill_s_per_block
        reload = self.reload_s_per_block
        if reload is None or prefill <= 0:
            return prefill
        p = min(max(tier_share, 0.0), 1.0)
        return p * min(prefill, reload) + (1.0 - p) * prefill

    @property
    def eviction_weight(self) -> float:
        """:attr:`eviction_s_per_block` over :attr:`prefill_s_per_block`: 1.0 without a
        lower tier; below 1 where reloading an evicted block is cheaper than recomputing
        it, which makes waiting to protect it worth that much less."""
        prefill = self.prefill_s_per_block
        return self.eviction_s_per_block / prefill if prefill > 0 else 1.0

    def growth_reserve(self) -> int:
        """Blocks the active trajectories (running, or leased and due back here) are
        expected to add on their next turn: each grows by what it grew last time."""
        due_here = self.returns.due_here
        return sum(
            st.growth_blocks
            for st in self.book.iter_states()
            if st.running or (st.lease is not None and due_here(st))
        )

    def hold_limit_s(self, tenant: str | None = None) -> float:
        """How long admission may hold a turn back: ``aging_s``, or ``aging_turns`` mean
        turn times where turns take longer (a slow or loaded engine). A bound in seconds
        alone would release every hold within a fraction of a turn there, and the turns it
        lets in would thrash the resident contexts that admission protects. The turn time
        is ``tenant``'s own (:meth:`turn_s_for`). Where a lower
        tier serves what turns missed, the bound shrinks by :meth:`tier_hold_factor`: a
        hold protects only a reload there."""
        limit = max(self.settings.aging_s, self.settings.aging_turns * self.turn_s_for(tenant))
        return limit * self.tier_hold_factor()

    def tier_hold_factor(self) -> float:
        """The share of admission's hold bound left with a lower tier: 1.0 without one
        (or before it served anything), falling in proportion to :attr:`tier_hit_rate`
        and reaching 0.0 at ``tier_hold_cutoff`` (at or below 0: no holds once the
        tier served anything)."""
        p = self.tier_hit_rate
        if p <= 0.0:
            return 1.0
        cutoff = self.settings.tier_hold_cutoff
        if cutoff <= 0.0:
            return 0.0
        return max(0.0, 1.0 - p / cutoff)

    @property
    def reserve_blocks(self) -> int:
        """Blocks kept free for running calls' growth when admitting non-resident turns."""
        return math.ceil(self.settings.reserve_fraction * self.num_blocks)

    def urgent(self, st: TrajState[B]) -> bool:
        """Does the join wait on ``st``'s waiting turn: its client marked it on the critical
        path, or it is a parent's turn back from a child's join (a child of it ran during
        the pause)? Admission never holds such a turn (an unhinted request is never held
        either, so the mark gains a client nothing it could not have without hints)."""
        return st.critical_path is True or st.join_return

    def returns_last(self, st: TrajState[B], now_s: float) -> bool:
        """Is ``st`` expected back no sooner than every other leased trajectory?"""
        expected = self.returns.expected_return_s
        mine = expected(st, now_s)
        return all(
            expected(o, now_s) <= mine
            for o in self.book.iter_states()
            if o.lease is not None and o is not st
        )

    # -- decisions -------------------------------------------------------------------
    def plan_lease(
        self,
        st: TrajState[B],
        wanted: int,
        now_s: float,
        *,
        free_blocks: int = 0,
        demand_blocks: int = 0,
    ) -> int:
        """How many blocks (a prefix of the ``wanted`` cached ones) to lease for ``st``.

        ``free_blocks``: blocks the pool can hand out now (leased ones excluded);
        ``demand_blocks``: blocks that admitted waiting work needs now. Counts a cap
        (``leases_capped``) or a decision to keep less (``leases_declined``).
        """
        if wanted <= 0:
            return 0
        book = self.book
        book.make_room(st, wanted)
        n = min(wanted, book.allowance(st))
        if n < wanted:
            book.note_capped(st)
        return self.strategies.sizing.fit(
            self, st, n, now_s, free_blocks=free_blocks, demand_blocks=demand_blocks
        )

    def pressure_release(
        self, exclude: str | None, now_s: float, need_blocks: int | None = None
    ) -> int:
        """Give up lease blocks for an allocation that failed; returns how many (0: none).

        Spares ``exclude`` (the trajectory the allocation is for) while any other lease
        is left; its own lease goes last (its cached prefix may no longer match, after a
        compaction). ``need_blocks``, when known, lets a trimming victim order give up
        just the victim's tail instead of ending it.
        """
        victim, plain = self._victims(exclude, now_s)
        if victim is not plain and plain is not None and self.book.lineage_level(plain) < 2:
            self.counters.lineage_protected += 1  # lineage spared a joining or critical lease
        if victim is None and exclude is not None:
            victim = self.book.get(exclude)
        if victim is None or victim.lease is None:
            return 0
        size = len(victim.lease.blocks)
        if (
            self.strategies.victims.may_trim
            and need_blocks is not None
            and 0 < need_blocks < size
            and victim.trajectory_id != exclude
        ):
            return self.book.trim_lease(victim, size - need_blocks)
        self.book.end_lease(victim, "pressure_released")
        return size

    def next_victim(self, exclude: str | None, now_s: float) -> TrajState[B] | None:
        """The lease that gives way first, ``exclude``'s spared (None: no other lease).

        Leases of tenants over their share of the retained cap go first (the share of
        their source, divided among its salts, where the salt gate named sources; with
        one tenant, as in the simulator, the order is the victim order's own). Within
        that, lineage (:meth:`TrajectoryBook.lineage_level`): leases marked off the
        critical path first, then unmarked ones, then critical ones, a parent waiting on
        a child's join last; then the victim order's rank."""
        return self._victims(exclude, now_s)[0]

    def _victims(
        self, exclude: str | None, now_s: float
    ) -> tuple[TrajState[B] | None, TrajState[B] | None]:
        """(the victim, the victim the order would pick without lineage)."""
        book = self.book
        rank = self.strategies.victims.rank
        best = plain = None
        best_key: tuple[float, ...] | None = None
        plain_key: tuple[float, ...] | None = None
        over = book.tenants_over_share()
        for st in book.iter_states():
            if st.lease is None or st.trajectory_id == exclude:
                continue
            first = float(st.tenant in over)
            order = rank(self, st, now_s)
            key = (first, float(book.lineage_level(st)), *order)
            if best_key is None or key > best_key:
                best, best_key = st, key
            if plain_key is None or (first, *order) > plain_key:
                plain, plain_key = st, (first, *order)
        return best, plain

    def plan_admission(
        self,
        waiting: Iterable[tuple[TrajState[B], int]],
        now_s: float,
        *,
        free_blocks: int,
        num_running: int,
    ) -> set[str]:
        """The trajectories whose waiting turns are held back this step (see
        :class:`~agentkv.residency._strategies.Admission`)."""
        return self.strategies.admission.plan(
            self, waiting, now_s, free_blocks=free_blocks, num_running=num_running
        )

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

    def stats(self) -> dict[str, float | int]:
        """The book's counters and gauges, plus the learned return lag."""
        out = self.book.stats()
        out["return_lag_ms"] = round(self.returns.return_lag_s * 1000.0, 1)
        return out

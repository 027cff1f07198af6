"""The policy's interchangeable parts: victim order, lease sizing, admission (pure).

Each part is a small object behind one protocol; :func:`make_strategies` builds the set
that :class:`~agentkv.residency.PolicySettings` names, and an experiment is a new
object passed to :class:`~agentkv.residency.PolicyCore`, not a flag inside it.

- **Victim order** ranks leases for the pressure override: the lease that ranks highest
  gives way first. :class:`EarliestDeadline` (hint retention) ends leases as advised,
  earliest deadline first; :class:`FurthestReturn` (predicted retention) gives up the
  lease expected back last, only its tail where that is enough (Belady's rule on
  forecasts: on a cyclic return pattern the trajectory that just paused comes back
  last, so a fixed subset stays resident). :class:`TierAwareReturn` (predicted retention,
  the default) is the same rule on an engine with a lower tier: leases the tier already
  holds whole give way first (losing them costs a reload), then the rest by how long
  until each is back per second of rebuilding it (reload where the tier holds it,
  recompute where not); without a tier it orders exactly as :class:`FurthestReturn`.
- **Lease sizing** says which finished turns are lease candidates and how much of a
  candidate's context to keep: :class:`AdvisedLeases` leases what the client advised
  (``retain`` with its TTL); :class:`PredictedLeases` offers every paused context, and
  declines or shortens the lease that the pool could not keep (the pool is short for
  waiting work and this trajectory is expected back last).
- **Admission** picks the waiting turns to hold back this step: :class:`AdmitAll`
  holds none (vLLM's own order); :class:`ProgramAdmission` holds a turn whose context
  is not resident and does not fit beside the leases, bounded in time, never a turn the
  join waits on (:meth:`PolicyCore.urgent`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from agentkv.residency._forecast import Forecast
from agentkv.residency._settings import PolicySettings

if TYPE_CHECKING:
    from agentkv.residency._book import TrajState
    from agentkv.residency._core import PolicyCore

__all__ = [
    "IDLE_WAIT_RECOMPUTE_FACTOR",
    "PRESSURE_REASON",
    "Admission",
    "AdmitAll",
    "AdvisedLeases",
    "EarliestDeadline",
    "FinishAction",
    "FinishIntent",
    "FurthestReturn",
    "LeaseSizing",
    "PredictedLeases",
    "ProgramAdmission",
    "Strategies",
    "TierAwareReturn",
    "VictimOrder",
    "make_strategies",
]

#: An idle engine holds a turn only when the wait is shorter than this many times the
#: recompute that admitting it would cause (see ``ProgramAdmission._worth_waiting``).
IDLE_WAIT_RECOMPUTE_FACTOR = 2.0

#: The advice reason of a release the client chose because the server looked full.
PRESSURE_REASON = "capacity_pressure"

#: What happens to a finished turn's context: ``release`` (demoted once freed),
#: ``offload`` (the lower tier holds it; demoted from device memory once freed),
#: ``lease`` (a lease of the advised TTL), ``candidate`` (a lease ranked by its
#: forecast, the TTL only bounds it), ``none`` (freed as the engine would).
FinishAction = Literal["release", "offload", "lease", "candidate", "none"]


@dataclass(frozen=True, slots=True)
class FinishIntent:
    """What the client advised about a context, as the residency policy reads it.

    ``action`` is the advice's (``default``, ``retain``, ``offload``, ``prefetch``,
    ``release``), ``ttl_ms`` its TTL, ``forecast`` the expected idle gap (None:
    unknown), ``reason`` the advice's reason.
    """

    action: str = "default"
    ttl_ms: int | None = None
    forecast: Forecast | None = None
    reason: str | None = None


# -- victim order ---------------------------------------------------------------------------
class VictimOrder(Protocol):
    """Ranks leases for the pressure override: the highest rank gives way first."""

    @property
    def may_trim(self) -> bool:
        """May give up only the tail blocks an allocation lacks (keeping the prefix)."""
        ...

    def rank(self, core: PolicyCore[Any], st: TrajState[Any], now_s: float) -> tuple[float, ...]:
        """The rank of ``st``'s lease (``st.lease`` is set); compared as a tuple."""
        ...


@dataclass(frozen=True, slots=True)
class EarliestDeadline:
    """Leases not expected back here first, then the earliest deadline, then the largest
    (as many trajectories as possible keep theirs); a lease always ends whole."""

    may_trim: bool = False

    def rank(self, core: PolicyCore[Any], st: TrajState[Any], now_s: float) -> tuple[float, int]:
        """See the class docstring."""
        assert st.lease is not None
        due = -st.lease.deadline_s if core.returns.due_here(st) else math.inf
        return (due, len(st.lease.blocks))


@dataclass(frozen=True, slots=True)
class FurthestReturn:
    """The lease expected back last first (then the largest); with ``may_trim`` only the
    blocks an allocation lacks go, deepest first."""

    may_trim: bool = True

    def rank(self, core: PolicyCore[Any], st: TrajState[Any], now_s: float) -> tuple[float, int]:
        """See the class docstring."""
        assert st.lease is not None
        return (core.returns.expected_return_s(st, now_s), len(st.lease.blocks))


@dataclass(frozen=True, slots=True)
class TierAwareReturn:
    """:class:`FurthestReturn` where the engine keeps a lower tier.

    A lease whose whole context the tier already holds gives way first (its loss costs a
    reload, not a recompute), the one expected back last first. Between the others the
    victim is the lease with the most time until its return per second it would take to
    bring it back: ``(expected return - now) / cost per block``, the cost mixing reload
    (for the share of its prefix the tier holds) and recompute
    (:meth:`PolicyCore.block_cost_s`). Without a tier (``core.tier_share`` is None) the
    rank is :class:`FurthestReturn`'s. With ``may_trim`` only the blocks an allocation
    lacks go, deepest first.
    """

    may_trim: bool = True

    def rank(self, core: PolicyCore[Any], st: TrajState[Any], now_s: float) -> tuple[float, ...]:
        """See the class docstring."""
        assert st.lease is not None
        back = core.returns.expected_return_s(st, now_s)
        size = len(st.lease.blocks)
        if core.tier_share is None:
            return (0.0, back, size)
        share = core.tier_share(st)
        whole = 1.0 if share >= 1.0 else 0.0
        cost = core.block_cost_s(share)
        wait = max(0.0, back - now_s)
        score = wait / cost if cost > 0 and math.isfinite(wait) else wait
        return (whole, score, size)


# -- lease sizing ---------------------------------------------------------------------------
class LeaseSizing(Protocol):
    """Which finished turns get a lease, and how much of one the pool can keep."""

    @property
    def ranks_forecasts(self) -> bool:
        """Every paused context is a candidate ranked by its forecast (advice other than
        an explicit release is read as a forecast, not an order)."""
        ...

    def finish_action(
        self, intent: FinishIntent, *, lower_tier: bool, pending_retain: bool
    ) -> FinishAction:
        """What to do with a finished turn's context (see :data:`FinishAction`)."""
        ...

    def fit(
        self,
        core: PolicyCore[Any],
        st: TrajState[Any],
        n: int,
        now_s: float,
        *,
        free_blocks: int,
        demand_blocks: int,
    ) -> int:
        """How many of the ``n`` blocks the retained cap allows to lease (a prefix)."""
        ...


def _advised_release(intent: FinishIntent) -> bool:
    return intent.action == "release"


@dataclass(frozen=True, slots=True)
class AdvisedLeases:
    """Leases exactly as advised: ``retain`` (or a retain that arrived while the turn
    ran) gets a lease of its TTL; ``offload`` on a server with a lower tier frees the
    context and evicts it from device memory first (the tier holds it); ``release``
    demotes it."""

    ranks_forecasts: bool = False

    def finish_action(
        self, intent: FinishIntent, *, lower_tier: bool, pending_retain: bool
    ) -> FinishAction:
        """See the class docstring."""
        if _advised_release(intent):
            return "release"
        if intent.action == "offload" and lower_tier:
            return "offload"
        if intent.action == "retain" or pending_retain:
            return "lease"
        return "none"

    def fit(
        self,
        core: PolicyCore[Any],
        st: TrajState[Any],
        n: int,
        now_s: float,
        *,
        free_blocks: int,
        demand_blocks: int,
    ) -> int:
        """Whatever the cap allows."""
        return n


@dataclass(frozen=True, slots=True)
class PredictedLeases:
    """Every paused context is a lease candidate, ranked by its forecast (an explicit
    ``release`` still releases, unless its reason is ``capacity_pressure``: that is the
    client's guess at what the server ranks itself; ``offload`` on a server with a
    lower tier frees the context and evicts it from device memory first, the tier
    holding it). With ``decline``, when the pool is
    short of blocks for waiting work and this trajectory is the one expected back last
    (and its tenant is not within its share while another is over), its tail — or all
    of it — goes back to the pool at once."""

    decline: bool = True
    ranks_forecasts: bool = True

    def finish_action(
        self, intent: FinishIntent, *, lower_tier: bool, pending_retain: bool
    ) -> FinishAction:
        """See the class docstring."""
        if _advised_release(intent) and intent.reason != PRESSURE_REASON:
            return "release"
        if intent.action == "offload" and lower_tier:
            return "offload"
        return "candidate"

    def fit(
        self,
        core: PolicyCore[Any],
        st: TrajState[Any],
        n: int,
        now_s: float,
        *,
        free_blocks: int,
        demand_blocks: int,
    ) -> int:
        """See the class docstring."""
        if not self.decline or n <= 0:
            return n
        short = demand_blocks + core.reserve_blocks - free_blocks
        if short > 0 and core.returns_last(st, now_s) and not core.book.within_share(st, n):
            keep = max(0, n - short)
            if keep < n:
                core.counters.leases_declined += 1
                st.last_outcome = "declined"
            return keep
        return n


# -- admission ------------------------------------------------------------------------------
class Admission(Protocol):
    """Picks the waiting turns to hold back this scheduling step."""

    def plan(
        self,
        core: PolicyCore[Any],
        waiting: Iterable[tuple[TrajState[Any], int]],
        now_s: float,
        *,
        free_blocks: int,
        num_running: int,
    ) -> set[str]:
        """The keys of the trajectories whose waiting turns are held back.

        ``waiting``: ``(state, blocks it must allocate)`` per waiting turn, in the order
        the scheduler would admit them; ``free_blocks``: blocks the pool can hand out
        without ending a lease; ``num_running``: calls running now.
        """
        ...


@dataclass(frozen=True, slots=True)
class AdmitAll:
    """Holds nothing back: the engine's own order."""

    def plan(
        self,
        core: PolicyCore[Any],
        waiting: Iterable[tuple[TrajState[Any], int]],
        now_s: float,
        *,
        free_blocks: int,
        num_running: int,
    ) -> set[str]:
        """Nothing is held."""
        return set()


class _LeaseEntry(NamedTuple):
    back_s: float  # expected return
    size: int  # blocks
    key: str


@dataclass(frozen=True, slots=True)
class ProgramAdmission:
    """Program-level admission: a waiting turn is admitted when its trajectory's
    context is leased (resident), when its missing blocks fit in the free pool beside
    the leases (minus a reserve for running calls' growth), when it can take the
    blocks of leases expected back later than its own trajectory would be after this
    turn (Belady's rule between a paused context and one that wants to run), when
    nothing else would run (work-conserving), or once it has waited
    :meth:`PolicyCore.hold_limit_s`. Otherwise it is held back, so that turns that
    cannot fit do not evict the resident contexts and thrash.

    While fewer than ``min_running`` calls run, a turn is held only when waiting for
    the context due back first costs less than recomputing what admitting it would
    evict, at the prefill cost learned from the engine's steps.

    A turn the join waits on (:meth:`PolicyCore.urgent`: marked on the critical path, or
    a parent's turn back from a child's join) is never held, and the plan counts it
    first, so the room it takes is not promised to a turn ahead of it in the queue
    (which is held instead). Without such turns the plan is the queue's order.
    """

    def plan(
        self,
        core: PolicyCore[Any],
        waiting: Iterable[tuple[TrajState[Any], int]],
        now_s: float,
        *,
        free_blocks: int,
        num_running: int,
    ) -> set[str]:
        """See the class docstring."""
        held: set[str] = set()
        counters = core.counters
        budget = free_blocks - core.reserve_blocks - core.growth_reserve()
        running = num_running
        returns = core.returns
        leases = sorted(
            (
                _LeaseEntry(
                    returns.expected_return_s(st, now_s), len(st.lease.blocks), st.trajectory_id
                )
                for st in core.book.iter_leased()
                if st.lease is not None
            ),
            reverse=True,
        )
        taken = 0  # leading entries of ``leases`` already promised to admitted turns
        soonest = (leases[-1][0], leases[-1][1]) if leases else None  # due back first
        order = list(waiting)
        urgent = [w for w in order if core.urgent(w[0])]
        if urgent:  # the turns the join waits on take the room first
            order = urgent + [w for w in order if not core.urgent(w[0])]
        for st, need in order:
            waited = now_s - (st.waiting_since_s if st.waiting_since_s is not None else now_s)
            aging_s = core.hold_limit_s(st.tenant)
            resident = st.lease is not None
            fits = need <= budget
            busy = running >= core.settings.min_running or (
                not (resident or fits) and self._worth_waiting(core, need - budget, soonest, now_s)
            )
            reclaimed = False
            if not (resident or fits) and busy and waited < aging_s:
                fits, budget, taken = self._reclaim(core, st, need, budget, now_s, leases, taken)
                reclaimed = fits
            if resident or fits or waited >= aging_s or not busy or core.urgent(st):
                if st.held:
                    counters.held_ms += round(waited * 1000.0)
                    if not resident and not fits and waited >= aging_s:
                        counters.holds_aged_out += 1
                st.held = False
                if not reclaimed:
                    budget -= max(0, need)
                running += 1
                continue
            if not st.held:
                counters.turns_held += 1
            st.held = True
            held.add(st.trajectory_id)
        return held

    @staticmethod
    def _worth_waiting(
        core: PolicyCore[Any], short_blocks: int, soonest: tuple[float, int] | None, now_s: float
    ) -> bool:
        """Below ``min_running`` (the engine has room): is holding a turn that does not fit
        (by ``short_blocks``) cheaper than admitting it? ``soonest``: (expected return,
        size) of the lease due back first.

        Holding idles the engine until that context has come back *and run its turn*
        (the held turn still does not fit while it runs): its return time plus a mean
        turn time. Admitting evicts blocks that must be prefilled again: the larger of
        the shortfall and the context due back (it is the one the pool gives up), at the
        prefill cost learned from the engine's steps (or the lower tier's reload cost
        where that is cheaper), and that recompute delays two
        parties, the context's owner and the engine's next turn
        (:data:`IDLE_WAIT_RECOMPUTE_FACTOR`). So the turn is held only when the wait is
        the smaller, and the context is due back within ``idle_wait_turns`` mean turn
        times. Until a prefill step and a turn are seen, the turn is never held.
        """
        if soonest is None or core.settings.idle_wait_turns <= 0:
            return False
        per_block_s = core.eviction_s_per_block
        turn_s = core.turn_s
        if per_block_s <= 0 or turn_s <= 0:
            return False
        back_s, size = soonest
        if back_s - now_s > core.settings.idle_wait_turns * turn_s:
            return False
        wait_s = back_s - now_s + turn_s
        return wait_s <= IDLE_WAIT_RECOMPUTE_FACTOR * max(short_blocks, size) * per_block_s

    @staticmethod
    def _reclaim(
        core: PolicyCore[Any],
        st: TrajState[Any],
        need: int,
        budget: int,
        now_s: float,
        leases: list[_LeaseEntry],
        taken: int,
    ) -> tuple[bool, int, int]:
        """Can ``st`` run on the free budget plus leases expected back after it would be?

        Returns (fits, new budget, leases taken so far).
        """
        # Without a forecast of its own return, only leases not due back here are later.
        f = st.forecast
        horizon = math.inf if f is None else now_s + core.turn_s + core.returns.shifted(f.p50_s)
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


@dataclass(frozen=True, slots=True)
class Strategies:
    """One choice of each part."""

    victims: VictimOrder
    sizing: LeaseSizing
    admission: Admission


def make_strategies(settings: PolicySettings) -> Strategies:
    """The parts ``settings`` names: ``retention`` picks the victim order and the lease
    sizing (``trim`` and ``decline`` refine them), ``admission`` the admission.
    Predicted retention ranks victims with :class:`TierAwareReturn` (which is
    :class:`FurthestReturn` on an engine without a lower tier)."""
    if settings.retention == "hint":
        victims: VictimOrder = EarliestDeadline()
        sizing: LeaseSizing = AdvisedLeases()
    else:
        victims = TierAwareReturn(may_trim=settings.trim)
        sizing = PredictedLeases(decline=settings.decline)
    admission: Admission = ProgramAdmission() if settings.admission else AdmitAll()
    return Strategies(victims, sizing, admission)

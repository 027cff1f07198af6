"""Per-trajectory state and lease bookkeeping (pure; no vLLM import, no clock).

This is the mechanical half of the policy core (:mod:`agentkv.residency._core` holds the
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
  and their leases freed), so hostile traffic cannot grow memory without limit; each
  tenant also tracks at most ``max_trajectories_per_tenant`` (its own least recently
  seen go first), so one tenant cannot push another's trajectories out;
- block hashes are interned under one global budget (:mod:`agentkv.residency._hashes`);
- no lease outlives ``max_lease_lifetime_ms`` from the start of its pause, however
  often it is extended or taken again;
- a tenant holds more than ``tenant_retained_share`` of the retained cap only while
  no tenant under its share needs the room (:meth:`TrajectoryBook.make_room` takes the
  excess back, tail first);
- shares are divided by source first, then among a source's tenants
  (:meth:`TrajectoryBook.set_group`): a source that names many tenants (salts) divides
  its own part, not everyone's. A tenant without a source is a source of its own;
- lineage links a trajectory only to a tracked parent of its own tenant
  (:meth:`TrajectoryBook.set_lineage`): one tenant's parent id never names another's
  trajectory. A joining parent's lease (a child of it is active) outlives its deadline,
  but never ``max_ttl_ms`` from the lease's start nor ``max_lease_lifetime_ms`` from
  its pause's start.

Trajectory keys are opaque strings: the vLLM plugin passes a key scoped by tenant
(:mod:`agentkv.vllm._tenancy`), the simulator the trajectory id.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from agentkv.residency._forecast import Forecast
from agentkv.residency._hashes import HashIndex
from agentkv.residency._lag import LagStats
from agentkv.residency._settings import PolicySettings

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

OUTCOMES = ("reused", "expired", "pressure_released", "released", "replaced")


@dataclass
class Lease(Generic[B]):
    """Blocks held (one reference each) for a trajectory until ``deadline_s``."""

    blocks: list[B]
    deadline_s: float
    created_s: float
    ahead: int = 0  # trailing blocks brought back ahead of the return
    ahead_by: str = "rewarm"  # how: "rewarm" (recomputed) or "prefetch" (loaded from the tier)
    deferred: bool = False  # its expiry was put off while its trajectory waited on a join


@dataclass
class TrajState(Generic[B]):
    """What the core knows about one trajectory."""

    trajectory_id: str  # the book's key (the plugin's is scoped by tenant)
    last_seen_s: float
    tenant: str = ""  # opaque tenant key ("": the unsalted scope)
    hashes: Sequence[bytes] = ()  # interned; set only through TrajectoryBook.set_hashes
    own_from: int = 0  # hashes[own_from:] are blocks this trajectory computed itself
    closed: bool = False  # finished or cancelled: a late turn gets no lease
    reopening: bool = False  # closed, and a turn 0 came: the id reopens if turn 1 follows
    last_priority: int | None = None  # what the driver gave its last request
    lease: Lease[B] | None = None
    pending_deadline_s: float | None = None
    last_outcome: str | None = None
    attained_tokens: int = 0
    # live requests of it here: request id -> may its finish leave a lease (False: it
    # was still running when the trajectory finished or was cancelled)
    live_requests: dict[str, bool] = field(default_factory=dict)
    paused_at_s: float | None = None  # its last turn finished then (None: running or new)
    forecast: Forecast | None = None  # expected idle gap of the current pause
    waiting_since_s: float | None = None  # a turn of it waits for admission since then
    held: bool = False  # admission held that turn back at the last decision
    running: bool = False  # a turn of it is admitted and not finished
    scheduled_at_s: float | None = None  # when its running turn was admitted
    context_blocks: int = 0  # blocks its context held when its last turn finished
    growth_blocks: int = 0  # how much its context grew over its last turn
    last_turn: int | None = None  # turn id of its last call that arrived here
    roaming: bool = False  # that call did not follow its previous turn here (see core)
    unsettled_return: bool | None = None  # did it follow? counted once the call settles
    parent_key: str | None = None  # its parent's key (same tenant), set by set_lineage
    critical_path: bool | None = None  # its client's mark: the join waits on it (None: unsaid)
    join_return: bool = False  # its waiting turn returns from a join (a child ran meanwhile)


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
    held_ms: int = 0  # time held turns waited, summed (from arrival to release)
    forecasts_updated: int = 0
    offloads: int = 0
    rewarms: int = 0
    rewarm_blocks: int = 0
    rewarm_blocks_used: int = 0
    rewarm_blocks_wasted: int = 0
    prefetches: int = 0  # leases of contexts loaded back from the lower tier ahead of use
    prefetch_blocks: int = 0
    prefetch_blocks_used: int = 0
    prefetch_blocks_wasted: int = 0
    leases_reclaimed: int = 0  # tails taken back from tenants over their share
    hashes_dropped: int = 0  # hashes not kept for the global hash budget
    trajectories_evicted: int = 0  # forgotten for the global or a tenant's quota
    events_rejected: int = 0
    hints_observed: int = 0  # from observe / shadow clients: counted, not applied
    leases_refused: int = 0  # late turns, aborted or errored requests, spent lifetimes
    turns_roaming: int = 0  # arrived without their previous turn here (another replica's)
    hints_late: int = 0  # retains that came after (some of) the context's blocks had left
    hint_late_blocks: int = 0  # the blocks those retains found already evicted
    priorities_clamped: int = 0  # requests whose own priority was outside the client bound
    lineage_protected: int = 0  # victims chosen past a joining parent's or critical lease
    lineage_expiry_deferred: int = 0  # leases kept past their deadline for a child's join


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

    def __init__(
        self, settings: PolicySettings, num_blocks: int, counters: Counters | None = None
    ) -> None:
        self.settings = settings
        self.num_blocks = max(1, num_blocks)
        self.counters = Counters() if counters is None else counters
        self._trajs: OrderedDict[str, TrajState[B]] = OrderedDict()
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        self._leased: dict[str, TrajState[B]] = {}  # running index: no scan per step
        self._pending: dict[str, TrajState[B]] = {}
        self._tenant_retained: dict[str, int] = {}
        self._groups: dict[str, str] = {}  # tenant -> its source (absent: its own)
        self._children: dict[str, dict[str, None]] = {}  # parent key -> its children's keys
        self._hashes = HashIndex(settings.max_hash_refs)
        self._to_free: list[list[B]] = []
        self.lags = LagStats()
        self._retained = 0

    # -- trajectory index ------------------------------------------------------------
    def get(self, trajectory_id: str) -> TrajState[B] | None:
        """Return the state of a known trajectory, or None."""
        return self._trajs.get(trajectory_id)

    def state(self, trajectory_id: str, now_s: float, tenant: str = "") -> TrajState[B]:
        """Return (creating if needed) a trajectory's state and mark it recently seen.

        A new trajectory beyond its tenant's quota pushes out that tenant's least
        recently seen one; beyond the global bound, the least recently seen of all.
        """
        st = self._trajs.get(trajectory_id)
        if st is not None:
            st.last_seen_s = now_s
            self._trajs.move_to_end(trajectory_id)
            self._by_tenant[st.tenant].move_to_end(trajectory_id)
            return st
        st = TrajState(trajectory_id=trajectory_id, last_seen_s=now_s, tenant=tenant)
        self._trajs[trajectory_id] = st
        mine = self._by_tenant.setdefault(tenant, OrderedDict())
        mine[trajectory_id] = None
        while len(mine) > max(1, self.settings.max_trajectories_per_tenant):
            self._drop(self._evictable(self._trajs[k] for k in mine if k != trajectory_id))
        while len(self._trajs) > max(1, self.settings.max_trajectories):
            self._drop(self._evictable(o for o in self._trajs.values() if o is not st))
        return st

    @staticmethod
    def _evictable(order: Iterable[TrajState[B]]) -> TrajState[B]:
        """The state to forget for a quota, from ``order`` (least recently seen first):
        the first without a lease or a live request, else the first without a lease, else
        the first. Leases are protected by the retained cap and the tenants' shares, not by
        the trajectory bound: a flood of made-up ids or salts forgets its own idle states,
        never another tenant's lease."""
        first = idle_ok = None
        for o in order:
            if first is None:
                first = o
            if o.lease is None:
                if not o.live_requests:
                    return o
                if idle_ok is None:
                    idle_ok = o
        chosen = idle_ok if idle_ok is not None else first
        assert chosen is not None, "a quota is over only when there are states to forget"
        return chosen

    def _drop(self, st: TrajState[B], outcome: str = "expired") -> None:
        if st.lease is not None:
            self._end_lease(st, outcome)
        self.set_hashes(st, [])
        self.set_pending(st, None)
        self._unlink(st)
        for key in self._children.pop(st.trajectory_id, ()):
            child = self._trajs.get(key)
            if child is not None:
                child.parent_key = None
        self._trajs.pop(st.trajectory_id, None)
        mine = self._by_tenant.get(st.tenant)
        if mine is not None:
            mine.pop(st.trajectory_id, None)
            if not mine:
                del self._by_tenant[st.tenant]
                self._groups.pop(st.tenant, None)
        if outcome == "expired":
            self.counters.trajectories_evicted += 1

    def states(self) -> list[TrajState[B]]:
        """Every tracked trajectory, least recently seen first."""
        return list(self._trajs.values())

    def iter_states(self) -> Iterator[TrajState[B]]:
        """Every tracked trajectory, least recently seen first (do not add or drop any
        while iterating)."""
        return iter(self._trajs.values())

    def iter_leased(self) -> Iterator[TrajState[B]]:
        """The trajectories holding a lease, in the order their leases began (do not
        grant or end leases while iterating)."""
        return iter(self._leased.values())

    @property
    def num_tenants(self) -> int:
        """How many tenants have tracked trajectories."""
        return len(self._by_tenant)

    def set_group(self, tenant: str, group: str | None) -> None:
        """``tenant``'s requests come from the source ``group`` (the driver's opaque key,
        never a tenant key; None: unknown, the last known source stays). Kept while the
        tenant has tracked trajectories."""
        if group is not None and tenant in self._by_tenant:
            self._groups[tenant] = group

    def tenant_size(self, tenant: str) -> int:
        """How many trajectories ``tenant`` has tracked."""
        return len(self._by_tenant.get(tenant, ()))

    def __len__(self) -> int:
        return len(self._trajs)

    # -- lineage -----------------------------------------------------------------------
    def set_lineage(
        self, st: TrajState[B], parent_key: str | None, critical_path: bool | None
    ) -> bool:
        """Record what ``st``'s latest hinted request said of its lineage: its client's
        ``critical_path`` mark, and its parent's key. The parent is linked only when it is
        a tracked trajectory of ``st``'s own tenant (a key the driver scoped the same way;
        a parent id of another tenant, or one never seen here, links nothing), and never
        ``st`` itself. Returns True when ``st`` has a parent now."""
        st.critical_path = critical_path
        parent = self._trajs.get(parent_key) if parent_key is not None else None
        if parent is None or parent is st or parent.tenant != st.tenant:
            self._unlink(st)
            return False
        if st.parent_key != parent.trajectory_id:
            self._unlink(st)
            st.parent_key = parent.trajectory_id
            self._children.setdefault(parent.trajectory_id, {})[st.trajectory_id] = None
        return True

    def _unlink(self, st: TrajState[B]) -> None:
        if st.parent_key is None:
            return
        mine = self._children.get(st.parent_key)
        if mine is not None:
            mine.pop(st.trajectory_id, None)
            if not mine:
                del self._children[st.parent_key]
        st.parent_key = None

    def children(self, st: TrajState[B]) -> Iterator[TrajState[B]]:
        """The tracked trajectories whose parent is ``st``."""
        for key in self._children.get(st.trajectory_id, ()):
            child = self._trajs.get(key)
            if child is not None:
                yield child

    def joining(self, st: TrajState[B]) -> bool:
        """Is ``st`` a parent waiting on a child's join: a child of it is active (not
        finished, and a turn of it waits or runs, or its paused context is leased)?"""
        if st.trajectory_id not in self._children:
            return False
        return any(
            not c.closed and (c.running or c.live_requests or c.lease is not None
                              or c.waiting_since_s is not None)
            for c in self.children(st)
        )  # fmt: skip

    def child_seen_since(self, st: TrajState[B], since_s: float) -> bool:
        """Did a request of a child of ``st`` arrive or finish at or after ``since_s``?"""
        return any(c.last_seen_s >= since_s for c in self.children(st))

    def lineage_level(self, st: TrajState[B]) -> int:
        """How readily ``st``'s lease gives way to pressure for its lineage (higher: sooner):
        3 marked off the critical path, 2 unmarked, 1 on the critical path, 0 a parent
        waiting on a child's join (:meth:`joining`)."""
        if self.joining(st):
            return 0
        if st.critical_path is None:
            return 2
        return 1 if st.critical_path else 3

    # -- shared-prefix interest --------------------------------------------------------
    def set_hashes(
        self, st: TrajState[B], hashes: Sequence[bytes], computed_from: int | None = None
    ) -> None:
        """Record the block hashes a trajectory's last request covered (interned, bounded).

        ``computed_from``: the request found its first that many blocks in the cache
        (None: it computed them all). What the trajectory computed itself, on this turn
        or an earlier one of the same context, is what release may demote.
        """
        new = list(hashes[: self.settings.max_hashes_per_trajectory])
        old = st.hashes
        extends = bool(old) and len(new) >= len(old) and new[len(old) - 1] == old[-1]
        fits = self._hashes.room() + len(old)
        if len(new) > fits:
            fits += self._free_hash_room(len(new) - fits, st)
        if len(new) > fits:
            self.counters.hashes_dropped += len(new) - fits
            del new[fits:]
        st.hashes = self._hashes.replace(old, new)
        mine = 0 if computed_from is None else max(0, computed_from)
        st.own_from = min(st.own_from, mine) if extends else mine

    def _free_hash_room(self, wanted: int, keep: TrajState[B]) -> int:
        """Drop idle trajectories' hashes (least recently seen first) to free ``wanted``."""
        freed = 0
        for other in self._trajs.values():
            if freed >= wanted:
                break
            if other is keep or other.lease is not None or other.live_requests or other.running:
                continue
            if other.hashes:
                n = len(other.hashes)
                self.counters.hashes_dropped += n
                other.hashes = self._hashes.replace(other.hashes, ())
                freed += n
        return freed

    def shared_with_others(self, block_hash: bytes, st: TrajState[B]) -> bool:
        """True when a trajectory other than ``st`` also covers ``block_hash``."""
        n = self._hashes.count(block_hash)
        if n != 1:
            return n > 1
        return block_hash not in st.hashes

    def own_unshared(self, st: TrajState[B]) -> list[bytes]:
        """``st``'s hashes that it computed itself and no other trajectory covers, deepest
        first: the only blocks a release may demote."""
        count = self._hashes.count
        tail = st.hashes[st.own_from :]
        return [h for h in reversed(tail) if count(h) == 1]

    @property
    def hashes_interned(self) -> int:
        """Distinct hash values held."""
        return len(self._hashes)

    @property
    def hash_refs(self) -> int:
        """Hash references held by all trajectories (bounded by ``max_hash_refs``)."""
        return self._hashes.refs

    def forget_trajectory(self, st: TrajState[B]) -> None:
        """Drop a finished trajectory entirely (its lease, if any, is ended as released)."""
        self._drop(st, "released")

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
        return list(self._leased.values())

    @property
    def leases_active(self) -> int:
        """Number of trajectories holding a lease."""
        return len(self._leased)

    @property
    def retained_cap(self) -> int:
        """The most blocks all leases may hold together."""
        return int(self.settings.max_retained_fraction * self.num_blocks)

    def allowance(self, st: TrajState[B] | None = None) -> int:
        """How many more blocks a lease for ``st`` may hold under the retained cap."""
        mine = len(st.lease.blocks) if st is not None and st.lease is not None else 0
        return max(0, self.retained_cap - (self._retained - mine))

    def tenant_retained(self, tenant: str) -> int:
        """Blocks the leases of ``tenant`` hold."""
        return self._tenant_retained.get(tenant, 0)

    @property
    def tenant_share(self) -> int:
        """Blocks of the retained cap each tenant keeps even when others filled it: at
        most ``tenant_retained_share`` of the cap, and no more than an equal part among the
        tenants holding leases (so that two or more tenants at the share's edge cannot
        leave a third with nothing)."""
        return self.share_for(None)

    def share_for(self, tenant: str | None) -> int:
        """:attr:`tenant_share` as ``tenant`` sees it: the tenants holding leases, with
        ``tenant`` counted among them when it holds none yet (None: the part of a source
        with one tenant)."""
        if tenant is None:
            sources = {self._groups.get(t, t) for t in self._tenant_retained}
            cap = int(self.settings.tenant_retained_share * self.retained_cap)
            return min(cap, self.retained_cap // len(sources)) if len(sources) > 1 else cap
        return self._shares(tenant)[tenant]

    def _shares(self, among: str) -> dict[str, int]:
        """Each lease holder's share, and ``among``'s, with ``among`` counted as a holder:
        the cap's part of each source (an equal part, at most ``tenant_retained_share``),
        divided equally among that source's holders."""
        holders = [*self._tenant_retained]
        if among not in self._tenant_retained:
            holders.append(among)
        cap = int(self.settings.tenant_retained_share * self.retained_cap)
        if len(holders) <= 1:
            return dict.fromkeys(holders, cap)
        group = self._groups.get
        sizes = Counter(group(t, t) for t in holders)
        parts = len(sizes)
        return {t: min(cap, self.retained_cap // (parts * sizes[group(t, t)])) for t in holders}

    def tenants_over_share(self) -> set[str]:
        """The lease holders retaining more than their share (:meth:`share_for`)."""
        held = self._tenant_retained
        if len(held) <= 1:
            return set()
        shares = self._shares(next(iter(held)))
        return {t for t, r in held.items() if r > shares[t]}

    def within_share(self, st: TrajState[B], n: int) -> bool:
        """True when a lease of ``n`` blocks keeps ``st``'s tenant within its share while
        another tenant holds more than its own: the pool's shortage is theirs to give."""
        shares = self._shares(st.tenant)
        mine = self.tenant_retained(st.tenant) - (len(st.lease.blocks) if st.lease else 0)
        return mine + n <= shares[st.tenant] and any(
            r > shares[t] for t, r in self._tenant_retained.items() if t != st.tenant
        )

    def make_room(self, st: TrajState[B], wanted: int) -> int:
        """Before a lease of ``wanted`` blocks for ``st``: when its tenant is under its share
        of the retained cap and the cap has no room, take the excess of tenants over their
        share back (tails of their largest leases first). Returns the blocks taken back."""
        shares = self._shares(st.tenant)
        share = shares[st.tenant]
        mine = self.tenant_retained(st.tenant) - (len(st.lease.blocks) if st.lease else 0)
        need = min(wanted, max(0, share - mine)) - self.allowance(st)
        taken = 0
        while need > 0:
            over = [(r - shares[t], t) for t, r in self._tenant_retained.items() if t != st.tenant]
            excess, tenant = max(over, default=(0, ""))
            if excess <= 0:
                break
            victim = max(
                (o for o in self._leased.values() if o.tenant == tenant),
                key=lambda o: len(o.lease.blocks) if o.lease is not None else 0,
            )
            size = len(victim.lease.blocks) if victim.lease is not None else 0
            give = self.trim_lease(victim, size - min(need, excess, size))
            self.counters.leases_reclaimed += 1
            taken += give
            need -= give
        return taken

    def lease_deadline_s(self, st: TrajState[B], ttl_ms: int | None, now_s: float) -> float:
        """``now + ttl`` (capped by ``max_ttl_ms``), and never later than
        ``max_lease_lifetime_ms`` after ``st``'s pause began: extending or taking a lease
        again cannot keep blocks longer than that."""
        deadline = now_s + self.clamp_ttl_ms(ttl_ms) / 1000.0
        anchor = st.paused_at_s if st.paused_at_s is not None else now_s
        return min(deadline, anchor + max(0, self.settings.max_lease_lifetime_ms) / 1000.0)

    def set_lease(self, st: TrajState[B], blocks: list[B], ttl_ms: int, now_s: float) -> None:
        """Give ``st`` a lease on ``blocks`` (references already taken by the caller).

        ``blocks`` must fit the allowance (callers size it with the core's plan). A
        previous lease of the same trajectory is ended (its blocks queued for freeing
        after the new references were taken, so no block is dropped in between).
        """
        if st.lease is not None:
            self._end_lease(st, "replaced")
        deadline = self.lease_deadline_s(st, ttl_ms, now_s)
        st.lease = Lease(blocks=list(blocks), deadline_s=deadline, created_s=now_s)
        self._leased[st.trajectory_id] = st
        self._add_retained(st, len(blocks))
        self.set_pending(st, None)
        st.last_outcome = "leased"
        self.counters.leases_created += 1

    def extend_lease(self, st: TrajState[B], ttl_ms: int, now_s: float) -> None:
        """Move an existing lease's deadline to ``now + ttl`` (capped, lifetime included)."""
        if st.lease is not None:
            st.lease.deadline_s = self.lease_deadline_s(st, ttl_ms, now_s)

    def set_pending(self, st: TrajState[B], deadline_s: float | None) -> None:
        """Remember a retain that arrived while a turn of ``st`` ran (None: forget it)."""
        st.pending_deadline_s = deadline_s
        if deadline_s is None:
            self._pending.pop(st.trajectory_id, None)
        else:
            self._pending[st.trajectory_id] = st

    def _add_retained(self, st: TrajState[B], n: int) -> None:
        self._retained += n
        left = self._tenant_retained.get(st.tenant, 0) + n
        if left > 0:
            self._tenant_retained[st.tenant] = left
        else:
            self._tenant_retained.pop(st.tenant, None)

    def note_capped(self, st: TrajState[B]) -> None:
        """Record that a lease was truncated or refused by the retained cap."""
        self.counters.leases_capped += 1
        st.last_outcome = "capped"

    def _end_lease(self, st: TrajState[B], outcome: str) -> None:
        assert st.lease is not None
        if st.lease.ahead:
            kind = "used" if outcome == "reused" else "wasted"
            name = f"{st.lease.ahead_by}_blocks_{kind}"
            setattr(self.counters, name, getattr(self.counters, name) + st.lease.ahead)
        self._add_retained(st, -len(st.lease.blocks))
        self._to_free.append(st.lease.blocks)
        st.lease = None
        self._leased.pop(st.trajectory_id, None)
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
        lost = min(lease.ahead, len(tail))  # blocks brought back ahead are the tail
        lease.ahead -= lost
        name = f"{lease.ahead_by}_blocks_wasted"
        setattr(self.counters, name, getattr(self.counters, name) + lost)
        self._add_retained(st, -len(tail))
        self._to_free.append(tail)
        self.counters.leases_trimmed += 1
        return len(tail)

    def expire(self, now_s: float) -> int:
        """End every lease whose deadline has passed; returns how many ended.

        A lease whose trajectory is back (a turn of it waits for admission) does not
        expire: the return it was kept for has come, and a queue's wait is not the
        client's pause. It ends when the turn is admitted (reused), under pressure, or
        when the waiting request ends without running. Nor does the lease of a parent
        waiting on a child's join (:meth:`joining`), until :meth:`hard_deadline_s`
        (counted once per lease as ``lineage_expiry_deferred``)."""
        due = [
            st
            for st in self._leased.values()
            if st.lease is not None and st.lease.deadline_s <= now_s and st.waiting_since_s is None
        ]
        if due and self._children:
            due = [st for st in due if not self._defer(st, now_s)]
        if len(due) > 1:  # free in the index's order (least recently seen first)
            ids = {id(st) for st in due}
            due = [st for st in self._trajs.values() if id(st) in ids]
        for st in due:
            self._end_lease(st, "expired")
        for st in list(self._pending.values()):
            if st.pending_deadline_s is not None and st.pending_deadline_s <= now_s:
                self.set_pending(st, None)
        return len(due)

    def hard_deadline_s(self, st: TrajState[B]) -> float:
        """The latest end of ``st``'s lease however long a join lasts: ``max_ttl_ms`` after
        the lease began, and no later than ``max_lease_lifetime_ms`` after its pause began."""
        lease = st.lease
        assert lease is not None
        anchor = st.paused_at_s if st.paused_at_s is not None else lease.created_s
        return min(
            lease.created_s + max(0, self.settings.max_ttl_ms) / 1000.0,
            anchor + max(0, self.settings.max_lease_lifetime_ms) / 1000.0,
        )

    def _defer(self, st: TrajState[B], now_s: float) -> bool:
        """Keep ``st``'s lease past its deadline: it waits on a child's join, and its hard
        deadline has not come."""
        lease = st.lease
        if lease is None or now_s >= self.hard_deadline_s(st) or not self.joining(st):
            return False
        if not lease.deferred:
            lease.deferred = True
            self.counters.lineage_expiry_deferred += 1
        return True

    def release_all(self, outcome: str = "released") -> None:
        """End every lease (used before a prefix-cache reset)."""
        for st in [st for st in self._trajs.values() if st.lease is not None]:
            self._end_lease(st, outcome)

    def note_ahead(self, st: TrajState[B], blocks: int, by: str = "rewarm") -> None:
        """``st``'s new lease holds ``blocks`` blocks at its tail brought back ahead of
        its return ``by`` recompute (``rewarm``) or a load from the lower tier
        (``prefetch``); counted as used when its turn takes the lease, else wasted."""
        if st.lease is not None and blocks > 0:
            st.lease.ahead = min(blocks, len(st.lease.blocks))
            st.lease.ahead_by = by
            counters = self.counters
            if by == "rewarm":
                counters.rewarms += 1
                counters.rewarm_blocks += st.lease.ahead
            else:
                counters.prefetches += 1
                counters.prefetch_blocks += st.lease.ahead

    def drain_frees(self) -> list[list[B]]:
        """Take the block lists whose references the driver must now drop (root first)."""
        out, self._to_free = self._to_free, []
        return out

    # -- lag and stats ---------------------------------------------------------------
    def record_lag_ms(self, lag_ms: float) -> None:
        """Record the delay between an event's emission and its receipt."""
        self.lags.record_ms(lag_ms)

    def stats(self) -> dict[str, float | int]:
        """Counters plus gauges, as served by ``GET /agentkv/v1/stats``."""
        out: dict[str, float | int] = {
            "leases_active": self.leases_active,
            "retained_blocks": self.retained_blocks,
            "trajectories_tracked": len(self._trajs),
            "tenants_tracked": len(self._by_tenant),
            "hashes_interned": len(self._hashes),
            "hash_refs": self._hashes.refs,
        }
        out.update(vars(self.counters))
        out["hint_lag_ms_p50"] = self.lags.median_ms()
        return out

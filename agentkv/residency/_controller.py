"""The residency controller: the lifecycle sequence, once, over a port to a block pool.

The vLLM scheduler plugin and the simulator each own a block pool and a scheduler; both
call this controller at the same lifecycle moments, and it alone calls the policy core
and applies what the core decides to the pool, through a :class:`BlockPort` (vLLM's
block pool in :mod:`agentkv.vllm._blockport`, the simulator's in
:mod:`agentkv.sim._blockport`):

- :meth:`ResidencyController.on_arrive` — a turn's request arrived (a late turn of a
  finished trajectory is marked; a turn 0 reopens the id);
- :meth:`ResidencyController.on_admitted` — the scheduler admitted it (its lease, if
  any, is handed over);
- :meth:`ResidencyController.on_finish` then :meth:`ResidencyController.after_free` —
  the turn finished: what the advice (a :class:`FinishIntent`) and the lease sizing say
  is done before the engine frees the request's blocks (a lease takes its own
  reference) and after (a release or an offload demotes the trajectory's own blocks);
- :meth:`ResidencyController.on_tool_start` / :meth:`ResidencyController.on_advice` —
  out-of-band advice between turns (a better forecast, a retain, a release);
- :meth:`ResidencyController.on_end` — the trajectory finished or was cancelled;
- :meth:`ResidencyController.give_way` — an allocation failed: a lease gives way;
- :meth:`ResidencyController.expire` and :meth:`ResidencyController.plan_admission` —
  before each scheduling step.

Counters of these moments are bumped here and nowhere else. Pure: no I/O, time passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

from agentkv.residency._book import Counters, TrajectoryBook, TrajState
from agentkv.residency._core import PolicyCore
from agentkv.residency._forecast import Forecast
from agentkv.residency._strategies import PRESSURE_REASON, FinishAction, FinishIntent

__all__ = ["BlockPort", "ResidencyController"]

B = TypeVar("B")


class BlockPort(Protocol[B]):
    """What the controller needs from an engine's block pool.

    Blocks are opaque; hashes are the chained block hashes a trajectory's requests
    covered (``bytes``). ``blocks_per_hash`` is the number of KV-cache groups: every hash
    stands for one block in each.
    """

    @property
    def blocks_per_hash(self) -> int:
        """Blocks one hash stands for (KV-cache groups; 1 in the simulator)."""
        ...

    def num_free(self) -> int:
        """Blocks the pool can hand out now (leased ones excluded)."""
        ...

    def cached_prefix(self, hashes: Sequence[bytes]) -> list[B]:
        """The cached blocks of the longest cached prefix of ``hashes``, hash by hash
        (every group's block of a hash before the next hash's)."""
        ...

    def take(self, blocks: list[B]) -> None:
        """Take one reference on each of ``blocks`` (cached ones leave the free queue)."""
        ...

    def free(self, blocks: list[B]) -> None:
        """Drop one reference on each of ``blocks`` (given root first; the deepest is
        freed first, so it is evicted first)."""
        ...

    def demote(self, hashes: Sequence[bytes]) -> int:
        """Move the free cached blocks of ``hashes`` (given deepest first) to the head
        of the eviction order, deepest first; returns how many moved."""
        ...

    def offload(self, hashes: Sequence[bytes]) -> None:
        """The lower tier must hold the blocks of ``hashes`` (a no-op where the engine's
        connector already stores every computed block)."""
        ...

    # Optional: ``tier_holds(hashes) -> int``, how many leading hashes of ``hashes`` the
    # lower tier holds (every group's block). Without it the tier's content is unknown
    # and pressure weighs every lease as a recompute. ``reload_s_per_block() -> float |
    # None``: seconds to load one block back (None: not known yet).


class ResidencyController(Generic[B]):
    """The lifecycle sequence of residency (see the module docstring).

    ``lower_tier``: the engine keeps evicted blocks in a lower tier (``offload`` advice
    means something); ``lifecycle``: leases, release and the pressure override are on
    (off, the controller only keeps state); ``demand``: the blocks admitted waiting work
    needs now, when the driver can tell at any moment (default: what the last
    :meth:`plan_admission` admitted).
    """

    def __init__(
        self,
        core: PolicyCore[B],
        port: BlockPort[B],
        *,
        lower_tier: bool = False,
        lifecycle: bool = True,
        demand: Callable[[], int] | None = None,
    ) -> None:
        self.core = core
        self.port = port
        reload = getattr(port, "reload_s_per_block", None)
        core.reload_s_per_block = reload() if callable(reload) else None
        holds = getattr(port, "tier_holds", None)
        if lower_tier and callable(holds):
            core.tier_share = self._tier_share
        self._tier_holds = holds
        self.lower_tier = lower_tier
        self.lifecycle = lifecycle
        self._demand = demand
        self.demand_blocks = 0  # what the last plan_admission admitted (see ``demand``)

    def _tier_share(self, st: TrajState[B]) -> float:
        """Share of ``st``'s leased prefix the lower tier holds (0.0 without a lease)."""
        lease = st.lease
        if lease is None or not lease.blocks or self._tier_holds is None:
            return 0.0
        n = min(len(st.hashes), len(lease.blocks) // max(1, self.port.blocks_per_hash))
        if n <= 0:
            return 0.0
        return min(1.0, int(self._tier_holds(st.hashes[:n])) / n)

    @property
    def book(self) -> TrajectoryBook[B]:
        """The core's trajectory book."""
        return self.core.book

    @property
    def counters(self) -> Counters:
        """The core's counters."""
        return self.core.book.counters

    # -- arrivals and admission --------------------------------------------------------
    def on_arrive(
        self,
        key: str,
        now_s: float,
        *,
        tenant: str = "",
        turn: int | None = None,
        request_id: str | None = None,
    ) -> TrajState[B]:
        """A request of trajectory ``key`` arrived and waits for admission.

        A trajectory that finished or was cancelled stays closed: a late turn of it gets
        no lease when it finishes. A turn 0 may be a retry of the run that ended or the
        id's new run (a LangGraph thread): it gets no lease either, and the id reopens
        when turn 1 follows it. ``request_id`` tracks the request until :meth:`on_finish`.
        """
        st = self.book.state(key, now_s, tenant)
        lease_ok = True
        if st.closed:
            if turn == 1 and st.reopening:
                st.closed = st.reopening = False
            else:
                st.reopening = turn == 0
                lease_ok = False
        self.core.on_waiting(st, now_s, turn)
        if request_id is not None:
            st.live_requests[request_id] = lease_ok
        return st

    def assign_priority(self, st: TrajState[B], advised: int | None, base: int) -> int:
        """The bounded priority of ``st``'s new request (see
        :meth:`PolicyCore.assign_priority`); remembered as its last priority."""
        st.last_priority = self.core.assign_priority(st, advised, base)
        return st.last_priority

    def on_admitted(self, key: str, now_s: float) -> None:
        """A turn of ``key`` was admitted: its lease is handed over to the request."""
        st = self.book.get(key)
        if st is not None:
            self.core.on_scheduled(st, now_s)
            self._apply_frees()

    def expire(self, now_s: float) -> int:
        """End every lease past its deadline (before a scheduling step); how many."""
        n = self.book.expire(now_s)
        if n:
            self._apply_frees()
        return n

    def plan_admission(
        self,
        waiting: Iterable[tuple[TrajState[B], int]],
        now_s: float,
        *,
        free_blocks: int,
        num_running: int,
    ) -> set[str]:
        """The keys of the waiting turns held back this step; ``waiting`` lists
        ``(state, blocks it must allocate)`` in admission order."""
        waiting = list(waiting)
        held = self.core.plan_admission(
            waiting, now_s, free_blocks=free_blocks, num_running=num_running
        )
        self.demand_blocks = sum(n for st, n in waiting if st.trajectory_id not in held)
        return held

    # -- a turn finishes ---------------------------------------------------------------
    def on_finish(
        self,
        key: str,
        intent: FinishIntent,
        now_s: float,
        *,
        hashes: Sequence[bytes],
        computed_from: int | None,
        tenant: str = "",
        leasable: bool = True,
        context_blocks: int | None = None,
        request_id: str | None = None,
    ) -> FinishAction:
        """A turn of ``key`` finished, before the engine frees its blocks.

        ``hashes``: the block hashes its request covered; ``computed_from``: how many of
        them it found cached (None: it computed them all); ``leasable``: it ended
        normally (an aborted or failed request leaves no lease); ``context_blocks``: the
        blocks its context holds (default: its hashes, in every group). A lease taken here
        holds its own references. Returns what :meth:`after_free` must do once the
        engine freed the request's blocks (``release``, ``offload`` or ``none``).
        """
        st = self.book.state(key, now_s, tenant)
        lease_ok = st.live_requests.pop(request_id, True) if request_id is not None else True
        self.book.set_hashes(st, hashes, computed_from)
        if not self.lifecycle:
            return "none"
        pending = st.pending_deadline_s
        what = self.core.strategies.sizing.finish_action(
            intent,
            lower_tier=self.lower_tier,
            pending_retain=pending is not None and pending > now_s,
        )
        if what == "release":
            return "release"
        blocks = len(st.hashes) * self.port.blocks_per_hash
        if context_blocks is not None:
            blocks = context_blocks
        if not (leasable and lease_ok) or st.closed:
            # A late turn of a finished trajectory, or an aborted or failed request.
            self.counters.leases_refused += 1
            self.book.set_pending(st, None)
            self.core.on_finished(st, now_s, None, blocks)
            return "none"
        if what == "candidate":
            # Ranked by the client's gap forecast; the lease lasts the advised TTL (the
            # cap without one: a crashed client's lease ends when it said it would) and
            # pressure ends it earlier.
            self.core.on_finished(st, now_s, intent.forecast, blocks)
            self._lease(st, self.book.clamp_ttl_ms(intent.ttl_ms), now_s)
        elif what == "lease":
            if intent.action == "retain":
                ttl_ms = self.book.clamp_ttl_ms(intent.ttl_ms)
            else:  # a retain that arrived while the turn ran
                ttl_ms = int(((pending or now_s) - now_s) * 1000)
            self.core.on_finished(st, now_s, Forecast.from_ttl_ms(ttl_ms), blocks)
            self._lease(st, ttl_ms, now_s)
        else:
            self.core.on_finished(st, now_s, intent.forecast, blocks)
            if what == "offload":
                return "offload"
        return "none"

    def after_free(self, key: str, what: FinishAction) -> int:
        """After the engine freed a finished turn's blocks: a release or an offload
        demotes the trajectory's own blocks (evicted first); returns how many."""
        st = self.book.get(key)
        if st is None or what not in ("release", "offload"):
            return 0
        if what == "release":
            return self.release(st)
        return self.offload(st)

    def offload(self, st: TrajState[B]) -> int:
        """The lower tier keeps ``st``'s context and device memory lets it go first: its
        lease ends, the tier is told to hold its blocks, its own unshared blocks are
        demoted (evicted first); its hashes are kept (it is expected back). Returns how
        many blocks were demoted."""
        self.counters.offloads += 1
        self.port.offload(st.hashes)
        n = self._demote(st)
        st.last_outcome = "offloaded"
        return n

    # -- between turns -------------------------------------------------------------------
    def on_tool_start(
        self, st: TrajState[B], forecast: Forecast | None, now_s: float, ttl_ms: int | None = None
    ) -> str | None:
        """A better forecast of ``st``'s pause (the tool that runs is known now) replaces
        the one its request carried; a paused context without a lease is offered one
        again, for ``ttl_ms`` (the cap without one). Returns why a lease was refused, or
        None."""
        if forecast is None or not self.core.update_forecast(st, forecast):
            return None
        self.counters.forecasts_updated += 1
        if st.lease is None and not st.live_requests and st.hashes:
            return self.retain(st, ttl_ms, now_s)
        return None

    def on_advice(self, st: TrajState[B], intent: FinishIntent, now_s: float) -> str | None:
        """Advice that arrived between turns (the control route's events). Where the
        lease sizing ranks forecasts, advice other than an explicit release is a better
        forecast (:meth:`on_tool_start`); otherwise ``release`` releases and ``retain``
        leases (:meth:`retain`). ``offload`` for a paused context on an engine with a
        lower tier is honoured under either sizing (:meth:`offload`). Returns why it
        was refused, or None."""
        if intent.action == "offload" and self.lower_tier and not st.live_requests:
            self.offload(st)
            return None
        ranked = intent.action != "release" or intent.reason == PRESSURE_REASON
        if self.core.strategies.sizing.ranks_forecasts and ranked:
            return self.on_tool_start(st, intent.forecast, now_s, intent.ttl_ms)
        if intent.action == "release":
            self.release(st)
        elif intent.action == "retain":
            return self.retain(st, intent.ttl_ms, now_s)
        return None

    def retain(self, st: TrajState[B], ttl_ms: int | None, now_s: float) -> str | None:
        """Lease ``st``'s cached context for ``ttl_ms`` (capped), extend its lease, or
        remember the retain for when its running turn ends. Returns why it was refused
        (a finished trajectory, a spent lease lifetime), or None."""
        if st.closed:
            self.counters.leases_refused += 1
            return "trajectory finished or cancelled"
        ttl = self.book.clamp_ttl_ms(ttl_ms)
        if self.book.lease_deadline_s(st, ttl, now_s) <= now_s:
            self.counters.leases_refused += 1
            return "lease lifetime spent for this pause"
        if st.lease is not None:
            self.book.extend_lease(st, ttl, now_s)
        elif st.live_requests or not st.hashes:
            self.book.set_pending(st, now_s + ttl / 1000.0)
        else:
            self._lease(st, ttl, now_s)
        return None

    def release(self, st: TrajState[B]) -> int:
        """End ``st``'s lease and demote the free cached blocks it computed itself and no
        other tracked trajectory covers (never those it only hit in the cache); its
        hashes are forgotten. Returns how many blocks were demoted."""
        n = self._demote(st)
        st.last_outcome = "released"
        self.book.set_hashes(st, [])
        return n

    def on_end(self, st: TrajState[B]) -> int:
        """``st`` finished or was cancelled: it is closed (its running turns will leave
        no lease) and released; returns the blocks demoted."""
        st.closed = True
        st.reopening = False
        for request_id in st.live_requests:
            st.live_requests[request_id] = False
        return self.release(st)

    def forget(self, st: TrajState[B]) -> None:
        """Drop a finished trajectory entirely (its lease, if any, ends as released)."""
        self.book.forget_trajectory(st)
        self._apply_frees()

    # -- pressure ------------------------------------------------------------------------
    def give_way(self, exclude: str | None, need_blocks: int | None, now_s: float) -> int:
        """An allocation for ``exclude``'s request failed, short of ``need_blocks``: one
        lease (or its tail) gives way. Returns the blocks given up (0: none left); the
        driver retries the allocation and calls again while it fails."""
        n = self.core.pressure_release(exclude, now_s, need_blocks)
        if n:
            self._apply_frees()
        return n

    def reset(self) -> None:
        """End every lease (before the engine's prefix cache is reset)."""
        self.book.release_all("released")
        self._apply_frees()

    # -- the port ------------------------------------------------------------------------
    def _lease(self, st: TrajState[B], ttl_ms: int, now_s: float) -> None:
        groups = self.port.blocks_per_hash
        demand = self._demand() if self._demand is not None else self.demand_blocks
        n = self.core.plan_lease(
            st,
            len(st.hashes) * groups,
            now_s,
            free_blocks=self.port.num_free(),
            demand_blocks=demand,
        )
        blocks = self.port.cached_prefix(st.hashes[: n // groups])
        if len(blocks) < n // groups * groups:
            # The retain came after (some of) the context's blocks were evicted: a late hint.
            self.counters.hints_late += 1
            self.counters.hint_late_blocks += n // groups * groups - len(blocks)
        if not blocks:
            return
        self.port.take(blocks)
        self.book.set_lease(st, blocks, ttl_ms, now_s)
        self._apply_frees()

    def _demote(self, st: TrajState[B]) -> int:
        self.book.end_lease(st, "released")
        self._apply_frees()
        n = self.port.demote(self.book.own_unshared(st))
        self.counters.blocks_demoted += n
        return n

    def _apply_frees(self) -> None:
        for blocks in self.book.drain_frees():
            if blocks:
                self.port.free(blocks)

"""Re-warm in the simulator (experimental): recompute an evicted paused context early.

When the policy core's settings turn ``rewarm`` on, every time a replica plans a step
with nothing waiting it asks the core (:meth:`agentkv.residency.PolicyCore.plan_rewarm`)
for a paused trajectory whose context lost blocks and is expected back soon. The
engine then runs a prefill-only call over that context (the tokens the client knows),
allocating all its missing blocks up front from the free pool (a re-warm never takes
a lease's blocks or preempts anything), and when it finishes the context is leased to
the trajectory with the re-warmed blocks counted (``rewarm_blocks``; ``..._used`` when
the next turn takes the lease over, ``..._wasted`` when it is given up first). A
re-warm call that would be preempted is dropped instead. While nothing is due, a wake
is scheduled for when the earliest candidate enters the horizon.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentkv.sim._steps import SimCall

if TYPE_CHECKING:
    from agentkv.residency import PolicyCore, TrajState
    from agentkv.sim._steps import Replica

__all__ = ["RewarmMixin", "plan_rewarm"]


def plan_rewarm(
    core: PolicyCore[int],
    candidates: Iterable[tuple[TrajState[int], int]],
    now_s: float,
    *,
    free_blocks: int,
    num_waiting: int,
    num_running: int,
) -> TrajState[int] | None:
    """The paused trajectory whose evicted context to recompute now, or None.

    ``candidates``: ``(state, missing blocks)`` of paused trajectories whose context
    is not all cached. Only with ``rewarm`` on, when no turn waits and fewer than
    ``min_running`` calls run (the engine has spare compute), for the candidate
    expected back soonest, when that return lies within ``rewarm_horizon_turns``
    mean turn times and its missing blocks fit in the free pool beside the reserve
    and the active contexts' growth (a re-warm never evicts a lease).
    """
    s = core.settings
    if not s.rewarm or num_waiting > 0 or num_running >= s.min_running:
        return None
    horizon = now_s + s.rewarm_horizon_turns * core.turn_s
    room = free_blocks - core.reserve_blocks - core.growth_reserve()
    best: tuple[float, TrajState[int]] | None = None
    for st, missing in candidates:
        if st.paused_at_s is None or st.forecast is None or not 0 < missing <= room:
            continue
        back = core.returns.expected_return_s(st, now_s)
        if back <= horizon and (best is None or back < best[0]):
            best = (back, st)
    return None if best is None else best[1]


class RewarmMixin:
    """Re-warm calls for :class:`agentkv.sim._engine.Engine` (see the module docstring)."""

    block_size: int
    traj_ids: list[str]
    ctx_keys: list[list[int]]
    rewarm_tokens: int
    rewarm_missing: dict[int, int]  # id(re-warm call) -> blocks it recomputes

    if TYPE_CHECKING:  # provided by the engine and agentkv.sim._steps.StepMixin

        def push_wake(self, time_s: float, r: Replica) -> None: ...

        def key_blocks(self, r: Replica, call: SimCall, tokens: int) -> None: ...

    def maybe_rewarm(
        self, now: float, r: Replica, budget: int, work: list[tuple[SimCall, int, bool]]
    ) -> None:
        """Start one re-warm call into ``work`` when the core picks a trajectory."""
        core = r.ctl.core
        if not core.settings.rewarm or r.waiting or budget <= 0:
            return
        if any(c.turn < 0 for c in r.running):
            return  # one re-warm at a time
        index = {tid: i for i, tid in enumerate(self.traj_ids)}
        cands: list[tuple[TrajState[int], int]] = []
        for st in core.book.iter_states():
            i = index.get(st.trajectory_id)
            if i is None or st.paused_at_s is None or st.running:
                continue
            keys = self.ctx_keys[i]
            missing = len(keys) - r.pool.match(keys, len(keys))
            if missing > 0:
                cands.append((st, missing))
        pick = plan_rewarm(
            core, cands, now, free_blocks=r.pool.num_free, num_waiting=0, num_running=len(r.running)
        )
        if pick is None:
            self._schedule_wake(now, r, cands)
            return
        self._start(now, r, index[pick.trajectory_id], budget, work)

    def _schedule_wake(
        self, now: float, r: Replica, cands: list[tuple[TrajState[int], int]]
    ) -> None:
        core = r.ctl.core
        if core.turn_s <= 0 or len(r.running) >= core.settings.min_running:
            return
        lead = core.settings.rewarm_horizon_turns * core.turn_s
        due = [core.returns.expected_return_s(st, now) - lead for st, _ in cands if st.forecast]
        later = [t for t in due if t > now]
        if later:
            self.push_wake(min(later), r)

    def _start(
        self, now: float, r: Replica, traj: int, budget: int, work: list[tuple[SimCall, int, bool]]
    ) -> None:
        keys, bs, pool = self.ctx_keys[traj], self.block_size, r.pool
        hit = pool.lookup(keys, len(keys))
        need = len(keys) - len(hit)
        free = pool.num_free - sum(1 for b in hit if pool.refcount(b) == 0)
        if need <= 0 or need > free:
            return
        pool.take(hit)
        new = pool.allocate(need)
        assert new is not None
        call = SimCall(traj, -1, keys, len(keys) * bs, 1)
        call.blocks, call.keyed, call.computed = hit + new, len(hit), len(hit) * bs
        call.first = False
        call.sent_s = call.arrival_s = now
        call.preempted = False
        n = min(call.target - call.computed, budget)
        r.running.append(call)
        work.append((call, n, True))
        self.rewarm_tokens += call.target - call.computed
        self.rewarm_missing[id(call)] = need

    def finish_rewarm(self, now: float, r: Replica, call: SimCall, dropped: bool) -> None:
        """A re-warm call ended: lease its context to the still-paused trajectory."""
        pool, ctl = r.pool, r.ctl
        book = ctl.book
        self.key_blocks(r, call, call.computed)
        blocks = call.blocks
        call.blocks = []
        st = book.get(self.traj_ids[call.traj])
        recomputed = self.rewarm_missing.pop(id(call), 0)
        if not dropped and st is not None and st.paused_at_s is not None and not st.running:
            n = min(call.keyed, book.allowance(st))
            if n > 0:
                pool.take(blocks[:n])
                book.set_lease(st, blocks[:n], ctl.core.settings.max_ttl_ms, now)
                book.note_rewarm(st, min(recomputed, n))
                for freed in book.drain_frees():
                    if freed:
                        pool.free_blocks(freed[::-1])
        pool.free_blocks(blocks[::-1])

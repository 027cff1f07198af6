"""Re-warm in the simulator (an experiment): recompute an evicted paused context early.

A policy that carries a :class:`Rewarm` turns it on. Every time a replica plans a step
with nothing waiting, the :class:`Rewarmer` asks :func:`plan_rewarm` for a paused
trajectory whose context lost blocks and is expected back soon. It then runs a
prefill-only call over that context (the tokens the client knows), allocating all its
missing blocks up front from the free pool (a re-warm never takes a lease's blocks or
preempts anything), and when it finishes the context is leased to the trajectory with
the re-warmed blocks counted (``rewarm_blocks``; ``..._used`` when the next turn takes
the lease over, ``..._wasted`` when it is given up first). A re-warm call that would be
preempted is dropped instead. While nothing is due, a wake is scheduled for when the
earliest candidate enters the horizon. A trajectory not expected back at this replica
(behind a router that scatters its turns) is never re-warmed there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentkv.sim._steps import SimCall

if TYPE_CHECKING:
    from agentkv.residency import PolicyCore, TrajState
    from agentkv.sim._steps import Replica

__all__ = ["Rewarm", "Rewarmer", "plan_rewarm"]


@dataclass(frozen=True, slots=True)
class Rewarm:
    """The re-warm experiment's setting: recompute the evicted part of the paused
    context expected back soonest, within ``horizon_turns`` mean turn times."""

    horizon_turns: float = 2.0


def plan_rewarm(
    core: PolicyCore[int],
    candidates: Iterable[tuple[TrajState[int], int]],
    now_s: float,
    *,
    free_blocks: int,
    num_waiting: int,
    num_running: int,
    horizon_turns: float = 2.0,
) -> TrajState[int] | None:
    """The paused trajectory whose evicted context to recompute now, or None.

    ``candidates``: ``(state, missing blocks)`` of paused trajectories whose context is
    not all cached. Only when no turn waits and fewer than ``min_running`` calls run
    (the engine has spare compute), for the candidate expected back soonest, when that
    return lies within ``horizon_turns`` mean turn times and its missing blocks fit in
    the free pool beside the reserve and the active contexts' growth (a re-warm never
    evicts a lease).
    """
    if num_waiting > 0 or num_running >= core.settings.min_running:
        return None
    horizon = now_s + horizon_turns * core.turn_s
    room = free_blocks - core.reserve_blocks - core.growth_reserve()
    best: tuple[float, TrajState[int]] | None = None
    for st, missing in candidates:
        if st.paused_at_s is None or st.forecast is None or not 0 < missing <= room:
            continue
        back = core.returns.expected_return_s(st, now_s)  # inf: not expected back here
        if back <= horizon and back < math.inf and (best is None or back < best[0]):
            best = (back, st)
    return None if best is None else best[1]


class Rewarmer:
    """Runs the re-warm experiment's calls in one simulation (see the module docstring).

    ``ctx_keys`` are the engine's per-trajectory context keys; ``key_blocks`` gives a
    call's filled blocks their keys (the step scheduler's); ``push_wake`` wakes a
    replica later.
    """

    def __init__(
        self,
        setting: Rewarm,
        block_size: int,
        traj_ids: list[str],
        ctx_keys: list[list[int]],
        key_blocks: Callable[[Replica, SimCall, int], None],
        push_wake: Callable[[float, Replica], None],
    ) -> None:
        self.setting = setting
        self.block_size = block_size
        self.traj_ids = traj_ids
        self.ctx_keys = ctx_keys
        self.key_blocks = key_blocks
        self.push_wake = push_wake
        self.tokens = 0  # tokens recomputed ahead of returns
        self._missing: dict[int, int] = {}  # id(re-warm call) -> blocks it recomputes
        self._index = {tid: i for i, tid in enumerate(traj_ids)}

    def maybe_start(
        self, now: float, r: Replica, budget: int, work: list[tuple[SimCall, int, bool]]
    ) -> None:
        """Start one re-warm call into ``work`` when a trajectory qualifies."""
        core = r.ctl.core
        if r.waiting or budget <= 0:
            return
        if any(c.turn < 0 for c in r.running):
            return  # one re-warm at a time
        cands: list[tuple[TrajState[int], int]] = []
        for st in core.book.iter_states():
            i = self._index.get(st.trajectory_id)
            if i is None or st.paused_at_s is None or st.running:
                continue
            keys = self.ctx_keys[i]
            missing = len(keys) - r.pool.match(keys, len(keys))
            if missing > 0:
                cands.append((st, missing))
        pick = plan_rewarm(
            core,
            cands,
            now,
            free_blocks=r.pool.num_free,
            num_waiting=0,
            num_running=len(r.running),
            horizon_turns=self.setting.horizon_turns,
        )
        if pick is None:
            self._schedule_wake(now, r, cands)
            return
        self._start(now, r, self._index[pick.trajectory_id], budget, work)

    def _schedule_wake(
        self, now: float, r: Replica, cands: list[tuple[TrajState[int], int]]
    ) -> None:
        core = r.ctl.core
        if core.turn_s <= 0 or len(r.running) >= core.settings.min_running:
            return
        lead = self.setting.horizon_turns * core.turn_s
        due = [core.returns.expected_return_s(st, now) - lead for st, _ in cands if st.forecast]
        later = [t for t in due if now < t < math.inf]  # inf: not expected back here
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
        self.tokens += call.target - call.computed
        self._missing[id(call)] = need

    def finish(self, now: float, r: Replica, call: SimCall, *, dropped: bool) -> None:
        """A re-warm call ended (``dropped``: preempted): lease its context to the
        still-paused trajectory, counting the re-warmed blocks."""
        pool, ctl = r.pool, r.ctl
        book = ctl.book
        self.key_blocks(r, call, call.computed)
        blocks = call.blocks
        call.blocks = []
        st = book.get(self.traj_ids[call.traj])
        recomputed = self._missing.pop(id(call), 0)
        if not dropped and st is not None and st.paused_at_s is not None and not st.running:
            n = min(call.keyed, book.allowance(st))
            if n > 0:
                pool.take(blocks[:n])
                book.set_lease(st, blocks[:n], ctl.core.settings.max_ttl_ms, now)
                book.note_ahead(st, min(recomputed, n), "rewarm")
                for freed in book.drain_frees():
                    if freed:
                        pool.free_blocks(freed[::-1])
        pool.free_blocks(blocks[::-1])

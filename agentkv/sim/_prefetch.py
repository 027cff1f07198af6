"""Tier prefetch in the simulator: load a paused context back from the lower tier before
its trajectory returns, so the reload leaves the critical path.

With a lower tier, an evicted context is not lost but costs a reload when its turn is
admitted, and that reload stalls the engine step that admits it. A policy that carries a
:class:`TierPrefetch` loads it ahead instead: before each step, for the paused
trajectories expected back (by the residency core's forecasts) within ``horizon_turns``
mean turn times, soonest first, whose context continues in the lower tier past what the
pool still caches, it allocates blocks for the tier's part, leases the whole prefix to the
trajectory (so it stays until the turn takes it over, counted ``prefetch_blocks_used``, or
gives way first, ``..._wasted``) and books the transfer on the replica's one load channel.
Room comes from the free pool beside the reserve and the active contexts' growth and,
with ``displace``, from leases expected back later than the prefetched trajectory (Belady's
rule between two paused contexts). A turn that arrives before its load has finished waits
for the rest of it. While nothing is due yet, a wake is scheduled for when the earliest
candidate enters the horizon.

vLLM 0.32 and 0.33 reload offloaded blocks only when the turn that needs them is
scheduled; the plugin cannot do this yet (see docs/vllm.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentkv.residency import TrajState
    from agentkv.sim._steps import Replica

__all__ = ["TierPrefetch", "TierPrefetcher"]


@dataclass(frozen=True, slots=True)
class TierPrefetch:
    """Tier prefetch's setting (see the module docstring)."""

    horizon_turns: float = 2.0
    displace: bool = True


class TierPrefetcher:
    """Runs tier prefetch in one simulation; ``ctx_keys`` are the engine's per-trajectory
    context keys, ``push_wake`` wakes a replica later."""

    def __init__(
        self,
        setting: TierPrefetch,
        traj_ids: list[str],
        ctx_keys: list[list[int]],
        push_wake: Callable[[float, Replica], None],
    ) -> None:
        self.setting = setting
        self.ctx_keys = ctx_keys
        self.push_wake = push_wake
        self._index = {tid: i for i, tid in enumerate(traj_ids)}
        self._ready: dict[int, float] = {}  # trajectory index -> when its load completes
        self._channel: dict[int, float] = {}  # replica index -> when its channel is free

    def stall_s(self, traj: int, now: float) -> float:
        """How long an admitted turn of ``traj`` waits for its prefetch to finish."""
        done = self._ready.pop(traj, 0.0)
        return max(0.0, done - now)

    def run(self, now: float, r: Replica) -> None:
        """Prefetch what is due on replica ``r`` (see the module docstring)."""
        tier = r.pool.lower_tier
        core = r.ctl.core
        if tier is None or core.turn_s <= 0:
            return
        horizon = now + self.setting.horizon_turns * core.turn_s
        due: list[tuple[float, int, TrajState[int], int, int]] = []
        later = math.inf
        for st in core.book.iter_states():
            if st.paused_at_s is None or st.running or st.forecast is None:
                continue
            i = self._index.get(st.trajectory_id)
            if i is None or i in self._ready:
                continue
            back = core.returns.expected_return_s(st, now)
            if back == math.inf:
                continue
            keys = self.ctx_keys[i]
            hit = r.pool.match(keys, len(keys))
            low = r.pool.match_lower(keys, hit, len(keys))
            if low <= 0:
                continue
            if back <= horizon:
                due.append((back, i, st, hit, low))
            else:
                later = min(later, back - self.setting.horizon_turns * core.turn_s)
        for back, i, st, hit, low in sorted(due, key=lambda d: (d[0], d[1])):
            self._load(now, r, back, i, st, hit, low)
        if later < math.inf and later > now:
            self.push_wake(later, r)

    def _room(self, r: Replica) -> int:
        core = r.ctl.core
        return r.pool.num_free - core.reserve_blocks - core.growth_reserve()

    def _load(
        self, now: float, r: Replica, back: float, i: int, st: TrajState[int], hit: int, low: int
    ) -> None:
        pool, ctl = r.pool, r.ctl
        core, book = ctl.core, ctl.book
        tier = pool.lower_tier
        assert tier is not None
        keys = self.ctx_keys[i]
        while self.setting.displace and self._room(r) < low:
            victim = core.next_victim(st.trajectory_id, now)
            if victim is None or core.returns.expected_return_s(victim, now) <= back:
                break
            if not ctl.give_way(st.trajectory_id, low - self._room(r), now):
                break
        if self._room(r) < low:
            return
        cached = pool.lookup(keys, hit)
        pool.take(cached)  # may pull free cached blocks out of the room counted above
        new = pool.allocate(low) if pool.num_free >= low else None
        if new is None:
            pool.free_blocks(cached[::-1])
            return
        pool.assign_keys(new, keys[hit : hit + low])
        for key in keys[hit : hit + low]:
            tier.touch(key)
        blocks = cached + new
        n = min(len(blocks), book.allowance(st))
        if n > 0:
            book.set_lease(st, blocks[:n], core.settings.max_ttl_ms, now)
            book.note_ahead(st, min(low, max(0, n - len(cached))), "prefetch")
        for freed in book.drain_frees():
            if freed:
                pool.free_blocks(freed[::-1])
        if n < len(blocks):
            pool.free_blocks(blocks[n:][::-1])
        start = max(now, self._channel.get(r.index, 0.0))
        done = start + tier.load_time_s(low)
        self._channel[r.index] = done
        self._ready[i] = done

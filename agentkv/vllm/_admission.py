"""Program-level admission for the vLLM plugin: the policy core decides, vLLM skips.

Before each ``schedule()`` the plugin asks the core (:meth:`PolicyCore.plan_admission`)
which waiting turns to hold back this step, from each waiting request's missing blocks
(its prompt blocks minus the longest prefix still cached, read with
``BlockPool.get_cached_block``, which has no side effects) and the pool's free blocks.
vLLM 0.32 then meets each waiting request in ``_handle_blocked_waiting_request``; the
override answers False for a held one, so the scheduler's own ``skip_request`` path
moves it aside for this step and puts it back at the front of its queue afterwards
(the path vLLM uses for requests that wait for remote KV or a grammar). A held request
stays in ``self.waiting`` and in ``self.requests``: ``has_requests()`` stays true, an
abort finds it, and its priority and arrival time are untouched. A request that was
preempted is never held (it was admitted once already). While fewer than
``min_running`` calls run, the core holds a turn only when a resident trajectory is
due back within ``idle_wait_turns`` mean turn times and sooner than recomputing what
admitting the turn could evict would take (its context would otherwise be evicted just
before it is needed); when that leaves nothing to run, each step sleeps
:data:`IDLE_HOLD_SLEEP_S` instead of spinning.

The prefill cost that decision weighs is learned from the engine's own steps: each
step's scheduled prompt tokens against its wall time, from ``schedule()`` to its
``update_from_output()``.

Every path is guarded: an exception here is counted and vLLM's behaviour continues.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

__all__ = ["IDLE_HOLD_SLEEP_S", "AdmissionMixin"]

#: How long a scheduling step sleeps when nothing runs and every waiting turn is held
#: (a resident context is due back soon): the engine loop would otherwise spin on it.
IDLE_HOLD_SLEEP_S = 0.002

if TYPE_CHECKING:
    _Base = Any
else:
    _Base = object


class AdmissionMixin(_Base):  # type: ignore[misc,valid-type]
    """The admission half of :class:`agentkv.vllm._scheduler.AgentKVSchedulerMixin`."""

    _akv_held: frozenset[str] = frozenset()
    _akv_demand: int = 0
    _akv_hits: dict[str, int]  # request id -> cached prefix blocks at the last plan
    _akv_steps: deque[tuple[Any, float, float]]  # (output, scheduled at, prefill blocks)
    _akv_output_s: float = 0.0  # when the last step's output came back

    def _akv_mark_step(self, out: Any) -> None:
        """Remember when the step ``out`` was scheduled and the blocks it prefills (in
        the unit of :meth:`_akv_need_blocks`: pool blocks, every KV-cache group)."""
        tokens = sum(n for n in out.num_scheduled_tokens.values() if n > 1)  # not decodes
        blocks = tokens / int(self.block_size) * max(1, len(self._akv_group_ids))
        self._akv_steps.append((out, time.monotonic(), blocks))

    def _akv_time_step(self, out: Any) -> None:
        """The output of step ``out`` came back: its wall time, from when it was
        scheduled or the previous output came back (whichever is later: with async
        scheduling the next step is scheduled while one runs), teaches the core the
        engine's prefill cost (:meth:`PolicyCore.observe_step`)."""
        now = time.monotonic()
        last, self._akv_output_s = self._akv_output_s, now
        steps = self._akv_steps
        while steps:  # outputs come back in the order steps were scheduled
            marked, at_s, blocks = steps.popleft()
            if marked is out:
                self._akv.observe_step(blocks, now - max(at_s, last))
                return

    def _akv_cached_hits(self, hashes: list[Any], start: int = 0) -> int:
        """Length of the longest cached prefix of ``hashes`` (in every group), walking
        from ``start`` (the caller knows the first ``start`` are cached)."""
        pool, groups = self._akv_pool, self._akv_group_ids
        n = start
        while n < len(hashes) and pool.get_cached_block(hashes[n], groups):
            n += 1
        return n

    def _akv_prefix_hits(self, request: Any) -> int:
        """Cached prefix blocks of a waiting request, walked once and then revalidated.

        The walk from the first block is remembered per request; later steps check only
        that its deepest cached block is still cached (vLLM frees a context's blocks
        deepest first, so the deepest goes first) and extend it from there. A miss there
        walks again from the start.
        """
        hashes = request.block_hashes
        cache = self._akv_hits
        rid = request.request_id
        known = cache.get(rid)
        pool, groups = self._akv_pool, self._akv_group_ids
        if known is not None and (known == 0 or pool.get_cached_block(hashes[known - 1], groups)):
            hits = self._akv_cached_hits(hashes, known)
        else:
            hits = self._akv_cached_hits(hashes)
        cache[rid] = hits
        return hits

    def _akv_need_blocks(self, request: Any) -> int:
        """Pool blocks a waiting request must allocate: the blocks of its prompt not
        cached, in every KV-cache group (each group allocates its own)."""
        size = int(self.block_size)
        total = -(-int(request.num_tokens) // size)
        groups = max(1, len(self._akv_group_ids))
        return max(0, total - self._akv_prefix_hits(request)) * groups

    def _akv_plan_admission(self, now_s: float) -> None:
        """Ask the core which waiting trajectories to hold back this step."""
        held: set[str] = set()
        demand = 0
        if self._akv_settings.admission and self._akv_settings.lifecycle:
            candidates = []
            for request in self.waiting:
                entry = self._akv_req.get(request.request_id)
                if entry is None or request.num_preemptions:
                    continue
                st = self._akv.get(entry.key)
                if st is not None:
                    candidates.append((st, self._akv_need_blocks(request)))
            held = self._akv.plan_admission(
                candidates,
                now_s,
                free_blocks=int(self._akv_pool.get_num_free_blocks()),
                num_running=len(self.running),
            )
            demand = sum(n for st, n in candidates if st.trajectory_id not in held)
            idle = held and not self.running and len(candidates) == len(self.waiting)
            if idle and all(st.trajectory_id in held for st, _ in candidates):
                # every turn waits for a resident context due back: idle politely
                time.sleep(IDLE_HOLD_SLEEP_S)
        self._akv_held = frozenset(held)
        self._akv_demand = demand
        cache = self._akv_hits
        if len(cache) > 2 * len(self.waiting) + 64:  # forget requests no longer waiting
            waiting = {r.request_id for r in self.waiting}
            for rid in [r for r in cache if r not in waiting]:
                del cache[rid]

    def _handle_blocked_waiting_request(self, request: Any) -> bool:
        ready = bool(super()._handle_blocked_waiting_request(request))
        if not ready or not self._akv_held or not getattr(self, "_akv_ready", False):
            return ready
        try:
            entry = self._akv_req.get(request.request_id)
            if entry is not None and not request.num_preemptions and entry.key in self._akv_held:
                return False
        except Exception:
            self._akv_fail("admission")
        return ready

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
preempted is never held (it was admitted once already), and the core never holds
while fewer than ``min_running`` calls run, so the engine does not spin idle on held
work.

Every path is guarded: an exception here is counted and vLLM's behaviour continues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["AdmissionMixin"]

if TYPE_CHECKING:
    _Base = Any
else:
    _Base = object


class AdmissionMixin(_Base):  # type: ignore[misc,valid-type]
    """The admission half of :class:`agentkv.vllm._scheduler.AgentKVSchedulerMixin`."""

    _akv_held: frozenset[str] = frozenset()
    _akv_demand: int = 0

    def _akv_need_blocks(self, request: Any) -> int:
        """Blocks a waiting request must allocate: its prompt minus its cached prefix."""
        size = int(self.block_size)
        total = -(-int(request.num_tokens) // size)
        return max(0, total - len(self._akv_cached_prefix(list(request.block_hashes))))

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
                st = self._akv.get(entry[0])
                if st is not None:
                    candidates.append((st, self._akv_need_blocks(request)))
            held = self._akv.plan_admission(
                candidates,
                now_s,
                free_blocks=int(self._akv_pool.get_num_free_blocks()),
                num_running=len(self.running),
            )
            demand = sum(n for st, n in candidates if st.trajectory_id not in held)
        self._akv_held = frozenset(held)
        self._akv_demand = demand

    def _handle_blocked_waiting_request(self, request: Any) -> bool:
        ready = bool(super()._handle_blocked_waiting_request(request))
        if not ready or not self._akv_held or not getattr(self, "_akv_ready", False):
            return ready
        try:
            entry = self._akv_req.get(request.request_id)
            if entry is not None and not request.num_preemptions and entry[0] in self._akv_held:
                return False
        except Exception:
            self._akv_fail("admission")
        return ready

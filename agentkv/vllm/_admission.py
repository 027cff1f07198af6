"""Program-level admission for the vLLM plugin: the residency controller decides, vLLM skips.

Before each ``schedule()`` the gate asks the controller which waiting turns to hold back
this step (:meth:`~agentkv.residency.ResidencyController.plan_admission`), from each
waiting request's missing blocks (its prompt blocks minus the longest prefix still
cached, read with ``BlockPool.get_cached_block``, which has no side effects) and the
pool's free blocks. vLLM 0.32 then meets each waiting request in
``_handle_blocked_waiting_request``; the scheduler's override asks :meth:`AdmissionGate.allows`
and answers False for a held one, so the scheduler's own ``skip_request`` path moves it
aside for this step and puts it back at the front of its queue afterwards (the path vLLM
uses for requests that wait for remote KV or a grammar). A held request stays in
``waiting`` and in ``requests``: ``has_requests()`` stays true, an abort finds it, and
its priority and arrival time are untouched. A request that was preempted is never held
(it was admitted once already). When every waiting turn is held and nothing runs (a
resident context is due back soon), each step sleeps :data:`IDLE_HOLD_SLEEP_S` instead
of spinning.

The prefill cost the decision weighs is learned from the engine's own steps: each
step's scheduled prompt tokens against its wall time, from ``schedule()`` to its
``update_from_output()``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentkv.vllm._plugin import Plugin

__all__ = ["IDLE_HOLD_SLEEP_S", "AdmissionGate"]

#: How long a scheduling step sleeps when nothing runs and every waiting turn is held
#: (a resident context is due back soon): the engine loop would otherwise spin on it.
IDLE_HOLD_SLEEP_S = 0.002


class AdmissionGate:
    """Which waiting turns the scheduler skips this step (see the module docstring)."""

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        self.held: frozenset[str] = frozenset()  # trajectory keys held this step
        self.hits: dict[str, int] = {}  # request id -> cached prefix blocks at the last plan
        self.steps: deque[tuple[Any, float, float]] = deque(maxlen=8)  # (output, at, blocks)
        self.output_s = 0.0  # when the last step's output came back

    # -- step timing -------------------------------------------------------------------
    def mark_step(self, out: Any) -> None:
        """Remember when the step ``out`` was scheduled and the blocks it prefills (in
        the unit of :meth:`need_blocks`: pool blocks, every KV-cache group)."""
        tokens = sum(n for n in out.num_scheduled_tokens.values() if n > 1)  # not decodes
        size = int(self.plugin.scheduler.block_size)
        blocks = tokens / size * self.plugin.port.blocks_per_hash
        self.steps.append((out, time.monotonic(), blocks))

    def time_step(self, out: Any) -> None:
        """The output of step ``out`` came back: its wall time, from when it was
        scheduled or the previous output came back (whichever is later: with async
        scheduling the next step is scheduled while one runs), teaches the core the
        engine's prefill cost."""
        now = time.monotonic()
        last, self.output_s = self.output_s, now
        steps = self.steps
        while steps:  # outputs come back in the order steps were scheduled
            marked, at_s, blocks = steps.popleft()
            if marked is out:
                self.plugin.ctl.core.observe_step(blocks, now - max(at_s, last))
                return

    # -- missing blocks ----------------------------------------------------------------
    def prefix_hits(self, request: Any) -> int:
        """Cached prefix blocks of a waiting request, walked once and then revalidated.

        The walk from the first block is remembered per request; later steps check only
        that its deepest cached block is still cached (vLLM frees a context's blocks
        deepest first, so the deepest goes first) and extend it from there. A miss there
        walks again from the start.
        """
        hashes = request.block_hashes
        port = self.plugin.port
        rid = request.request_id
        known = self.hits.get(rid)
        if known is not None and (known == 0 or port.is_cached(hashes[known - 1])):
            hits = port.cached_count(hashes, known)
        else:
            hits = port.cached_count(hashes)
        self.hits[rid] = hits
        return hits

    def need_blocks(self, request: Any) -> int:
        """Pool blocks a waiting request must allocate: the blocks of its prompt not
        cached, in every KV-cache group (each group allocates its own)."""
        size = int(self.plugin.scheduler.block_size)
        total = -(-int(request.num_tokens) // size)
        return max(0, total - self.prefix_hits(request)) * self.plugin.port.blocks_per_hash

    # -- the plan ----------------------------------------------------------------------
    def plan(self, now_s: float) -> None:
        """Ask the controller which waiting trajectories to hold back this step."""
        plugin = self.plugin
        sched = plugin.scheduler
        held: set[str] = set()
        if plugin.settings.admission and plugin.settings.lifecycle:
            book = plugin.ctl.book
            candidates = []
            for request in sched.waiting:
                entry = plugin.requests.get(request.request_id)
                if entry is None or request.num_preemptions:
                    continue
                st = book.get(entry.key)
                if st is not None:
                    candidates.append((st, self.need_blocks(request)))
            held = plugin.ctl.plan_admission(
                candidates,
                now_s,
                free_blocks=plugin.port.num_free(),
                num_running=len(sched.running),
            )
            idle = held and not sched.running and len(candidates) == len(sched.waiting)
            if plugin.acting and idle and all(st.trajectory_id in held for st, _ in candidates):
                # every turn waits for a resident context due back: idle politely
                time.sleep(IDLE_HOLD_SLEEP_S)
        else:
            plugin.ctl.demand_blocks = 0
        self.held = frozenset(held)
        if len(self.hits) > 2 * len(sched.waiting) + 64:  # forget requests no longer waiting
            waiting = {r.request_id for r in sched.waiting}
            for rid in [r for r in self.hits if r not in waiting]:
                del self.hits[rid]

    def allows(self, request: Any) -> bool:
        """May vLLM admit this waiting request now (False: held back this step; never
        outside mode ``act``: a shadow plan is counted, not applied)?"""
        if not self.held or not self.plugin.acting:
            return True
        entry = self.plugin.requests.get(request.request_id)
        return entry is None or bool(request.num_preemptions) or entry.key not in self.held

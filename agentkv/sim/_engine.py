"""The discrete-event engine: trajectories, arrivals, replicas stepping, turns finishing.

A trajectory's call is sent, reaches its replica's scheduler ``overhead_s`` later,
waits, is admitted, prefills in chunks and decodes in engine steps (see
:mod:`agentkv.sim._steps`). When its answer is done, the policy says what to do with
the context (:meth:`agentkv.sim.Policy.after_turn`) and the replica's policy core (the
same code as the vLLM plugin) leases, frees or releases it; the next call is sent after
the tool gap. Arrivals are closed-loop (``concurrency`` trajectories in flight, the next
one starting when one ends, as ``agentkv bench`` replays) or each trajectory starts at
its own ``start_s``.

Everything is deterministic for a given workload, config and seed.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentkv.residency import PolicyCore
from agentkv.residency._controller import ResidencyController
from agentkv.residency._strategies import FinishIntent
from agentkv.sim._blockport import SimBlockPort, hash_of
from agentkv.sim._config import SimConfig
from agentkv.sim._policies import NEVER, Action, Policy, TurnView
from agentkv.sim._pool import BlockPool, KeyChain, LowerTier, make_pool
from agentkv.sim._prefetch import TierPrefetcher
from agentkv.sim._rewarm import Rewarmer
from agentkv.sim._routing import Router
from agentkv.sim._steps import Replica, SimCall, StepScheduler
from agentkv.sim._workload import SimTrajectory, max_request_blocks

__all__ = ["RunStats", "run_policy", "size_pool", "working_set_blocks"]

_START, _ARRIVE, _STEP, _WAKE, _TOOL = 0, 1, 2, 3, 4


@dataclass
class RunStats:
    """Raw totals of one run; :func:`agentkv.sim.summarize` turns them into metrics."""

    reusable_tokens: int = 0
    cached_tokens: int = 0
    lower_tier_tokens: int = 0  # first admissions' prompt tokens the lower tier served
    lower_tier_load_blocks: int = 0  # every block loaded back from the lower tier
    lower_tier_store_blocks: int = 0  # blocks written to the lower tier
    block_bytes: int = 0
    prompt_tokens: int = 0
    prefill_tokens_computed: int = 0
    rebuilt_tokens: int = 0
    preemptions: int = 0
    num_turns: int = 0
    queue_wait_s: float = 0.0
    makespan_s: float = 0.0
    evictions: int = 0
    leases_forced: int = 0
    jct_s: list[float] = field(default_factory=list)
    pool_blocks: int = 0
    peak_live_blocks: int = 0  # most blocks live trajectories' contexts held at once
    core: dict[str, int] = field(default_factory=dict)  # policy-core counters, all replicas
    busy_s: float = 0.0  # engine time spent in steps, summed over replicas
    rewarm_tokens: int = 0  # tokens recomputed ahead of returns (re-warm, experimental)
    # (trajectory id, turn) -> (replica, prompt tokens served from the cache) of each call
    calls: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)


def working_set_blocks(workload: Sequence[SimTrajectory], config: SimConfig) -> int:
    """The workload's KV working set: peak blocks of live trajectories' contexts.

    Measured by a reference run with a pool that never evicts (stock LRU policy, the
    same timing model, arrivals, queue and replicas), summed over replicas.
    """
    total = sum(
        -(-(t.prompt_tokens + t.output_tokens) // config.block_size)
        for tr in workload
        for t in tr.turns
    )
    ref = config.with_(pool_blocks=max(1, total), replicas=1, routing="session")
    return max(1, Engine(workload, ref, Policy(), ref.pool_blocks or 1).run().peak_live_blocks)


def size_pool(
    workload: Sequence[SimTrajectory], config: SimConfig, working_set: int | None = None
) -> int:
    """Blocks per replica: ``pool_blocks``, or ``pool_fraction`` of the working set split
    over the replicas; never fewer than the largest single call needs."""
    floor = max_request_blocks(workload, config.block_size) + 1
    if config.pool_blocks is not None:
        return max(config.pool_blocks, floor)
    ws = working_set_blocks(workload, config) if working_set is None else working_set
    return max(math.ceil(config.pool_fraction * ws / config.replicas), floor)


class Engine:
    """One simulation run (see the module docstring): the event queue, the calls'
    lifecycle and the replicas; each replica's engine steps are the step scheduler's
    (:class:`~agentkv.sim._steps.StepScheduler`)."""

    def __init__(
        self, workload: Sequence[SimTrajectory], config: SimConfig, policy: Policy, pool_blocks: int
    ) -> None:
        self.workload = workload
        self.config = config
        self.store_on_compute = config.lower_tier is not None and config.lower_tier.store == "compute"
        self.block_size = config.block_size
        self.policy = policy
        self.stats = RunStats(pool_blocks=pool_blocks)
        self.replicas = [self._replica(i, pool_blocks) for i in range(config.replicas)]
        self.router = Router(
            config.routing,
            config.replicas,
            placement=dict(config.placement),
            calls={(t, turn): r for t, turn, r in config.call_placement},
        )
        self.sent_at = {(t, turn): s for t, turn, s in config.call_times}
        jitter = config.cost.overhead_jitter > 0 and config.cost.overhead_s > 0
        self.jitter = random.Random(f"agentkv-sim-jitter:{config.jitter_seed}") if jitter else None
        self.chain = KeyChain()
        self.common_keys = self.chain.extend([], 0, config.system_prefix_tokens, self.block_size)
        self.events: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        n = len(workload)
        self.traj_ids = [t.trajectory_id for t in workload]
        self.ctx_keys: list[list[int]] = [[] for _ in range(n)]
        self.attained_s = [0.0] * n
        self.advised_prio = [0] * n  # the policy's advice for the next call
        self.req_prio = [0] * n  # the core's bounded priority of the waiting call
        self.last_finish_s = [0.0] * n
        self.started_s = [0.0] * n
        self.live_held = [0] * n
        self.live_blocks = 0
        self.next_closed = 0
        self.now_s = 0.0
        self.rewarmer: Rewarmer | None = None
        self.steps = StepScheduler(self, config, self.traj_ids, self.attained_s)
        if policy.rewarm is not None:
            self.rewarmer = Rewarmer(
                policy.rewarm,
                self.block_size,
                self.traj_ids,
                self.ctx_keys,
                self.steps.key_blocks,
                self.push_wake,
            )
            self.steps.rewarm = self.rewarmer
        if policy.tier_prefetch is not None and config.lower_tier is not None:
            self.steps.prefetch = TierPrefetcher(
                policy.tier_prefetch, self.traj_ids, self.ctx_keys, self.push_wake
            )

    def _replica(self, index: int, pool_blocks: int) -> Replica:
        tier = None
        if self.config.lower_tier is not None:
            t = self.config.lower_tier
            tier = LowerTier(
                t.capacity_blocks, t.bandwidth_bytes_per_s, t.latency_s, self.config.block_bytes
            )
        pool = make_pool(pool_blocks, priority_queue=self.policy.priority_queue, lower_tier=tier)
        core: PolicyCore[int] = PolicyCore(
            self.policy.core_settings(), pool_blocks, self.policy.core_strategies()
        )
        r = Replica(index, pool, None)  # type: ignore[arg-type]
        r.ctl = ResidencyController(
            core, SimBlockPort(pool), lower_tier=tier is not None, demand=lambda: self._demand(r)
        )
        return r

    # -- events ------------------------------------------------------------------------
    def push(self, time_s: float, kind: int, what: Any, epoch: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time_s, self.seq, kind, what, epoch))

    def push_wake(self, time_s: float, r: Replica) -> None:
        self.push(time_s, _WAKE, r)

    def push_step(self, r: Replica) -> None:
        step = r.step
        assert step is not None
        self.push(step.start_s + step.k * step.dt, _STEP, r, r.epoch)

    def run(self) -> RunStats:
        n = len(self.workload)
        if self.sent_at:  # replaying a real run: each trajectory starts when it did
            earliest: dict[str, float] = {}  # trajectory -> its first recorded send
            for (tid, _), sent in self.sent_at.items():
                earliest[tid] = min(earliest.get(tid, sent), sent)
            for i, tid in enumerate(self.traj_ids):
                self.push(self.sent_at.get((tid, 0), earliest.get(tid, 0.0)), _START, i)
            self.next_closed = n
        elif self.config.arrival == "closed":
            first = min(n, self.config.concurrency)
            for i in range(first):
                self.push(0.0, _START, i)
            self.next_closed = first
        else:
            for i, traj in enumerate(self.workload):
                self.push(traj.start_s, _START, i)
        now = 0.0
        while self.events:
            now, _, kind, what, epoch = heapq.heappop(self.events)
            self.now_s = now
            if kind == _START:
                self.started_s[what] = now
                self.send(now, what, 0)
            elif kind == _ARRIVE:
                self.arrive(now, what)
            elif kind == _WAKE:
                if what.step is None:
                    self.steps.begin_step(now, what)
            elif kind == _TOOL:
                self.tool_started(now, *what)
            elif epoch == what.epoch and what.step is not None:
                self.steps.end_step(now, what)
        stuck = sum(len(r.waiting) + len(r.running) for r in self.replicas)
        if stuck or len(self.stats.jct_s) != n:
            raise RuntimeError(f"simulation stalled with {stuck} calls left (a bug)")
        return self._totals(now)

    def _totals(self, now: float) -> RunStats:
        st = self.stats
        st.makespan_s = now
        st.evictions = sum(r.pool.num_evictions for r in self.replicas)
        st.lower_tier_store_blocks = sum(
            r.pool.lower_tier.stored_blocks for r in self.replicas if r.pool.lower_tier is not None
        )
        st.block_bytes = self.config.block_bytes
        st.preemptions = self.steps.preemptions
        st.leases_forced = self.steps.pressure_releases
        st.busy_s = self.steps.busy_s
        st.rewarm_tokens = self.rewarmer.tokens if self.rewarmer is not None else 0
        merged: dict[str, int] = {}
        for r in self.replicas:
            for key, value in vars(r.ctl.counters).items():
                merged[key] = merged.get(key, 0) + int(value)
        st.core = merged
        return st

    # -- calls -------------------------------------------------------------------------
    def send(self, now: float, traj: int, turn: int) -> None:
        """The client sends a call; it reaches the scheduler ``overhead_s`` later."""
        t = self.workload[traj].turns[turn]
        prev = self.ctx_keys[traj]
        if turn == 0 and self.common_keys:
            prev = self.common_keys
            shared = min(len(prev) * self.block_size, t.prompt_tokens)
        else:
            shared = t.shared_tokens
        keys = self.chain.extend(prev, shared, t.prompt_tokens + t.output_tokens, self.block_size)
        self.ctx_keys[traj] = keys
        call = SimCall(traj, turn, keys, t.prompt_tokens, t.output_tokens)
        call.sent_s = now
        cost = self.config.cost
        overhead = cost.overhead_s
        if self.jitter is not None:
            overhead *= 1.0 + cost.overhead_jitter * (2.0 * self.jitter.random() - 1.0)
        call.arrival_s = now + overhead
        self.push(call.arrival_s, _ARRIVE, call)

    def arrive(self, now: float, call: SimCall) -> None:
        traj = self.workload[call.traj]
        turn = traj.turns[call.turn]
        self.stats.reusable_tokens += turn.shared_tokens
        self.stats.prompt_tokens += turn.prompt_tokens
        if call.turn > 0:
            prev = traj.turns[call.turn - 1]
            # A server sees the whole pause; a client from its answer to its next call.
            since = call.sent_s if self.policy.learns_client_gaps else now
            idle_s = since - self.last_finish_s[call.traj]
            self.policy.on_resume(traj.trajectory_id, prev.tool_class, idle_s)
        max_hit = (turn.prompt_tokens - 1) // self.block_size
        call.replica = self.router.route(
            traj.trajectory_id, call.keys, max_hit, self.replicas, turn=call.turn
        )
        r = self.replicas[call.replica]
        st = r.ctl.on_arrive(traj.trajectory_id, now, turn=call.turn)
        if self.config.queue == "priority":
            # What the plugin does in add_request: bounded advice, resumed step, service.
            self.req_prio[call.traj] = r.ctl.assign_priority(st, self.advised_prio[call.traj], 0)
        r.waiting.append(call)
        if r.step is None:
            self.steps.begin_step(now, r)
        else:
            self.steps.cut_step(now, r)

    def queue_order(self, r: Replica) -> list[SimCall]:
        q = self.config.queue
        if q == "fcfs":
            return list(r.waiting)
        if q == "priority":
            aged, cutoff = r.ctl.core.aged_priority(), r.ctl.core.settings.aging_s

            def key(c: SimCall) -> tuple[int, float]:
                waited = self.now_s - c.arrival_s >= cutoff
                return (aged if waited else self.req_prio[c.traj], c.arrival_s)

            return sorted(r.waiting, key=key)
        return sorted(r.waiting, key=lambda c: (self.attained_s[c.traj], c.arrival_s))

    def count_admission(self, now: float, r: Replica, call: SimCall, hit: int, low: int) -> None:
        turn = self.workload[call.traj].turns[call.turn]
        if r.pool.lower_tier is not None:  # what the plugin reads from vLLM's connector
            r.ctl.core.observe_reload((call.target - 1) // self.block_size - hit, low)
        st, bs = self.stats, self.block_size
        st.lower_tier_load_blocks += low
        hit_tokens = (hit + low) * bs
        st.prefill_tokens_computed += call.target - hit_tokens
        st.rebuilt_tokens += max(0, turn.shared_tokens - hit_tokens)
        if call.first:
            cached = min(hit_tokens, turn.shared_tokens)
            st.cached_tokens += cached
            st.calls[(self.workload[call.traj].trajectory_id, call.turn)] = (call.replica, cached)
            st.lower_tier_tokens += low * bs
            st.queue_wait_s += now - call.arrival_s

    # -- completion --------------------------------------------------------------------
    def finish_call(self, now: float, r: Replica, call: SimCall) -> None:
        """A call's answer is done: the policy decides, the controller applies, and the
        trajectory's next call is sent after its tool gap (or the trajectory ends)."""
        traj = self.workload[call.traj]
        turn = traj.turns[call.turn]
        self.steps.key_blocks(r, call, call.computed)
        tier = r.pool.lower_tier
        if tier is not None and self.store_on_compute:
            for key in call.keys[: call.keyed]:  # the connector stores what the turn computed
                tier.store(key)
        r.running.remove(call)
        self.stats.num_turns += 1
        held = len(call.blocks)
        self.live_blocks += held - self.live_held[call.traj]
        self.live_held[call.traj] = held
        self.stats.peak_live_blocks = max(self.stats.peak_live_blocks, self.live_blocks)
        self.last_finish_s[call.traj] = now
        last = call.turn == len(traj.turns) - 1
        action = self.decide(now, r, call, last)
        self.apply(now, r, call, action)
        if action.update is not None and not last:
            # the client's tool-start event, as fast as a call reaches the scheduler
            keys = call.keys[: call.keyed]
            self.push(now + self.config.cost.overhead_s, _TOOL, (r, call.traj, action.update, keys))
        if last:
            st = r.ctl.book.get(traj.trajectory_id)
            if st is not None:
                r.ctl.forget(st)
            self.router.finish(traj.trajectory_id)
            self.stats.jct_s.append(now - self.started_s[call.traj])
            self.live_blocks -= held
            self.live_held[call.traj] = 0
            if self.config.arrival == "closed" and self.next_closed < len(self.workload):
                self.push(now, _START, self.next_closed)
                self.next_closed += 1
        else:
            at = self.sent_at.get((traj.trajectory_id, call.turn + 1))
            self.send(
                now + (turn.gap_s or 0.0) if at is None else max(now, at), call.traj, call.turn + 1
            )

    def decide(self, now: float, r: Replica, call: SimCall, last: bool) -> Action:
        traj = self.workload[call.traj]
        turn = traj.turns[call.turn]
        ctx = turn.prompt_tokens + turn.output_tokens
        nxt_use: float | None = None
        nxt_blocks = 0
        if not last:
            nt = traj.turns[call.turn + 1]
            nxt_use = now + (turn.gap_s or 0.0) + self.config.cost.overhead_s
            bs = self.block_size
            nxt_blocks = min(nt.shared_tokens // bs, max(0, (nt.prompt_tokens - 1) // bs))
        tier = r.pool.lower_tier
        view = TurnView(
            now_s=now,
            trajectory_id=traj.trajectory_id,
            turn_id=call.turn,
            tool_class=turn.tool_class,
            prev_tool_class=traj.turns[call.turn - 1].tool_class if call.turn > 0 else None,
            terminal=last,
            context_tokens=ctx,
            context_blocks=len(call.blocks),
            kv_usage=r.pool.usage,
            num_waiting=len(r.waiting),
            has_lower_tier=tier is not None,
            attained_service_s=self.attained_s[call.traj],
            recompute_s=self.config.cost.prefill_s(ctx),
            load_s=tier.load_time_s(len(call.blocks)) if tier is not None else 0.0,
            used_blocks=r.pool.num_blocks - r.pool.num_free,
            future_next_use_s=nxt_use,
            future_shared_blocks=nxt_blocks,
        )
        return self.policy.after_turn(view)

    def apply(self, now: float, r: Replica, call: SimCall, action: Action) -> None:
        """What the plugin does at ``_free_blocks``: the controller decides before the
        call's blocks are freed (a lease takes its own references) and after (a release
        or an offload demotes the trajectory's blocks)."""
        blocks = call.blocks
        call.blocks = []
        self.advised_prio[call.traj] = action.request_priority
        tid = self.traj_ids[call.traj]
        what = r.ctl.on_finish(
            tid,
            _intent(action),
            now,
            hashes=[hash_of(k) for k in call.keys[: call.keyed]],
            computed_from=call.cached_blocks,
            context_blocks=len(blocks),
        )
        if what == "release":
            r.pool.free_blocks(blocks[::-1])
        else:
            self._free_with(r.pool, blocks, action)
        r.ctl.after_free(tid, what)

    def tool_started(
        self, now: float, r: Replica, traj: int, forecast: Any, keys: list[int]
    ) -> None:
        """The client's tool-start event reached the trajectory's replica: the pause's
        forecast becomes the running tool's (see
        :meth:`~agentkv.residency.ResidencyController.on_tool_start`)."""
        st = r.ctl.book.get(self.traj_ids[traj])
        if st is not None:
            r.ctl.on_tool_start(st, forecast, now)

    def _demand(self, r: Replica) -> int:
        """Blocks the waiting calls that admission would let in need now."""
        book = r.ctl.book
        out = 0
        for call in r.waiting:
            st = book.get(self.traj_ids[call.traj])
            if st is None or not st.held:
                out += self.steps.need_blocks(r, call)
        return out

    @staticmethod
    def _free_with(pool: BlockPool, blocks: list[int], action: Action) -> None:
        pb = action.priority_blocks
        if pb < 0 or pb >= len(blocks):
            pool.free_blocks(blocks[::-1], action.priority)
        else:
            pool.free_blocks(blocks[pb:][::-1], NEVER)
            pool.free_blocks(blocks[:pb][::-1], action.priority)


def _intent(action: Action) -> FinishIntent:
    """The advice a simulated policy's action stands for (a retain without a TTL is none)."""
    if action.kind == "retain":
        if action.ttl_s <= 0:
            return FinishIntent(forecast=action.forecast)
        return FinishIntent("retain", int(action.ttl_s * 1000), action.forecast)
    if action.kind in ("release", "offload"):
        return FinishIntent(action.kind, forecast=action.forecast)
    return FinishIntent(forecast=action.forecast)


def run_policy(
    workload: Sequence[SimTrajectory],
    config: SimConfig,
    policy: Policy,
    *,
    working_set: int | None = None,
) -> RunStats:
    """Simulate ``workload`` under ``policy`` and return the raw totals.

    ``working_set`` (blocks) skips the reference run that sizes the pool from
    ``config.pool_fraction``; it is unused when ``config.pool_blocks`` is set.
    """
    blocks = size_pool(workload, config, working_set)
    return Engine(workload, config, policy, blocks).run()

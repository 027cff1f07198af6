"""The discrete-event engine: replicas, queues, prefill lanes, leases and preemption.

Time advances from event to event (a call arrives; a call's answer is done). A replica
admits waiting calls while it has a free sequence slot and blocks for the prompt; the
prefill runs on the replica's single prefill lane, then the answer decodes. When the
answer is done the call needs blocks for its output: leases are given up first, then the
most recently admitted other call is preempted (its blocks freed, it waits again and
recomputes). The policy then decides what happens to the call's blocks.

Everything is deterministic for a given workload, config and seed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentkv.sim._config import SimConfig
from agentkv.sim._policies import NEVER, Action, Policy, TurnView
from agentkv.sim._pool import BlockPool, KeyChain, LowerTier, make_pool
from agentkv.sim._routing import Router
from agentkv.sim._workload import SimTrajectory, max_request_blocks

__all__ = ["RunStats", "run_policy", "size_pool", "working_set_blocks"]

_ARRIVE, _FINISH = 0, 1


class _Req:
    __slots__ = ("arrival_s", "blocks", "epoch", "first", "keys", "replica", "traj", "turn")

    def __init__(self, traj: int, turn: int, keys: list[int], arrival_s: float) -> None:
        self.traj = traj
        self.turn = turn
        self.keys = keys
        self.arrival_s = arrival_s
        self.blocks: list[int] = []
        self.epoch = 0
        self.first = True
        self.replica = 0


@dataclass(eq=False, slots=True)
class _Lease:
    traj: int
    blocks: list[int]
    deadline_s: float
    action: Action
    alive: bool = True


@dataclass(eq=False)
class _Replica:
    index: int
    pool: BlockPool
    waiting: list[tuple[float, float, int, _Req]] = field(default_factory=list)
    running: list[_Req] = field(default_factory=list)
    lane_free_s: float = 0.0
    leases: dict[int, _Lease] = field(default_factory=dict)
    lease_heap: list[tuple[float, int, _Lease]] = field(default_factory=list)


@dataclass
class RunStats:
    """Raw totals of one run; :func:`agentkv.sim.summarize` turns them into metrics."""

    reusable_tokens: int = 0
    cached_tokens: int = 0
    lower_tier_tokens: int = 0
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


def working_set_blocks(workload: Sequence[SimTrajectory], config: SimConfig) -> int:
    """The workload's KV working set: peak blocks of live trajectories' contexts.

    Measured by a reference run with a pool that never evicts (stock LRU policy, the
    same timing model, queue and replicas), summed over replicas.
    """
    total = sum(
        -(-(t.prompt_tokens + t.output_tokens) // config.block_size)
        for tr in workload
        for t in tr.turns
    )
    ref = config.with_(pool_blocks=max(1, total), replicas=1, routing="session")
    return max(1, _Engine(workload, ref, Policy(), ref.pool_blocks or 1).run().peak_live_blocks)


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


class _Engine:
    def __init__(
        self, workload: Sequence[SimTrajectory], config: SimConfig, policy: Policy, pool_blocks: int
    ) -> None:
        self.workload = workload
        self.config = config
        self.block_size = config.block_size
        self.policy = policy
        self.stats = RunStats()
        self.stats.pool_blocks = pool_blocks
        self.replicas = []
        for i in range(config.replicas):
            tier = None
            if config.lower_tier is not None:
                t = config.lower_tier
                tier = LowerTier(
                    t.capacity_blocks, t.bandwidth_bytes_per_s, t.latency_s, config.block_bytes
                )
            pool = make_pool(
                self.stats.pool_blocks, priority_queue=policy.priority_queue, lower_tier=tier
            )
            self.replicas.append(_Replica(i, pool))
        self.router = Router(config.routing, config.replicas)
        self.chain = KeyChain()
        self.events: list[tuple[float, int, int, _Req, int]] = []
        self.seq = 0
        n = len(workload)
        self.ctx_keys: list[list[int]] = [[] for _ in range(n)]
        self.attained_s = [0.0] * n
        self.req_prio = [0] * n
        self.last_finish_s = [0.0] * n
        self.live_held = [0] * n
        self.live_blocks = 0
        self.fast = type(policy).after_turn is Policy.after_turn and not policy.priority_queue

    # -- events -----------------------------------------------------------------------
    def push(self, time_s: float, kind: int, req: _Req) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time_s, self.seq, kind, req, req.epoch))

    def run(self) -> RunStats:
        for i, traj in enumerate(self.workload):
            self.push(traj.start_s, _ARRIVE, self._new_req(i, 0, traj.start_s))
        events = self.events
        now = 0.0
        while events:
            now, _, kind, req, epoch = heapq.heappop(events)
            if kind == _ARRIVE:
                self.arrive(now, req)
            elif epoch == req.epoch:
                self.finish(now, req)
        st = self.stats
        st.makespan_s = now
        st.evictions = sum(r.pool.num_evictions for r in self.replicas)
        return st

    def _new_req(self, traj: int, turn: int, now: float) -> _Req:
        t = self.workload[traj].turns[turn]
        keys = self.chain.extend(
            self.ctx_keys[traj], t.shared_tokens, t.prompt_tokens + t.output_tokens, self.block_size
        )
        self.ctx_keys[traj] = keys
        return _Req(traj, turn, keys, now)

    def arrive(self, now: float, req: _Req) -> None:
        traj = self.workload[req.traj]
        turn = traj.turns[req.turn]
        self.stats.reusable_tokens += turn.shared_tokens
        self.stats.prompt_tokens += turn.prompt_tokens
        if req.turn > 0:
            prev = traj.turns[req.turn - 1]
            self.policy.on_resume(
                traj.trajectory_id, prev.tool_class, now - self.last_finish_s[req.traj]
            )
        max_hit = (turn.prompt_tokens - 1) // self.block_size
        req.replica = self.router.route(traj.trajectory_id, req.keys, max_hit, self.replicas)
        r = self.replicas[req.replica]
        self.enqueue(r, req)
        self.schedule(now, r)

    def enqueue(self, r: _Replica, req: _Req) -> None:
        q = self.config.queue
        if q == "fcfs":
            k1 = req.arrival_s
        elif q == "priority":
            k1 = float(self.req_prio[req.traj])
        else:
            k1 = self.attained_s[req.traj]
        self.seq += 1
        heapq.heappush(r.waiting, (k1, req.arrival_s, self.seq, req))

    # -- admission ----------------------------------------------------------------------
    def expire_leases(self, now: float, r: _Replica) -> None:
        heap = r.lease_heap
        while heap and heap[0][0] <= now:
            lease = heapq.heappop(heap)[2]
            if lease.alive:
                self.drop_lease(r, lease)

    def drop_lease(self, r: _Replica, lease: _Lease) -> None:
        lease.alive = False
        del r.leases[lease.traj]
        self.free_with(r.pool, lease.blocks, lease.action)

    def free_with(self, pool: BlockPool, blocks: list[int], action: Action) -> None:
        pb = action.priority_blocks
        if pb < 0 or pb >= len(blocks):
            pool.free_blocks(blocks[::-1], action.priority)
        else:
            pool.free_blocks(blocks[pb:][::-1], NEVER)
            pool.free_blocks(blocks[:pb][::-1], action.priority)

    def force_one_lease(self, r: _Replica, keep: int) -> bool:
        """Pressure override: give up the lease with the latest deadline (not ``keep``'s)."""
        best = None
        for lease in r.leases.values():
            if lease.traj != keep and (best is None or lease.deadline_s > best.deadline_s):
                best = lease
        if best is None:
            return False
        self.drop_lease(r, best)
        self.stats.leases_forced += 1
        return True

    def available(self, r: _Replica, req: _Req, hit: list[int]) -> int:
        pool = r.pool
        refcount = pool.refcount
        hit_blocks = set(hit)
        avail = pool.num_free - sum(1 for b in hit_blocks if refcount(b) == 0)
        lease = r.leases.get(req.traj)
        if lease is not None:
            avail += sum(1 for b in lease.blocks if refcount(b) == 1 and b not in hit_blocks)
        return avail

    def schedule(self, now: float, r: _Replica) -> None:
        self.expire_leases(now, r)
        while r.waiting and len(r.running) < self.config.max_num_seqs:
            if not self.admit(now, r, r.waiting[0][3]):
                break
            heapq.heappop(r.waiting)

    def admit(self, now: float, r: _Replica, req: _Req) -> bool:
        traj = self.workload[req.traj]
        turn = traj.turns[req.turn]
        bs, pool, p = self.block_size, r.pool, turn.prompt_tokens
        max_hit = (p - 1) // bs if p > 0 else 0
        hit = pool.lookup(req.keys, max_hit)
        h = len(hit)
        need = -(-p // bs) - h
        if r.leases or need + h > pool.num_free:
            while self.available(r, req, hit) < need:
                if not self.force_one_lease(r, req.traj):
                    return False
        low = pool.match_lower(req.keys, h, max_hit) if pool.lower_tier is not None else 0
        pool.take(hit)
        if r.leases:
            own = r.leases.get(req.traj)
            if own is not None:
                self.drop_lease(r, own)
        new = pool.allocate(need)
        assert new is not None  # available() said so
        pool.assign_keys(new, req.keys[h : p // bs])
        hit += new
        req.blocks = hit
        hit_tokens = (h + low) * bs
        st = self.stats
        computed = p - hit_tokens
        st.prefill_tokens_computed += computed
        st.rebuilt_tokens += max(0, turn.shared_tokens - hit_tokens)
        if req.first:
            st.cached_tokens += min(hit_tokens, turn.shared_tokens)
            st.lower_tier_tokens += low * bs
            st.queue_wait_s += now - req.arrival_s
            req.first = False
        load_s = 0.0
        if low and pool.lower_tier is not None:
            for k in req.keys[h : h + low]:
                pool.lower_tier.touch(k)
            load_s = pool.lower_tier.load_time_s(low)
            if getattr(self.policy, "prefetch", False) and req.turn > 0:
                load_s = max(0.0, load_s - (traj.turns[req.turn - 1].gap_s or 0.0))
        cost = self.config.cost
        prefill_s = cost.prefill_s(computed, hit_tokens)
        start = max(now + load_s, r.lane_free_s)
        r.lane_free_s = start + prefill_s
        decode_s = cost.decode_s(turn.output_tokens)
        self.attained_s[req.traj] += prefill_s + decode_s
        r.running.append(req)
        self.push(r.lane_free_s + decode_s, _FINISH, req)
        return True

    # -- completion -----------------------------------------------------------------------
    def preempt_one(self, r: _Replica, keep: _Req) -> bool:
        for victim in reversed(r.running):
            if victim is not keep:
                r.running.remove(victim)
                victim.epoch += 1
                r.pool.free_blocks(victim.blocks[::-1])
                victim.blocks = []
                self.stats.preemptions += 1
                self.enqueue(r, victim)
                return True
        return False

    def finish(self, now: float, req: _Req) -> None:
        traj = self.workload[req.traj]
        turn = traj.turns[req.turn]
        r = self.replicas[req.replica]
        bs, pool = self.block_size, r.pool
        total = turn.prompt_tokens + turn.output_tokens
        grow = -(-total // bs) - len(req.blocks)
        if grow > 0:
            while pool.num_free < grow:
                if not self.force_one_lease(r, -1) and not self.preempt_one(r, req):
                    break
            more = pool.allocate(grow)
            assert more is not None, "pool smaller than one call; size_pool prevents this"
            req.blocks.extend(more)
        lo = turn.prompt_tokens // bs
        pool.assign_keys(req.blocks[lo : total // bs], req.keys[lo : total // bs])
        r.running.remove(req)
        self.stats.num_turns += 1
        held = len(req.blocks)
        self.live_blocks += held - self.live_held[req.traj]
        self.live_held[req.traj] = held
        if self.live_blocks > self.stats.peak_live_blocks:
            self.stats.peak_live_blocks = self.live_blocks
        self.last_finish_s[req.traj] = now
        last = req.turn == len(traj.turns) - 1
        action = self.decide(now, r, req, last)
        self.apply(now, r, req, action)
        if last:
            self.stats.jct_s.append(now - traj.start_s)
            self.live_blocks -= held
            self.live_held[req.traj] = 0
        else:
            nxt = self._new_req(req.traj, req.turn + 1, now + (turn.gap_s or 0.0))
            self.push(nxt.arrival_s, _ARRIVE, nxt)
        self.schedule(now, r)

    def decide(self, now: float, r: _Replica, req: _Req, last: bool) -> Action:
        if self.fast:
            return Action("free")
        traj = self.workload[req.traj]
        turn = traj.turns[req.turn]
        ctx = turn.prompt_tokens + turn.output_tokens
        nxt_use: float | None = None
        nxt_blocks = 0
        if not last:
            nt = traj.turns[req.turn + 1]
            nxt_use = now + (turn.gap_s or 0.0)
            nxt_blocks = min(
                nt.shared_tokens // self.block_size,
                max(0, (nt.prompt_tokens - 1) // self.block_size),
            )
        tier = r.pool.lower_tier
        view = TurnView(
            now_s=now,
            trajectory_id=traj.trajectory_id,
            turn_id=req.turn,
            tool_class=turn.tool_class,
            terminal=last,
            context_tokens=ctx,
            context_blocks=len(req.blocks),
            kv_usage=r.pool.usage,
            num_waiting=len(r.waiting),
            has_lower_tier=tier is not None,
            attained_service_s=self.attained_s[req.traj],
            recompute_s=self.config.cost.prefill_s(ctx),
            load_s=tier.load_time_s(len(req.blocks)) if tier is not None else 0.0,
            used_blocks=r.pool.num_blocks - r.pool.num_free,
            future_next_use_s=nxt_use,
            future_shared_blocks=nxt_blocks,
        )
        return self.policy.after_turn(view)

    def apply(self, now: float, r: _Replica, req: _Req, action: Action) -> None:
        pool, blocks = r.pool, req.blocks
        req.blocks = []
        self.req_prio[req.traj] = action.request_priority
        kind = action.kind
        if kind == "retain" and action.ttl_s > 0:
            old = r.leases.get(req.traj)
            if old is not None:
                self.drop_lease(r, old)
            lease = _Lease(req.traj, blocks, now + action.ttl_s, action)
            r.leases[req.traj] = lease
            self.seq += 1
            heapq.heappush(r.lease_heap, (lease.deadline_s, self.seq, lease))
            return
        if kind == "offload" and pool.lower_tier is not None:
            for b in blocks:
                k = pool.key[b]
                if k:
                    pool.lower_tier.store(k)
        self.free_with(pool, blocks, action)
        if kind in ("release", "offload"):
            pool.demote(blocks)


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
    return _Engine(workload, config, policy, blocks).run()

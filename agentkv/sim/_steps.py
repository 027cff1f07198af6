"""One replica's engine steps, as vLLM 0.32's scheduler runs them, driving the policy core.

A step schedules, in this order (``Scheduler.schedule``): every running call (a chunk
of its prompt, or one decode token), allocating blocks as it goes; when an allocation
fails, the pressure override gives up lease blocks (the core picks them), and only then
is the most recently admitted running call preempted. If nothing was preempted, waiting
calls are admitted in queue order while the token budget and the sequence slots last:
the core's admission decides which are held back this step (the plugin's
``_handle_blocked_waiting_request`` hook); an admitted call takes its cached prefix and
its lease is handed over. A waiting call is admitted only when the blocks of its whole
prompt fit, though it allocates only its first chunk's (vLLM 0.32's
``scheduler_reserve_full_isl``, on by default). A call whose blocks cannot be found even
after the override stops admission for the step, as in vLLM.

Steps that only decode are identical until a call finishes, needs a new block, or a
lease deadline or an admission wait ends, so they are simulated together; an arrival
in the middle cuts such a run of steps at the next step boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentkv.residency._controller import ResidencyController
    from agentkv.sim._config import SimConfig
    from agentkv.sim._pool import BlockPool
    from agentkv.sim._prefetch import TierPrefetcher
    from agentkv.sim._rewarm import Rewarmer

__all__ = ["Replica", "SimCall", "Step", "StepHost", "StepScheduler"]

#: Seconds a replica whose waiting calls are all held sleeps before it plans again (the
#: plugin's ``IDLE_HOLD_SLEEP_S``).
IDLE_WAKE_S = 0.002


class SimCall:
    """One model call in flight: its context's content keys and its progress."""

    __slots__ = (
        "arrival_s",
        "blocks",
        "cached_blocks",
        "computed",
        "first",
        "generated",
        "keyed",
        "keys",
        "output",
        "preempted",
        "prompt",
        "replica",
        "sent_s",
        "target",
        "traj",
        "turn",
    )

    def __init__(self, traj: int, turn: int, keys: list[int], prompt: int, output: int) -> None:
        self.traj = traj
        self.turn = turn
        self.keys = keys
        self.prompt = prompt
        self.output = max(1, output)
        self.target = prompt  # tokens to prefill (prompt, plus output after a preemption)
        self.computed = 0  # tokens whose KV exists
        self.generated = 0  # output tokens sampled
        self.blocks: list[int] = []
        self.keyed = 0  # leading blocks that carry their content key
        self.first = True  # not admitted yet (a preempted call is admitted again)
        self.cached_blocks = 0  # blocks found cached (or in the lower tier) at first admission
        self.preempted = False
        self.sent_s = 0.0
        self.arrival_s = 0.0
        self.replica = 0


@dataclass(eq=False, slots=True)
class Step:
    """A run of ``k`` identical engine steps of ``dt`` seconds each, from ``start_s``."""

    start_s: float
    dt: float
    k: int
    work: list[tuple[SimCall, int, bool]]  # (call, tokens per step, is a prompt chunk)


@dataclass(eq=False)
class Replica:
    """One server: its block pool, its residency controller, its queues and its steps."""

    index: int
    pool: BlockPool
    ctl: ResidencyController[int]
    waiting: list[SimCall] = field(default_factory=list)
    running: list[SimCall] = field(default_factory=list)
    step: Step | None = None
    epoch: int = 0


class StepHost(Protocol):
    """What the step scheduler needs from the engine that owns the event queue."""

    def push_step(self, r: Replica) -> None:
        """Schedule the end of ``r``'s current steps."""
        ...

    def push_wake(self, time_s: float, r: Replica) -> None:
        """Wake ``r`` at ``time_s`` to plan again."""
        ...

    def finish_call(self, now: float, r: Replica, call: SimCall) -> None:
        """``call``'s answer is done."""
        ...

    def count_admission(self, now: float, r: Replica, call: SimCall, hit: int, low: int) -> None:
        """``call`` was admitted with ``hit`` cached and ``low`` lower-tier blocks."""
        ...

    def queue_order(self, r: Replica) -> list[SimCall]:
        """``r``'s waiting calls in the order its scheduler admits them."""
        ...


class StepScheduler:
    """Step planning and execution on every replica (see the module docstring).

    ``host`` owns the event queue and the calls' lifecycle; ``attained_s`` is the
    engine's per-trajectory attained service, which steps add to; ``rewarm`` is the
    re-warm experiment and ``prefetch`` tier prefetch, or None.
    """

    def __init__(
        self,
        host: StepHost,
        config: SimConfig,
        traj_ids: list[str],
        attained_s: list[float],
        rewarm: Rewarmer | None = None,
        prefetch: TierPrefetcher | None = None,
    ) -> None:
        self.host = host
        self.config = config
        self.block_size = config.block_size
        self.traj_ids = traj_ids
        self.attained_s = attained_s
        self.rewarm = rewarm
        self.prefetch = prefetch
        self.preemptions = 0
        self.pressure_releases = 0
        self.busy_s = 0.0

    # -- blocks ------------------------------------------------------------------------
    def key_blocks(self, r: Replica, call: SimCall, tokens: int) -> None:
        """Give the call's blocks that ``tokens`` filled their content keys."""
        hi = min(tokens // self.block_size, len(call.keys), len(call.blocks))
        if hi > call.keyed:
            r.pool.assign_keys(call.blocks[call.keyed : hi], call.keys[call.keyed : hi])
            call.keyed = hi

    def make_room(self, now: float, r: Replica, need: int, traj: int, hit: list[int]) -> bool:
        """The pressure override: give up lease blocks until ``need`` blocks can be
        allocated beside ``hit`` (blocks about to be taken); False if leases run out."""
        pool, ctl, tid = r.pool, r.ctl, self.traj_ids[traj]
        while True:
            avail = pool.num_free
            if hit:
                avail -= sum(1 for b in hit if pool.refcount(b) == 0)
            if avail >= need:
                return True
            if not ctl.give_way(tid, need - avail, now):
                return False
            self.pressure_releases += 1

    def preempt(self, now: float, r: Replica, victim: SimCall) -> None:
        """Preempt a running call: its blocks are freed, it waits at the head again (a
        re-warm call is dropped instead)."""
        r.running.remove(victim)
        if victim.turn < 0:
            assert self.rewarm is not None
            self.rewarm.finish(now, r, victim, dropped=True)
            return
        self.key_blocks(r, victim, victim.computed)
        r.pool.free_blocks(victim.blocks[::-1])
        victim.blocks = []
        victim.keyed = 0
        victim.target = victim.prompt + victim.generated
        victim.computed = 0
        victim.preempted = True
        self.preemptions += 1
        r.waiting.insert(0, victim)

    def grow(self, now: float, r: Replica, call: SimCall, tokens: int) -> tuple[bool, bool]:
        """Blocks for ``tokens`` of a running call; returns (call still runs, preempted any)."""
        need = -(-tokens // self.block_size) - len(call.blocks)
        if need <= 0:
            return True, False
        preempted = False
        while not self.make_room(now, r, need, call.traj, []):
            victim = r.running[-1]
            self.preempt(now, r, victim)
            preempted = True
            if victim is call:
                return False, True
        new = r.pool.allocate(need)
        assert new is not None
        call.blocks += new
        return True, preempted

    # -- planning ----------------------------------------------------------------------
    def plan_step(self, now: float, r: Replica) -> Step | None:
        """Schedule the next step (or run of identical steps); None when idle."""
        r.ctl.expire(now)
        if self.prefetch is not None:
            self.prefetch.run(now, r)
        budget = self.config.max_num_batched_tokens
        work: list[tuple[SimCall, int, bool]] = []
        preempted = False
        i = 0
        while i < len(r.running) and budget > 0:
            call = r.running[i]
            chunk = call.computed < call.target
            n = min(call.target - call.computed, budget) if chunk else 1
            runs, any_preempted = self.grow(now, r, call, call.computed + n)
            preempted = preempted or any_preempted
            if not runs:
                continue
            work.append((call, n, chunk))
            budget -= n
            i += 1
        load_s = 0.0
        if not preempted and r.waiting and budget > 0:
            load_s = self.admit_waiting(now, r, budget, work)
        if not preempted and not r.waiting and self.rewarm is not None:
            left = self.config.max_num_batched_tokens - sum(n for _, n, _ in work)
            self.rewarm.maybe_start(now, r, left, work)
        if not work:
            return None
        return self._timed(now, r, work, load_s)

    def _timed(
        self, now: float, r: Replica, work: list[tuple[SimCall, int, bool]], load_s: float
    ) -> Step:
        cost = self.config.cost
        chunks = [(n, call.computed) for call, n, chunk in work if chunk]
        decodes = len(work) - len(chunks)
        dt = cost.step_s(decodes, chunks) + load_s
        k = 1
        if not chunks and load_s == 0.0:
            bs = self.block_size
            k = min(
                min(call.output - call.generated, len(call.blocks) * bs - call.computed)
                for call, _, _ in work
            )
            wake = self.wake_s(r)
            if dt > 0 and wake < math.inf:
                k = min(k, max(1, math.ceil((wake - now) / dt)))
            k = max(1, k)
        return Step(now, dt, k, work)

    def wake_s(self, r: Replica) -> float:
        """When waiting calls may become admissible without a call finishing: the next
        lease deadline or the end of an admission wait (inf when nothing waits)."""
        if not r.waiting:
            return math.inf
        core = r.ctl.core
        out = math.inf
        for st in core.book.iter_leased():
            assert st.lease is not None
            out = min(out, st.lease.deadline_s)
        for call in r.waiting:
            w = core.book.get(self.traj_ids[call.traj])
            if w is not None and w.held and w.waiting_since_s is not None:
                out = min(out, w.waiting_since_s + core.hold_limit_s(w.tenant))
        return out

    # -- admission ---------------------------------------------------------------------
    def need_blocks(self, r: Replica, call: SimCall) -> int:
        """Blocks the call must allocate to hold its whole prompt (cached ones excluded)."""
        bs = self.block_size
        hit = r.pool.match(call.keys, (call.target - 1) // bs)
        return max(0, -(-call.target // bs) - hit)

    def admit_waiting(
        self, now: float, r: Replica, budget: int, work: list[tuple[SimCall, int, bool]]
    ) -> float:
        """Admit waiting calls into ``work``; returns seconds of lower-tier loads."""
        ctl, ids = r.ctl, self.traj_ids
        order = self.host.queue_order(r)
        gated = [
            (ctl.book.state(ids[c.traj], now), self.need_blocks(r, c))
            for c in order
            if not c.preempted
        ]
        held = ctl.plan_admission(
            gated, now, free_blocks=r.pool.num_free, num_running=len(r.running)
        )
        admitted: set[int] = set()
        load_s = 0.0
        for call in order:
            if budget <= 0 or len(r.running) >= self.config.max_num_seqs:
                break
            if not call.preempted and ids[call.traj] in held:
                continue
            got = self.admit(now, r, call, budget)
            if got is None:
                break
            n, call_load_s = got
            load_s += call_load_s
            work.append((call, n, True))
            admitted.add(id(call))
            budget -= n
        if admitted:
            r.waiting = [c for c in r.waiting if id(c) not in admitted]
        return load_s

    def admit(self, now: float, r: Replica, call: SimCall, budget: int) -> tuple[int, float] | None:
        """Take the call's cached prefix and blocks for its first chunk; None if short."""
        pool, bs = r.pool, self.block_size
        max_hit = (call.target - 1) // bs
        hit = pool.lookup(call.keys, max_hit)
        h = len(hit)
        tier = pool.lower_tier
        low = pool.match_lower(call.keys, h, max_hit) if tier is not None else 0
        computed = (h + low) * bs
        n = min(call.target - computed, budget)
        need = -(-(computed + n) // bs) - h
        whole = -(-call.target // bs) - h  # the whole prompt must fit to be admitted
        if not self.make_room(now, r, max(need, whole), call.traj, hit):
            return None
        pool.take(hit)
        r.ctl.on_admitted(self.traj_ids[call.traj], now)
        new = pool.allocate(need)
        assert new is not None  # make_room() said so
        call.blocks = hit + new
        call.keyed = h
        load_s = 0.0
        if low and tier is not None:
            pool.assign_keys(new[:low], call.keys[h : h + low])
            call.keyed = h + low
            for key in call.keys[h : h + low]:
                tier.touch(key)
            load_s = tier.load_time_s(low)
        if self.prefetch is not None and call.first:
            load_s += self.prefetch.stall_s(call.traj, now)
        call.computed = computed
        if call.first:
            call.cached_blocks = h + low
        self.host.count_admission(now, r, call, h, low)
        call.first = False
        call.preempted = False
        r.running.append(call)
        return n, load_s

    # -- execution ---------------------------------------------------------------------
    def end_step(self, now: float, r: Replica) -> None:
        """Apply the finished steps' progress, finish calls, and plan what comes next."""
        step = r.step
        assert step is not None
        r.step = None
        self.busy_s += step.k * step.dt
        finished: list[SimCall] = []
        cost = self.config.cost
        core, ids = r.ctl.core, self.traj_ids
        prefilled = sum(n for _, n, chunk in step.work if chunk)
        if prefilled:  # what the plugin learns from the engine's steps (a chunk: k == 1)
            core.observe_step(prefilled / self.block_size, step.dt)
        for call, n, chunk in step.work:
            st = core.book.get(ids[call.traj])
            if st is not None:  # program-level attained service, as the plugin counts it
                st.attained_tokens += n if chunk else step.k
            if chunk:
                self.attained_s[call.traj] += cost.prefill_s(n, call.computed)
                call.computed += n
                self.key_blocks(r, call, call.computed)
                if call.computed >= call.target:
                    call.generated += 1
            else:
                self.attained_s[call.traj] += step.k * cost.decode_s_per_token
                call.computed += step.k
                call.generated += step.k
            if call.generated >= call.output:
                finished.append(call)
        for call in finished:
            if call.turn < 0:
                r.running.remove(call)
                assert self.rewarm is not None
                self.rewarm.finish(now, r, call, dropped=False)
            else:
                self.host.finish_call(now, r, call)
        self.begin_step(now, r)

    def begin_step(self, now: float, r: Replica) -> None:
        """Plan and start the replica's next steps (nothing when it has no work)."""
        step = self.plan_step(now, r)
        r.step = step
        if step is not None:
            r.epoch += 1
            self.host.push_step(r)
        elif r.waiting:
            # Every waiting call is held back and nothing runs: no step end or arrival
            # may come to re-plan, so wake at the next lease deadline or hold's end (the
            # plugin re-plans every engine step; when idle it sleeps IDLE_WAKE_S).
            wake = self.wake_s(r)
            if wake < math.inf:
                self.host.push_wake(max(wake, now + IDLE_WAKE_S), r)

    def cut_step(self, now: float, r: Replica) -> None:
        """An arrival: end a run of identical steps at the next step boundary."""
        step = r.step
        if step is None or step.k <= 1 or step.dt <= 0:
            return
        done = int((now - step.start_s) / step.dt) + 1
        if done < step.k:
            step.k = done
            r.epoch += 1
            self.host.push_step(r)

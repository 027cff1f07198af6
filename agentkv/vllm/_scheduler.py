"""The agentkv scheduler plugin for vLLM 0.32 (loaded with ``--scheduler-cls``).

Pass ``--scheduler-cls agentkv.vllm._scheduler.AgentKVScheduler``. vLLM calls that
name with the scheduler's keyword arguments inside the engine-core process; it is a
factory that applies :class:`AgentKVSchedulerMixin` to ``AsyncScheduler`` when async
scheduling is on (GPU builds) and to ``Scheduler`` otherwise (the CPU build).

What the mixin adds, keyed by the trajectory id in ``vllm_xargs["agentkv_traj"]``
scoped by the request's ``cache_salt`` (:mod:`agentkv.vllm._tenancy`: one tenant cannot
name, read, release or extend another's trajectory):

- retain: when a request advised ``retain`` finishes, its cached prefix blocks get one
  extra reference each (a lease) until a deadline (capped); leases expire lazily at the
  top of ``schedule()`` and are handed over when the trajectory's next turn is admitted;
- pressure override: when ``allocate_slots`` fails, leases are ended (earliest deadline
  first) and the allocation retried before vLLM would preempt or stall anything;
- release: the cached blocks a trajectory computed itself (never those it only hit in
  the cache) move to the head of the free queue, so they are evicted first; blocks
  another tracked trajectory covers are never demoted;
- tombstones: a finished or cancelled trajectory's late turns, and aborted or failed
  requests, get no lease;
- priority (under ``--scheduling-policy priority``): an offset inside a band around the
  request's own priority (advice, a step for resumed turns with state, a penalty for
  program-level attained service), and aging bounded to just ahead of that band;
- observe / shadow clients (``agentkv_mode``): counted, nothing applied.

The control channel's operations (events, queries, stats) live in
:mod:`agentkv.vllm._ops`.

Every hook runs guarded: an exception inside agentkv code is counted
(``internal_errors``) and logged, and vLLM's own behaviour continues. A bug here must
never take the engine down.
"""

from __future__ import annotations

import heapq
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentkv.residency._core import PolicyCore
from agentkv.residency._forecast import Forecast
from agentkv.vllm._admission import AdmissionMixin
from agentkv.vllm._hints import Hint, decide_finish, has_lower_tier, parse_hint
from agentkv.vllm._ops import ControlOpsMixin
from agentkv.vllm._settings import SchedSettings
from agentkv.vllm._tenancy import Scoper

__all__ = ["AgentKVScheduler", "AgentKVSchedulerMixin", "TurnEntry", "make_scheduler_class"]

_log = logging.getLogger("agentkv.scheduler")

if TYPE_CHECKING:
    _Base = Any
else:
    _Base = object


#: Finished statuses after which a turn may leave a lease (vLLM's names); an aborted,
#: failed or ignored request never does.
_LEASABLE = frozenset({"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"})


@dataclass(slots=True)
class TurnEntry:
    """What the plugin keeps about one live hinted request."""

    key: str  # the book's key: tenant-scoped trajectory id
    tenant: str
    hint: Hint
    lease_ok: bool = True  # False: a late turn of a finished or cancelled trajectory
    cached_blocks: int | None = None  # its prefix-cache hit at admission, in blocks


class AgentKVSchedulerMixin(AdmissionMixin, ControlOpsMixin):
    """Hint-honouring overrides for vLLM's ``Scheduler`` / ``AsyncScheduler`` (see module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._akv_ready = False
        self._akv_internal_errors = 0
        try:
            self._akv_setup()
            self._akv_ready = True
        except Exception:
            _log.exception("agentkv plugin setup failed; serving with vLLM's default behaviour")

    # -- setup and guards ----------------------------------------------------------------
    def _akv_setup(self) -> None:
        self._akv_settings = SchedSettings.from_env()
        pool = self.kv_cache_manager.block_pool
        self._akv_pool = pool
        self._akv_num_blocks = int(pool.num_gpu_blocks) - 1  # the null block is never usable
        self._akv: PolicyCore[Any] = PolicyCore(self._akv_settings, self._akv_num_blocks)
        self._akv_scoper = Scoper()
        self._akv_req: dict[str, TurnEntry] = {}
        self._akv_base: dict[str, int] = {}  # request id -> its own priority (for aging)
        # Lifecycle events for a trajectory no request of this engine ever named: a sign
        # that a router sent them to another replica or rank than the trajectory's calls.
        self._akv_events_unknown = 0
        self._akv_group_ids = list(range(len(self.kv_cache_config.kv_cache_groups)))
        self._akv_hits = {}
        self._akv_steps = deque(maxlen=8)
        # A lower tier: vLLM's offloading connector (GPU builds) stores computed blocks.
        self._akv_lower_tier = has_lower_tier(getattr(self.vllm_config, "kv_transfer_config", None))
        self._akv_priority_policy = str(getattr(self.policy, "value", self.policy)) == "priority"
        original = self.kv_cache_manager.allocate_slots

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(request, *args, **kwargs)
            if result is not None or not self._akv_ready or not self._akv_settings.lifecycle:
                return result
            try:
                entry = self._akv_req.get(request.request_id)
                exclude = entry.key if entry is not None else None
                now = time.monotonic()
                new_tokens = int(args[0] if args else kwargs.get("num_new_tokens", 0))
                while result is None and self._akv.pressure_release(
                    exclude, now, self._akv_shortfall(request, new_tokens)
                ):
                    self._akv_apply_frees()
                    result = original(request, *args, **kwargs)
            except Exception:
                self._akv_fail("allocate_slots")
            return result

        self.kv_cache_manager.allocate_slots = allocate_slots
        _log.info(
            "agentkv scheduler plugin active: lifecycle=%s program=%s priority_policy=%s "
            "blocks=%d max_ttl_ms=%d max_retained_fraction=%.2f",
            self._akv_settings.lifecycle,
            self._akv_settings.program,
            self._akv_priority_policy,
            self._akv_num_blocks,
            self._akv_settings.max_ttl_ms,
            self._akv_settings.max_retained_fraction,
        )

    def _akv_fail(self, where: str) -> None:
        self._akv_internal_errors += 1
        n = self._akv_internal_errors
        if n <= 20 or n % 1000 == 0:
            _log.exception("agentkv hook %s failed (%d so far); vLLM behaviour continues", where, n)

    def _akv_shortfall(self, request: Any, new_tokens: int) -> int:
        """Blocks a failed allocation lacks, at least (>= 1; the override gives up one
        victim's blocks at a time and retries). A request not running yet is admitted
        only when its whole uncached prompt fits (vLLM 0.32's
        ``scheduler_reserve_full_isl``, on by default), a running one needs its next
        tokens. Giving up the allocation's size instead of what it lacks threw away
        whole leases for a block or two."""
        free = int(self._akv_pool.get_num_free_blocks())
        if int(request.num_computed_tokens) == 0:
            need = self._akv_need_blocks(request)
        else:
            groups = max(1, len(self._akv_group_ids))
            need = (-(-new_tokens // int(self.block_size)) + 1) * groups
        return max(1, need - free)

    def _akv_apply_frees(self) -> None:
        for blocks in self._akv.drain_frees():
            if blocks:
                self._akv_pool.free_blocks(reversed(blocks))

    def _akv_cached_prefix(self, hashes: Sequence[bytes]) -> list[Any]:
        """Blocks still cached for the longest prefix of ``hashes`` (all groups)."""
        out: list[Any] = []
        for h in hashes:
            got = self._akv_pool.get_cached_block(h, self._akv_group_ids)
            if not got:
                break
            out.extend(got)
        return out

    def _akv_take_lease(self, st: Any, ttl_ms: int, now_s: float) -> None:
        groups = max(1, len(self._akv_group_ids))
        free = int(self._akv_pool.get_num_free_blocks())
        wanted = len(st.hashes) * groups
        n = self._akv.plan_lease(
            st, wanted, now_s, advised=True, free_blocks=free, demand_blocks=self._akv_demand
        )
        n //= groups
        blocks = self._akv_cached_prefix(st.hashes[:n])
        if not blocks:
            return
        self._akv_pool.touch(blocks)
        self._akv.set_lease(st, blocks, ttl_ms, now_s)
        self._akv_apply_frees()

    def _akv_release(self, st: Any) -> int:
        """End ``st``'s lease and demote the free cached blocks it computed itself and no
        other tracked trajectory covers; returns the demoted count."""
        n = self._akv_demote(st)
        st.last_outcome = "released"
        self._akv.set_hashes(st, [])
        return n

    def _akv_demote(self, st: Any) -> int:
        """End ``st``'s lease; the free cached blocks it computed itself (never those it
        only hit in the cache) and no other tracked trajectory covers go to the head of
        the free queue (evicted first); returns how many."""
        self._akv.end_lease(st, "released")
        self._akv_apply_frees()
        queue = self._akv_pool.free_block_queue
        demoted: list[Any] = []
        for h in self._akv.own_unshared(st):
            for block in self._akv_pool.get_cached_block(h, self._akv_group_ids) or ():
                if block.ref_cnt == 0 and not block.is_null and block.prev_free_block is not None:
                    queue.remove(block)
                    demoted.append(block)
        if demoted:
            queue.prepend_n(demoted)
        self._akv.counters.blocks_demoted += len(demoted)
        return len(demoted)

    def _akv_turns_of(self, st: Any) -> list[TurnEntry]:
        return [e for r in st.live_requests if (e := self._akv_req.get(r)) is not None]

    # -- vLLM hooks ----------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        if self._akv_ready and request.request_id not in self.requests:
            try:
                self._akv_on_add(request)
            except Exception:
                self._akv_fail("add_request")
        super().add_request(request)

    def _akv_on_add(self, request: Any) -> None:
        self._akv_base[request.request_id] = int(request.priority)
        params = getattr(request, "sampling_params", None)
        hint = parse_hint(getattr(params, "extra_args", None))
        if hint is None:
            return
        c = self._akv.counters
        c.hints_received += 1
        c.hint_errors += len(hint.errors)
        if hint.passive:
            c.hints_observed += 1
            return
        if not hint.trajectory_id:
            return
        now = time.monotonic()
        salt = getattr(request, "cache_salt", None)
        tenant = self._akv_scoper.tenant(salt)
        key = self._akv_scoper.key(salt, hint.trajectory_id)
        st = self._akv.state(key, now, tenant)
        entry = TurnEntry(key, tenant, hint)
        if st.closed:
            if hint.turn_id == 0:
                st.closed = False  # the id starts a new run (e.g. a LangGraph thread)
            else:
                entry.lease_ok = False  # a late turn of a finished or cancelled run
        self._akv.on_waiting(st, now, hint.turn_id)
        st.live_requests.add(request.request_id)
        self._akv_req[request.request_id] = entry
        if self._akv_settings.program and self._akv_priority_policy:
            request.priority = self._akv.assign_priority(st, hint.priority, request.priority)
            st.last_priority = request.priority

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._akv_ready:
            try:
                self._akv_before_schedule()
            except Exception:
                self._akv_fail("schedule.before")
        out = super().schedule(*args, **kwargs)
        if self._akv_ready:
            try:
                self._akv_after_schedule(out)
            except Exception:
                self._akv_fail("schedule.after")
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        if self._akv_ready and self._akv_settings.admission:
            try:
                self._akv_time_step(scheduler_output)
            except Exception:
                self._akv_fail("update_from_output")
        return super().update_from_output(scheduler_output, model_runner_output)

    def _akv_before_schedule(self) -> None:
        now = time.monotonic()
        if self._akv.expire(now):
            self._akv_apply_frees()
        self._akv_plan_admission(now)
        if self._akv_settings.program and self._akv_priority_policy:
            heap = getattr(self.waiting, "_heap", None)
            if heap:
                cutoff = time.time() - self._akv_settings.aging_s
                changed = 0
                for req in heap:
                    if req.arrival_time >= cutoff:
                        continue
                    own = self._akv_base.setdefault(req.request_id, req.priority)
                    aged = self._akv.aged_priority(own)
                    if req.priority > aged:
                        req.priority = aged
                        changed += 1
                if changed:
                    heapq.heapify(heap)
                    self._akv.counters.requests_aged += changed

    def _akv_after_schedule(self, out: Any) -> None:
        size = int(self.block_size)
        if self._akv_settings.admission:
            self._akv_mark_step(out)
        for data in out.scheduled_new_reqs:
            entry = self._akv_req.get(data.req_id)
            if entry is not None:
                if entry.cached_blocks is None:  # first admission: what it found cached
                    entry.cached_blocks = int(data.num_computed_tokens) // size
                st = self._akv.get(entry.key)
                if st is not None:
                    self._akv.on_scheduled(st, time.monotonic())
        self._akv_apply_frees()
        for req_id, n in out.num_scheduled_tokens.items():
            entry = self._akv_req.get(req_id)
            if entry is not None:
                st = self._akv.get(entry.key)
                if st is not None:
                    st.attained_tokens += int(n)

    def _free_blocks(self, request: Any) -> None:
        after = None
        self._akv_base.pop(request.request_id, None)
        if self._akv_ready:
            try:
                after = self._akv_before_free(request)
            except Exception:
                self._akv_fail("free_blocks.before")
        super()._free_blocks(request)
        if after is not None:
            try:
                what, st = after
                if what == "release":
                    self._akv_release(st)
                else:  # offload: the lower tier holds the blocks; device memory goes first
                    self._akv.counters.offloads += 1
                    self._akv_demote(st)
            except Exception:
                self._akv_fail("free_blocks.release")

    def _akv_before_free(self, request: Any) -> Any:
        entry = self._akv_req.pop(request.request_id, None)
        if entry is None:
            return None
        hint = entry.hint
        now = time.monotonic()
        st = self._akv.state(entry.key, now, entry.tenant)
        st.live_requests.discard(request.request_id)
        hashes = list(request.block_hashes)
        # Never admitted (aborted while waiting): it computed nothing of its prompt.
        hit = entry.cached_blocks if entry.cached_blocks is not None else len(hashes)
        self._akv.set_hashes(st, hashes, hit)
        if not self._akv_settings.lifecycle:
            return None
        pending = st.pending_deadline_s
        what = decide_finish(
            hint,
            retention=self._akv_settings.retention,
            has_lower_tier=self._akv_lower_tier,
            pending_retain=pending is not None and pending > now,
        )
        if what == "release":
            return ("release", st)
        blocks = len(st.hashes) * max(1, len(self._akv_group_ids))  # pool blocks, all groups
        if not entry.lease_ok or st.closed or str(request.status) not in _LEASABLE:
            # A late turn of a finished trajectory, or an aborted or failed request.
            self._akv.counters.leases_refused += 1
            self._akv.set_pending(st, None)
            self._akv.on_finished(st, now, None, blocks)
            return None
        forecast = Forecast.from_hint_ms(hint.gap_ms, hint.gap_p90_ms, hint.gap_p99_ms, hint.ttl_ms)
        if what == "candidate":
            # Every paused context is a candidate, ranked by the client's gap forecast.
            # The lease lasts up to the cap; pressure ends it earlier.
            self._akv.on_finished(st, now, forecast, blocks)
            self._akv_take_lease(st, self._akv_settings.max_ttl_ms, now)
        elif what == "lease":
            if hint.action == "retain":
                ttl_ms = self._akv.clamp_ttl_ms(hint.ttl_ms)
            else:
                ttl_ms = int(((pending or now) - now) * 1000)
            self._akv.on_finished(st, now, Forecast.from_ttl_ms(ttl_ms), blocks)
            self._akv_take_lease(st, ttl_ms, now)
        else:
            self._akv.on_finished(st, now, forecast, blocks)
            if what == "offload":
                return ("offload", st)
        return None

    def has_requests(self) -> bool:
        # Leases are not work: counting them would keep the engine loop spinning.
        return bool(super().has_requests())

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        if self._akv_ready:
            try:
                self._akv.release_all("released")
                self._akv_apply_frees()
            except Exception:
                self._akv_fail("reset_prefix_cache")
        return bool(super().reset_prefix_cache(*args, **kwargs))


_CLASSES: dict[type, type] = {}


def make_scheduler_class(base: type) -> type:
    """Return (cached) ``AgentKVSchedulerMixin`` applied over ``base``."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(f"AgentKV{base.__name__}", (AgentKVSchedulerMixin, base), {})
        _CLASSES[base] = cls
    return cls


def AgentKVScheduler(**kwargs: Any) -> Any:
    """Build the plugin scheduler over the base vLLM would have used (async or not)."""
    vllm_config = kwargs["vllm_config"]
    base: type
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        base = AsyncScheduler
    else:
        from vllm.v1.core.sched.scheduler import Scheduler

        base = Scheduler
    return make_scheduler_class(base)(**kwargs)


def _engine_control(self: Any, payload: str) -> str:
    handler = getattr(getattr(self, "scheduler", None), "agentkv_handle", None)
    if handler is None:
        return json.dumps({"status": 503, "error": "the agentkv scheduler plugin is not loaded"})
    return str(handler(payload))


def _install_engine_utility() -> None:
    """Add ``EngineCore.agentkv_control`` (reached through vLLM's utility RPC)."""
    try:
        from vllm.v1.engine.core import EngineCore
    except Exception:  # pragma: no cover - vLLM missing or changed
        return
    if not hasattr(EngineCore, "agentkv_control"):
        EngineCore.agentkv_control = _engine_control  # type: ignore[attr-defined]


_install_engine_utility()

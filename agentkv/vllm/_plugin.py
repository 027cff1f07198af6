"""agentkv's half of the vLLM scheduler: hints in, residency controller calls out.

:class:`Plugin` is the collaborator the scheduler subclass
(:mod:`agentkv.vllm._scheduler`) holds as ``agentkv``; each of the subclass's hook
overrides calls one method here, guarded. It owns:

- the table of live hinted requests (:class:`TurnEntry`, keyed by vLLM's request id),
  their trajectory keys, and their parents' (the hint's lineage), scoped by the
  request's ``cache_salt``
  (:mod:`agentkv.vllm._tenancy`: one tenant cannot name, read, release or extend
  another's trajectory);
- the residency controller (:class:`~agentkv.residency.ResidencyController`) over vLLM's
  block pool (:class:`~agentkv.vllm._blockport.VllmBlockPort`), which holds every lease,
  pressure and release decision;
- the pressure override: vLLM's ``allocate_slots`` is wrapped on the scheduler's own
  ``kv_cache_manager`` so that a failed allocation makes leases give way, one at a
  time, before vLLM would preempt or stall anything;
- priority under ``--scheduling-policy priority``: an offset inside a band around the
  request's own priority, and aging bounded to just ahead of that band;
- the admission gate (:mod:`agentkv.vllm._admission`) and the control-route operations
  (:mod:`agentkv.vllm._ops`), each a collaborator of its own.

Observe / shadow clients (``mode`` in the hint) are counted and nothing is applied.

**Policy modes** (the server's own rollout switch, :attr:`Plugin.mode`): ``act`` applies
every decision; ``shadow`` runs the same controller over a
:class:`~agentkv.vllm._blockport.ShadowPort` (it reads the pool and changes nothing in
it) and does not touch priorities, admission or the pressure override, so the engine
behaves as stock vLLM while the decisions are counted apart (``shadow_*`` stats);
``off`` is stock vLLM with the plugin idle. The request's own priority is clamped into
``±max_client_priority`` in every mode (a bound, not a policy). A switch
(:meth:`Plugin.set_mode`, the control route's ``POST /agentkv/v1/mode``) ends every lease
of the mode it leaves, through that mode's own port, and starts the policy's state
afresh; counters carry on.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentkv.protocol._hints import Hint, decode_hint
from agentkv.protocol._wire import XARG_SOURCE
from agentkv.residency._book import Counters
from agentkv.residency._controller import ResidencyController
from agentkv.residency._core import PolicyCore
from agentkv.residency._strategies import FinishAction
from agentkv.vllm._admission import AdmissionGate
from agentkv.vllm._blockport import OffloadIndex, ShadowPort, VllmBlockPort
from agentkv.vllm._hints import has_lower_tier, intent_of
from agentkv.vllm._ops import ControlOps
from agentkv.vllm._outcomes import HintOutcome, PluginOutcomes
from agentkv.vllm._settings import MODES, SchedSettings
from agentkv.vllm._tenancy import Scoper
from agentkv.vllm._tier import TierMeter, block_bytes

__all__ = ["Plugin", "TurnEntry"]

_log = logging.getLogger("agentkv.scheduler")

T = TypeVar("T")

#: Finished statuses after which a turn may leave a lease (vLLM's names); an aborted,
#: failed or ignored request never does.
_LEASABLE = frozenset({"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"})


@dataclass(slots=True)
class TurnEntry:
    """What the plugin keeps about one live hinted request."""

    key: str  # the book's key: tenant-scoped trajectory id
    tenant: str
    hint: Hint
    cached_blocks: int | None = None  # its prefix-cache hit at admission, in blocks
    outcome: HintOutcome | None = None  # its accepted hint's two phases (_outcomes)


class Plugin:
    """agentkv's state and hook bodies for one vLLM scheduler (see the module docstring)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.internal_errors = 0
        self.settings = SchedSettings.from_env()
        pool = scheduler.kv_cache_manager.block_pool
        self.num_blocks = int(pool.num_gpu_blocks) - 1  # the null block is never usable
        # A lower tier: vLLM's offloading connector (GPU builds) stores computed blocks.
        kv_transfer = getattr(scheduler.vllm_config, "kv_transfer_config", None)
        self.lower_tier = has_lower_tier(kv_transfer)
        index = OffloadIndex.from_scheduler(scheduler) if self.lower_tier else None
        kv_config = scheduler.kv_cache_config
        self.port = VllmBlockPort(pool, range(len(kv_config.kv_cache_groups)), index)
        self.tier = TierMeter(
            lower_tier=self.lower_tier,
            block_size=int(scheduler.block_size),
            bytes_per_block=block_bytes(kv_config),
            no_tier_reason=self.settings.offload_reason,
        )
        self.mode = self.settings.mode if self.settings.mode in MODES else "act"
        self.mode_switches = 0
        self.counters = Counters()  # what the policy did (act)
        self.shadow_counters = Counters()  # what it would have done (shadow)
        self.ctl: ResidencyController[Any] = self._make_controller(self.mode)
        self.scoper = Scoper()
        self.outcomes = PluginOutcomes(self)  # per-hint outcomes, for the control route
        self.requests: dict[str, TurnEntry] = {}
        self.base_priority: dict[str, int] = {}  # request id -> its own priority (for aging)
        policy = scheduler.policy
        self.priority_policy = str(getattr(policy, "value", policy)) == "priority"
        # Lifecycle events for a trajectory no request of this engine ever named: a sign
        # that a router sent them to another replica or rank than the trajectory's calls.
        self.events_unknown = 0
        self.admission = AdmissionGate(self)
        self.control = ControlOps(self)
        self._wrap_allocate(scheduler.kv_cache_manager)
        self._usage_at = -1.0  # when usage() last walked the leases
        self._usage = 0.0
        self._wrap_usage(pool)
        s = self.settings
        _log.info(
            "agentkv scheduler plugin active: mode=%s lifecycle=%s program=%s "
            "priority_policy=%s blocks=%d max_ttl_ms=%d max_retained_fraction=%.2f",
            self.mode,
            s.lifecycle,
            s.program,
            self.priority_policy,
            self.num_blocks,
            s.max_ttl_ms,
            s.max_retained_fraction,
        )

    # -- policy modes --------------------------------------------------------------------------
    @property
    def acting(self) -> bool:
        """The plugin's decisions change what the engine does (mode ``act``)."""
        return self.mode == "act"

    def _make_controller(self, mode: str) -> ResidencyController[Any]:
        shadow = mode == "shadow"
        counters = self.shadow_counters if shadow else self.counters
        core: PolicyCore[Any] = PolicyCore(self.settings, self.num_blocks, counters=counters)
        port: Any = ShadowPort(self.port) if shadow else self.port
        return ResidencyController(
            core, port, lower_tier=self.lower_tier, lifecycle=self.settings.lifecycle
        )

    def set_mode(self, mode: str) -> str:
        """Switch to ``mode`` (``act``, ``shadow`` or ``off``); returns the previous one.

        Every lease of the mode left ends through its own port (act's give their blocks
        back to vLLM; shadow's held none), and the new mode's policy starts afresh."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        previous = self.mode
        if mode == previous:
            return previous
        self.ctl.reset()
        self.outcomes.reset(f"the server's policy mode changed to {mode}")
        self.admission.held = frozenset()
        self.mode = mode
        self.ctl = self._make_controller(mode)
        self.mode_switches += 1
        _log.warning("agentkv policy mode: %s -> %s", previous, mode)
        return previous

    @property
    def programs(self) -> bool:
        """Program-aware priority is on and the engine orders its queue by priority."""
        return self.settings.program and self.priority_policy

    # -- guards ----------------------------------------------------------------------------
    def fail(self, where: str) -> None:
        """Count and log an exception inside agentkv code; vLLM's behaviour continues."""
        self.internal_errors += 1
        n = self.internal_errors
        if n <= 20 or n % 1000 == 0:
            _log.exception("agentkv hook %s failed (%d so far); vLLM behaviour continues", where, n)

    def guarded(self, where: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``, or None after counting an exception (:meth:`fail`)."""
        try:
            return fn(*args)
        except Exception:
            self.fail(where)
            return None

    # -- the pressure override ---------------------------------------------------------------
    def _wrap_allocate(self, manager: Any) -> None:
        original = manager.allocate_slots

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(request, *args, **kwargs)
            if result is not None or not self.settings.lifecycle or self.mode == "off":
                return result
            try:
                entry = self.requests.get(request.request_id)
                exclude = entry.key if entry is not None else None
                now = time.monotonic()
                new_tokens = int(args[0] if args else kwargs.get("num_new_tokens", 0))
                if not self.acting:  # shadow: record which lease would give way, no retry
                    self.ctl.give_way(exclude, self.shortfall(request, new_tokens), now)
                    return result
                while result is None and self.ctl.give_way(
                    exclude, self.shortfall(request, new_tokens), now
                ):
                    result = original(request, *args, **kwargs)
            except Exception:
                self.fail("allocate_slots")
            return result

        manager.allocate_slots = allocate_slots

    # -- load as others see it --------------------------------------------------------------
    #: How long :meth:`usage` reuses its last walk of the leases (vLLM reads the usage on
    #: every step; routers and autoscalers scrape it far less often).
    USAGE_MAX_AGE_S = 0.25

    def _wrap_usage(self, pool: Any) -> None:
        original = pool.get_usage

        def get_usage() -> float:
            if not self.acting:  # no lease holds a block: vLLM's own figure
                return float(original())
            try:
                return self.usage()
            except Exception:
                self.fail("get_usage")
                return float(original())

        pool.get_usage = get_usage

    def usage(self, *, fresh: bool = False) -> float:
        """The share of the pool in use, blocks held only by leases counted as free.

        The pressure override gives a lease's blocks up the moment an allocation needs
        them, so they are not load: vLLM's own ``kv_cache_usage`` (the
        ``vllm:kv_cache_usage_perc`` series routers read, vllm-router's Program scheduling
        among them) reports them as free too, or a router would see a pool full of leases
        and hold back the very requests whose allocations would make the leases give way.
        The walk covers leased blocks only and is reused for :data:`USAGE_MAX_AGE_S`.
        """
        now = time.monotonic()
        if not fresh and now - self._usage_at < self.USAGE_MAX_AGE_S:
            return self._usage
        lease_only = {
            id(b)
            for st in self.ctl.book.iter_leased()
            for b in (st.lease.blocks if st.lease is not None else ())
            if int(getattr(b, "ref_cnt", 0)) <= 1
        }
        used = max(0, self.num_blocks - self.port.num_free() - len(lease_only))
        self._usage = used / max(1, self.num_blocks)
        self._usage_at = now
        return self._usage

    def shortfall(self, request: Any, new_tokens: int) -> int:
        """Blocks a failed allocation lacks, at least (>= 1; the override gives up one
        victim's blocks at a time and retries). A request not running yet is admitted
        only when its whole uncached prompt fits (vLLM 0.32's
        ``scheduler_reserve_full_isl``, on by default), a running one needs its next
        tokens."""
        free = self.port.num_free()
        if int(request.num_computed_tokens) == 0:
            need = self.admission.need_blocks(request)
        else:
            need = (
                -(-new_tokens // int(self.scheduler.block_size)) + 1
            ) * self.port.blocks_per_hash
        return max(1, need - free)

    # -- requests ----------------------------------------------------------------------------
    def on_add(self, request: Any) -> None:
        """``add_request``: read the hint, scope the trajectory, set the priority."""
        if self.priority_policy:
            bound = max(0, self.settings.max_client_priority)
            own = int(request.priority)
            if not -bound <= own <= bound:
                request.priority = max(-bound, min(bound, own))
                self.counters.priorities_clamped += 1
        params = getattr(request, "sampling_params", None)
        hint = decode_hint(getattr(params, "extra_args", None))
        salt = getattr(request, "cache_salt", None)
        if self.mode == "off":
            if hint is not None:
                self.outcomes.on_request(salt, hint)  # unsupported: the policy is off
            return
        self.base_priority[request.request_id] = int(request.priority)
        if hint is None:
            return
        c = self.ctl.counters
        c.hints_received += 1
        if hint.rejected:  # served as if it carried no hint
            c.hint_errors += 1
            self.outcomes.on_request(salt, hint)
            return
        if hint.passive:
            c.hints_observed += 1
            return
        tenant = self.scoper.tenant(salt)
        key = self.scoper.key(salt, hint.trajectory_id)
        st = self.ctl.on_arrive(
            key, time.monotonic(), tenant=tenant, turn=hint.turn_id, request_id=request.request_id
        )
        # The parent's key in this request's own scope: another tenant's id names nothing.
        parent = None if hint.parent_id is None else self.scoper.key(salt, hint.parent_id)
        self.ctl.book.set_lineage(st, parent, hint.critical_path)
        source = getattr(params, "extra_args", {}).get(XARG_SOURCE)  # set by the salt gate
        if isinstance(source, str) and source:
            self.ctl.book.set_group(tenant, "src:" + source[:80])  # shares by source
        outcome = self.outcomes.on_request(salt, hint, key)
        self.requests[request.request_id] = TurnEntry(key, tenant, hint, outcome=outcome)
        if self.programs:
            priority = self.ctl.assign_priority(st, hint.priority, request.priority)
            if self.acting:  # shadow: decided and counted, not applied
                request.priority = priority

    def before_schedule(self) -> None:
        """Top of ``schedule()``: expire leases, plan admission, age waiting priorities."""
        if self.mode == "off":
            return
        now = time.monotonic()
        self.ctl.expire(now)
        self.admission.plan(now)
        self.outcomes.settle()
        if not self.programs or not self.acting:
            return
        heap = getattr(self.scheduler.waiting, "_heap", None)
        if heap:
            cutoff = time.time() - self.settings.aging_s
            changed = 0
            for req in heap:
                if req.arrival_time >= cutoff:
                    continue
                own = self.base_priority.setdefault(req.request_id, req.priority)
                aged = self.ctl.core.aged_priority(own)
                if req.priority > aged:
                    req.priority = aged
                    changed += 1
            if changed:
                heapq.heapify(heap)
                self.ctl.counters.requests_aged += changed

    def after_schedule(self, out: Any) -> None:
        """After ``schedule()``: hand leases over to admitted turns, count service."""
        if self.mode == "off":
            return
        size = int(self.scheduler.block_size)
        if self.settings.admission:
            self.admission.mark_step(out)
        now = time.monotonic()
        tier = self.tier
        requests = self.scheduler.requests
        for data in out.scheduled_new_reqs:
            request = requests.get(data.req_id)
            if request is not None and getattr(request, "prefill_stats", None) is not None:
                seen = tier.on_admitted(request)
                if seen is not None and self.lower_tier:
                    self.ctl.core.observe_reload(*seen)
            entry = self.requests.get(data.req_id)
            if entry is not None:
                if entry.cached_blocks is None:  # first admission: what it found cached
                    entry.cached_blocks = int(data.num_computed_tokens) // size
                self.ctl.on_admitted(entry.key, now)
                self.outcomes.on_admitted(entry.key)
        self.outcomes.settle()  # leases that gave way to pressure in this step
        book = self.ctl.book
        for req_id, n in out.num_scheduled_tokens.items():
            entry = self.requests.get(req_id)
            if entry is not None:
                st = book.get(entry.key)
                if st is not None:
                    st.attained_tokens += int(n)

    def on_output(self, model_runner_output: Any) -> None:
        """``update_from_output``: the offloading connector's transfers of the step; the
        load bandwidth they achieved sets the policy's reload cost."""
        reload_s = self.tier.on_step(model_runner_output)
        if reload_s is not None:
            self.port.reload_s = reload_s
            self.ctl.core.reload_s_per_block = reload_s

    def before_free(self, request: Any) -> tuple[str, FinishAction] | None:
        """``_free_blocks``, before vLLM frees the request's blocks: the controller
        decides what the finished turn leaves (a lease takes its own references)."""
        self.base_priority.pop(request.request_id, None)
        entry = self.requests.pop(request.request_id, None)
        if entry is None or self.mode == "off":
            return None
        hashes = list(request.block_hashes)
        # Never admitted (aborted while waiting): it computed nothing of its prompt.
        hit = entry.cached_blocks if entry.cached_blocks is not None else len(hashes)
        leasable = str(request.status) in _LEASABLE
        before = self.outcomes.lease_before(entry.key)
        what = self.ctl.on_finish(
            entry.key,
            intent_of(entry.hint),
            time.monotonic(),
            hashes=hashes,
            computed_from=hit,
            tenant=entry.tenant,
            leasable=leasable,
            request_id=request.request_id,
        )
        if entry.outcome is not None:
            self.outcomes.on_finish(entry.key, entry.hint.action, entry.outcome, before, leasable)
        return None if what == "none" else (entry.key, what)

    def after_free(self, after: tuple[str, FinishAction]) -> None:
        """After vLLM freed them: a release or an offload demotes the trajectory's own
        blocks (with an offload, the lower tier holds them; device memory goes first)."""
        key, what = after
        self.ctl.after_free(key, what)

    def reset(self) -> None:
        """Before vLLM resets its prefix cache: every lease ends."""
        self.ctl.reset()
        self.outcomes.reset("the server's prefix cache was reset")

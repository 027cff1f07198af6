"""The plugin's control channel: the out-of-band route's operations on the scheduler.

``POST /agentkv/v1/events`` and the capability, trajectory and stats queries reach the
scheduler through ``EngineCore.agentkv_control`` (vLLM's utility RPC) and land in
:meth:`ControlOpsMixin.agentkv_handle`, a half of
:class:`agentkv.vllm._scheduler.AgentKVSchedulerMixin`. Input and output are JSON
strings; every operation runs guarded (an exception is counted and answered with 500,
and the engine goes on). The control route (:mod:`agentkv.vllm._control`) validates
input in the API-server process before it forwards an operation.

Tenancy: every event and query names its scope (the cache salt the trajectory's
requests carried) and reaches only the state of that scope (:mod:`agentkv.vllm._tenancy`).
An event never creates state: a trajectory no request has used is rejected, and so is
a retain for a finished or cancelled one (a tombstone) or one whose lease lifetime is
spent. Events from observe or shadow clients are counted and change nothing.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from agentkv._protocol import PASSIVE_MODES
from agentkv.residency._forecast import Forecast
from agentkv.vllm._hints import PRESSURE_REASON

__all__ = ["PREFETCH_UNAVAILABLE", "ControlOpsMixin"]

#: Why ``prefetch`` is not offered (docs/vllm.md, "Re-warm"): recomputing an evicted
#: prefix ahead of its return did not pay robustly in the simulator, and vLLM 0.32 reloads
#: offloaded blocks only when the turn that needs them is scheduled.
PREFETCH_UNAVAILABLE = (
    "not offered: re-warming an evicted prefix ahead of its return showed no robust gain "
    "in the simulator, and vLLM 0.32 reloads offloaded blocks only when their turn is "
    "scheduled (offload advice is honoured where there is a lower tier)"
)

if TYPE_CHECKING:
    _Base = Any
else:
    _Base = object


class ControlOpsMixin(_Base):  # type: ignore[misc,valid-type]
    """The control-route half of the scheduler plugin (see the module docstring)."""

    _akv_control_calls: int = 0  # engine-core calls served (the route caches stats)

    # -- control channel (called through EngineCore.agentkv_control) ---------------------
    def agentkv_handle(self, payload: str) -> str:
        """Serve one control-route operation; input and output are JSON strings."""
        self._akv_control_calls += 1
        if not self._akv_ready:
            return json.dumps({"status": 503, "error": "the agentkv plugin failed to start"})
        try:
            req = json.loads(payload)
            op = req.get("op")
            if op == "events":
                result = self._akv_events(req.get("events", []), float(req.get("now_ms", 0)))
            elif op == "capabilities":
                result = self._akv_capabilities()
            elif op == "trajectory":
                salt = req.get("cache_salt")
                result = self._akv_trajectory(str(req.get("trajectory_id", "")), salt)
            elif op == "stats":
                self._akv_before_schedule_expire_only()
                result = self._akv_stats()
            else:
                result = {"status": 400, "error": f"unknown op {op!r}"}
        except Exception as exc:
            self._akv_fail("control")
            result = {"status": 500, "error": f"agentkv control failed: {type(exc).__name__}"}
        return json.dumps(result)

    def _akv_before_schedule_expire_only(self) -> None:
        if self._akv.expire(time.monotonic()):
            self._akv_apply_frees()

    def _akv_events(self, events: list[dict[str, Any]], now_ms: float) -> dict[str, Any]:
        self._akv_before_schedule_expire_only()
        rejected: list[dict[str, Any]] = []
        accepted = 0
        for i, ev in enumerate(events):
            self._akv.counters.events_received += 1
            emitted = ev.get("emitted_at_ms")
            if isinstance(emitted, (int, float)) and now_ms:
                self._akv.record_lag_ms(now_ms - float(emitted))
            error = self._akv_event(ev)
            if error is None:
                accepted += 1
            else:
                self._akv.counters.events_rejected += 1
                rejected.append({"index": i, "error": error})
        return {"accepted": accepted, "rejected": rejected}

    def _akv_event(self, ev: dict[str, Any]) -> str | None:
        """Apply one validated event; returns why it was rejected, or None."""
        key = self._akv_scoper.key(ev.get("cache_salt"), ev["trajectory_id"])
        st = self._akv.get(key)
        if st is None:
            self._akv_events_unknown += 1
            return "unknown trajectory: no request of this scope has used it"
        if ev.get("mode") in PASSIVE_MODES:
            self._akv.counters.hints_observed += 1
            return None
        if not self._akv_settings.lifecycle:
            return None
        now = time.monotonic()
        kind, action = ev["event"], ev.get("action")
        predicted = self._akv_settings.retention == "predicted"
        ranked = action != "release" or ev.get("reason") == PRESSURE_REASON
        if kind in ("trajectory_finished", "trajectory_cancelled"):
            st.closed = True
            for turn in self._akv_turns_of(st):
                turn.lease_ok = False  # still running now: no lease when it finishes
            self._akv_release(st)
        elif action is not None and predicted and ranked:
            return self._akv_on_forecast(st, ev, now)
        elif action == "release":
            self._akv_release(st)
        elif action == "retain":
            return self._akv_retain(st, ev.get("ttl_ms"), now)
        return None

    def _akv_retain(self, st: Any, ttl: int | None, now: float) -> str | None:
        if st.closed:
            self._akv.counters.leases_refused += 1
            return "trajectory finished or cancelled"
        ttl_ms = self._akv.clamp_ttl_ms(ttl)
        if self._akv.lease_deadline_s(st, ttl_ms, now) <= now:
            self._akv.counters.leases_refused += 1
            return "lease lifetime spent for this pause"
        if st.lease is not None:
            self._akv.extend_lease(st, ttl_ms, now)
        elif st.live_requests or not st.hashes:
            self._akv.set_pending(st, now + ttl_ms / 1000.0)
        else:
            self._akv_take_lease(st, ttl_ms, now)
        return None

    def _akv_on_forecast(self, st: Any, ev: dict[str, Any], now: float) -> str | None:
        """Predicted retention: a tool started and the client's forecast of this pause
        is now about the tool that runs. It replaces the one the request carried; a
        paused context that holds no lease is offered one again (the core re-decides)."""
        forecast = Forecast.from_hint_ms(
            ev.get("gap_ms"), ev.get("gap_p90_ms"), ev.get("gap_p99_ms"), ev.get("ttl_ms")
        )
        if forecast is None or not self._akv.update_forecast(st, forecast):
            return None
        self._akv.counters.forecasts_updated += 1
        if st.lease is None and not st.live_requests and st.hashes:
            return self._akv_retain(st, self._akv_settings.max_ttl_ms, now)
        return None

    def _akv_capabilities(self) -> dict[str, Any]:
        import vllm

        s = self._akv_settings
        offload = bool(self._akv_lower_tier)
        try:
            from vllm.platforms import current_platform

            platform = str(current_platform.device_type)
        except Exception:  # pragma: no cover - defensive
            platform = "unknown"
        unavailable: dict[str, str] = {}
        if not offload:
            unavailable["offload"] = s.offload_reason or "KV offload is not configured"
        unavailable["prefetch"] = PREFETCH_UNAVAILABLE
        if not (s.program and self._akv_priority_policy):
            unavailable["priority"] = (
                "program-aware scheduling is off"
                if not s.program
                else "the server does not run --scheduling-policy priority"
            )
        if not s.lifecycle:
            for name in ("retain", "release", "pressure_override"):
                unavailable[name] = "lifecycle hints are off"
        return {
            "vllm_version": vllm.__version__,
            "platform": platform,
            "block_size": int(self.block_size),
            "num_blocks": self._akv_num_blocks,
            "features": {
                "retain": s.lifecycle,
                "release": s.lifecycle,
                "pressure_override": s.lifecycle,
                "priority": s.program and self._akv_priority_policy,
                "attained_service": s.program and self._akv_priority_policy,
                "offload": offload,
                "prefetch": False,
                "tenant_scope": "cache_salt",
            },
            "unavailable": unavailable,
            "limits": {
                "max_ttl_ms": s.max_ttl_ms,
                "max_lease_lifetime_ms": s.max_lease_lifetime_ms,
                "max_retained_fraction": s.max_retained_fraction,
                "max_retained_blocks": int(s.max_retained_fraction * self._akv_num_blocks),
                "tenant_retained_share": s.tenant_retained_share,
                "max_trajectories_per_tenant": s.max_trajectories_per_tenant,
                "priority_bound": s.priority_bound,
                "aging_s": s.aging_s,
            },
        }

    def _akv_trajectory(self, trajectory_id: str, salt: Any) -> dict[str, Any]:
        self._akv_before_schedule_expire_only()
        st = self._akv.get(self._akv_scoper.key(salt, trajectory_id))
        if st is None:
            return {"status": 404, "error": "unknown trajectory in this scope"}
        now = time.monotonic()
        lease = st.lease
        return {
            "trajectory_id": trajectory_id,
            "leased_blocks": len(lease.blocks) if lease else 0,
            "lease_expires_in_ms": int(max(0.0, lease.deadline_s - now) * 1000) if lease else None,
            "cached_blocks": len(self._akv_cached_prefix(st.hashes)),
            "last_outcome": st.last_outcome,
            "attained_tokens": st.attained_tokens,
            "live_requests": len(st.live_requests),
            "closed": st.closed,
            "last_priority": st.last_priority,
        }

    def _akv_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._akv.stats())
        out["internal_errors"] = self._akv_internal_errors
        out["events_unknown_trajectory"] = self._akv_events_unknown
        out["control_calls"] = self._akv_control_calls
        out["num_blocks"] = self._akv_num_blocks
        free = int(self._akv_pool.get_num_free_blocks())
        out["free_blocks"] = free
        # Load for clients' advisors: blocks held only by leases count as free (the
        # pressure override gives them up on demand), so leases never read as pressure.
        # The walk covers leased blocks only (at most the retained cap).
        lease_only = {
            id(b)
            for st in self._akv.leased_states()
            for b in (st.lease.blocks if st.lease is not None else ())
            if int(getattr(b, "ref_cnt", 0)) <= 1
        }
        used = max(0, self._akv_num_blocks - free - len(lease_only))
        out["kv_usage"] = used / max(1, self._akv_num_blocks)
        out["num_waiting"] = len(self.waiting)
        out["hint_lag_seconds"] = self._akv.lags.histogram()
        return out

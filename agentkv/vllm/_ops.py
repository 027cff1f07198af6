"""The plugin's control channel: the out-of-band route's operations on the scheduler.

``POST /agentkv/v1/events`` and the capability, trajectory and stats queries reach the
scheduler through ``EngineCore.agentkv_control`` (vLLM's utility RPC) and land in
:meth:`ControlOpsMixin.agentkv_handle`, a half of
:class:`agentkv.vllm._scheduler.AgentKVSchedulerMixin`. Input and output are JSON
strings; every operation runs guarded (an exception is counted and answered with 500,
and the engine goes on).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from agentkv.policy._book import Forecast
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

    # -- control channel (called through EngineCore.agentkv_control) ---------------------
    def agentkv_handle(self, payload: str) -> str:
        """Serve one control-route operation; input and output are JSON strings."""
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
                result = self._akv_trajectory(str(req.get("trajectory_id", "")))
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
        lifecycle = self._akv_settings.lifecycle
        predicted = self._akv_settings.retention == "predicted"
        for ev in events:
            now = time.monotonic()
            self._akv.counters.events_received += 1
            emitted = ev.get("emitted_at_ms")
            if isinstance(emitted, (int, float)) and now_ms:
                self._akv.record_lag_ms(now_ms - float(emitted))
            traj = ev["trajectory_id"]
            kind = ev["event"]
            if self._akv.get(traj) is None:
                self._akv_events_unknown += 1
            action = ev.get("action")
            terminal = kind in ("trajectory_finished", "trajectory_cancelled")
            ranked = action != "release" or ev.get("reason") == PRESSURE_REASON
            if lifecycle and not terminal and action is not None and predicted and ranked:
                self._akv_on_forecast(traj, ev, now)
            elif lifecycle and (terminal or action == "release"):
                st = self._akv.get(traj)
                if st is not None:
                    self._akv_release(st)
            elif lifecycle and action == "retain":
                st = self._akv.state(traj, now)
                ttl_ms = self._akv.clamp_ttl_ms(ev.get("ttl_ms"))
                if st.lease is not None:
                    self._akv.extend_lease(st, ttl_ms, now)
                elif st.live_requests or not st.hashes:
                    st.pending_deadline_s = now + ttl_ms / 1000.0
                else:
                    self._akv_take_lease(st, ttl_ms, now)
            accepted += 1
        return {"accepted": accepted, "rejected": rejected}

    def _akv_on_forecast(self, traj: str, ev: dict[str, Any], now: float) -> None:
        """Predicted retention: a tool started and the client's forecast of this pause
        is now about the tool that runs. It replaces the one the request carried; a
        paused context that holds no lease is offered one again (the core re-decides)."""
        st = self._akv.get(traj)
        forecast = Forecast.from_hint_ms(
            ev.get("gap_ms"), ev.get("gap_p90_ms"), ev.get("gap_p99_ms"), ev.get("ttl_ms")
        )
        if st is None or forecast is None or not self._akv.update_forecast(st, forecast):
            return
        self._akv.counters.forecasts_updated += 1
        if st.lease is None and not st.live_requests and st.hashes:
            self._akv_take_lease(st, self._akv_settings.max_ttl_ms, now)

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
            },
            "unavailable": unavailable,
            "limits": {
                "max_ttl_ms": s.max_ttl_ms,
                "max_retained_fraction": s.max_retained_fraction,
                "max_retained_blocks": int(s.max_retained_fraction * self._akv_num_blocks),
                "priority_bound": s.priority_bound,
                "aging_s": s.aging_s,
            },
        }

    def _akv_trajectory(self, trajectory_id: str) -> dict[str, Any]:
        self._akv_before_schedule_expire_only()
        st = self._akv.get(trajectory_id)
        if st is None:
            return {"status": 404, "error": f"unknown trajectory {trajectory_id!r}"}
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
        }

    def _akv_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._akv.stats())
        out["internal_errors"] = self._akv_internal_errors
        out["events_unknown_trajectory"] = self._akv_events_unknown
        out["num_blocks"] = self._akv_num_blocks
        free = int(self._akv_pool.get_num_free_blocks())
        out["free_blocks"] = free
        # Load for clients' advisors: blocks held only by leases count as free (the
        # pressure override gives them up on demand), so leases never read as pressure.
        lease_only = {
            id(b)
            for st in self._akv.leased_states()
            for b in (st.lease.blocks if st.lease is not None else ())
            if int(getattr(b, "ref_cnt", 0)) <= 1
        }
        used = max(0, self._akv_num_blocks - free - len(lease_only))
        out["kv_usage"] = used / max(1, self._akv_num_blocks)
        out["num_waiting"] = len(self.waiting)
        return out

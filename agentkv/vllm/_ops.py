"""The plugin's control channel: the out-of-band route's operations on the scheduler.

``POST /agentkv/v1/events`` and the capability, trajectory and stats queries reach the
scheduler through ``EngineCore.agentkv_control`` (vLLM's utility RPC) and land in
:meth:`ControlOps.handle`, a collaborator of the plugin (:class:`agentkv.vllm._plugin.Plugin`). Input and output are JSON
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

from agentkv.protocol._wire import (
    ENVELOPE_FEATURE,
    KV_HINTS_FIELD,
    KV_HINTS_FIELD_FEATURE,
    PASSIVE_MODES,
)
from agentkv.residency._forecast import Forecast
from agentkv.residency._strategies import FinishIntent
from agentkv.vllm._settings import MODES

__all__ = ["PREFETCH_UNAVAILABLE", "ControlOps"]

#: Why ``prefetch`` is not offered (docs/vllm.md, "Re-warm"): recomputing an evicted
#: prefix ahead of its return did not pay robustly in the simulator, and vLLM 0.32 reloads
#: offloaded blocks only when the turn that needs them is scheduled.
PREFETCH_UNAVAILABLE = (
    "not offered: re-warming an evicted prefix ahead of its return showed no robust gain "
    "in the simulator, and vLLM 0.32 reloads offloaded blocks only when their turn is "
    "scheduled (offload advice is honoured where there is a lower tier)"
)

if TYPE_CHECKING:
    from agentkv.vllm._plugin import Plugin


def http_takes_kv_hints() -> bool:
    """Whether the installed vLLM's HTTP chat request has a ``kv_hints`` field (vLLM 0.32
    and 0.33 have none: their ``Request.kv_hints`` is settable only in-process)."""
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    except Exception:
        try:
            from vllm.entrypoints.openai.protocol import (  # type: ignore[no-redef]
                ChatCompletionRequest,
            )
        except Exception:
            return False
    fields = getattr(ChatCompletionRequest, "model_fields", None)
    return isinstance(fields, dict) and KV_HINTS_FIELD in fields


def kv_hints_field_unavailable(plugin: Any, http_field: bool) -> str | None:
    """Why this server does not take agentkv's envelope in ``kv_hints``, or None when it
    does: vLLM's HTTP API must take the field, and the scheduler plugin must read the hint
    from it (a plugin says so with ``reads_kv_hints_field = True``; until then it reads
    ``vllm_xargs`` only, and a client that sent ``kv_hints`` would lose its hints)."""
    if not http_field:
        return "this vLLM's HTTP API has no kv_hints request field: hints go in vllm_xargs"
    if getattr(plugin, "reads_kv_hints_field", False) is not True:
        return "the scheduler plugin reads hints from vllm_xargs"
    return None


class ControlOps:
    """The control route's operations on one plugin (see the module docstring)."""

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        self.calls = 0  # engine-core calls served (the route caches stats)

    def handle(self, payload: str) -> str:
        """Serve one control-route operation; input and output are JSON strings."""
        self.calls += 1
        try:
            req = json.loads(payload)
            op = req.get("op")
            if op == "events":
                result = self.events(req.get("events", []), float(req.get("now_ms", 0)))
            elif op == "capabilities":
                result = self.capabilities()
            elif op == "trajectory":
                salt = req.get("cache_salt")
                result = self.trajectory(str(req.get("trajectory_id", "")), salt)
            elif op == "outcomes":
                salt = req.get("cache_salt")
                result = self.outcomes(str(req.get("trajectory_id", "")), salt)
            elif op == "mode":
                result = self.set_mode(req.get("mode"))
            elif op == "stats":
                self.plugin.ctl.expire(time.monotonic())
                result = self.stats()
            else:
                result = {"status": 400, "error": f"unknown op {op!r}"}
        except Exception as exc:
            self.plugin.fail("control")
            result = {"status": 500, "error": f"agentkv control failed: {type(exc).__name__}"}
        return json.dumps(result)

    def events(self, events: list[dict[str, Any]], now_ms: float) -> dict[str, Any]:
        """Apply a validated batch of lifecycle events; says which were rejected and why."""
        ctl = self.plugin.ctl
        ctl.expire(time.monotonic())
        rejected: list[dict[str, Any]] = []
        accepted = 0
        scopes: dict[tuple[Any, str], int] = {}  # each trajectory's first event
        for i, ev in enumerate(events):
            ctl.counters.events_received += 1
            emitted = ev.get("emitted_at_ms")
            if isinstance(emitted, (int, float)) and now_ms:
                ctl.book.record_lag_ms(now_ms - float(emitted))
            error = self.event(ev)
            if error is None:
                accepted += 1
                scopes.setdefault((ev.get("cache_salt"), ev["trajectory_id"]), i)
            else:
                ctl.counters.events_rejected += 1
                rejected.append({"index": i, "error": error})
        # What became of each trajectory's hints, after these events (agentkv.vllm._outcomes).
        hint_outcomes = []
        for (salt, trajectory_id), i in scopes.items():
            turns = self.plugin.outcomes.get(salt, trajectory_id)
            if turns:
                hint_outcomes.append({"index": i, "turns": turns})
        return {"accepted": accepted, "rejected": rejected, "hint_outcomes": hint_outcomes}

    def event(self, ev: dict[str, Any]) -> str | None:
        """Apply one validated event; returns why it was rejected, or None."""
        plugin = self.plugin
        ctl = plugin.ctl
        if plugin.mode == "off":  # accepted and ignored: the policy is switched off
            return None
        st = ctl.book.get(plugin.scoper.key(ev.get("cache_salt"), ev["trajectory_id"]))
        if st is None:
            plugin.events_unknown += 1
            return "unknown trajectory: no request of this scope has used it"
        if ev.get("mode") in PASSIVE_MODES:
            ctl.counters.hints_observed += 1
            return None
        if not plugin.settings.lifecycle:
            return None
        now = time.monotonic()
        kind, action = ev["event"], ev.get("action")
        if kind in ("trajectory_finished", "trajectory_cancelled"):
            ctl.on_end(st)
            return None
        if action is None:
            return None
        forecast = Forecast.from_hint_ms(
            ev.get("gap_ms"), ev.get("gap_p90_ms"), ev.get("gap_p99_ms"), ev.get("ttl_ms")
        )
        intent = FinishIntent(action, ev.get("ttl_ms"), forecast, ev.get("reason"))
        return ctl.on_advice(st, intent, now)

    def set_mode(self, mode: Any) -> dict[str, Any]:
        """Switch the policy mode (``act``, ``shadow`` or ``off``; authorized by the route)."""
        plugin = self.plugin
        if mode not in MODES:
            return {"status": 400, "error": f"mode must be one of {', '.join(MODES)}"}
        previous = plugin.set_mode(str(mode))
        return {"mode": plugin.mode, "previous": previous, "mode_switches": plugin.mode_switches}

    def capabilities(self) -> dict[str, Any]:
        """What this server honours, and why not where it does not."""
        import vllm

        plugin = self.plugin
        s = plugin.settings
        offload = bool(plugin.lower_tier)
        try:
            from vllm.platforms import current_platform

            platform = str(current_platform.device_type)
        except Exception:  # pragma: no cover - defensive
            platform = "unknown"
        unavailable: dict[str, str] = {}
        if not offload:
            unavailable["offload"] = s.offload_reason or "KV offload is not configured"
        unavailable["prefetch"] = PREFETCH_UNAVAILABLE
        kv_field_reason = kv_hints_field_unavailable(plugin, http_takes_kv_hints())
        if kv_field_reason is not None:
            unavailable[KV_HINTS_FIELD_FEATURE] = kv_field_reason
        if not plugin.programs:
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
            "block_size": int(plugin.scheduler.block_size),
            "num_blocks": plugin.num_blocks,
            "features": {
                "retain": s.lifecycle,
                "release": s.lifecycle,
                "pressure_override": s.lifecycle,
                "priority": plugin.programs,
                "attained_service": plugin.programs,
                "offload": offload,
                "prefetch": False,
                "tenant_scope": "cache_salt",
                ENVELOPE_FEATURE: True,  # the envelope form of request hints is read
                # vLLM's own kv_hints request field carries the envelope (docs/protocol.md)
                KV_HINTS_FIELD_FEATURE: kv_field_reason is None,
                "policy_modes": list(MODES),  # POST /agentkv/v1/mode switches between them
            },
            "policy_mode": plugin.mode,
            "unavailable": unavailable,
            "limits": {
                "max_ttl_ms": s.max_ttl_ms,
                "max_lease_lifetime_ms": s.max_lease_lifetime_ms,
                "max_retained_fraction": s.max_retained_fraction,
                "max_retained_blocks": int(s.max_retained_fraction * plugin.num_blocks),
                "tenant_retained_share": s.tenant_retained_share,
                "max_trajectories_per_tenant": s.max_trajectories_per_tenant,
                "priority_bound": s.priority_bound,
                "aging_s": s.aging_s,
            },
        }

    def trajectory(self, trajectory_id: str, salt: Any) -> dict[str, Any]:
        """One trajectory's residency, in the scope of ``salt`` (404 outside it)."""
        plugin = self.plugin
        now = time.monotonic()
        plugin.ctl.expire(now)
        st = plugin.ctl.book.get(plugin.scoper.key(salt, trajectory_id))
        if st is None:
            return {"status": 404, "error": "unknown trajectory in this scope"}
        lease = st.lease
        held = len(lease.blocks) if lease else 0
        expires = int(max(0.0, lease.deadline_s - now) * 1000) if lease else None
        shadow = plugin.mode == "shadow"  # a shadow lease holds nothing in the engine
        return {
            "trajectory_id": trajectory_id,
            "policy_mode": plugin.mode,
            "leased_blocks": 0 if shadow else held,
            "lease_expires_in_ms": None if shadow else expires,
            "shadow_leased_blocks": held if shadow else 0,
            "cached_blocks": len(plugin.port.cached_prefix(st.hashes)),
            "last_outcome": st.last_outcome,
            "attained_tokens": st.attained_tokens,
            "live_requests": len(st.live_requests),
            "closed": st.closed,
            "last_priority": st.last_priority,
        }

    def outcomes(self, trajectory_id: str, salt: Any) -> dict[str, Any]:
        """The per-hint outcomes of one trajectory's recent turns, in the scope of
        ``salt`` (404 when none is recorded there)."""
        turns = self.plugin.outcomes.get(salt, trajectory_id)
        if not turns:
            return {"status": 404, "error": "no hint outcomes for this trajectory in this scope"}
        return {"trajectory_id": trajectory_id, "turns": turns}

    def stats(self) -> dict[str, Any]:
        """Counters and gauges for ``GET /agentkv/v1/stats`` and ``/metrics``."""
        plugin = self.plugin
        ctl = plugin.ctl
        out: dict[str, Any] = dict(ctl.core.stats())
        if plugin.mode == "shadow":  # the shadow policy's gauges are what it would hold
            out["shadow_leases_active"] = out["leases_active"]
            out["shadow_retained_blocks"] = out["retained_blocks"]
            out["leases_active"] = out["retained_blocks"] = 0
        else:
            out["shadow_leases_active"] = out["shadow_retained_blocks"] = 0
        out.update(vars(plugin.counters))  # what the policy did
        out.update({f"shadow_{k}": v for k, v in vars(plugin.shadow_counters).items()})
        out["policy_mode"] = plugin.mode
        out["mode_switches"] = plugin.mode_switches
        out["internal_errors"] = plugin.internal_errors
        out["events_unknown_trajectory"] = plugin.events_unknown
        out.update(plugin.outcomes.log.stats())
        out["control_calls"] = self.calls
        out["num_blocks"] = plugin.num_blocks
        free = plugin.port.num_free()
        out["free_blocks"] = free
        out["kv_usage"] = plugin.usage(fresh=True)
        out["num_waiting"] = len(plugin.scheduler.waiting)
        out.update(plugin.tier.stats())
        out["hint_lag_seconds"] = ctl.book.lags.histogram()
        return out

"""Parse agentkv hints out of a request's ``vllm_xargs`` (pure, no vLLM import).

The wire format is fixed in ``docs/protocol.md``: flat ``agentkv_*`` keys, plus an
optional ``agentkv_hints`` JSON envelope shaped like vLLM's ``KvHintsEnvelope``. Flat
keys win; the envelope fills what they leave out. Nothing here raises on bad input:
problems are returned as a list of short error strings for the caller to count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentkv import _protocol as wire
from agentkv.residency._forecast import Forecast
from agentkv.residency._strategies import FinishIntent

__all__ = ["Hint", "has_lower_tier", "intent_of", "parse_hint"]

#: vLLM 0.32's connectors that keep KV in a lower tier (``--kv-offloading-backend native``
#: sets the first or, with ``VLLM_USE_SIMPLE_KV_OFFLOAD``, the second; ``lmcache`` the
#: others). A disaggregated-prefill connector (NIXL, Mooncake) is not a lower tier.
LOWER_TIER_CONNECTORS = frozenset(
    {
        "OffloadingConnector",
        "SimpleCPUOffloadConnector",
        "LMCacheMPConnector",
        "LMCacheConnectorV1",
    }
)


@dataclass
class Hint:
    """The agentkv advice attached to one request (fields absent on the wire are None)."""

    trajectory_id: str
    turn_id: int | None = None
    parent_id: str | None = None
    action: str = "default"
    ttl_ms: int | None = None
    gap_ms: int | None = None  # the client's forecast of the idle gap after this request
    gap_p90_ms: int | None = None
    gap_p99_ms: int | None = None
    priority: int | None = None
    reason: str | None = None
    policy_version: str | None = None
    mode: str = "active"  # the client's rollout mode; observe / shadow change nothing
    errors: list[str] = field(default_factory=list)

    @property
    def passive(self) -> bool:
        """True for an observe or shadow client: the hint is counted, never applied."""
        return self.mode in wire.PASSIVE_MODES


def _as_id(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= wire.MAX_ID_CHARS:
        return value
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _as_ms(value: Any) -> int | None:
    """A non-negative finite number of milliseconds, rounded; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value < 2**53:
        return round(value)
    return None


def _as_mode(value: Any, errors: list[str]) -> str:
    if isinstance(value, str) and value in wire.MODES:
        return value
    errors.append("unknown agentkv_mode")
    return "observe"  # unreadable: assume the client meant to change nothing


def parse_hint(extra_args: Mapping[str, Any] | None) -> Hint | None:
    """Read a :class:`Hint` from ``SamplingParams.extra_args``; None when there is no agentkv hint.

    Invalid fields are dropped (the request proceeds as if they were absent) and named
    in ``Hint.errors``. A request without a usable trajectory id carries no hint.
    """
    if not extra_args or not isinstance(extra_args, Mapping):
        return None
    errors: list[str] = []
    env: dict[str, Any] = {}
    if wire.XARG_HINTS in extra_args:
        env = wire.parse_envelope(extra_args.get(wire.XARG_HINTS), errors)

    def pick(flat_key: str, env_key: str) -> Any:
        if flat_key in extra_args:
            return extra_args[flat_key]
        return env.get(env_key)

    traj_raw = pick(wire.XARG_TRAJECTORY, "trajectory_id")
    if traj_raw is None and not errors:
        return None
    traj = _as_id(traj_raw)
    if traj is None:
        return None if traj_raw is None else Hint("", errors=[*errors, "bad agentkv_traj"])
    hint = Hint(trajectory_id=traj, errors=errors)

    turn = pick(wire.XARG_TURN, "turn_id")
    if turn is not None:
        hint.turn_id = _as_int(turn)
        if hint.turn_id is None or hint.turn_id < 0:
            hint.turn_id = None
            errors.append("bad agentkv_turn")
    parent = pick(wire.XARG_PARENT, "parent_trajectory_id")
    if parent is not None:
        hint.parent_id = _as_id(parent)
        if hint.parent_id is None:
            errors.append("bad agentkv_parent")
    action = pick(wire.XARG_ACTION, "action")
    if action is not None:
        if isinstance(action, str) and action in wire.ACTIONS:
            hint.action = action
        else:
            errors.append("unknown agentkv_action")
    ttl = pick(wire.XARG_TTL_MS, "ttl_ms")
    if ttl is not None:
        hint.ttl_ms = _as_int(ttl)
        if hint.ttl_ms is None or hint.ttl_ms < 0:
            hint.ttl_ms = None
            errors.append("bad agentkv_ttl_ms")
    for flat_key, env_key, attr in (
        (wire.XARG_GAP_MS, "gap_ms", "gap_ms"),
        (wire.XARG_GAP_P90_MS, "gap_p90_ms", "gap_p90_ms"),
        (wire.XARG_GAP_P99_MS, "gap_p99_ms", "gap_p99_ms"),
    ):
        value = pick(flat_key, env_key)
        if value is not None:
            ms = _as_ms(value)
            setattr(hint, attr, ms)
            if ms is None:
                errors.append(f"bad {flat_key}")
    prio = pick(wire.XARG_PRIORITY, "priority")
    if prio is not None:
        hint.priority = _as_int(prio)
        if hint.priority is None or abs(hint.priority) > 2**31:
            hint.priority = None
            errors.append("bad agentkv_priority")
    mode = pick(wire.XARG_MODE, "mode")
    if mode is not None:
        hint.mode = _as_mode(mode, errors)
    for flat_key, env_key, attr in (
        (wire.XARG_REASON, "reason", "reason"),
        (wire.XARG_POLICY, "policy_version", "policy_version"),
    ):
        value = pick(flat_key, env_key)
        if value is not None:
            setattr(hint, attr, _as_id(value))
    return hint


def intent_of(hint: Hint) -> FinishIntent:
    """What the residency controller reads from a request's hint when its turn finishes:
    the advised action and TTL, and the gap forecast (its quantiles, else the TTL)."""
    forecast = Forecast.from_hint_ms(hint.gap_ms, hint.gap_p90_ms, hint.gap_p99_ms, hint.ttl_ms)
    return FinishIntent(hint.action, hint.ttl_ms, forecast, hint.reason)


def has_lower_tier(kv_transfer_config: Any) -> bool:
    """True when vLLM's KV-transfer config names a connector that offloads to a lower
    tier (see :data:`LOWER_TIER_CONNECTORS`); a ``MultiConnector`` counts when one of
    its connectors does."""
    if kv_transfer_config is None:
        return False
    name = getattr(kv_transfer_config, "kv_connector", None)
    if name in LOWER_TIER_CONNECTORS:
        return True
    if name == "MultiConnector":
        extra = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
        subs = extra.get("connectors", []) if isinstance(extra, dict) else []
        return any(isinstance(c, dict) and c.get("kv_connector") in LOWER_TIER_CONNECTORS
                   for c in subs)  # fmt: skip
    return False

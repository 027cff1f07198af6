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

__all__ = ["Hint", "parse_hint"]


@dataclass
class Hint:
    """The agentkv advice attached to one request (fields absent on the wire are None)."""

    trajectory_id: str
    turn_id: int | None = None
    parent_id: str | None = None
    action: str = "default"
    ttl_ms: int | None = None
    priority: int | None = None
    reason: str | None = None
    policy_version: str | None = None
    errors: list[str] = field(default_factory=list)


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
    prio = pick(wire.XARG_PRIORITY, "priority")
    if prio is not None:
        hint.priority = _as_int(prio)
        if hint.priority is None or abs(hint.priority) > 2**31:
            hint.priority = None
            errors.append("bad agentkv_priority")
    for flat_key, env_key, attr in (
        (wire.XARG_REASON, "reason", "reason"),
        (wire.XARG_POLICY, "policy_version", "policy_version"),
    ):
        value = pick(flat_key, env_key)
        if value is not None:
            setattr(hint, attr, _as_id(value))
    return hint

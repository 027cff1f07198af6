"""The advice codec: a :class:`CacheAdvice` as a JSON object, spelled by the schema.

The same object travels in a lifecycle event's ``advice`` (the control route) and, with
the request's own fields, in a request hint (:mod:`agentkv.protocol._hints`): its keys are
the schema's own aliases (``ttlMs``, ``predictedGapMs``, ...), read from the model, never
restated. Decoding follows the rule of :mod:`agentkv.protocol._fields`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentkv.events._schema import ADVICE_ACTIONS, CacheAdvice, TrajectoryEvent
from agentkv.protocol._fields import Malformed, read_choice, read_count, read_id, read_int, read_ms

__all__ = ["ADVICE_KEYS", "AdviceFields", "decode_advice", "encode_advice", "read_advice"]

#: The wire name of each field: the schema's aliases (``{"ttl_ms": "ttlMs", ...}``).
ADVICE_KEYS: dict[str, str] = {
    name: field.alias or name for name, field in CacheAdvice.model_fields.items()
}
#: Names shared with the event schema (a hint's parent trajectory).
EVENT_KEYS: dict[str, str] = {
    name: field.alias or name for name, field in TrajectoryEvent.model_fields.items()
}
_ACTIONS = frozenset(ADVICE_ACTIONS)
_K = ADVICE_KEYS
_PRIORITY_LIMIT = 2**31


@dataclass(frozen=True, slots=True)
class AdviceFields:
    """What a server reads from an advice object (absent fields are None)."""

    trajectory_id: str | None
    turn_id: int | None
    action: str | None
    ttl_ms: int | None
    priority: int | None
    reason: str | None
    policy_version: str | None
    gap_ms: float | None
    gap_p90_ms: float | None
    gap_p99_ms: float | None


def encode_advice(advice: CacheAdvice) -> dict[str, Any]:
    """The advice's wire object (unset optional fields left out)."""
    return advice.to_wire()


def read_advice(obj: Mapping[str, Any]) -> AdviceFields:
    """The advice fields of ``obj`` (a wire object); raises :class:`Malformed`."""
    get = obj.get
    return AdviceFields(
        trajectory_id=read_id(_K["trajectory_id"], get(_K["trajectory_id"])),
        turn_id=read_count(_K["turn_id"], get(_K["turn_id"])),
        action=read_choice(_K["action"], get(_K["action"]), _ACTIONS),
        ttl_ms=read_int(_K["ttl_ms"], get(_K["ttl_ms"]), 0, 2**53),
        priority=read_int(_K["priority"], get(_K["priority"]), -_PRIORITY_LIMIT, _PRIORITY_LIMIT),
        reason=read_id(_K["reason"], get(_K["reason"])),
        policy_version=read_id(_K["policy_version"], get(_K["policy_version"])),
        gap_ms=read_ms(_K["predicted_gap_ms"], get(_K["predicted_gap_ms"])),
        gap_p90_ms=read_ms(_K["predicted_gap_p90_ms"], get(_K["predicted_gap_p90_ms"])),
        gap_p99_ms=read_ms(_K["predicted_gap_p99_ms"], get(_K["predicted_gap_p99_ms"])),
    )


def decode_advice(obj: Any) -> AdviceFields:
    """The fields of a whole advice object (an action required); raises :class:`Malformed`."""
    if not isinstance(obj, Mapping):
        raise Malformed("advice must be a JSON object")
    fields = read_advice(obj)
    if fields.action is None:
        raise Malformed(f"advice.{_K['action']} is missing")
    return fields

"""The request-hint codec: agentkv's fields on one model request, in ``vllm_xargs``.

One hint object, spelled by the schema's aliases (``trajectoryId``, ``turnId``,
``parentTrajectoryId``, ``criticalPath``, the advice's keys, ``mode``), travels in one of
two forms, one per request:

- the envelope form, ``{"agentkv_hints": "<JSON of a KvHintsEnvelope>"}``: the advice's
  action is the action type, the hint object its payload. Sent where the server
  advertises the :data:`~agentkv.protocol._wire.ENVELOPE_FEATURE` capability;
- the flat form, one ``vllm_xargs`` entry per field, named ``agentkv_`` and the field's
  wire name (``agentkv_ttlMs``): sent to every other vLLM (flat values only: vLLM answers
  a nested one with HTTP 400; a boolean it turns into ``1`` or ``0``, so there
  ``criticalPath`` travels as ``1`` or ``0`` and is read back as a boolean).

The client encodes (:func:`encode_hint`); the scheduler plugin decodes either form
(:func:`decode_hint`) under the rule of :mod:`agentkv.protocol._fields`: a request whose
hint breaks it is served as if it carried none, and the reason is counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentkv.events._schema import CacheAdvice
from agentkv.protocol._advice import ADVICE_KEYS, EVENT_KEYS, read_advice
from agentkv.protocol._fields import Malformed, read_bool, read_choice, read_count, read_id
from agentkv.protocol._wire import (
    EVENT_MODE_FIELD,
    KV_HINTS_FIELD,
    MODES,
    PASSIVE_MODES,
    XARG_HINTS,
    XARG_PREFIX,
    build_envelope,
    build_envelope_object,
    parse_envelope,
)

__all__ = [
    "HINT_KEYS",
    "Hint",
    "decode_hint",
    "decode_request_hint",
    "encode_hint",
    "encode_kv_hints_field",
    "flat_key",
]

_K = ADVICE_KEYS
_TRAJECTORY = _K["trajectory_id"]
_TURN = _K["turn_id"]
_PARENT = EVENT_KEYS["parent_trajectory_id"]
_CRITICAL = EVENT_KEYS["critical_path"]
_ACTION = _K["action"]
_TTL = _K["ttl_ms"]
_PRIORITY = _K["priority"]
_REASON = _K["reason"]
_POLICY = _K["policy_version"]
_GAPS = (_K["predicted_gap_ms"], _K["predicted_gap_p90_ms"], _K["predicted_gap_p99_ms"])
_MODE = EVENT_MODE_FIELD

#: Every field of a hint, by its wire name.
HINT_KEYS: tuple[str, ...] = (
    _TRAJECTORY, _TURN, _PARENT, _CRITICAL, _ACTION, _TTL, *_GAPS, _PRIORITY, _REASON,
    _POLICY, _MODE,
)  # fmt: skip


def flat_key(name: str) -> str:
    """The flat form's ``vllm_xargs`` key of the field ``name`` (``agentkv_ttlMs``)."""
    return XARG_PREFIX + name


def _hint_object(
    trajectory_id: str,
    turn_id: int,
    parent_id: str | None,
    advice: CacheAdvice | None,
    critical_path: bool | None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {_TRAJECTORY: trajectory_id, _TURN: turn_id}
    if parent_id is not None:
        obj[_PARENT] = parent_id
    if critical_path is not None:
        obj[_CRITICAL] = bool(critical_path)
    if advice is None:
        return obj
    obj[_ACTION] = advice.action
    if advice.ttl_ms is not None:
        obj[_TTL] = int(advice.ttl_ms)
    for key, value in zip(
        _GAPS,
        (advice.predicted_gap_ms, advice.predicted_gap_p90_ms, advice.predicted_gap_p99_ms),
        strict=True,
    ):
        if value is not None:
            obj[key] = round(value)  # whole milliseconds
    if advice.priority is not None:
        obj[_PRIORITY] = int(advice.priority)
    obj[_REASON] = advice.reason
    obj[_POLICY] = advice.policy_version
    return obj


def encode_hint(
    trajectory_id: str,
    turn_id: int,
    parent_id: str | None,
    advice: CacheAdvice | None,
    *,
    envelope: bool,
    critical_path: bool | None = None,
) -> dict[str, Any]:
    """The ``vllm_xargs`` entries of a hint: the envelope form or the flat form.

    ``critical_path``: the trajectory scope's mark (a turn the join waits on; None: not
    said, and not sent)."""
    obj = _hint_object(trajectory_id, turn_id, parent_id, advice, critical_path)
    if envelope:
        action = obj.pop(_ACTION, "default")
        return {XARG_HINTS: build_envelope(action, obj)}
    # vLLM's request model turns a boolean into 1 or 0: send that, it is what arrives
    return {XARG_PREFIX + key: int(v) if isinstance(v, bool) else v for key, v in obj.items()}


def encode_kv_hints_field(
    trajectory_id: str,
    turn_id: int,
    parent_id: str | None,
    advice: CacheAdvice | None,
    *,
    critical_path: bool | None = None,
) -> dict[str, Any]:
    """The request body entry ``{"kv_hints": <envelope object>}`` of a hint: the envelope
    form, as vLLM's own ``kv_hints`` field takes it (a JSON object, not a string)."""
    obj = _hint_object(trajectory_id, turn_id, parent_id, advice, critical_path)
    action = obj.pop(_ACTION, "default")
    return {KV_HINTS_FIELD: build_envelope_object(action, obj)}


@dataclass
class Hint:
    """The agentkv hint of one request (fields absent on the wire are None).

    ``errors`` holds the reason a hint was rejected; a rejected hint has no trajectory
    id and nothing of it is applied. Its ``rejected_id`` (and ``turn_id``) are what its
    own ``trajectoryId`` (and ``turnId``) said, where those fields were readable: the
    server reports the rejection to that trajectory's scope, and acts on nothing.
    """

    trajectory_id: str
    turn_id: int | None = None
    parent_id: str | None = None
    critical_path: bool | None = None  # the client's mark: the join waits on this trajectory
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
    rejected_id: str | None = None

    @property
    def rejected(self) -> bool:
        """True when the hint broke the protocol's rule (see ``errors``)."""
        return bool(self.errors)

    @property
    def passive(self) -> bool:
        """True for an observe or shadow client: the hint is counted, never applied."""
        return self.mode in PASSIVE_MODES


def _whole(ms: float | None) -> int | None:
    return None if ms is None else round(ms)


def _read(obj: Mapping[str, Any], *, flat: bool = False) -> Hint:
    fields = read_advice(obj)
    if fields.trajectory_id is None:
        raise Malformed(f"{_TRAJECTORY} is missing")
    return Hint(
        trajectory_id=fields.trajectory_id,
        turn_id=fields.turn_id,
        parent_id=read_id(_PARENT, obj.get(_PARENT)),
        critical_path=read_bool(_CRITICAL, obj.get(_CRITICAL), numeric=flat),
        action=fields.action or "default",
        ttl_ms=fields.ttl_ms,
        gap_ms=_whole(fields.gap_ms),
        gap_p90_ms=_whole(fields.gap_p90_ms),
        gap_p99_ms=_whole(fields.gap_p99_ms),
        priority=fields.priority,
        reason=fields.reason,
        policy_version=fields.policy_version,
        mode=read_choice(_MODE, obj.get(_MODE), MODES) or "active",
    )


def decode_hint(extra_args: Any) -> Hint | None:
    """The hint of a request's ``SamplingParams.extra_args``; None when it carries none.

    The envelope form is read when ``agentkv_hints`` is present (flat keys beside it are
    then ignored), else the flat form. Never raises: a hint that breaks the rule comes
    back rejected (:attr:`Hint.rejected`, the reason in :attr:`Hint.errors`).
    """
    if not extra_args or not isinstance(extra_args, Mapping):
        return None
    obj: Mapping[str, Any] = {}
    try:
        if XARG_HINTS in extra_args:
            action, payload = parse_envelope(extra_args[XARG_HINTS])
            obj = {**payload, _ACTION: action}
        else:
            n = len(XARG_PREFIX)
            obj = {
                key[n:]: value
                for key, value in extra_args.items()
                if isinstance(key, str) and key.startswith(XARG_PREFIX)
            }
            if not obj:
                return None
            return _read(obj, flat=True)
        return _read(obj)
    except (ValueError, TypeError) as exc:  # Malformed is a ValueError
        rejected = Hint("", errors=[str(exc)])
        rejected.rejected_id, rejected.turn_id = _readable(obj)
        return rejected


def _plain(value: Any) -> Any:
    """A ``KvHintsEnvelope`` / ``KvHintAction`` (msgspec structs) as plain dicts and lists."""
    fields = getattr(value, "__struct_fields__", None)
    if isinstance(fields, tuple):
        return {name: _plain(getattr(value, name, None)) for name in fields}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def decode_request_hint(request: Any) -> Hint | None:
    """The hint of an engine request: its ``kv_hints`` envelope where that holds agentkv's
    action (a payload with ``trajectoryId``), else its ``SamplingParams.extra_args``
    (:func:`decode_hint`). Other producers' actions in the envelope (a router's
    ``vllm.set_priority``) are not agentkv's and are left alone. Never raises.
    """
    obj: Mapping[str, Any] = {}
    try:
        envelope = _plain(getattr(request, KV_HINTS_FIELD, None))
        actions = envelope.get("actions") if isinstance(envelope, Mapping) else None
        for action in actions if isinstance(actions, list) else ():
            payload = action.get("payload") if isinstance(action, Mapping) else None
            if isinstance(payload, Mapping) and "trajectoryId" in payload:
                obj = {**payload, _ACTION: action.get("action_type", "default")}
                return _read(obj)
    except (ValueError, TypeError) as exc:
        rejected = Hint("", errors=[str(exc)])
        rejected.rejected_id, rejected.turn_id = _readable(obj)
        return rejected
    params = getattr(request, "sampling_params", None)
    return decode_hint(getattr(params, "extra_args", None))


def _readable(obj: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The trajectory id and turn id of a rejected hint's object, each where readable."""
    out: list[Any] = []
    for key, read in ((_TRAJECTORY, read_id), (_TURN, read_count)):
        try:
            out.append(read(key, obj.get(key)))
        except (ValueError, TypeError):
            out.append(None)
    return out[0], out[1]

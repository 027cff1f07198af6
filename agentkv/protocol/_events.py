"""The lifecycle-event codec: ``POST /agentkv/v1/events`` bodies.

An event is a :class:`TrajectoryEvent` in its wire form (the schema's aliases), with the
scope's ``cacheSalt`` and, where the client has one, an ``advice`` object (the advice
codec, :mod:`agentkv.protocol._advice`). The client encodes (:func:`encode_event`); the
control route decodes a body (:func:`decode_events_body`) under the rule of
:mod:`agentkv.protocol._fields`: each event that breaks it is rejected as a whole, with its
index and reason in the answer; the others are applied.
"""

from __future__ import annotations

import json
from typing import Any

from agentkv.events._schema import EVENT_KINDS, CacheAdvice, TrajectoryEvent
from agentkv.protocol._advice import EVENT_KEYS, decode_advice, encode_advice
from agentkv.protocol._fields import (
    Malformed,
    read_choice,
    read_count,
    read_id,
    read_ms,
    read_salt,
    read_turn_id,
)
from agentkv.protocol._wire import (
    EVENT_MODE_FIELD,
    EVENT_SALT_FIELD,
    MAX_BODY_BYTES,
    MAX_EVENTS_PER_BATCH,
    MODES,
)

__all__ = ["ADVICE_FIELD", "BodyError", "decode_event", "decode_events_body", "encode_event"]

ADVICE_FIELD = "advice"
_E = EVENT_KEYS
_KINDS = frozenset(EVENT_KINDS)


class BodyError(ValueError):
    """A body not usable as a whole; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def encode_event(
    event: TrajectoryEvent, *, cache_salt: str | None = None, advice: CacheAdvice | None = None
) -> dict[str, Any]:
    """An event's wire object, with its scope's salt and its advice where given."""
    out = event.to_wire()
    if cache_salt is not None:
        out[EVENT_SALT_FIELD] = cache_salt
    if advice is not None:
        out[ADVICE_FIELD] = encode_advice(advice)
    return out


def decode_event(ev: Any, default_salt: str | None) -> dict[str, Any]:
    """The fields the server reads from one event, as the engine's ``events`` operation
    takes them; raises :class:`Malformed` with the reason."""
    if not isinstance(ev, dict):
        raise Malformed("an event must be a JSON object")
    traj = read_id(_E["trajectory_id"], ev.get(_E["trajectory_id"]))
    if traj is None:
        raise Malformed(f"{_E['trajectory_id']} is missing")
    kind = read_choice(_E["event"], ev.get(_E["event"]), _KINDS)
    if kind is None:
        raise Malformed(f"{_E['event']} is missing")
    # A turn label says nothing about order; the trajectory's own counter does.
    read_turn_id(_E["turn_id"], ev.get(_E["turn_id"]))
    read_count(_E["turn_index"], ev.get(_E["turn_index"]))
    salt = ev.get(EVENT_SALT_FIELD)
    out: dict[str, Any] = {
        "trajectory_id": traj,
        "event": kind,
        "emitted_at_ms": read_ms(_E["emitted_at_ms"], ev.get(_E["emitted_at_ms"])),
        "cache_salt": read_salt(EVENT_SALT_FIELD, default_salt if salt is None else salt),
        "mode": read_choice(EVENT_MODE_FIELD, ev.get(EVENT_MODE_FIELD), MODES),
    }
    raw = ev.get(ADVICE_FIELD)
    if raw is None:
        return out
    try:
        advice = decode_advice(raw)
    except Malformed as exc:
        raise Malformed(f"{ADVICE_FIELD}: {exc}") from None
    if advice.trajectory_id is not None and advice.trajectory_id != traj:
        raise Malformed(f"{ADVICE_FIELD}.{_E['trajectory_id']} differs from the event's")
    out.update(action=advice.action, ttl_ms=advice.ttl_ms, reason=advice.reason)
    for name, value in (
        ("gap_ms", advice.gap_ms),
        ("gap_p90_ms", advice.gap_p90_ms),
        ("gap_p99_ms", advice.gap_p99_ms),
    ):
        if value is not None:
            out[name] = value
    return out


def decode_events_body(
    body: bytes, default_salt: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(decoded events, rejected entries)`` of a ``POST /agentkv/v1/events`` body.

    ``default_salt`` is the scope of events that name none. A body not usable as a whole
    (too large, not JSON, nested too deeply, no ``events`` list, too many events) raises
    :class:`BodyError`.
    """
    if len(body) > MAX_BODY_BYTES:
        raise BodyError(413, f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BodyError(400, "body is not valid JSON") from None
    except RecursionError:
        raise BodyError(400, "body is nested too deeply") from None
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        raise BodyError(400, 'body must be an object with an "events" list')
    events = data["events"]
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise BodyError(413, f"{len(events)} events; send at most {MAX_EVENTS_PER_BATCH} per batch")
    good: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for i, ev in enumerate(events):
        try:
            good.append(decode_event(ev, default_salt))
        except Malformed as exc:
            rejected.append({"index": i, "error": str(exc)})
    return good, rejected

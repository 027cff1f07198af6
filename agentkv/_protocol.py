"""The wire protocol both sides share (``docs/protocol.md``): names, limits, the envelope.

The client side (the backend adapters, the capability probe, the lifecycle channel)
writes what the server side (:mod:`agentkv.vllm._hints`, :mod:`agentkv.vllm._control`)
reads; both take the names and limits from here, so the two cannot drift apart. Pure and
a leaf: no agentkv, vLLM or pydantic import, so the vLLM API-server process loads it
cheaply.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

__all__ = [
    "ACTIONS",
    "CAPABILITIES_PATH",
    "EVENTS_PATH",
    "EVENT_KINDS",
    "EVENT_MODE_FIELD",
    "EVENT_SALT_FIELD",
    "MAX_BODY_BYTES",
    "MAX_ENVELOPE_CHARS",
    "MAX_EVENTS_PER_BATCH",
    "MAX_ID_CHARS",
    "MAX_SALT_CHARS",
    "MODES",
    "PASSIVE_MODES",
    "PROTOCOL_VERSION",
    "ROUTE_PREFIX",
    "SALT_HEADER",
    "STATS_PATH",
    "TRAJECTORIES_PATH",
    "XARG_ACTION",
    "XARG_GAP_MS",
    "XARG_GAP_P90_MS",
    "XARG_GAP_P99_MS",
    "XARG_HINTS",
    "XARG_MODE",
    "XARG_PARENT",
    "XARG_POLICY",
    "XARG_PRIORITY",
    "XARG_REASON",
    "XARG_TRAJECTORY",
    "XARG_TTL_MS",
    "XARG_TURN",
    "build_envelope",
    "envelope_of_payload_json",
    "parse_envelope",
    "valid_salt",
]

PROTOCOL_VERSION = "agentkv/1"

# --- limits -------------------------------------------------------------------------------
MAX_ID_CHARS = 256  # trajectory ids, parent ids, reasons, policy versions
MAX_ENVELOPE_CHARS = 16_384  # the JSON of one agentkv_hints envelope
MAX_EVENTS_PER_BATCH = 256  # events in one POST /agentkv/v1/events
MAX_BODY_BYTES = 1 << 20  # one control-route request body
MAX_SALT_CHARS = 128  # vLLM's own limit on cache_salt
_SALT_FORBIDDEN = frozenset("@/\\\x00")  # vLLM refuses these in cache_salt

ACTIONS = frozenset({"default", "retain", "offload", "prefetch", "release"})
EVENT_KINDS = frozenset(
    {
        "model_started",
        "tool_started",
        "tool_finished",
        "trajectory_finished",
        "trajectory_cancelled",
    }
)

#: Rollout modes of a client. ``observe`` and ``shadow`` must change no scheduling: the
#: server counts what such a client sends and applies none of it.
MODES = frozenset({"observe", "shadow", "active"})
PASSIVE_MODES = frozenset({"observe", "shadow"})

# --- in-band hints: flat vllm_xargs keys ------------------------------------------------
XARG_TRAJECTORY = "agentkv_traj"
XARG_TURN = "agentkv_turn"
XARG_PARENT = "agentkv_parent"
XARG_ACTION = "agentkv_action"
XARG_TTL_MS = "agentkv_ttl_ms"
# The client's forecast of the idle gap after this request (quantiles, ms): the server's
# predicted retention ranks paused trajectories by it.
XARG_GAP_MS = "agentkv_gap_ms"
XARG_GAP_P90_MS = "agentkv_gap_p90_ms"
XARG_GAP_P99_MS = "agentkv_gap_p99_ms"
XARG_PRIORITY = "agentkv_priority"
XARG_REASON = "agentkv_reason"
XARG_POLICY = "agentkv_policy"
XARG_HINTS = "agentkv_hints"  # the JSON envelope below
XARG_MODE = "agentkv_mode"  # optional: the client's rollout mode (MODES)

# --- out-of-band: the control route -------------------------------------------------------
ROUTE_PREFIX = "/agentkv/v1/"
EVENTS_PATH = ROUTE_PREFIX + "events"
CAPABILITIES_PATH = ROUTE_PREFIX + "capabilities"
STATS_PATH = ROUTE_PREFIX + "stats"
TRAJECTORIES_PATH = ROUTE_PREFIX + "trajectories/"

# --- tenant scope ----------------------------------------------------------------------
# Server-side state is keyed by (scope, trajectory id); the scope is the request's
# ``cache_salt`` (none: the unsalted scope). Events and queries name the scope the same
# way, so one tenant cannot name another's trajectory.
EVENT_SALT_FIELD = "cacheSalt"  # per event in POST /agentkv/v1/events
EVENT_MODE_FIELD = "mode"  # per event: the client's rollout mode (MODES), optional
SALT_HEADER = "X-AgentKV-Cache-Salt"  # queries; default scope of a POST's events


def valid_salt(salt: Any) -> bool:
    """True when ``salt`` is a cache salt vLLM accepts (1..128 characters, no ``@ / \\ NUL``)."""
    return (
        isinstance(salt, str)
        and 0 < len(salt) <= MAX_SALT_CHARS
        and not any(ch in _SALT_FORBIDDEN for ch in salt)
    )


# --- the envelope (shaped like vLLM's KvHintsEnvelope) ---------------------------------------
# Message and action ids: unique per process (a counter) and across processes (a random
# prefix); 32 hex digits like a uuid4's, at a fraction of its cost on the request path.
_ID_PREFIX = os.urandom(8).hex()
_ids = itertools.count()
#: ``json.dumps(..., separators=(",", ":"))`` without building an encoder per call.
_encode_compact = json.JSONEncoder(separators=(",", ":")).encode
_quote = encode_basestring_ascii  # how ``json.dumps`` writes a str (ASCII)
_HEAD = f'{{"protocol_version":{_quote(PROTOCOL_VERSION)},"message_id":"'


def _new_id() -> str:
    return f"{_ID_PREFIX}{next(_ids):016x}"


def _payload_json(payload: Mapping[str, Any]) -> str | None:
    """``payload`` as compact JSON, the bytes ``json.dumps`` writes, when every key is a
    str and every value a str or an int (what the client sends); else None."""
    parts = []
    for key, value in payload.items():
        if type(key) is not str:
            return None
        kind = type(value)
        if kind is str:
            parts.append(f"{_quote(key)}:{_quote(value)}")
        elif kind is int:
            parts.append(f"{_quote(key)}:{int.__repr__(value)}")
        else:
            return None
    return "{" + ",".join(parts) + "}"


def build_envelope(action: str | None, payload: Mapping[str, Any]) -> str:
    """The ``agentkv_hints`` value: JSON of an envelope carrying ``action`` with ``payload``
    (the advice's fields: ``trajectory_id``, ``turn_id``, ``reason``, ``policy_version`` and
    where set ``ttl_ms``, ``gap_ms``, ``gap_p90_ms``, ``gap_p99_ms``, ``priority``,
    ``parent_trajectory_id``); no action: none listed.

    Written directly for the usual payload (str and int values: one per model call),
    byte for byte what the general ``json`` encoding below gives.
    """
    if action is None:
        return f'{_HEAD}{_new_id()}","actions":[]}}'
    body = _payload_json(payload) if type(action) is str else None
    if body is not None:
        return envelope_of_payload_json(action, body)
    actions: list[dict[str, Any]] = [
        {
            "action_id": _new_id(),
            "action_type": action,
            "action_version": "1",
            "payload": dict(payload),
        }
    ]
    envelope = {
        "protocol_version": PROTOCOL_VERSION,
        "message_id": _new_id(),
        "actions": actions,
    }
    return _encode_compact(envelope)


def envelope_of_payload_json(action: str, payload_json: str) -> str:
    """:func:`build_envelope` of ``action`` with a payload already written as compact JSON
    (``payload_json``: the bytes ``json.dumps(payload, separators=(",", ":"))`` gives)."""
    action_id = _new_id()
    return (
        f'{_HEAD}{_new_id()}","actions":[{{"action_id":"{action_id}",'
        f'"action_type":{_quote(action)},"action_version":"1","payload":{payload_json}}}]}}'
    )


def parse_envelope(raw: Any, errors: list[str]) -> dict[str, Any]:
    """The payload of an envelope's first action, plus its ``action`` type.

    Never raises: what is wrong is appended to ``errors`` and ``{}`` comes back.
    """
    if not isinstance(raw, str) or len(raw) > MAX_ENVELOPE_CHARS:
        errors.append("agentkv_hints: not a JSON string of reasonable size")
        return {}
    try:
        env = json.loads(raw)
    except ValueError:
        errors.append("agentkv_hints: not valid JSON")
        return {}
    actions = env.get("actions") if isinstance(env, dict) else None
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        errors.append("agentkv_hints: no actions")
        return {}
    first = actions[0]
    payload = first.get("payload")
    out: dict[str, Any] = dict(payload) if isinstance(payload, dict) else {}
    out["action"] = first.get("action_type")
    return out

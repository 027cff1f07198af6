"""Names, limits, routes and the envelope shared by every channel (``docs/protocol.md``).

Pure and a leaf: no agentkv, vLLM or pydantic import.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CAPABILITIES_PATH",
    "ENVELOPE_FEATURE",
    "EVENTS_PATH",
    "EVENT_MODE_FIELD",
    "EVENT_SALT_FIELD",
    "KV_HINTS_FIELD",
    "KV_HINTS_FIELD_FEATURE",
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
    "XARG_HINTS",
    "XARG_PREFIX",
    "build_envelope",
    "build_envelope_object",
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

#: Rollout modes of a client. ``observe`` and ``shadow`` must change no scheduling: the
#: server counts what such a client sends and applies none of it.
MODES = frozenset({"observe", "shadow", "active"})
PASSIVE_MODES = frozenset({"observe", "shadow"})

# --- in-band hints ------------------------------------------------------------------------
#: The ``vllm_xargs`` key of the envelope form; the flat form's keys are this prefix and
#: each field's wire name (:mod:`agentkv.protocol._hints`).
XARG_PREFIX = "agentkv_"
XARG_HINTS = "agentkv_hints"
#: Set by the API server's salt gate (:mod:`agentkv.vllm._saltgate`) on every hinted
#: request, after removing any the client sent: the request's source (a MAC of its bearer
#: token, else its address), which the plugin groups tenant shares by. Not a hint field.
XARG_SOURCE = "agentkv_source"
#: The capability feature a server sets when it reads the envelope form.
ENVELOPE_FEATURE = "hint_envelope"
#: vLLM's own request field for a ``KvHintsEnvelope`` (``Request.kv_hints``, vLLM 0.33;
#: no HTTP field sets it there). A server whose HTTP API takes the field *and* whose
#: scheduler reads agentkv's hint from it advertises :data:`KV_HINTS_FIELD_FEATURE`; the
#: client then sends the envelope, as a JSON object, in that field instead of
#: ``vllm_xargs`` (docs/protocol.md). Where it is not advertised, ``vllm_xargs`` carries it.
KV_HINTS_FIELD = "kv_hints"
KV_HINTS_FIELD_FEATURE = "kv_hints_field"

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
# prefix); 32 hex digits like a uuid4's.
_ID_PREFIX = os.urandom(8).hex()
_ids = itertools.count()
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _new_id() -> str:
    return f"{_ID_PREFIX}{next(_ids):016x}"


def build_envelope_object(action: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """An envelope (vLLM's ``KvHintsEnvelope`` shape) with one action of type ``action``
    carrying ``payload``: what the ``kv_hints`` request field takes."""
    return {
        "protocol_version": PROTOCOL_VERSION,
        "message_id": _new_id(),
        "actions": [
            {
                "action_id": _new_id(),
                "action_type": action,
                "action_version": "1",
                "payload": dict(payload),
            }
        ],
    }


def build_envelope(action: str, payload: Mapping[str, Any]) -> str:
    """The ``agentkv_hints`` value: compact JSON of :func:`build_envelope_object` (the
    payload JSON-encodable, no NaN)."""
    return _dumps(build_envelope_object(action, payload))


def parse_envelope(raw: Any) -> tuple[Any, dict[str, Any]]:
    """``(action type, payload)`` of an envelope's first action.

    Raises :class:`ValueError` (with the reason) for what is not one: not a string of at
    most :data:`MAX_ENVELOPE_CHARS`, not JSON (or nested too deeply to parse), no action,
    a payload that is not an object.
    """
    if not isinstance(raw, str) or len(raw) > MAX_ENVELOPE_CHARS:
        raise ValueError(
            f"{XARG_HINTS} must be a JSON string of at most {MAX_ENVELOPE_CHARS} characters"
        )
    try:
        env = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{XARG_HINTS} is nested too deeply") from None
    except ValueError:
        raise ValueError(f"{XARG_HINTS} is not valid JSON") from None
    actions = env.get("actions") if isinstance(env, dict) else None
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        raise ValueError(f"{XARG_HINTS} has no actions")
    payload = actions[0].get("payload")
    if not isinstance(payload, dict):
        raise ValueError(f"{XARG_HINTS} action has no payload object")
    return actions[0].get("action_type"), payload

"""The ``kv_hints`` request field: agentkv's envelope in vLLM's own ``KvHintsEnvelope``.

The client's body entry (:func:`encode_kv_hints_field`) is read back by
:func:`decode_request_hint` from an engine request's ``kv_hints`` (vLLM's msgspec struct, as
vLLM builds it, or a plain dict), and ``vllm_xargs`` stays the fallback.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import agentkv
from agentkv.protocol._hints import decode_request_hint, encode_hint, encode_kv_hints_field
from tests.support.requires import require_module

ADVICE = agentkv.CacheAdvice(
    trajectory_id="t-1",
    action="retain",
    ttl_ms=30_000,
    reason="short_tool_gap",
    policy_version="p1",
    predicted_gap_ms=4_000.0,
)


def _request(kv_hints: Any = None, extra_args: Any = None) -> SimpleNamespace:
    return SimpleNamespace(
        kv_hints=kv_hints, sampling_params=SimpleNamespace(extra_args=extra_args)
    )


def test_the_field_round_trips_through_vllms_own_envelope_struct() -> None:
    """vLLM's ``KvHintsEnvelope`` decodes the client's object unchanged (msgspec, strict)
    and the plugin-side decoder reads agentkv's action from the struct."""
    msgspec = require_module("msgspec")
    protocol = require_module("vllm.v1.kv_hints.protocol", "pip install 'agentkv-cache[cpu]'")
    entry = encode_kv_hints_field("t-1", 3, "parent", ADVICE)
    struct = msgspec.convert(entry["kv_hints"], protocol.KvHintsEnvelope)
    hint = decode_request_hint(_request(kv_hints=struct))
    assert hint is not None and not hint.errors
    assert (hint.trajectory_id, hint.turn_id, hint.parent_id) == ("t-1", 3, "parent")
    assert hint.action == "retain" and hint.ttl_ms == 30_000


def test_vllm_xargs_stays_the_fallback_when_kv_hints_is_empty() -> None:
    xargs = encode_hint("t-2", 1, None, ADVICE, envelope=False)
    hint = decode_request_hint(_request(kv_hints=None, extra_args=xargs))
    assert hint is not None and hint.trajectory_id == "t-2" and hint.turn_id == 1


def test_another_producers_actions_are_not_taken_for_agentkvs() -> None:
    """A router's ``vllm.set_priority`` in the envelope is not an agentkv hint: the
    request's ``vllm_xargs`` decide."""
    foreign = {
        "protocol_version": "0.1",
        "message_id": "router/1",
        "actions": [
            {
                "action_id": "a",
                "action_type": "vllm.set_priority",
                "action_version": "1.0",
                "payload": {"target": "request_cached", "value": 10},
            }
        ],
    }
    assert decode_request_hint(_request(kv_hints=foreign)) is None
    xargs = encode_hint("t-3", 2, None, None, envelope=True)
    hint = decode_request_hint(_request(kv_hints=foreign, extra_args=xargs))
    assert hint is not None and hint.trajectory_id == "t-3"


def test_a_broken_payload_in_the_field_is_a_rejected_hint_not_an_error() -> None:
    entry = encode_kv_hints_field("t-4", 1, None, ADVICE)
    entry["kv_hints"]["actions"][0]["payload"]["turnId"] = "not-a-number" * 10
    hint = decode_request_hint(_request(kv_hints=entry["kv_hints"]))
    assert hint is not None and hint.errors

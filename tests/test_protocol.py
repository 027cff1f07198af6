"""The wire protocol: what the client writes is what the server reads (one module for both)."""

from __future__ import annotations

from test_backends import RETAIN

from agentkv._protocol import PROTOCOL_VERSION, XARG_HINTS, build_envelope, parse_envelope
from agentkv.client.backends import RequestHints, VLLMAdapter
from agentkv.vllm._hints import parse_hint


def test_the_adapter_fields_parse_back_into_the_same_hint_flat_or_enveloped() -> None:
    hints = RequestHints("t-1", 3, "r-1", parent_id="p-0", advice=RETAIN)
    body: dict = {}
    VLLMAdapter().apply(hints, body, {})
    xargs = body["vllm_xargs"]
    flat = parse_hint(xargs)
    enveloped = parse_hint({XARG_HINTS: xargs[XARG_HINTS]})
    for hint in (flat, enveloped):
        assert hint is not None and not hint.errors
        assert (hint.trajectory_id, hint.turn_id, hint.parent_id) == ("t-1", 3, "p-0")
        assert (hint.action, hint.ttl_ms, hint.priority) == ("retain", 90_000, -1)
        assert (hint.reason, hint.policy_version) == ("short_tool_gap", "p")


def test_an_envelope_without_advice_carries_no_action() -> None:
    errors: list[str] = []
    raw = build_envelope(None, {})
    assert PROTOCOL_VERSION in raw
    assert parse_envelope(raw, errors) == {} and errors == ["agentkv_hints: no actions"]

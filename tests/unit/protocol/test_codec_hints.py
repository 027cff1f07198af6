"""The request-hint codec: what the client encodes is what the plugin decodes, in either form."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentkv.client.backends import RequestHints, VLLMAdapter, make_envelope
from agentkv.events._schema import ADVICE_ACTIONS, ADVICE_REASONS, CacheAdvice
from agentkv.protocol._hints import HINT_KEYS, decode_hint, encode_hint, flat_key
from agentkv.protocol._wire import ENVELOPE_FEATURE, PROTOCOL_VERSION, XARG_HINTS
from agentkv.vllm._hints import intent_of

_IDS = st.text(min_size=1, max_size=40)


def _advice(**fields: object) -> CacheAdvice:
    return CacheAdvice(**fields)  # type: ignore[arg-type]


_GAP = st.one_of(st.none(), st.floats(0, 1e9), st.integers(0, 10**9))
_ADVICE = st.builds(
    _advice,
    trajectory_id=_IDS,
    action=st.sampled_from(ADVICE_ACTIONS),
    ttl_ms=st.one_of(st.none(), st.integers(0, 10**9)),
    priority=st.one_of(st.none(), st.integers(-1000, 1000)),
    reason=st.sampled_from(ADVICE_REASONS),
    policy_version=st.text(min_size=1, max_size=64),
    predicted_gap_ms=_GAP,
    predicted_gap_p90_ms=_GAP,
    predicted_gap_p99_ms=_GAP,
)


def _whole(x: float | None) -> int | None:
    return None if x is None else round(x)


@given(
    trajectory_id=_IDS,
    turn_id=st.integers(0, 10**6),
    parent_id=st.one_of(st.none(), _IDS),
    advice=st.one_of(st.none(), _ADVICE),
    envelope=st.booleans(),
)
def test_a_hint_round_trips_in_either_form(
    trajectory_id: str,
    turn_id: int,
    parent_id: str | None,
    advice: CacheAdvice | None,
    envelope: bool,
) -> None:
    xargs = encode_hint(trajectory_id, turn_id, parent_id, advice, envelope=envelope)
    json.dumps(xargs, allow_nan=False)  # what the HTTP body carries
    assert all(isinstance(v, (str, int, float)) for v in xargs.values())  # flat values only
    hint = decode_hint(xargs)
    assert hint is not None and not hint.rejected, hint and hint.errors
    assert (hint.trajectory_id, hint.turn_id, hint.parent_id) == (trajectory_id, turn_id, parent_id)
    if advice is None:
        assert (hint.action, hint.ttl_ms, hint.reason, hint.priority) == (
            "default",
            None,
            None,
            None,
        )
        return
    assert (hint.action, hint.ttl_ms, hint.priority) == (
        advice.action,
        advice.ttl_ms,
        advice.priority,
    )
    assert (hint.reason, hint.policy_version) == (advice.reason, advice.policy_version)
    assert (hint.gap_ms, hint.gap_p90_ms, hint.gap_p99_ms) == (
        _whole(advice.predicted_gap_ms),
        _whole(advice.predicted_gap_p90_ms),
        _whole(advice.predicted_gap_p99_ms),
    )
    assert intent_of(hint).action == advice.action


def test_each_request_carries_one_form() -> None:
    """The envelope alone where the server advertises it, else flat keys alone."""
    advice = CacheAdvice(
        trajectory_id="t", action="retain", ttl_ms=5000, priority=-1, reason="short_tool_gap",
        policy_version="p", predicted_gap_ms=1500.4,
    )  # fmt: skip
    hints = RequestHints("t", 3, "r", parent_id="p-0", advice=advice)
    flat: dict = {}
    VLLMAdapter().apply(hints, flat, {})
    assert XARG_HINTS not in flat["vllm_xargs"]
    assert flat["vllm_xargs"] == {
        "agentkv_trajectoryId": "t", "agentkv_turnId": 3, "agentkv_parentTrajectoryId": "p-0",
        "agentkv_action": "retain", "agentkv_ttlMs": 5000, "agentkv_predictedGapMs": 1500,
        "agentkv_priority": -1, "agentkv_reason": "short_tool_gap", "agentkv_policyVersion": "p",
    }  # fmt: skip
    caps = {"features": {ENVELOPE_FEATURE: True}}
    enveloped: dict = {}
    VLLMAdapter(capabilities=caps).apply(hints, enveloped, {})
    assert list(enveloped["vllm_xargs"]) == [XARG_HINTS]
    env = json.loads(enveloped["vllm_xargs"][XARG_HINTS])
    assert env["protocol_version"] == PROTOCOL_VERSION
    (action,) = env["actions"]
    assert action["action_type"] == "retain"
    # One spelling per field: the payload's keys are the flat form's, less the prefix.
    assert {flat_key(k) for k in action["payload"]} | {"agentkv_action"} == set(flat["vllm_xargs"])
    assert decode_hint(enveloped["vllm_xargs"]) == decode_hint(flat["vllm_xargs"])
    assert json.loads(make_envelope(hints))["actions"][0]["payload"] == action["payload"]


def test_the_spelling_is_the_schemas() -> None:
    """Every hint field is named by the schema's alias (the advice's, the event's lineage
    fields, or the event's ``mode``)."""
    lineage = {"parentTrajectoryId", "criticalPath"}
    names = {f.alias for f in CacheAdvice.model_fields.values()} | lineage | {"mode"}
    assert set(HINT_KEYS) <= names


def test_a_request_without_agentkv_keys_has_no_hint() -> None:
    assert decode_hint(None) is None and decode_hint({}) is None
    assert decode_hint({"other": 1, "agentic_context": "{}"}) is None


def test_an_envelope_flat_keys_beside_it_are_ignored() -> None:
    xargs = encode_hint("t", 1, None, None, envelope=True)
    hint = decode_hint({**xargs, "agentkv_trajectoryId": "other"})
    assert hint is not None and hint.trajectory_id == "t"

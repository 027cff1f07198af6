"""The one strictness rule of every decoder (docs/protocol.md): unknown keys ignored; a
known field wrongly typed, out of range, NaN or infinite rejects the whole message with
its reason; nothing raises."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentkv.protocol._events import BodyError, decode_events_body
from agentkv.protocol._hints import decode_hint, encode_hint
from agentkv.protocol._wire import MAX_ENVELOPE_CHARS, XARG_HINTS, build_envelope

GOOD = {"agentkv_trajectoryId": "t", "agentkv_turnId": 2, "agentkv_action": "retain",
        "agentkv_ttlMs": 5000}  # fmt: skip
EVENT = {"trajectoryId": "t", "event": "tool_started", "turnId": "2", "emittedAtMs": 10}

BAD_HINT_FIELDS = [
    ("agentkv_trajectoryId", 7),
    ("agentkv_trajectoryId", ""),
    ("agentkv_trajectoryId", "x" * 257),
    ("agentkv_turnId", -1),
    ("agentkv_turnId", 1.5),
    ("agentkv_turnId", True),
    ("agentkv_action", "keep"),
    ("agentkv_ttlMs", "5000"),
    ("agentkv_ttlMs", math.nan),
    ("agentkv_ttlMs", math.inf),
    ("agentkv_ttlMs", -5),
    ("agentkv_predictedGapMs", math.nan),
    ("agentkv_predictedGapMs", -math.inf),
    ("agentkv_predictedGapMs", 2.0**60),
    ("agentkv_priority", 2**40),
    ("agentkv_priority", [1]),
    ("agentkv_mode", "loud"),
    ("agentkv_mode", 3),
    ("agentkv_reason", {"nested": 1}),
]


@pytest.mark.parametrize(("key", "value"), BAD_HINT_FIELDS)
@pytest.mark.parametrize("form", ["flat", "envelope"])
def test_a_wrongly_typed_hint_field_rejects_the_whole_hint(key: str, value: Any, form: str) -> None:
    xargs = {**GOOD, key: value}
    if form == "envelope":
        action = xargs.pop("agentkv_action")  # the envelope's action type
        payload = {k.removeprefix("agentkv_"): v for k, v in xargs.items()}
        xargs = {XARG_HINTS: json.dumps({"actions": [{"action_type": action, "payload": payload}]})}
    hint = decode_hint(xargs)
    assert hint is not None and hint.rejected and not hint.trajectory_id
    (reason,) = hint.errors
    assert key.removeprefix("agentkv_") in reason  # the reason names the field


def test_unknown_keys_are_ignored_and_absent_fields_stay_absent() -> None:
    hint = decode_hint({**GOOD, "agentkv_newField": {"x": 1}, "other": "y"})
    assert hint is not None and not hint.rejected
    assert (hint.trajectory_id, hint.ttl_ms, hint.priority, hint.gap_ms) == ("t", 5000, None, None)


def test_a_hint_without_a_trajectory_is_rejected() -> None:
    hint = decode_hint({"agentkv_action": "retain"})
    assert hint is not None and hint.rejected and "trajectoryId is missing" in hint.errors[0]


@pytest.mark.parametrize(
    "raw",
    [
        7,
        "not json",
        "[" * 100_000 + "]" * 100_000,  # nested too deeply for the parser
        "x" * (MAX_ENVELOPE_CHARS + 1),
        '{"actions": []}',
        '{"actions": [{"action_type": "retain", "payload": [1]}]}',
        json.dumps({"actions": [{"payload": {"trajectoryId": "t", "turnId": {"a": [[[]]]}}}]}),
    ],
)
def test_a_malformed_envelope_is_rejected_with_a_reason(raw: Any) -> None:
    hint = decode_hint({XARG_HINTS: raw})
    assert hint is not None and hint.rejected and hint.errors[0]


@given(st.dictionaries(st.text(max_size=30), st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
), max_size=6))  # fmt: skip
def test_no_input_makes_the_hint_decoder_raise(extra: dict[str, Any]) -> None:
    for xargs in (
        extra,
        {"agentkv_" + k: v for k, v in extra.items()},
        # json.dumps writes NaN and Infinity literals, as a hostile client may
        {XARG_HINTS: json.dumps({"actions": [{"action_type": "retain", "payload": extra}]})},
    ):
        hint = decode_hint(xargs)
        assert hint is None or hint.rejected or hint.trajectory_id


def test_encoding_refuses_what_the_decoder_would_reject() -> None:
    """The client never sends NaN: JSON has no such number."""
    with pytest.raises(ValueError):
        build_envelope("retain", {"ttlMs": math.nan})
    assert decode_hint(encode_hint("t", 1, None, None, envelope=False)) is not None


BAD_EVENTS = [
    ({**EVENT, "trajectoryId": 1}, "trajectoryId"),
    ({**EVENT, "event": "tool_paused"}, "event"),
    ({**EVENT, "turnId": -2}, "turnId"),
    ({**EVENT, "turnId": ""}, "turnId"),  # a label is any non-empty string
    ({**EVENT, "turnId": ["2"]}, "turnId"),
    ({**EVENT, "emittedAtMs": "now"}, "emittedAtMs"),
    ({**EVENT, "emittedAtMs": True}, "emittedAtMs"),
    ({**EVENT, "cacheSalt": "a/b"}, "cacheSalt"),
    ({**EVENT, "mode": "loud"}, "mode"),
    ({**EVENT, "advice": "retain"}, "advice"),
    ({**EVENT, "advice": {"action": "keep"}}, "action"),
    ({**EVENT, "advice": {"action": "retain", "ttlMs": -1}}, "ttlMs"),
    ({**EVENT, "advice": {"action": "retain", "ttlMs": 1.5}}, "ttlMs"),
    ({**EVENT, "advice": {"action": "retain", "predictedGapMs": "1"}}, "predictedGapMs"),
    ({**EVENT, "advice": {"action": "retain", "trajectoryId": "other"}}, "trajectoryId"),
    ({**EVENT, "advice": {"ttlMs": 5}}, "action"),
    ({k: v for k, v in EVENT.items() if k != "trajectoryId"}, "trajectoryId"),
    ({k: v for k, v in EVENT.items() if k != "event"}, "event"),
    ([EVENT], "object"),
]


def test_each_malformed_event_is_rejected_alone_with_its_reason() -> None:
    events = [EVENT, *(ev for ev, _ in BAD_EVENTS), {**EVENT, "futureField": {"x": [1]}}]
    good, bad = decode_events_body(json.dumps({"events": events}).encode())
    assert len(good) == 2  # the first and the last (an unknown key is ignored)
    assert [r["index"] for r in bad] == list(range(1, len(BAD_EVENTS) + 1))
    for entry, (_, field) in zip(bad, BAD_EVENTS, strict=True):
        assert field in entry["error"]


def test_nan_and_infinity_in_an_event_are_rejected() -> None:
    body = b'{"events": [{"trajectoryId": "t", "event": "tool_started", "emittedAtMs": NaN},' \
           b'{"trajectoryId": "t", "event": "tool_started", "emittedAtMs": 1,' \
           b' "advice": {"action": "retain", "predictedGapMs": Infinity}}]}'  # fmt: skip
    good, bad = decode_events_body(body)
    assert good == [] and [r["index"] for r in bad] == [0, 1]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"[" * 100_000 + b"]" * 100_000, 400),
        (b"not json", 400),
        (b'{"events": {}}', 400),
        (json.dumps({"events": [EVENT] * 257}).encode(), 413),
        (b" " * (1 << 20) + b"{}", 413),
    ],
)
def test_a_body_unusable_as_a_whole_raises_with_its_status(body: bytes, status: int) -> None:
    with pytest.raises(BodyError) as info:
        decode_events_body(body)
    assert info.value.status == status

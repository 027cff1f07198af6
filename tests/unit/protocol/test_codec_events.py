"""The lifecycle-event codec: what the client posts is what the control route decodes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentkv.events._schema import (
    ADVICE_ACTIONS,
    ADVICE_REASONS,
    EVENT_KINDS,
    CacheAdvice,
    TrajectoryEvent,
)
from agentkv.protocol._events import decode_events_body, encode_event
from agentkv.protocol._wire import EVENT_SALT_FIELD

_IDS = st.text(min_size=1, max_size=64)
_SALTS = st.one_of(
    st.none(), st.text(st.characters(blacklist_characters="@/\\\x00"), min_size=1, max_size=128)
)
_GAP = st.one_of(st.none(), st.floats(0, 1e9))


@given(
    trajectory_id=_IDS,
    turn_id=st.integers(0, 10**6),
    kind=st.sampled_from(EVENT_KINDS),
    emitted=st.integers(0, 2**42),
    tool_class=st.one_of(st.none(), _IDS),
    salt=_SALTS,
    advice=st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from(ADVICE_ACTIONS),
            st.one_of(st.none(), st.integers(0, 10**9)),
            st.sampled_from(ADVICE_REASONS),
            _GAP,
            _GAP,
        ),
    ),
)
def test_an_event_round_trips(
    trajectory_id: str,
    turn_id: int,
    kind: str,
    emitted: int,
    tool_class: str | None,
    salt: str | None,
    advice: tuple | None,
) -> None:
    event = TrajectoryEvent(
        trajectory_id=trajectory_id, turn_id=turn_id, event=kind, emitted_at_ms=emitted,
        tool_class=tool_class,
    )  # fmt: skip
    sent_advice = None
    if advice is not None:
        action, ttl, reason, gap, gap90 = advice
        sent_advice = CacheAdvice(
            trajectory_id=trajectory_id, action=action, ttl_ms=ttl, reason=reason,
            policy_version="p", predicted_gap_ms=gap, predicted_gap_p90_ms=gap90,
        )  # fmt: skip
    wire = encode_event(event, cache_salt=salt, advice=sent_advice)
    assert (
        TrajectoryEvent.model_validate(
            {k: v for k, v in wire.items() if k not in (EVENT_SALT_FIELD, "advice")}
        )
        == event
    )  # the schema reads the wire form back
    good, bad = decode_events_body(json.dumps({"events": [wire]}).encode())
    assert bad == [] and len(good) == 1
    (got,) = good
    assert (got["trajectory_id"], got["event"], got["emitted_at_ms"]) == (
        trajectory_id, kind, emitted,
    )  # fmt: skip
    assert got["cache_salt"] == salt and got["mode"] is None
    if sent_advice is None:
        assert "action" not in got
    else:
        assert (got["action"], got["ttl_ms"], got["reason"]) == (
            sent_advice.action, sent_advice.ttl_ms, sent_advice.reason,
        )  # fmt: skip
        assert got.get("gap_ms") == sent_advice.predicted_gap_ms
        assert got.get("gap_p90_ms") == sent_advice.predicted_gap_p90_ms


def test_the_header_scope_applies_to_events_without_a_salt() -> None:
    body = {"events": [
        {"trajectoryId": "a", "event": "tool_started", "turnId": "1", "emittedAtMs": 1},
        {"trajectoryId": "b", "event": "tool_started", EVENT_SALT_FIELD: "own", "emittedAtMs": 1},
    ]}  # fmt: skip
    good, bad = decode_events_body(json.dumps(body).encode(), default_salt="hdr")
    assert bad == [] and [e["cache_salt"] for e in good] == ["hdr", "own"]

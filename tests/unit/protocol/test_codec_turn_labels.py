"""``turnId: string``: the control route takes a harness's own turn label.

An event of a turn opened with ``agentkv.model_call(turn_id="run-3/turn-7")`` carries the
label as its ``turnId`` and the trajectory's own counter as ``turnIndex``; the lifecycle
channel posts it as the client encodes it, and the control route's codec must apply it,
not reject it (a rejected ``tool_started`` loses the retention it carries).
"""

from __future__ import annotations

import json

import agentkv
from agentkv.protocol._events import decode_events_body, encode_event
from agentkv.testing import capture_events


def test_labelled_turn_events_round_trip_through_the_control_route_codec() -> None:
    with capture_events() as events, agentkv.trajectory("t-label"):
        with agentkv.model_call(turn_id="run-3/turn-7"):
            pass
        with agentkv.tool_call("shell"):
            pass
    wire = [encode_event(e) for e in events]
    assert any(w["turnId"] == "run-3/turn-7" for w in wire)
    good, rejected = decode_events_body(json.dumps({"events": wire}).encode())
    assert rejected == []
    assert [g["event"] for g in good] == [e.event for e in events]


def test_turn_numbers_labels_and_bad_turn_ids() -> None:
    base = {"trajectoryId": "t", "event": "tool_started", "emittedAtMs": 1}
    events = [
        {**base, "turnId": 3},
        {**base, "turnId": "3"},
        {**base, "turnId": "run-3/turn-7", "turnIndex": 7},
        {**base, "turnId": "x" * 257},
        {**base, "turnId": -1},
        {**base, "turnId": "a", "turnIndex": -1},
    ]
    good, rejected = decode_events_body(json.dumps({"events": events}).encode())
    assert len(good) == 3
    assert [r["index"] for r in rejected] == [3, 4, 5]
    assert "turnId" in rejected[0]["error"] and "turnIndex" in rejected[2]["error"]

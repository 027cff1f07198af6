"""The event/advice contract: field names on the wire, parsing, validation."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

import agentkv

SEED_EVENT_FIELDS = {
    "trajectoryId",
    "turnId",
    "event",
    "toolClass",
    "emittedAtMs",
    "expectedNextAgent",
    "criticalPath",
}
SEED_ADVICE_FIELDS = {"trajectoryId", "action", "ttlMs", "priority", "reason", "policyVersion"}


def test_event_dumps_seed_fields_in_camel_case() -> None:
    e = agentkv.TrajectoryEvent(
        trajectory_id="t1",
        turn_id=2,
        event="tool_started",
        tool_class="shell",
        emitted_at_ms=1000,
        expected_next_agent="coder",
        critical_path=True,
    )
    wire = e.model_dump(by_alias=True)
    assert set(wire) >= SEED_EVENT_FIELDS
    assert wire["trajectoryId"] == "t1" and wire["toolClass"] == "shell"
    assert json.loads(e.model_dump_json(by_alias=True))["emittedAtMs"] == 1000
    assert e.trajectory_id == "t1"  # snake_case in Python


def test_event_parses_camel_case_json_and_round_trips() -> None:
    raw = '{"trajectoryId":"a","turnId":0,"event":"model_started","emittedAtMs":5}'
    e = agentkv.TrajectoryEvent.model_validate_json(raw)
    assert e.turn_id == 0 and e.event == "model_started"
    assert agentkv.TrajectoryEvent.model_validate_json(e.model_dump_json(by_alias=True)) == e


def test_advice_dumps_seed_fields() -> None:
    a = agentkv.CacheAdvice(
        trajectory_id="t",
        action="retain",
        ttl_ms=4000,
        priority=-1,
        reason="short_tool_gap",
        policy_version="coarse-1",
    )
    assert set(a.model_dump(by_alias=True)) >= SEED_ADVICE_FIELDS
    assert a.to_wire() == {
        "trajectoryId": "t",
        "action": "retain",
        "ttlMs": 4000,
        "priority": -1,
        "reason": "short_tool_gap",
        "policyVersion": "coarse-1",
    }


@pytest.mark.parametrize(
    ("model", "kwargs", "field"),
    [
        (
            agentkv.TrajectoryEvent,
            {"trajectory_id": "t", "turn_id": 0, "event": "tool_exploded", "emitted_at_ms": 1},
            "event",
        ),
        (
            agentkv.TrajectoryEvent,
            {"trajectory_id": "t", "turn_id": -1, "event": "model_started", "emitted_at_ms": 1},
            "turn_id",
        ),
        (
            agentkv.TrajectoryEvent,
            {"trajectory_id": "t", "turn_id": "", "event": "model_started", "emitted_at_ms": 1},
            "turn_id",
        ),
        (
            agentkv.TrajectoryEvent,
            {"trajectory_id": "", "turn_id": 0, "event": "model_started", "emitted_at_ms": 1},
            "trajectory_id",
        ),
        (
            agentkv.CacheAdvice,
            {
                "trajectory_id": "t",
                "action": "retain",
                "ttl_ms": -5,
                "reason": "short_tool_gap",
                "policy_version": "p",
            },
            "ttl_ms",
        ),
        (
            agentkv.CacheAdvice,
            {
                "trajectory_id": "t",
                "action": "hoard",
                "reason": "short_tool_gap",
                "policy_version": "p",
            },
            "action",
        ),
        (
            agentkv.CacheAdvice,
            {"trajectory_id": "t", "action": "retain", "reason": "because", "policy_version": "p"},
            "reason",
        ),
    ],
)
def test_invalid_input_raises_validation_error_naming_the_field(
    model: type, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        model(**kwargs)
    locs = {err["loc"][0] for err in info.value.errors()}
    assert locs & {
        field,
        "".join(w.capitalize() if i else w for i, w in enumerate(field.split("_"))),
    }


def test_models_are_frozen() -> None:
    e = agentkv.TrajectoryEvent(
        trajectory_id="t", turn_id=0, event="model_started", emitted_at_ms=1
    )
    with pytest.raises(ValidationError):
        e.turn_id = 3  # type: ignore[misc]


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError):
        agentkv.TrajectoryEvent.model_validate(
            {
                "trajectoryId": "t",
                "turnId": 0,
                "event": "model_started",
                "emittedAtMs": 1,
                "prompt": "secret",
            }
        )


def test_turn_id_is_a_string_on_the_wire_and_numbers_are_accepted() -> None:
    """The contract: ``turnId: string`` (integers accepted), ``emittedAtMs: number``."""
    e = agentkv.TrajectoryEvent.model_validate(
        {"trajectoryId": "a", "turnId": "3", "event": "model_started", "emittedAtMs": 1.5}
    )
    assert (e.turn_id, e.emitted_at_ms) == (3, 1)
    assert e.to_wire()["turnId"] == "3"
    assert '"turnId":"3"' in e.model_dump_json(by_alias=True)
    again = agentkv.TrajectoryEvent.model_validate(e.to_wire())
    assert again == e
    legacy = agentkv.TrajectoryEvent.model_validate(
        {"trajectoryId": "a", "turnId": 3, "event": "model_started", "emittedAtMs": 7}
    )
    assert legacy.turn_id == 3 and legacy.to_wire()["turnId"] == "3"


def test_turn_id_takes_any_string_label_and_keeps_the_order_apart() -> None:
    """``turnId: string`` means any string: a harness's own label is kept as it is; only
    ``turn_index`` (or an integer id) orders turns."""
    e = agentkv.TrajectoryEvent(
        trajectory_id="t", turn_id="run-3/turn-7", event="model_started", emitted_at_ms=1
    )
    assert e.turn_id == "run-3/turn-7" and e.turn_number is None
    assert e.to_wire()["turnId"] == "run-3/turn-7"
    assert agentkv.TrajectoryEvent.model_validate_json(e.model_dump_json(by_alias=True)) == e
    indexed = agentkv.TrajectoryEvent.model_validate(
        {
            "trajectoryId": "t",
            "turnId": "b",
            "turnIndex": 4,
            "event": "model_started",
            "emittedAtMs": 1,
        }
    )
    assert (indexed.turn_id, indexed.turn_number) == ("b", 4)
    assert (
        agentkv.TrajectoryEvent(
            trajectory_id="t", turn_id=2, event="model_started", emitted_at_ms=1
        ).turn_number
        == 2
    )
    with pytest.raises(ValidationError):
        agentkv.TrajectoryEvent(
            trajectory_id="t", turn_id="x" * 257, event="model_started", emitted_at_ms=1
        )


def test_model_call_turn_label_is_the_events_turn_id_and_the_counter_their_order() -> None:
    """A labelled turn's events say the label; ``turn_index`` is the trajectory's counter,
    so an unlabelled turn after it still counts on."""
    from agentkv.testing import capture_events

    with capture_events() as events, agentkv.trajectory("t-label"):
        with agentkv.model_call():
            pass
        with agentkv.model_call(turn_id="run-3/turn-7"):
            with agentkv.tool_call("search", name="grep"):
                pass
        with agentkv.model_call():
            pass
    turns = [
        (e.event, e.turn_id, e.turn_number) for e in events if e.event != "trajectory_finished"
    ]
    assert turns == [
        ("model_started", 0, 0),
        ("model_started", "run-3/turn-7", 1),
        ("tool_started", "run-3/turn-7", 1),
        ("tool_finished", "run-3/turn-7", 1),
        ("model_started", 2, 2),
    ]
    with pytest.raises(ValueError, match="turn_id"):
        agentkv.model_call(turn_id="")

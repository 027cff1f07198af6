"""Idle gaps reach the gap learner the same way with and without event consumers."""

from __future__ import annotations

import pytest

import agentkv
from agentkv.events import _pipeline
from agentkv.testing import capture_events


def _two_calls_after_a_tool() -> None:
    with agentkv.trajectory("t"):
        with agentkv.model_call():
            pass
        with agentkv.tool_call("shell:pytest"):
            pass
        with agentkv.model_call():
            pass
        with agentkv.model_call():
            pass


@pytest.mark.parametrize("consumer", ["none", "capture"])
def test_idle_gaps_are_learned_with_or_without_consumers(consumer: str) -> None:
    """Without sinks, listeners or captures, the learner is fed without an event."""
    model = agentkv.GapModel(min_samples=1)
    agentkv.configure(gap_model=model)
    if consumer == "capture":
        with capture_events() as events:
            _two_calls_after_a_tool()
        assert [e.event for e in events].count("model_started") == 3
    else:
        assert not _pipeline.has_consumers()
        _two_calls_after_a_tool()
    assert model.estimate("shell:pytest", fallback=False).n == 1
    assert model.estimate("*", fallback=False).n == 2  # the all-tools pool has both gaps
    assert model.tool_classes("idle") == ["*", "shell", "shell:pytest"]
    # the "next" kind keys each gap by what the call before it followed: the first
    # gap follows a call that followed no tool (the all-tools pool only), the second a
    # call sent after shell:pytest
    assert model.estimate("shell:pytest", kind="next", fallback=False).n == 1
    assert model.estimate("*", kind="next", fallback=False).n == 2
    assert model.tool_classes("next") == ["*", "shell", "shell:pytest"]


def test_idle_gaps_are_not_learned_when_learning_is_off() -> None:
    """learn_gaps=False: nothing is learned on the direct path either."""
    agentkv.configure(learn_gaps=False)
    _two_calls_after_a_tool()
    assert _pipeline.ensure_gap_model() is None


def test_learn_call_matches_emit() -> None:
    """GapModel.learn_call learns what emit learns from the same model_started event."""
    from agentkv.events._schema import TrajectoryEvent

    by_event, direct = agentkv.GapModel(min_samples=1), agentkv.GapModel(min_samples=1)
    event = TrajectoryEvent.model_validate(
        {
            "event": "model_started",
            "trajectory_id": "t",
            "turn_id": 1,
            "emitted_at_ms": 1_700_000_000_000,
            "idle_gap_ms": 1500.0,
            "after_tool_class": "web",
        }
    )
    by_event.emit(event)
    direct.learn_call("t", "web", 1500.0, 1_700_000_000_000)
    assert by_event.export_records() == direct.export_records()
    assert {r.kind for r in direct.export_records()} == {"idle", "next"}

"""The ``next`` kind: the gap after a model call, keyed by the tool the call followed.

A call is sent before its answer picks the next tool, so the forecast it can carry is
the gap that follows calls sent after the same tool. These tests pin how it is learned
(``learn_call``, events, traces, the bench warm-up), how it answers
(``estimate_after_call``, with the class's own idle gap as the fallback) and how the
advisor uses it for a model call's advice.
"""

from __future__ import annotations

import logging

import pytest

from agentkv.advice._advisor import Advisor, TrajectoryState, after_call_estimate
from agentkv.events._schema import TrajectoryEvent
from agentkv.gaps import _model
from agentkv.gaps._cli import learn_trace
from agentkv.gaps._model import GapModel
from agentkv.traces import TraceTrajectory, TraceTurn, dump_trace, load_trace
from agentkv.workload._warm import GapWarmup

T0_MS = 1_700_000_000_000


def _edit_then_bash(model: GapModel, trajectories: int) -> None:
    """Each trajectory: call 0 -> edit (0.05 s) -> call 1 -> bash (4 s) -> call 2.

    The edit's own gap is short, but the call sent after an edit is followed by the
    bash run: 4 s."""
    for i in range(trajectories):
        tid = f"t{i}"
        model.learn_call(tid, None, None, T0_MS)
        model.learn_call(tid, "edit", 50.0, T0_MS)
        model.learn_call(tid, "bash", 4000.0, T0_MS)


def test_the_gap_after_a_call_is_keyed_by_the_tool_the_call_followed() -> None:
    model = GapModel(min_samples=3, half_life_s=None)
    _edit_then_bash(model, 5)
    assert model.estimate("edit", fallback=False).p50 == pytest.approx(0.05)
    after_edit = model.estimate_after_call("edit")
    assert after_edit.kind == "next" and after_edit.source == "edit"
    assert after_edit.p50 == pytest.approx(4.0)
    # the first pause follows a call that followed no tool: the all-tools pool only
    assert model.estimate("*", kind="next", fallback=False).n == 10
    assert model.tool_classes("next") == ["*", "edit"]


def test_after_call_falls_back_to_the_class_own_idle_gap() -> None:
    """Too few ``next`` samples (a store written before the kind, a class just seen):
    the answer is what the call carried before, the class's own idle estimate."""
    model = GapModel(min_samples=3, half_life_s=None)
    for gap_s in (1.0, 1.2, 1.4):
        model.observe("shell:pytest", gap_s)
    assert model.estimate_after_call("shell:pytest") == model.estimate("shell:pytest")
    assert model.estimate_after_call(None) == model.estimate("*")
    # a parent class's next figures answer before the fallback
    _edit_then_bash(model, 0)
    for i in range(3):
        model.learn_call(f"p{i}", "shell:git", None, T0_MS)
        model.learn_call(f"p{i}", "edit", 2000.0, T0_MS)
    assert model.estimate_after_call("shell:pytest").source == "shell"


def test_an_unseen_previous_call_counts_as_following_no_tool() -> None:
    """The model remembers the last call of at most MAX_TRACKED_TRAJECTORIES
    trajectories; a pause whose call it forgot (or never saw) is learned in the
    all-tools pool only, never under a wrong class."""
    model = GapModel(min_samples=1, half_life_s=None)
    model.learn_call("old", "edit", None, T0_MS)
    for i in range(_model.MAX_TRACKED_TRAJECTORIES):
        model.learn_call(f"n{i}", "bash", None, T0_MS)
    model.learn_call("old", "bash", 700.0, T0_MS)  # its previous call was forgotten
    assert model.estimate("edit", kind="next", fallback=False).n == 0
    assert model.estimate("*", kind="next", fallback=False).n == 1
    model.learn_call("never-seen", "bash", 300.0, T0_MS)
    assert model.estimate("*", kind="next", fallback=False).n == 2


def test_a_bad_gap_is_dropped_and_the_call_still_remembered(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AGENTKV_STRICT", "0")
    model = GapModel(min_samples=1, half_life_s=None)
    model.learn_call("t", "edit", None, T0_MS)
    with caplog.at_level(logging.WARNING):
        model.learn_call("t", "bash", -5.0, T0_MS)
    assert model.export_records() == []
    model.learn_call("t", "edit", 900.0, T0_MS)  # follows the call sent after bash
    assert model.estimate("bash", kind="next", fallback=False).n == 1


def test_events_teach_the_next_kind_like_learn_call() -> None:
    by_event, direct = GapModel(min_samples=1), GapModel(min_samples=1)
    for turn, (after, gap) in enumerate([(None, None), ("edit", 50.0), ("bash", 4000.0)]):
        fields = {"event": "model_started", "trajectory_id": "t", "turn_id": turn}
        extra = {"after_tool_class": after, "idle_gap_ms": gap}
        by_event.emit(
            TrajectoryEvent.model_validate(
                {
                    **fields,
                    **{k: v for k, v in extra.items() if v is not None},
                    "emitted_at_ms": T0_MS,
                }
            )
        )
        direct.learn_call("t", after, gap, T0_MS)
    assert by_event.export_records() == direct.export_records()
    assert by_event.estimate("edit", kind="next", fallback=False).n == 1


def test_next_records_survive_the_store(tmp_path) -> None:
    path = tmp_path / "gaps.db"
    with GapModel(store=path, min_samples=3, half_life_s=None) as model:
        _edit_then_bash(model, 4)
    with GapModel(store=path, min_samples=3, half_life_s=None) as again:
        assert again.estimate_after_call("edit").p50 == pytest.approx(4.0)


def test_a_trace_and_the_bench_warm_up_teach_the_next_kind(tmp_path) -> None:
    turns = (
        TraceTurn(
            arrival_s=0.0,
            prompt_tokens=10,
            output_tokens=5,
            shared_prefix_tokens=0,
            tool_name="edit",
            tool_gap_s=0.05,
        ),
        TraceTurn(
            arrival_s=1.0,
            prompt_tokens=20,
            output_tokens=5,
            shared_prefix_tokens=10,
            tool_name="bash",
            tool_gap_s=4.0,
        ),
        TraceTurn(arrival_s=6.0, prompt_tokens=30, output_tokens=5, shared_prefix_tokens=20),
    )
    path = tmp_path / "t.jsonl"
    dump_trace([TraceTrajectory(0, turns)], path)
    model = GapModel(min_samples=1, half_life_s=None)
    counts = learn_trace(model, load_trace(path), at=T0_MS / 1000.0)
    assert counts["next:*"] == 1 and counts["next:edit"] == 1
    assert model.estimate_after_call("edit").p50 == pytest.approx(4.0)
    warm = GapWarmup("train", (("edit", 0.05, None), ("bash", 4.0, "edit")), (0,))
    warmed = warm.make_model()
    assert warmed.estimate("bash", kind="next", fallback=False).n == 0
    assert warmed.estimate("edit", kind="next", fallback=False).n == 1
    assert warmed.estimate("*", kind="next", fallback=False).n == 2


class _IdleOnly:
    """A gap model without the next kind (a caller's own): the class's idle gap."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def estimate(self, tool_class: str, *, kind: str = "idle") -> object:
        self.asked.append((tool_class, kind))
        return GapModel(min_samples=1).estimate(tool_class)


def test_a_model_call_advice_carries_the_gap_after_the_call() -> None:
    model = GapModel(min_samples=3, half_life_s=None)
    _edit_then_bash(model, 5)
    advisor = Advisor(model, min_evidence=3)
    at_call = TrajectoryState("t0", 1, tool_class="edit", prefix_tokens=100, at_call=True)
    running = TrajectoryState("t0", 1, tool_class="edit", prefix_tokens=100)
    assert advisor.advise(at_call).predicted_gap_ms == pytest.approx(4000.0)
    assert advisor.advise(running).predicted_gap_ms == pytest.approx(50.0)
    # the bound stays the previous tool's own TTL (p99 x margin + slack)
    assert advisor.advise(at_call).ttl_ms == advisor.retain_ttl_ms("edit")
    assert advisor.advise(running).ttl_ms == advisor.retain_ttl_ms("edit")
    other = _IdleOnly()
    after_call_estimate(other, "edit")
    assert other.asked == [("edit", "idle")]

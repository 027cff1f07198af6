"""A user's own runs (turn records + events) become a replayable trace."""

from __future__ import annotations

import json
from pathlib import Path

from agentkv import TrajectoryEvent, TurnRecord
from agentkv.traces import load_trace
from agentkv.workload import make_workload, record_trace, write_recorded_trace


def _rec(turn: int, start_ms: int, prompt: int, eligible: int) -> TurnRecord:
    return TurnRecord(
        trajectory_id="run-1",
        turn_id=turn,
        api="chat",
        model="m",
        backend="vllm",
        mode="hint",
        started_at_ms=start_ms,
        latency_ms=500.0,
        outcome="ok",
        prompt_tokens=prompt,
        completion_tokens=20,
        cached_tokens=0,
        eligible_prefix_tokens=eligible,
    )


def _ev(kind: str, at_ms: int, **kw: object) -> TrajectoryEvent:
    return TrajectoryEvent(trajectory_id="run-1", turn_id=0, event=kind, emitted_at_ms=at_ms, **kw)  # type: ignore[arg-type]


def test_records_and_events_become_a_trace(tmp_path: Path) -> None:
    """Arrival, gap, tool name, tool time and shared prefix come out right and load back."""
    records = [_rec(0, 10_000, 1000, 0), _rec(1, 12_000, 1300, 1000)]
    events = [
        _ev("tool_started", 10_600, tool_class="shell"),
        _ev("tool_finished", 11_800, tool_class="shell", duration_ms=1200.0),
    ]
    out = tmp_path / "mine.jsonl"
    write_recorded_trace(records, out, events)
    trace = load_trace(out)
    (traj,) = trace.trajectories
    t0, t1 = traj.turns
    assert t0.arrival_s == 0.0 and t1.arrival_s == 2.0
    assert t0.tool_name == "shell" and t0.tool_gap_s == 1.5 and t0.tool_exec_s == 1.2
    assert t1.shared_prefix_tokens == 1000 and t1.tool_gap_s is None
    assert make_workload(trace).num_turns == 2


def test_jsonl_inputs_in_wire_form(tmp_path: Path) -> None:
    """The JSONL a JsonlSink writes (camelCase) and TurnRecord.to_dict lines are accepted."""
    rec_path = tmp_path / "records.jsonl"
    ev_path = tmp_path / "events.jsonl"
    rec_path.write_text(
        "\n".join(json.dumps(_rec(i, 1000 * i, 100 + i, 100 * (i > 0)).to_dict()) for i in range(3))
    )
    ev_path.write_text(json.dumps(_ev("tool_started", 600, tool_class="web").to_wire()) + "\n")
    trace = record_trace(
        [json.loads(x) for x in rec_path.read_text().splitlines()],
        [json.loads(x) for x in ev_path.read_text().splitlines()],
    )
    assert trace.trajectories[0].turns[0].tool_name == "web"
    assert write_recorded_trace(rec_path, tmp_path / "o.jsonl", ev_path).num_turns == 3

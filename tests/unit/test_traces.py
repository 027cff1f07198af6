"""The trace loader on valid and broken files, as the benchmark and the simulator use it."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from agentkv import TraceFormatError
from agentkv.traces import dump_trace, load_trace
from agentkv.workload import Scaling, make_workload

SHARED = Path("/work/shared/data/traces")


def _turn(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "arrival_s": 0.0,
        "prompt_tokens": 100,
        "output_tokens": 10,
        "tool_name": "bash",
        "tool_gap_s": 0.5,
        "shared_prefix_tokens_with_previous_turn": 0,
    }
    base.update(kw)
    return base


def _write(tmp_path: Path, rows: list[object]) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


def test_bundled_subset_loads_and_is_a_prefix_of_the_shared_trace() -> None:
    """The demo's data are unmodified rows of the real trace."""
    path = resources.files("agentkv.bench").joinpath("data", "openhands_swebv_subset.jsonl")
    trace = load_trace(str(path))
    assert len(trace.trajectories) == 12
    assert all(t.has_tokens for t in trace.trajectories)
    full = SHARED / "openhands_swebv_claude35.jsonl"
    if full.exists():
        head = full.read_text().splitlines()[:12]
        assert Path(str(path)).read_text().splitlines() == head


@pytest.mark.skipif(not SHARED.exists(), reason="shared traces not present")
def test_shared_traces_load_with_flags() -> None:
    """Missing token counts and compaction are kept as data and flagged."""
    t2 = load_trace(SHARED / "openhands_v1_sdk_conversations.jsonl")
    assert len(t2.with_tokens().trajectories) < len(t2.trajectories)
    assert sum(t.num_prefix_breaks for t in t2.trajectories) > 0
    w = make_workload(t2, Scaling(token_scale=0.1))
    assert w.num_skipped_without_tokens == len(t2.trajectories) - len(w.trajectories)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["{not json"], "line 1: not valid JSON"),
        ([{"turns": [_turn()]}], "'traj_idx'"),
        ([{"traj_idx": 0, "turns": []}], "'turns'"),
        ([{"traj_idx": 0, "turns": [_turn(prompt_tokens="many")]}], "must be a number"),
        ([{"traj_idx": 0, "turns": [_turn(output_tokens=-3)]}], "must not be negative"),
        ([{"traj_idx": 0, "turns": [_turn(arrival_s=5.0), _turn(arrival_s=1.0)]}], "arrival order"),
        (
            [
                {
                    "traj_idx": 0,
                    "turns": [
                        _turn(),
                        _turn(arrival_s=1, shared_prefix_tokens_with_previous_turn=500),
                    ],
                }
            ],
            "exceeds prompt_tokens",
        ),
        ([{"traj_idx": 0, "turns": [_turn()]}, {"traj_idx": 0, "turns": [_turn()]}], "line 2"),
        ([{"agentkv_trace": 99}], "not supported"),
    ],
)
def test_broken_files_name_line_and_field(tmp_path: Path, rows: list[object], message: str) -> None:
    """Every broken file raises TraceFormatError saying where and what."""
    with pytest.raises(TraceFormatError, match=message.replace("(", r"\(")):
        load_trace(_write(tmp_path, rows))


def test_unreadable_and_empty_files(tmp_path: Path) -> None:
    """A missing file and a file without trajectories are clear errors."""
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceFormatError, match="no trajectories"):
        load_trace(_write(tmp_path, [""]))


def test_missing_tokens_and_prefix_break_are_flagged(tmp_path: Path) -> None:
    """A trajectory without counts is loaded but skipped by the workload; breaks are flagged."""
    rows = [
        {"traj_idx": 0, "turns": [_turn(prompt_tokens=None)]},
        {
            "traj_idx": 1,
            "turns": [
                _turn(prompt_tokens=1000),
                _turn(arrival_s=2, prompt_tokens=400, shared_prefix_tokens_with_previous_turn=300),
            ],
        },
    ]
    trace = load_trace(_write(tmp_path, rows))
    assert not trace.trajectories[0].has_tokens
    assert trace.trajectories[1].turns[1].prefix_break
    w = make_workload(trace)
    assert [t.traj_idx for t in w.trajectories] == [1]
    assert w.trajectories[0].turns[1].prefix_break


def test_dump_then_load_round_trips(tmp_path: Path) -> None:
    """Writing a trace and reading it back gives the same turns, with a version header."""
    trace = load_trace(
        _write(tmp_path, [{"traj_idx": 3, "turns": [_turn(), _turn(arrival_s=1.5)]}])
    )
    out = tmp_path / "out.jsonl"
    dump_trace(trace, out)
    again = load_trace(out)
    assert again.header["agentkv_trace"] == 1
    assert again.trajectories[0].turns == trace.trajectories[0].turns


def test_negative_tool_gaps_are_clamped_to_zero_and_counted(tmp_path: Path) -> None:
    """Clock skew gives negative gaps in real traces: read as 0, counted in the manifest."""
    turns = [
        _turn(tool_gap_s=-1.1),
        _turn(arrival_s=1.0, tool_gap_s=0.2, shared_prefix_tokens_with_previous_turn=50),
        _turn(arrival_s=2.0, tool_gap_s=None, tool_name=None),
    ]
    p = _write(
        tmp_path,
        [{"traj_idx": 0, "turns": turns}, {"traj_idx": 1, "turns": [_turn(tool_gap_s=-0.01)]}],
    )
    trace = load_trace(p)
    assert trace.num_negative_gaps_clamped == 2
    assert [t.tool_gap_s for t in trace.trajectories[0].turns] == [0.0, 0.2, None]
    assert trace.with_tokens().num_negative_gaps_clamped == 2
    w = make_workload(trace, Scaling(time_scale=0.5))
    assert w.describe()["num_negative_gaps_clamped"] == 2
    assert w.trajectories[0].turns[0].tool_gap_s == 0.0


def test_a_negative_token_count_is_still_refused(tmp_path: Path) -> None:
    p = _write(tmp_path, [{"traj_idx": 0, "turns": [_turn(prompt_tokens=-1)]}])
    with pytest.raises(TraceFormatError, match="must not be negative"):
        load_trace(p)

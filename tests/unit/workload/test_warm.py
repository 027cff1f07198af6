"""The bench's gap warm-up: every replay starts from the same model, trained off the test split."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from agentkv._errors import ConfigError, TraceFormatError
from agentkv.traces import load_trace
from agentkv.workload import Scaling, make_workload
from agentkv.workload._warm import load_warm_trace, make_warmup


def _write(
    path: Path, trajectories: int, tool: Callable[[int], str], gap: Callable[[int], float]
) -> Path:
    """A trace of ``trajectories`` x 3 calls; call i's tool is ``tool(i)``, every gap of
    trajectory idx is ``gap(idx)``."""
    rows = []
    for idx in range(trajectories):
        turns = [
            {"arrival_s": float(i), "prompt_tokens": 100 + i, "output_tokens": 10,
             "tool_name": tool(i), "tool_gap_s": gap(idx),
             "shared_prefix_tokens_with_previous_turn": 100 if i else 0}
            for i in range(3)
        ]  # fmt: skip
        rows.append({"traj_idx": idx, "turns": turns})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _trace(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "t.jsonl", 4, lambda i: "bash" if i % 2 else "editor", lambda j: 1.0 + j
    )


def test_train_warmup_learns_only_trajectories_that_are_not_replayed(tmp_path: Path) -> None:
    trace = load_trace(_trace(tmp_path))
    workload = make_workload(trace, Scaling(max_trajectories=2, time_scale=0.5))
    warm = make_warmup(trace, workload, "train")
    assert warm.train_trajectories == (2, 3)
    # two gaps per trajectory (not after its last call), scaled like the workload
    assert sorted(g for _, g, _ in warm.samples) == [1.5, 1.5, 2.0, 2.0]
    # each gap also names the tool its call followed (None: the trajectory's first call)
    assert [b for _, _, b in warm.samples].count(None) == 2
    info = warm.describe()
    assert (info["mode"], info["train_trajectories"], info["train_gaps"]) == ("train", 2, 4)
    a, b = warm.make_model(), warm.make_model()
    assert a is not b  # each replay gets a fresh copy of the same state
    assert a.estimate("bash", fallback=False).n == b.estimate("bash", fallback=False).n == 2


def test_no_train_split_or_none_starts_cold_with_priors(tmp_path: Path) -> None:
    trace = load_trace(_trace(tmp_path))
    everything = make_workload(trace, Scaling())
    warm = make_warmup(trace, everything, "train")
    assert warm.samples == () and "empty" in warm.describe()["description"]
    cold = make_warmup(trace, make_workload(trace, Scaling(max_trajectories=1)), "none")
    assert cold.samples == () and cold.describe()["mode"] == "none"
    assert cold.make_model().estimate("bash").source == "prior:shell"


def _other_trace(tmp_path: Path) -> Path:
    """Another run of the same harness: two trajectories, bash gaps of 8 s."""
    return _write(tmp_path / "other.jsonl", 2, lambda i: "bash", lambda j: 8.0)


def test_warm_from_another_trace_learns_all_its_gaps_before_the_train_split(
    tmp_path: Path,
) -> None:
    """Where every trajectory is replayed (no train split), another trace of the same
    harness still warms the model: all of its gaps, scaled like the workload, first."""
    trace_path, other_path = _trace(tmp_path), _other_trace(tmp_path)
    trace = load_trace(trace_path)
    other = load_warm_trace(str(trace_path), str(other_path), "train")
    assert other is not None
    everything = make_workload(trace, Scaling(time_scale=0.5))
    warm = make_warmup(trace, everything, "train", other, str(other_path))
    assert [g for _, g, _ in warm.samples] == [4.0] * 4  # 2 trajectories x 2 gaps, x0.5
    info = warm.describe()
    assert (info["warm_from"], info["warm_from_gaps"], info["train_gaps"]) == (
        str(other_path), 4, 0)  # fmt: skip
    assert str(other_path) in info["description"]
    assert "the train split is empty" in info["description"]
    assert warm.make_model().estimate("bash", fallback=False).n == 4
    # with a train split as well, the other trace comes first and both are learned
    part = make_warmup(trace, make_workload(trace, Scaling(max_trajectories=2)), "train",
                       other, str(other_path))  # fmt: skip
    assert len(part.samples) == 4 + 4 and part.describe()["train_gaps"] == 4
    assert "then those of the trace's trajectories that are not replayed (train split, 4 gaps)" in (
        part.describe()["description"])  # fmt: skip
    assert [g for _, g, _ in part.samples[:4]] == [8.0] * 4


def test_warm_from_is_refused_for_the_replayed_trace_a_cold_start_or_a_bad_file(
    tmp_path: Path,
) -> None:
    trace_path, other_path = _trace(tmp_path), _other_trace(tmp_path)
    assert load_warm_trace(str(trace_path), None, "none") is None  # nothing named
    with pytest.raises(ConfigError, match="is the replayed trace"):
        load_warm_trace(str(trace_path), str(tmp_path / "." / "t.jsonl"), "train")
    with pytest.raises(ConfigError, match="not with --warm-gaps none"):
        load_warm_trace(str(trace_path), str(other_path), "none")
    trace = load_trace(trace_path)
    with pytest.raises(ConfigError, match="not with --warm-gaps none"):
        make_warmup(trace, make_workload(trace, Scaling()), "none", load_trace(other_path))
    with pytest.raises(TraceFormatError, match="cannot read trace file"):
        load_warm_trace(str(trace_path), str(tmp_path / "missing.jsonl"), "train")

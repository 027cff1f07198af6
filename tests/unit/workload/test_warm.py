"""The bench's gap warm-up: every replay starts from the same model, trained off the test split."""

from __future__ import annotations

import json
from pathlib import Path

from agentkv.traces import load_trace
from agentkv.workload import Scaling, make_workload
from agentkv.workload._warm import make_warmup


def _trace(tmp_path: Path) -> Path:
    rows = []
    for idx in range(4):
        turns = [
            {"arrival_s": float(i), "prompt_tokens": 100 + i, "output_tokens": 10,
             "tool_name": "bash" if i % 2 else "editor", "tool_gap_s": 1.0 + idx,
             "shared_prefix_tokens_with_previous_turn": 100 if i else 0}
            for i in range(3)
        ]  # fmt: skip
        rows.append({"traj_idx": idx, "turns": turns})
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


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

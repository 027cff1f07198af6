"""`agentkv demo`: its regime, and that it says plainly when an arm wins, loses or ties
(no server: the real run is `python3 -m agentkv demo`, see docs/benchmark.md)."""

from __future__ import annotations

import pytest

from agentkv._demo import DEMO_ARMS, demo_config, print_side_by_side, verdict
from agentkv.traces import load_trace
from agentkv.workload import make_workload


def test_demo_runs_under_pressure_with_every_trajectory_in_flight() -> None:
    """E and G against B and the limit L; all trajectories in flight; a pool under
    pressure; contexts long enough that recomputing a prefix costs time."""
    cfg = demo_config("out", 1)
    assert set(DEMO_ARMS) == {"B", "E", "G", "L"} and cfg.arms == DEMO_ARMS
    assert cfg.pool_fractions == (0.3,)
    workload = make_workload(load_trace(cfg.trace_path), cfg.scaling)
    assert len(workload.trajectories) == cfg.arrival.concurrency == 12
    assert workload.max_context_tokens > 3000
    assert cfg.max_parallel_starts == len(DEMO_ARMS)


def _arm(value: float, lo: float, hi: float, headroom: float | None = None) -> dict[str, object]:
    arm: dict[str, object] = {
        "ratio_vs_B": {"value": value, "ci_low": lo, "ci_high": hi},
        "jct_mean_s": 10.0,
        "ci_unit": "trajectories",
    }
    if headroom is not None:
        arm["headroom_captured"] = {"value": headroom, "ci_low": None, "ci_high": None}
    return arm


def test_verdict_says_win_loss_or_no_difference_plainly() -> None:
    """A win needs the whole interval above 1; a loss says LOST; otherwise no difference."""
    gain = {"value": 2.0, "ci_low": 1.5, "ci_high": 2.5}
    win = verdict("E", _arm(1.6, 1.3, 2.0, 0.55), gain)
    assert "faster than stock vLLM: 1.60x (95% CI 1.30-2.00)" in win
    assert "captured 55% [?] of the headroom" in win
    assert "LOST" in verdict("G", _arm(0.8, 0.7, 0.9), gain)
    tie = verdict("E", _arm(1.05, 0.95, 1.2), gain)
    assert "no clear difference" in tie and "includes 1" in tie


def test_side_by_side_prints_every_arm_and_says_why_one_did_not_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each arm's column, its ratio to B and headroom; an arm that did not run says why."""
    arms = {n: {**_arm(1.0, 1.0, 1.0, 0.0), "prefix_reuse_ratio": 0.5} for n in ("B", "E", "L")}
    arms["G"] = {"not_run": "no FP8 here"}
    print_side_by_side({"arms": arms})
    out = capsys.readouterr().out
    assert "E: agentkv leases" in out and "L: limit" in out
    assert "headroom captured" in out and "G: not run: no FP8 here" in out

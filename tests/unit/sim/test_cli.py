"""`agentkv sim` on a real trace file: table, results.json, plots, calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentkv._errors import ConfigError
from agentkv.cli import main
from agentkv.sim import SimTrajectory, calibrate, find_elbow, synthesize
from agentkv.traces import TraceTrajectory, TraceTurn, dump_trace


def _write_trace(path: Path, workload: tuple[SimTrajectory, ...]) -> None:
    trajs = []
    for i, traj in enumerate(workload):
        t, turns = 0.0, []
        for turn in traj.turns:
            turns.append(
                TraceTurn(
                    arrival_s=t,
                    prompt_tokens=turn.prompt_tokens,
                    output_tokens=turn.output_tokens,
                    shared_prefix_tokens=turn.shared_tokens,
                    tool_name=turn.tool_class,
                    tool_gap_s=turn.gap_s,
                )
            )
            t += (turn.gap_s or 0.0) + 1.0
        trajs.append(TraceTrajectory(i, tuple(turns)))
    dump_trace(trajs, path)


def test_cli_writes_results_json_in_the_benchmark_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    _write_trace(trace, synthesize(8, 5, seed=1, system_prompt_tokens=600))
    out = tmp_path / "out"
    code = main(
        [
            "sim",
            "--trace",
            str(trace),
            "--policies",
            "lru,oracle",
            "--pool-fraction",
            "0.2",
            "0.6",
            "1.0",
            "--block-size",
            "32",
            "--out",
            str(out),
            "--no-plots",
        ]
    )
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert set(data) == {"policies", "sweep", "manifest"}
    assert [e["pool_fraction"] for e in data["sweep"]] == [0.2, 0.6, 1.0]
    assert data["policies"] == data["sweep"][0]["policies"]
    for key in ("prefix_reuse_ratio", "rebuild_tax", "jct_p50_s", "jct_p95_s", "preemptions"):
        assert key in data["policies"]["lru"]
    assert data["manifest"]["source"]["sha256"]
    assert "oracle" in capsys.readouterr().out
    assert find_elbow(data) in (0.2, 0.6, 1.0)


def test_cli_draws_plots(tmp_path: Path) -> None:
    import matplotlib  # noqa: F401  (a dev extra: imported, never skipped)

    trace = tmp_path / "t.jsonl"
    _write_trace(trace, synthesize(4, 3, seed=2, system_prompt_tokens=300))
    assert (
        main(
            [
                "sim",
                "--trace",
                str(trace),
                "--policies",
                "lru",
                "--pool-fraction",
                "0.5",
                "1",
                "--block-size",
                "32",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert (tmp_path / "reuse_vs_pool.png").stat().st_size > 0
    assert (tmp_path / "jct_vs_pool.png").stat().st_size > 0


def test_cli_rejects_an_unknown_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    _write_trace(trace, synthesize(2, 2, seed=2))
    assert (
        main(["sim", "--trace", str(trace), "--policies", "lru,magic", "--out", str(tmp_path)]) == 2
    )
    assert "choose from" in capsys.readouterr().err


def test_calibration_reads_a_bench_results_json(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {
                "arms": {"B": {"prefill_tokens_per_s": 3500.0, "decode_s_per_token": 0.03}},
                "manifest": {},
            }
        )
    )
    cost = calibrate(path)
    assert cost.prefill_tokens_per_s == 3500.0 and cost.step_s(1, []) == 0.03
    path.write_text(json.dumps({"arms": {"B": {}}, "manifest": {}}))
    with pytest.raises(ConfigError, match="prefill_tokens_per_s"):
        calibrate(path)


def test_cli_replays_the_bench_workload_in_a_closed_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scaling flags as `agentkv bench`; closed loop by default; Poisson never saturates."""
    trace = tmp_path / "t.jsonl"
    _write_trace(trace, synthesize(6, 4, seed=3, system_prompt_tokens=600))
    out = tmp_path / "out"
    argv = ["sim", "--trace", str(trace), "--policies", "lru,agentkv", "--no-plots"]
    flags = ["--token-scale", "0.5", "--time-scale", "0.3", "--max-turns", "3"]
    assert main([*argv, *flags, "--concurrency", "2", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    src = res["manifest"]["source"]
    assert src["arrival"] == "closed" and src["concurrency"] == 2
    assert src["scaling"]["token_scale"] == 0.5 and src["scaling"]["max_turns"] == 3
    assert res["policies"]["lru"]["num_turns"] == 6 * 3
    assert main([*argv, "--arrival", "poisson", "--out", str(out)]) == 0
    rate = json.loads((out / "results.json").read_text())["sweep"][0]["arrival_rate_per_s"]
    assert 0 < rate < 1.0

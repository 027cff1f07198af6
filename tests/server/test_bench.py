"""One short real benchmark run: arms B, G and the limit L against real vLLM servers on
the tiny model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.support.requires import require_vllm

pytestmark = pytest.mark.server


def test_bench_cli_runs_b_g_and_the_limit_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`agentkv bench` replays a tiny trace on arms B, G and L, writes every output, and
    states headroom captured and reuse against the simulator's oracle."""
    require_vllm()
    from agentkv._demo import demo_trace_path
    from agentkv.bench import _cli

    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "--trace",
            demo_trace_path(),
            "--arms",
            "B,G,L",
            "--reps",
            "1",
            "--max-trajectories",
            "2",
            "--max-turns",
            "3",
            "--token-scale",
            "0.03",
            "--time-scale",
            "0.05",
            "--time-scale-from-prefill",
            "--concurrency",
            "2",
            "--out",
            str(tmp_path),
            "--plain",
        ]
    )
    assert _cli.run(args) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    for arm in ("B", "G", "L"):
        a = results["arms"][arm]
        assert a["trajectories"] == 2 and a["failed_turns"] == 0
        assert a["cold_verified"] and a["client_wrapped"]
        assert a["jct_mean_s"] > 0 and a["prefix_reuse_ratio"] is not None
    assert results["arms"]["B"]["ratio_vs_B"]["value"] == 1.0
    limit = results["manifest"]["limit_pool_blocks"]
    assert limit > results["manifest"]["pools"][0]["pool_blocks"]
    assert str(limit) in results["arms"]["L"]["description"]
    assert results["arms"]["L"]["prefix_reuse_ratio"] >= results["arms"]["B"]["prefix_reuse_ratio"]
    for arm in ("B", "G", "L"):  # defined when L beat B, else None: never missing
        assert "headroom_captured" in results["arms"][arm]
        assert results["arms"][arm]["ci_unit"] == "trajectories"
        assert (results["arms"][arm]["reuse_vs_oracle"] is None) == (arm == "L")
    assert results["simulator"]["0.5"]["oracle"]["prefix_reuse_ratio"] > 0
    # every call: cached <= eligible, sent in the replay's order, and set against the sim
    (calls,) = results["arms"]["G"]["calls_per_rep"]
    assert len(calls) == sum(1 for s in results["arms"]["G"]["turn_samples"])
    for traj in {key.split("/")[0] for key in calls}:
        turns = sorted(
            (int(k.split("/")[1]), v) for k, v in calls.items() if k.startswith(f"{traj}/")
        )
        assert all(0 <= c[0] <= c[1] and c[3] > 0 for _, c in turns)
        assert [c[2] for _, c in turns] == sorted(c[2] for _, c in turns)
    diff = results["simulator"]["0.5"]["arms"]["G"]["call_diff"]
    assert sum(g["calls"] for g in diff.values()) <= len(calls)
    # the simulator runs on B's measured costs when its testbed gave a prefill rate and a
    # decode step (a tiny run's prefill rate can be unmeasurable), else on a fit
    measured = results["testbed"]["B@0.5"]
    complete = measured["prefill"]["tokens_per_s"] and measured["decode"]["batch_n_step_s"]
    method = results["simulator"]["0.5"]["calibration"]["method"]
    assert method == ("testbed" if complete else "turn_samples")
    assert results["arms"]["G"]["agentkv_counters"].get("hints_received", 0) > 0
    assert results["manifest"]["scaling"]["token_scale"] == 0.03
    # the gaps' scale was chosen from the measured prefill rate, capped by --time-scale
    gap = results["manifest"]["gap_scale"]
    assert gap["time_scale"] == results["manifest"]["scaling"]["time_scale"] == 0.05
    rates = {t["prefill"]["tokens_per_s"] for t in results["testbed"].values()}
    assert gap["prefill_tokens_per_s"] in rates
    for name in ("B@0.5", "G@0.5", "L@0.5"):
        testbed = results["testbed"][name]
        assert testbed["fixed_turn"]["client_ttft_s_p50"] > 0
        assert testbed["decode"]["batch_n"] == 2
    assert results["arms"]["B"]["per_turn_processes"]["cpu_s"]["worker"] > 0
    assert "## Testbed costs" in (tmp_path / "report.md").read_text()
    assert all((tmp_path / f).exists() for f in ("report.md", "jct_cdf.png", "ratios.png"))
    report = (tmp_path / "report.md").read_text()
    assert "headroom captured" in report and "The simulator on this workload" in report
    out = capsys.readouterr().out
    assert "G" in out and "headroom captured" in out


def test_bench_behind_the_router_records_each_calls_replica_and_a_replicas_costs(
    tmp_path: Path,
) -> None:
    """`agentkv bench --replicas 2 --routing round_robin`: two real replicas behind the
    real vllm-router. Every call's replica comes back (both replicas serve), the testbed
    is measured on one replica at its share of the batch, and the simulator check routes
    each call where it ran."""
    require_vllm()
    from agentkv._demo import demo_trace_path
    from agentkv.bench import _cli

    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    args = parser.parse_args(
        ["--trace", demo_trace_path(), "--arms", "B", "--reps", "1",
         "--max-trajectories", "2", "--max-turns", "3", "--token-scale", "0.03",
         "--time-scale", "0.05", "--concurrency", "2", "--replicas", "2",
         "--routing", "round_robin", "--out", str(tmp_path), "--plain"]
    )  # fmt: skip
    assert _cli.run(args) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    arm = results["arms"]["B"]
    assert arm["trajectories"] == 2 and arm["failed_turns"] == 0
    (calls,) = arm["replicas"]["call_replicas_per_rep"]
    assert sorted(calls) == [f"{t}/{turn}" for t in range(2) for turn in range(3)]
    assert set(calls.values()) == {0, 1}  # round robin spreads the calls
    testbed = results["testbed"]["B@0.5"]
    assert testbed["fixed_turn"]["client_ttft_s_p50"] > 0
    assert testbed["decode"]["batch_n"] == 1  # each replica's share of 2 in flight
    sim = results["simulator"]["0.5"]["arms"]["B"]
    assert sim["routed_as_recorded"] and len(sim["prefix_reuse_per_rep"]) == 1

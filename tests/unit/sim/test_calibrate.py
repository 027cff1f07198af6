"""Calibration: the cost model, block size and pool come from a bench results.json."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from agentkv._errors import ConfigError
from agentkv.cli import main
from agentkv.sim import SimCost, fit_calibration, synthesize
from agentkv.traces import TraceTrajectory, TraceTurn, dump_trace

TRUE = SimCost(prefill_tokens_per_s=4000.0, attention_s_per_token2=2e-8, decode_s_per_token=0.03)


def _samples(n: int, seed: int = 0, fixed_s: float = 0.0) -> list[dict[str, Any]]:
    """Calls timed by TRUE plus ``fixed_s``, some of them delayed by queueing (TTFT only
    grows)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = rng.randrange(300, 6000)
        cached = rng.randrange(0, prompt) // 32 * 32
        output = rng.randrange(2, 60)
        ttft = fixed_s + TRUE.prefill_s(prompt - cached, cached)
        if rng.random() < 0.5:
            ttft += rng.uniform(0.0, 3.0)  # waited behind other calls
        out.append(
            {
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "output_tokens": output,
                "ttft_s": ttft,
                "latency_s": ttft + (output - 1) * TRUE.decode_s_per_token,
            }
        )
    return out


def _results(tmp_path: Path, arms: dict[str, Any]) -> Path:
    doc = {
        "format": "agentkv-bench-results/1",
        "manifest": {
            "pools": [{"pool_fraction": 0.5, "pool_blocks": 414, "block_size": 32}],
            "trace": {"num_turns": 47},
        },
        "arms": arms,
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    return path


def test_turn_samples_recover_the_service_time_despite_queueing(tmp_path: Path) -> None:
    path = _results(tmp_path, {"B": {"turn_samples": _samples(200)}, "D": {"not_run": "gpu"}})
    cal = fit_calibration(path)
    assert cal.method == "turn_samples" and cal.num_samples == 200 and cal.arms == ("B",)
    assert cal.block_size == 32 and cal.pool_blocks == 414
    assert cal.cost.step_s(1, []) == pytest.approx(0.03)  # a step at the bench's batch
    for n, c in ((500, 0), (4000, 1000), (200, 5000)):
        want = TRUE.prefill_s(n, c)
        assert cal.cost.prefill_s(n, c) == pytest.approx(want, rel=0.05)
    assert json.dumps(cal.describe())  # JSON-ready for the manifest


def test_fixed_latency_is_a_call_that_did_not_wait_not_the_median(tmp_path: Path) -> None:
    """Under load most short calls queue behind others' prefill (the simulator models that
    wait itself): the fitted fixed latency is the lower tail, not the middle."""
    rng = random.Random(1)
    small = []
    for _ in range(60):
        prompt = rng.randrange(1000, 3000)
        new = rng.randrange(1, 200)
        ttft = 0.03 + TRUE.prefill_s(new, prompt - new)
        if rng.random() < 0.7:
            ttft += rng.uniform(0.1, 1.0)  # waited behind other calls
        small.append(
            {
                "prompt_tokens": prompt,
                "cached_tokens": prompt - new,
                "output_tokens": 2,
                "ttft_s": ttft,
                "latency_s": ttft + TRUE.decode_s_per_token,
            }
        )
    path = _results(tmp_path, {"B": {"turn_samples": _samples(200, fixed_s=0.03) + small}})
    cal = fit_calibration(path)
    assert cal.cost.overhead_s == pytest.approx(0.03, abs=0.01)


def test_aggregates_only_give_a_coarse_prefill_rate_and_say_so(tmp_path: Path) -> None:
    arms = {"B": {"prefill_tokens": 94000.0, "ttft_p50_s": 2.0, "prefix_reuse_ratio": 0.4}}
    cal = fit_calibration(_results(tmp_path, arms))
    assert cal.method == "aggregates"
    assert cal.cost.prefill_tokens_per_s == pytest.approx(94000 / 47 / 2.0)
    assert cal.cost.decode_s_per_token == SimCost().decode_s_per_token
    assert cal.cost.step_base_s == SimCost().step_base_s
    assert any("turn_samples" in n for n in cal.notes)


def test_explicit_figures_win_and_missing_figures_are_an_error(tmp_path: Path) -> None:
    arms = {"B": {"prefill_tokens_per_s": 3500.0, "decode_s_per_token": 0.05}}
    cost = fit_calibration(_results(tmp_path, arms)).cost
    assert cost.prefill_tokens_per_s == 3500.0 and cost.step_s(1, []) == 0.05
    with pytest.raises(ConfigError, match="turn_samples"):
        fit_calibration(_results(tmp_path, {"B": {}}))
    with pytest.raises(ConfigError, match="no arm 'Z'"):
        fit_calibration(_results(tmp_path, {"B": {}}), arm="Z")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not an `agentkv bench`"):
        fit_calibration(bad)


def _synthetic_trace(tmp_path: Path, n: int, *, seed: int) -> Path:
    """``n`` synthesized trajectories of ``n`` turns, written as a trace file."""
    trace = tmp_path / "t.jsonl"
    trajs = []
    for i, traj in enumerate(synthesize(n, n, seed=seed)):
        turns = tuple(
            TraceTurn(
                arrival_s=2.0 * j,
                prompt_tokens=u.prompt_tokens,
                output_tokens=u.output_tokens,
                shared_prefix_tokens=u.shared_tokens,
                tool_name=u.tool_class,
                tool_gap_s=u.gap_s,
            )
            for j, u in enumerate(traj.turns)
        )
        trajs.append(TraceTrajectory(i, turns))
    dump_trace(trajs, trace)
    return trace


def test_cli_takes_block_size_and_pool_from_the_calibration(tmp_path: Path) -> None:
    path = _results(tmp_path, {"B": {"turn_samples": _samples(50)}})
    trace = _synthetic_trace(tmp_path, 3, seed=1)
    out = tmp_path / "out"
    argv = ["sim", "--trace", str(trace), "--calibrate", str(path), "--policies", "lru"]
    assert main([*argv, "--pool-fraction", "1.0", "--out", str(out), "--no-plots"]) == 0
    res = json.loads((out / "results.json").read_text())
    cfg = res["manifest"]["config"]
    assert cfg["block_size"] == 32 and cfg["pool_blocks"] == 414
    assert res["manifest"]["source"]["calibration"]["method"] == "turn_samples"
    assert cfg["prefill_tokens_per_s"] > 0 and cfg["step_base_s"] == pytest.approx(0.03)
    assert cfg["arrival"] == "closed"  # the bench's default arrivals


def test_grid_with_calibration_sweeps_its_own_pools(tmp_path: Path) -> None:
    """--calibrate gives a grid its costs and scaling, not its pool: each --grid-pools
    fraction runs its own pool (the bench's pool pinned them all to one before), and
    --pool-blocks beside --grid is refused with a clear message."""
    path = _results(tmp_path, {"B": {"turn_samples": _samples(50)}})
    trace = _synthetic_trace(tmp_path, 4, seed=2)
    out = tmp_path / "grid"
    argv = ["sim", "--trace", str(trace), "--calibrate", str(path), "--grid"]
    grid = ["--grid-concurrency", "2", "--grid-pools", "0.3", "1.0", "--grid-open"]
    assert main([*argv, *grid, "--policies", "lru,agentkv", "--out", str(out), "--no-plots"]) == 0
    rows = json.loads((out / "grid.json").read_text())
    pools = {r["point"]["pool_fraction"] for r in rows}
    assert pools == {0.3, 1.0}
    reuse = {
        r["point"]["pool_fraction"]: r["cells"]["lru"]["reuse"]
        for r in rows
        if r["point"]["slice"] == "all"
    }
    assert reuse[0.3] < reuse[1.0]  # one pinned pool gave both fractions the same run
    assert main([*argv, *grid, "--pool-blocks", "100", "--out", str(out)]) == 2

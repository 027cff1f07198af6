"""The operating grid: its rendering (pure) and the simulator's sweep of it."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentkv._errors import ConfigError
from agentkv.sim import SimConfig, SimCost, synthesize
from agentkv.sim._grid import cycled, grid_json, run_sim_grid
from agentkv.workload._grid import Cell, GridPoint, long_tail_ids, render_grid


def test_a_cell_loses_below_the_mean_floor_and_costs_the_tail_below_the_p95_floor() -> None:
    assert Cell((1.05, 0.97, 1.12), (1.0, None, None)).loses  # the interval's low end
    assert not Cell((1.05, 0.99, 1.12), (1.0, None, None)).loses
    assert Cell((0.975, None, None), (1.0, None, None)).loses  # no interval: the value
    assert Cell((1.2, None, None), (0.96, None, None)).tail_cost
    assert not Cell((1.2, None, None), (0.97, None, None)).tail_cost


def test_the_table_flags_lost_and_tail_points_and_counts_them() -> None:
    rows = [
        (GridPoint(0.3, concurrency=4), {"E": Cell((1.3, 1.1, 1.5), (0.9, 0.8, 1.0), 0.4)}),
        (GridPoint(0.3, rate_per_s=0.2, open_fraction=0.8), {"E": Cell((0.9, 0.85, 0.95), (1.1, None, None))}),
    ]
    table = render_grid(rows, ["E"], "B")
    assert "| c4 | 0.3 | 1.30 [1.10, 1.50] | 0.90 [0.80, 1.00] TAIL | 40% |" in table
    assert "| open 80% | 0.3 | 0.90 [0.85, 0.95] LOST | 1.10 | - |" in table
    assert "E against B: lost at 1 of 2 points" in table and "tail cost at 1 of 2" in table


def test_a_point_with_the_pool_at_its_floor_is_marked_and_its_flags_still_count() -> None:
    floor = {"pool_floored": True}
    rows = [
        (GridPoint(0.15, concurrency=2), {"E": Cell((1.0, 0.99, 1.02), (0.87, 0.7, 1.1)), "lru": Cell((1.0, None, None), (1.0, None, None), 0.0, floor)}),
        (GridPoint(0.3, concurrency=4), {"E": Cell((1.0, 0.9, 1.1), (0.9, None, None)), "lru": Cell((1.0, None, None), (1.0, None, None), 0.0)}),
    ]  # fmt: skip
    table = render_grid(rows, ["E"], "B")
    assert "| c2 | 0.15 (floor) | 1.00 [0.99, 1.02] | 0.87 [0.70, 1.10] TAIL |" in table
    assert "| c4 | 0.3 | 1.00 [0.90, 1.10] LOST | 0.90 TAIL |" in table
    assert "lost at 1 of 2 points" in table and "tail cost at 2 of 2" in table
    assert "Of these, 0 lost and 1 tail-cost points have the pool at its floor." in table
    # without a floored point the summary says nothing of floors
    assert "floor" not in render_grid(rows[1:], ["E"], "B")


def test_the_long_tail_slice_is_the_trajectories_with_the_longest_gaps() -> None:
    gaps = {f"t{i}": [0.1, float(i)] for i in range(10)}
    assert long_tail_ids(gaps, q=0.8) == ["t8", "t9"]
    assert long_tail_ids({}) == []


def test_the_simulated_grid_covers_closed_open_and_long_tail_points() -> None:
    workload = synthesize(8, 5, seed=2, arrival_rate_per_s=None, system_prompt_tokens=300)
    cfg = SimConfig(block_size=32, cost=SimCost(overhead_s=0.01))
    rows = run_sim_grid(
        lambda rate: synthesize(8, 5, seed=2, arrival_rate_per_s=rate, system_prompt_tokens=300)
        if rate is not None else workload,
        cfg, ["agentkv"], concurrencies=[2, 4], pools=[0.3], open_fractions=[0.5, 1.0],
    )  # fmt: skip
    labels = [p.label for p, _ in rows]
    assert labels[:4] == ["c2", "c4", "open 50%", "open 100%"]
    assert any("long-tail" in label for label in labels)
    for _point, cells in rows:
        assert set(cells) == {"agentkv", "lru"} and cells["lru"].mean_ratio[0] == 1.0
        assert cells["agentkv"].mean_ratio[0] > 0
    doc = grid_json(rows)
    assert doc[2]["point"]["open_fraction"] == 0.5 and doc[2]["point"]["rate_per_s"] > 0
    json.dumps(doc)  # JSON-ready


def test_agentkv_sim_grid_writes_the_table_and_json(tmp_path: Path) -> None:
    trace = Path(__file__).resolve().parents[3] / "agentkv/bench/data/openhands_swebv_subset.jsonl"
    out = tmp_path / "grid"
    done = subprocess.run(
        [sys.executable, "-m", "agentkv", "sim", "--trace", str(trace), "--grid",
         "--policies", "lru,agentkv", "--grid-concurrency", "2", "4", "--grid-pools", "0.3",
         "--grid-open", "0.8", "--token-scale", "0.15", "--max-turns", "4", "--no-plots",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = (out / "grid.md").read_text()
    assert "| c2 | 0.3 (floor) |" in table and "| open 80% | 0.3 |" in table
    assert "agentkv against lru" in table
    rows = json.loads((out / "grid.json").read_text())
    assert {r["point"]["label"] for r in rows} >= {"c2", "c4", "open 80%"}


# -- the bench's grid (orchestration; the runs themselves are the bench's own tests) ------
def _results(ratio: float) -> dict[str, object]:
    arm = {"ratio_vs_B": {"value": ratio, "ci_low": ratio - 0.05, "ci_high": ratio + 0.05},
           "p95_ratio_vs_B": {"value": 1.0, "ci_low": 0.9, "ci_high": 1.1},
           "headroom_captured": {"value": 0.5}}  # fmt: skip
    return {"sweep": {"0.3": {"B": {}, "E": arm, "L": {}}, "0.5": {"B": {}, "E": arm}}}


def _b_rep() -> object:
    """One repetition of arm B at pool 0.3: 5 trajectories done in 10 s (0.5 per second)."""
    replay = type("R", (), {"wall_s": 10.0, "trajectories": [type("T", (), {"ok": True})()] * 5})
    return type("Rep", (), {"arm": "B", "pool_fraction": 0.3, "replay": replay})


def test_bench_grid_runs_each_point_and_derives_open_rates_from_b(
    tmp_path: Path, monkeypatch: object
) -> None:
    import pytest

    from agentkv.bench import _grid
    from agentkv.bench.run._runner import BenchConfig

    mp = monkeypatch
    assert isinstance(mp, pytest.MonkeyPatch)
    seen: list[object] = []

    def fake_run(cfg: BenchConfig, notify: object = None) -> dict[str, object]:
        seen.append(cfg.arrival)
        return {"reps": [_b_rep()]}

    mp.setattr(_grid, "run_bench", fake_run)
    mp.setattr("agentkv.bench.report._report.write_report", lambda raw, out: (_results(1.2), []))
    cfg = BenchConfig(trace_path="t.jsonl", arms=("B", "E", "L"), reps=1,
                      pool_fractions=(0.3, 0.5), out_dir=str(tmp_path))  # fmt: skip
    rows, files = _grid.run_bench_grid(cfg, [12, 4], [0.5, 1.0])
    kinds = [(a.process, a.concurrency if a.process == "closed" else a.rate_per_s) for a in seen]  # type: ignore[attr-defined]
    assert kinds == [("closed", 4), ("closed", 12), ("poisson", 0.25), ("poisson", 0.5)]
    assert len(rows) == 8 and all(set(cells) == {"E"} for _, cells in rows)
    table = (tmp_path / "grid.md").read_text()
    assert "0.500 trajectories/s" in table and "| open 50% | 0.3 |" in table
    assert (tmp_path / "grid.json").exists() and tmp_path / "grid.md" in files


def test_bench_grid_chooses_the_gap_scale_at_its_first_point_and_holds_it(
    tmp_path: Path, monkeypatch: object
) -> None:
    import dataclasses
    import json

    import pytest

    from agentkv.bench import _grid
    from agentkv.bench.run._gapscale import GapScaleRule
    from agentkv.bench.run._runner import BenchConfig

    mp = monkeypatch
    assert isinstance(mp, pytest.MonkeyPatch)
    seen: list[BenchConfig] = []
    record = {"time_scale": 0.18, "prefill_tokens_per_s": 15000.0, "rebuild_s": 0.12,
              "mean_context_tokens": 1842, "rule": {"rebuild_share": 0.25}, "reason": "r"}  # fmt: skip

    def fake_run(cfg: BenchConfig, notify: object = None) -> dict[str, object]:
        seen.append(cfg)
        chosen = dataclasses.replace(cfg.scaling, time_scale=0.18)
        raw: dict[str, object] = {
            "reps": [_b_rep()],
            "config": dataclasses.replace(cfg, scaling=chosen),
        }
        if cfg.gap_scale is not None:  # the runner chose a scale on this run's testbed
            raw["gap_scale"] = record
        return raw

    mp.setattr(_grid, "run_bench", fake_run)
    mp.setattr("agentkv.bench.report._report.write_report", lambda raw, out: (_results(1.2), []))
    cfg = BenchConfig(trace_path="t.jsonl", arms=("B", "E", "L"), reps=1, pool_fractions=(0.3,),
                      out_dir=str(tmp_path), gap_scale=GapScaleRule())  # fmt: skip
    _grid.run_bench_grid(cfg, [4, 12], [0.8])
    assert seen[0].gap_scale is not None  # the first point measures and chooses
    assert all(c.gap_scale is None and c.scaling.time_scale == 0.18 for c in seen[1:])
    assert len(seen) == 3
    assert json.loads((tmp_path / "grid.json").read_text())["gap_scale"] == record
    assert "tool gaps x0.18" in (tmp_path / "grid.md").read_text()


# -- repetitions, the pool floor, the long-tail slice ----------------------------------------
def _synth(rate: float | None, rep: int = 0) -> object:
    return synthesize(8, 5, seed=2 + rep, arrival_rate_per_s=rate, system_prompt_tokens=300)


def test_one_repetition_is_one_run_per_arm_and_gives_no_interval() -> None:
    import pytest

    from agentkv.sim import run_policy
    from agentkv.sim._policies import make_policy
    from agentkv.sim._report import percentile

    cfg = SimConfig(block_size=32, cost=SimCost(overhead_s=0.01))
    rows = run_sim_grid(
        _synth, cfg, ["agentkv"], concurrencies=[4], pools=[0.3], open_fractions=[],
        long_tail=False,
    )  # fmt: skip
    [(_point, cells)] = rows
    point_cfg = cfg.with_(arrival="closed", concurrency=4, pool_fraction=0.3)
    base = run_policy(_synth(None), point_cfg, make_policy("lru")).jct_s  # type: ignore[arg-type]
    arm = run_policy(_synth(None), point_cfg, make_policy("agentkv")).jct_s  # type: ignore[arg-type]
    mean, low, high = cells["agentkv"].mean_ratio
    assert mean == pytest.approx(sum(base) / sum(arm), rel=1e-12) and low is None and high is None
    assert cells["agentkv"].p95_ratio[0] == pytest.approx(percentile(base, 95) / percentile(arm, 95))
    assert cells["lru"].extra["repetitions"] == 1


def test_repetitions_pool_the_runs_and_give_an_interval_around_the_ratio() -> None:
    cfg = SimConfig(block_size=32, cost=SimCost(overhead_s=0.01))
    rows = run_sim_grid(
        _synth, cfg, ["agentkv"], concurrencies=[4], pools=[0.3], open_fractions=[0.8],
        long_tail=False, repetitions=3,
    )  # fmt: skip
    assert [p.label for p, _ in rows] == ["c4", "open 80%"]
    for _point, cells in rows:
        value, low, high = cells["agentkv"].mean_ratio
        assert low is not None and high is not None and low <= value <= high
        assert cells["agentkv"].p95_ratio[1] is not None
        assert cells["lru"].extra["repetitions"] == 3
    doc = grid_json(rows)
    assert len(doc[0]["cells"]["agentkv"]["mean_ratio_ci"]) == 2


def test_repetitions_below_one_are_refused() -> None:
    import pytest

    from agentkv import ConfigError

    with pytest.raises(ConfigError, match="repetitions"):
        run_sim_grid(_synth, SimConfig(block_size=32), ["agentkv"], repetitions=0)


def test_a_pool_at_its_floor_is_flagged_and_the_long_tail_slice_runs_once_per_size() -> None:
    cfg = SimConfig(block_size=32, cost=SimCost(overhead_s=0.01))
    rows = run_sim_grid(
        _synth, cfg, ["agentkv"], concurrencies=[2], pools=[0.01, 0.9], open_fractions=[],
    )  # fmt: skip
    by_pool = {(p.label, p.pool_fraction): cells for p, cells in rows}
    assert by_pool[("c2", 0.01)]["lru"].extra["pool_floored"] is True
    assert by_pool[("c2", 0.9)]["lru"].extra["pool_floored"] is False
    tail_labels = [p.label for p, _ in rows if p.slice != "all" and p.pool_fraction == 0.9]
    assert len(tail_labels) == len(set(tail_labels)) >= 1


def test_cycled_repeats_the_trajectories_as_new_ones_on_one_poisson_process() -> None:
    workload = synthesize(3, 2, seed=1, arrival_rate_per_s=None, system_prompt_tokens=50)
    out = cycled(workload, 8, 2.0, seed=0)
    ids = [t.trajectory_id for t in out]
    assert len(out) == 8 and len(set(ids)) == 8  # every copy is a trajectory of its own
    assert ids[:3] == [t.trajectory_id for t in workload] and ids[3].endswith("~1")
    assert [t.turns for t in out[3:6]] == [t.turns for t in workload]  # in order
    starts = [t.start_s for t in out]
    assert starts[0] == 0.0 and all(b > a for a, b in itertools.pairwise(starts))
    assert cycled(workload, 2, 2.0, seed=0)[-1].trajectory_id == workload[-1].trajectory_id
    assert [t.start_s for t in cycled(workload, 8, 2.0, seed=1)] != starts  # another draw


def test_open_loop_points_run_the_cycled_trajectories_and_closed_ones_the_trace() -> None:
    workload = synthesize(4, 3, seed=2, arrival_rate_per_s=None, system_prompt_tokens=100)
    cfg = SimConfig(block_size=32, cost=SimCost(overhead_s=0.01))
    rows = run_sim_grid(
        lambda rate, rep=0: workload, cfg, ["agentkv"], concurrencies=[2], pools=[0.3],
        open_fractions=[0.8], long_tail=False, repetitions=2, open_trajectories=20,
    )  # fmt: skip
    (closed, c_cells), (opened, o_cells) = rows
    assert closed.concurrency == 2 and c_cells["lru"].extra["trajectories"] == 4
    assert opened.open_fraction == 0.8 and o_cells["lru"].extra["trajectories"] == 20
    with pytest.raises(ConfigError, match="open_trajectories"):
        run_sim_grid(lambda rate, rep=0: workload, cfg, ["agentkv"], open_trajectories=-1)


def test_bench_grid_states_the_simulated_oracles_bound_per_point() -> None:
    """Each point's simulator section gives grid.md the headroom agentkv-oracle takes on
    that point's workload, beside each arm's real and simulated headroom."""
    from agentkv.bench._grid import bound_table, grid_rows

    results = _results(1.2)
    results["simulator"] = {
        "0.3": {"arms": {"E": {"headroom": 0.2}},
                "oracles": {"agentkv-oracle": {"headroom": 0.3}}},
    }  # fmt: skip
    rows = grid_rows(results, GridPoint(0.3, concurrency=4))
    by_pool = {p.pool_fraction: cells for p, cells in rows}
    assert by_pool[0.3]["E"].extra["oracle_headroom_sim"] == 0.3
    assert by_pool[0.3]["E"].extra["sim_headroom"] == 0.2
    assert by_pool[0.5]["E"].extra["oracle_headroom_sim"] is None  # not simulated there
    table = bound_table(rows, ["E"])
    assert "| point | pool | oracle headroom | E headroom real / simulated |" in table
    assert "| c4 | 0.3 | 30% | 50% / 20% |" in table
    assert "| c4 | 0.5 |" not in table  # a point without the figure has no row
    assert bound_table(grid_rows(_results(1.2), GridPoint(0.3, concurrency=4)), ["E"]) == ""

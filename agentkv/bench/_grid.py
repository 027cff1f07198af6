"""``agentkv bench --grid``: the benchmark protocol at every point of the operating grid.

One full run (servers per arm and pool, cold caches, shuffled repetitions) per closed-loop
concurrency, each over every grid pool fraction, then one per open-loop rate: fractions of
stock vLLM's sustained rate, measured as arm B's completed trajectories per second of
replay in the highest-concurrency run at the first pool. Each run keeps its own folder
(``c12/``, ``open-80/``) with its results.json and report.md; the grid's table
(:func:`agentkv.workload._grid.render_grid`), grid.json and heat map go on top. A tool
gap scale chosen from the machine (``BenchConfig.gap_scale``) is chosen once, at the first
point, and held for the rest, so that the points differ in load alone.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError
from agentkv.bench.report._simtable import oracle_headroom, pct
from agentkv.bench.run._gapscale import describe_gap_scale
from agentkv.bench.run._runner import BenchConfig, Progress, run_bench
from agentkv.workload._arrival import Arrival
from agentkv.workload._grid import Cell, GridPoint, plot_grid, render_grid

__all__ = ["bound_table", "grid_rows", "run_bench_grid", "sustained_rate"]

Row = tuple[GridPoint, dict[str, Cell]]


def _triple(r: Any) -> tuple[float, float | None, float | None]:
    if not isinstance(r, dict) or r.get("value") is None:
        return (float("nan"), None, None)
    return (float(r["value"]), r.get("ci_low"), r.get("ci_high"))


def grid_rows(results: dict[str, Any], point: GridPoint) -> list[Row]:
    """One row per pool fraction of a run's results.json: a cell per agentkv arm (the
    baseline B and the limit L have none)."""
    rows: list[Row] = []
    for fraction, arms in results.get("sweep", {}).items():
        sim = (results.get("simulator") or {}).get(fraction) or {}
        bound = oracle_headroom(sim)
        cells: dict[str, Cell] = {}
        for name, arm in arms.items():
            if name in ("B", "L") or "not_run" in arm or "ratio_vs_B" not in arm:
                continue
            hr = arm.get("headroom_captured")
            cells[name] = Cell(
                _triple(arm["ratio_vs_B"]),
                _triple(arm.get("p95_ratio_vs_B")),
                hr.get("value") if isinstance(hr, dict) else None,
                {
                    "jct_mean_s": arm.get("jct_mean_s"),
                    "jct_p95_s": arm.get("jct_p95_s"),
                    "reuse": arm.get("prefix_reuse_ratio"),
                    "sim_headroom": ((sim.get("arms") or {}).get(name) or {}).get("headroom"),
                    "oracle_headroom_sim": bound,
                },
            )
        rows.append((dataclasses.replace(point, pool_fraction=float(fraction)), cells))
    return rows


def bound_table(rows: Sequence[Row], arms: Sequence[str]) -> str:
    """grid.md's table of the simulator's bound: per point, the headroom
    ``agentkv-oracle`` (the lease policy given every return time) takes on that point's
    own workload, pool and measured costs, beside each arm's real and simulated headroom.
    Empty when no point has the figure."""
    body = []
    for point, cells in rows:
        bound = next((c.extra.get("oracle_headroom_sim") for c in cells.values()), None)
        if bound is None:
            continue
        per_arm = " | ".join(
            f"{pct(cells[a].headroom)} / {pct(cells[a].extra.get('sim_headroom'))}"
            if a in cells
            else "– / –"
            for a in arms
        )
        body.append(f"| {point.label} | {point.pool_fraction:g} | {pct(bound)} | {per_arm} |")
    if not body:
        return ""
    head = " | ".join(f"{a} headroom real / simulated" for a in arms)
    return (
        "\n## The bound on each point's workload\n\n"
        "The simulator on each point's own workload, pool and measured costs "
        "(its report's simulator section): the headroom between the simulated B and L that "
        "`agentkv-oracle` takes (agentkv's lease policy given every return time), the most "
        "the lease policy can take there with perfect forecasts.\n\n"
        f"| point | pool | oracle headroom | {head} |\n"
        f"|---|---|---|{'---|' * len(arms)}\n" + "\n".join(body) + "\n"
    )


def sustained_rate(raw: dict[str, Any], pool_fraction: float) -> float:
    """Arm B's completed trajectories per second of replay at ``pool_fraction`` (the
    mean over its repetitions); 0.0 when B did not run there."""
    rates = [
        sum(1 for t in r.replay.trajectories if t.ok) / r.replay.wall_s
        for r in raw["reps"]
        if r.arm == "B" and r.pool_fraction == pool_fraction and r.replay.wall_s > 0
    ]
    return statistics.mean(rates) if rates else 0.0


def run_bench_grid(
    cfg: BenchConfig,
    concurrencies: Sequence[int],
    open_fractions: Sequence[float],
    notify: Progress | None = None,
) -> tuple[list[Row], list[Path]]:
    """Run ``cfg`` at every grid point (its ``pool_fractions`` are the grid's pools, its
    ``arrival`` is replaced point by point); returns the rows and the files written."""
    from agentkv.bench.report._report import write_report

    if not concurrencies:
        raise ConfigError("the grid needs at least one closed-loop concurrency")
    if "B" not in cfg.arms:
        raise ConfigError("the grid compares every arm with B: include arm B")
    out = Path(cfg.out_dir)
    rows: list[Row] = []
    top_raw: dict[str, Any] | None = None
    gap_scale: dict[str, Any] | None = None
    for c in sorted(concurrencies):
        arrival = Arrival("closed", c, cfg.arrival.rate_per_s, cfg.seed)
        sub = dataclasses.replace(cfg, arrival=arrival, out_dir=str(out / f"c{c}"))
        raw = run_bench(sub, notify)
        results, _ = write_report(raw, sub.out_dir)
        rows += grid_rows(results, GridPoint(cfg.pool_fractions[0], concurrency=c))
        top_raw = raw
        if cfg.gap_scale is not None and "gap_scale" in raw:
            # the first point's choice holds for the whole grid: points differ in load only
            gap_scale = raw["gap_scale"]
            cfg = dataclasses.replace(cfg, scaling=raw["config"].scaling, gap_scale=None)
    assert top_raw is not None
    sustained = sustained_rate(top_raw, cfg.pool_fractions[0])
    for frac in open_fractions if sustained > 0 else ():
        rate = frac * sustained
        arrival = Arrival("poisson", cfg.arrival.concurrency, rate, cfg.seed)
        sub = dataclasses.replace(
            cfg, arrival=arrival, out_dir=str(out / f"open-{round(frac * 100)}")
        )
        raw = run_bench(sub, notify)
        results, _ = write_report(raw, sub.out_dir)
        point = GridPoint(cfg.pool_fractions[0], rate_per_s=rate, open_fraction=frac)
        rows += grid_rows(results, point)
    arms = [a for a in cfg.arms if a not in ("B", "L")]
    rows.sort(key=lambda r: (r[0].pool_fraction, r[0].concurrency is None, r[0].concurrency or 0,
                             r[0].open_fraction or 0.0))  # fmt: skip
    table = render_grid(rows, arms, "B (stock vLLM)")
    scale_line = (
        ""
        if gap_scale is None
        else "At every point, " + describe_gap_scale(gap_scale) + ". The scale was chosen "
        "at the first point and held for the rest.\n\n"
    )
    (out / "grid.md").write_text(
        f"# Benchmark grid: {cfg.trace_path}\n\nB's sustained rate (c{max(concurrencies)}, "
        f"pool {cfg.pool_fractions[0]:g}): {sustained:.3f} trajectories/s. Ratios are B's JCT "
        "over the arm's (above 1 is faster) with 95% intervals; headroom is (B - arm) / "
        "(B - L) on mean JCT.\n\n" + scale_line + table + bound_table(rows, arms)
    )
    doc = [
        {
            "point": dataclasses.asdict(p),
            "label": p.label,
            "cells": {a: dataclasses.asdict(c) for a, c in cells.items()},
        }
        for p, cells in rows
    ]
    (out / "grid.json").write_text(
        json.dumps(
            {
                "sustained_rate_per_s": sustained,
                **({"gap_scale": gap_scale} if gap_scale is not None else {}),
                "rows": doc,
            },
            indent=1,
            default=str,
        )
        + "\n"
    )
    files = [out / "grid.md", out / "grid.json"]
    png = plot_grid(rows, arms, out / "grid.png")
    if png is not None:
        files.append(png)
    return rows, files

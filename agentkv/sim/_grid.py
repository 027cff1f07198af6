"""``agentkv sim --grid``: every policy across the operating grid, against stock LRU.

See :mod:`agentkv.workload._grid` for the grid and its rendering. For each pool fraction
the simulator runs, per point, the baseline (``lru``, stock vLLM), the limit (``lru`` on a
pool that holds everything) and each policy; open-loop rates are fractions of the
baseline's sustained rate at that pool (trajectories completed per second in a closed
loop at the grid's highest concurrency). The simulator is deterministic, so ratios carry
no interval here; the bench's grid has them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from agentkv.sim._config import SimConfig
from agentkv.sim._engine import RunStats, run_policy, working_set_blocks
from agentkv.sim._policies import make_policy
from agentkv.sim._report import percentile
from agentkv.sim._workload import SimTrajectory
from agentkv.workload._grid import (
    CONCURRENCIES,
    OPEN_FRACTIONS,
    POOLS,
    Cell,
    GridPoint,
    long_tail_ids,
)

__all__ = ["LIMIT_POOL_FRACTION", "grid_json", "run_sim_grid"]

#: The limit's pool, as a fraction of the working set: it never evicts a live context.
LIMIT_POOL_FRACTION = 2.0

Workload = Sequence[SimTrajectory]
Row = tuple[GridPoint, dict[str, Cell]]


def _figures(stats: RunStats) -> tuple[float, float, float]:
    jct = stats.jct_s
    reuse = stats.cached_tokens / stats.reusable_tokens if stats.reusable_tokens else 0.0
    return statistics.mean(jct), percentile(jct, 95), reuse


def _point(workload: Workload, config: SimConfig, policies: Sequence[str], point: GridPoint) -> Row:
    ws = working_set_blocks(workload, config)
    base_mean, base_p95, base_reuse = _figures(
        run_policy(workload, config, make_policy("lru"), working_set=ws)
    )
    limit = config.with_(pool_fraction=LIMIT_POOL_FRACTION)
    limit_mean = _figures(run_policy(workload, limit, make_policy("lru"), working_set=ws))[0]
    cells: dict[str, Cell] = {}
    for name in policies:
        mean, p95, reuse = _figures(run_policy(workload, config, make_policy(name), working_set=ws))
        span = base_mean - limit_mean
        cells[name] = Cell(
            (base_mean / mean, None, None),
            (base_p95 / p95, None, None),
            (base_mean - mean) / span if span > 1e-9 else None,
            {"jct_mean_s": mean, "jct_p95_s": p95, "reuse": reuse},
        )
    cells["lru"] = Cell(
        (1.0, None, None),
        (1.0, None, None),
        0.0,
        {
            "jct_mean_s": base_mean,
            "jct_p95_s": base_p95,
            "reuse": base_reuse,
            "limit_jct_mean_s": limit_mean,
        },
    )
    return point, cells


def run_sim_grid(
    make_workload: Callable[[float | None], Workload],
    config: SimConfig,
    policies: Sequence[str],
    *,
    concurrencies: Sequence[int] = CONCURRENCIES,
    pools: Sequence[float] = POOLS,
    open_fractions: Sequence[float] = OPEN_FRACTIONS,
    long_tail: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Simulate ``policies`` (names) at every grid point; ``make_workload(rate)`` builds
    the workload for Poisson starts at ``rate`` (None: all at time 0, for closed loops).
    Returns ``(point, {policy: cell})`` rows, the baseline ``lru`` included."""
    say = progress or (lambda _msg: None)
    closed = make_workload(None)
    rows: list[Row] = []
    for pool in pools:
        for c in concurrencies:
            cfg = config.with_(arrival="closed", concurrency=c, pool_fraction=pool)
            rows.append(_point(closed, cfg, policies, GridPoint(pool, concurrency=c)))
            say(f"closed c{c} pool {pool:g}")
        top = config.with_(arrival="closed", concurrency=max(concurrencies), pool_fraction=pool)
        stats = run_policy(closed, top, make_policy("lru"))
        sustained = len(closed) / stats.makespan_s if stats.makespan_s > 0 else 0.0
        for frac in open_fractions if sustained > 0 else ():
            rate = frac * sustained
            cfg = config.with_(arrival="poisson", arrival_rate_per_s=rate, pool_fraction=pool)
            point = GridPoint(pool, rate_per_s=rate, open_fraction=frac)
            rows.append(_point(make_workload(rate), cfg, policies, point))
            say(f"open {frac:.0%} ({rate:.3f}/s) pool {pool:g}")
        if long_tail:
            gaps = {t.trajectory_id: [u.gap_s or 0.0 for u in t.turns] for t in closed}
            keep = set(long_tail_ids(gaps, q=0.75))
            tail = [t for t in closed if t.trajectory_id in keep]
            if len(tail) >= 2:
                for c in (4, 12):
                    conc = min(c, len(tail))
                    cfg = config.with_(arrival="closed", concurrency=conc, pool_fraction=pool)
                    point = GridPoint(pool, concurrency=conc, slice="long-tail gaps")
                    rows.append(_point(tail, cfg, policies, point))
                say(f"long-tail slice pool {pool:g}")
    return rows


def grid_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The rows as JSON-ready dicts."""
    out = []
    for point, cells in rows:
        out.append(
            {
                "point": {
                    "label": point.label,
                    "pool_fraction": point.pool_fraction,
                    "concurrency": point.concurrency,
                    "rate_per_s": point.rate_per_s,
                    "open_fraction": point.open_fraction,
                    "slice": point.slice,
                },
                "cells": {
                    name: {
                        "mean_ratio": cell.mean_ratio[0],
                        "p95_ratio": cell.p95_ratio[0],
                        "headroom": cell.headroom,
                        "loses": cell.loses,
                        "tail_cost": cell.tail_cost,
                        **dict(cell.extra),
                    }
                    for name, cell in cells.items()
                },
            }
        )
    return out

"""``agentkv sim --grid``: every policy across the operating grid, against stock LRU.

See :mod:`agentkv.workload._grid` for the grid and its rendering. For each pool fraction
the simulator runs, per point, the baseline (``lru``, stock vLLM), the limit (``lru`` on a
pool that holds everything) and each policy; open-loop rates are fractions of the
baseline's sustained rate at that pool (trajectories completed per second in a closed
loop at the grid's highest concurrency). The simulator is deterministic, so one run has
no noise, but one run's p95 is one draw of a start order or of arrivals: with
``repetitions`` each point runs again with the trajectories in another start order
(closed loops) or other Poisson arrivals (open loops); each ratio is then the geometric
mean of the repetitions' paired ratios, with a 95% interval across them.

An open loop over a trace of a few dozen trajectories never reaches a steady state: a
draw of arrivals either queues up or does not, and the draws' ratios scatter so widely
that no interval excludes 1. Open-loop points therefore run the trace's trajectories
cycled (each copy a new trajectory, with contexts of its own) to ``open_trajectories``
arrivals of one Poisson process.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from agentkv._errors import ConfigError
from agentkv.sim._config import SimConfig
from agentkv.sim._engine import RunStats, run_policy, size_pool, working_set_blocks
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

__all__ = ["LIMIT_POOL_FRACTION", "OPEN_TRAJECTORIES", "cycled", "grid_json", "run_sim_grid"]

#: The limit's pool, as a fraction of the working set: it never evicts a live context.
LIMIT_POOL_FRACTION = 2.0

#: Arrivals per open-loop run by default (the trace's trajectories cycled to this many).
OPEN_TRAJECTORIES = 240

Workload = Sequence[SimTrajectory]
Row = tuple[GridPoint, dict[str, Cell]]


def _figures(jct: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(jct), percentile(jct, 95)


#: Student's t at 97.5% by degrees of freedom (1-10); 1.96 beyond.
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)


def _ratio(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """The repetitions' ratios as one: their geometric mean (one repetition: its ratio)
    and a 95% t-interval on the log scale (None, None for fewer than two)."""
    logs = [math.log(v) for v in values]
    mid = statistics.mean(logs)
    n = len(logs)
    if n < 2:
        return math.exp(mid), None, None
    t = _T975[n - 2] if n - 2 < len(_T975) else 1.96
    half = t * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mid), math.exp(mid - half), math.exp(mid + half)


def _order(workload: Workload, rep: int) -> Workload:
    """Repetition ``rep`` of a closed loop: the same trajectories in another start order
    (repetition 0 keeps the trace's own)."""
    if rep == 0:
        return workload
    out = list(workload)
    random.Random(f"agentkv-sim-grid:{rep}").shuffle(out)
    return out


def cycled(workload: Workload, n: int, rate_per_s: float, seed: int) -> Workload:
    """``workload``'s trajectories repeated in order to ``n`` (at least once each), every
    copy a new trajectory (``<id>~<k>``), starting at one Poisson process of
    ``rate_per_s`` (seeded)."""
    if not workload:
        return workload
    total = max(n, len(workload))
    rng = random.Random(f"agentkv-sim-grid-open:{seed}")
    t, out = 0.0, []
    for i in range(total):
        base = workload[i % len(workload)]
        k = i // len(workload)
        tid = base.trajectory_id if k == 0 else f"{base.trajectory_id}~{k}"
        out.append(SimTrajectory(tid, t, base.turns))
        t += rng.expovariate(rate_per_s)
    return tuple(out)


class _Runs:
    """One arm's runs at a point: every trajectory's JCT pooled, and per repetition."""

    def __init__(self) -> None:
        self.pooled: list[float] = []
        self.per_rep: list[tuple[float, float]] = []
        self.reused = self.reusable = 0

    def add(self, stats: RunStats) -> None:
        self.pooled.extend(stats.jct_s)
        self.per_rep.append(_figures(stats.jct_s))
        self.reused += stats.cached_tokens
        self.reusable += stats.reusable_tokens

    @property
    def reuse(self) -> float:
        return self.reused / self.reusable if self.reusable else 0.0


def _point(
    workloads: Sequence[Workload], config: SimConfig, policies: Sequence[str], point: GridPoint
) -> Row:
    """Every arm at one point, once per workload (repetition). Ratios are the geometric
    mean of the repetitions' ratios (each repetition pairs the arm with the baseline on
    the same workload) with a 95% interval; JCT figures and the headroom pool every
    repetition's trajectories."""
    base, limit = _Runs(), _Runs()
    arms = {name: _Runs() for name in policies}
    floored = 0
    lim_cfg = config.with_(pool_fraction=LIMIT_POOL_FRACTION)
    for workload in workloads:
        ws = working_set_blocks(workload, config)
        floored += size_pool(workload, config, ws) > math.ceil(
            config.pool_fraction * ws / config.replicas
        )
        base.add(run_policy(workload, config, make_policy("lru"), working_set=ws))
        limit.add(run_policy(workload, lim_cfg, make_policy("lru"), working_set=ws))
        for name, runs in arms.items():
            runs.add(run_policy(workload, config, make_policy(name), working_set=ws))
    base_mean, base_p95 = _figures(base.pooled)
    limit_mean = _figures(limit.pooled)[0]
    span = base_mean - limit_mean
    cells: dict[str, Cell] = {}
    for name, runs in arms.items():
        mean, p95 = _figures(runs.pooled)
        pairs = list(zip(base.per_rep, runs.per_rep, strict=True))
        cells[name] = Cell(
            _ratio([b[0] / a[0] for b, a in pairs]),
            _ratio([b[1] / a[1] for b, a in pairs]),
            (base_mean - mean) / span if span > 1e-9 else None,
            {"jct_mean_s": mean, "jct_p95_s": p95, "reuse": runs.reuse},
        )
    cells["lru"] = Cell(
        (1.0, None, None),
        (1.0, None, None),
        0.0,
        {
            "jct_mean_s": base_mean,
            "jct_p95_s": base_p95,
            "reuse": base.reuse,
            "limit_jct_mean_s": limit_mean,
            "repetitions": len(workloads),
            "trajectories": len(workloads[0]),
            # the pool sits at its floor (the largest call's blocks), not at the fraction
            "pool_floored": floored == len(workloads),
        },
    )
    return point, cells


def run_sim_grid(
    make_workload: Callable[..., Workload],
    config: SimConfig,
    policies: Sequence[str],
    *,
    concurrencies: Sequence[int] = CONCURRENCIES,
    pools: Sequence[float] = POOLS,
    open_fractions: Sequence[float] = OPEN_FRACTIONS,
    long_tail: bool = True,
    repetitions: int = 1,
    open_trajectories: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Simulate ``policies`` (names) at every grid point; ``make_workload(rate)`` builds
    the workload for Poisson starts at ``rate`` (None: all at time 0, for closed loops),
    and ``make_workload(rate, rep)`` repetition ``rep``'s draw of those starts.
    ``repetitions`` runs each point that many times: closed loops start the trajectories
    in another order each time, open loops draw other arrivals; ratios are the geometric
    mean over repetitions with a 95% interval, JCT figures pool every repetition's
    trajectories. ``open_trajectories`` > 0 runs each open-loop draw over the trajectories
    cycled to that many arrivals (:func:`cycled`; 0: the workload as ``make_workload``
    draws it).
    Returns ``(point, {policy: cell})`` rows, the baseline ``lru`` included."""
    if repetitions < 1:
        raise ConfigError(f"repetitions must be at least 1, got {repetitions}")
    if open_trajectories < 0:
        raise ConfigError(f"open_trajectories must be 0 or more, got {open_trajectories}")
    say = progress or (lambda _msg: None)
    closed = make_workload(None)
    reps = range(repetitions)
    closed_reps = [_order(closed, r) for r in reps]
    rows: list[Row] = []
    for pool in pools:
        for c in concurrencies:
            cfg = config.with_(arrival="closed", concurrency=c, pool_fraction=pool)
            rows.append(_point(closed_reps, cfg, policies, GridPoint(pool, concurrency=c)))
            say(f"closed c{c} pool {pool:g}")
        top = config.with_(arrival="closed", concurrency=max(concurrencies), pool_fraction=pool)
        stats = run_policy(closed, top, make_policy("lru"))
        sustained = len(closed) / stats.makespan_s if stats.makespan_s > 0 else 0.0
        for frac in open_fractions if sustained > 0 else ():
            rate = frac * sustained
            cfg = config.with_(arrival="poisson", arrival_rate_per_s=rate, pool_fraction=pool)
            point = GridPoint(pool, rate_per_s=rate, open_fraction=frac)
            if open_trajectories:
                draws = [cycled(closed, open_trajectories, rate, r) for r in reps]
            else:
                draws = [make_workload(rate) if r == 0 else make_workload(rate, r) for r in reps]
            rows.append(_point(draws, cfg, policies, point))
            say(f"open {frac:.0%} ({rate:.3f}/s) pool {pool:g}")
        if long_tail:
            gaps = {t.trajectory_id: [u.gap_s or 0.0 for u in t.turns] for t in closed}
            keep = set(long_tail_ids(gaps, q=0.75))
            tail = [t for t in closed if t.trajectory_id in keep]
            if len(tail) >= 2:
                # a slice smaller than 12 trajectories runs once, at its own size
                for conc in sorted({min(c, len(tail)) for c in (4, 12)}):
                    cfg = config.with_(arrival="closed", concurrency=conc, pool_fraction=pool)
                    point = GridPoint(pool, concurrency=conc, slice="long-tail gaps")
                    rows.append(_point([_order(tail, r) for r in reps], cfg, policies, point))
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
                        "mean_ratio_ci": list(cell.mean_ratio[1:]),
                        "p95_ratio": cell.p95_ratio[0],
                        "p95_ratio_ci": list(cell.p95_ratio[1:]),
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

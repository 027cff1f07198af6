"""The operating grid a speed claim is judged on: concurrency x pool, plus open loop.

A claim about speed holds only across a grid, not at one point: closed-loop concurrency
{2, 4, 6, 8, 12, 16} x pool {0.15, 0.3, 0.5} of the working set, open-loop Poisson
arrivals at 50%, 80% and 100% of the stock arm's sustained rate, and a slice of the
trace with long-tail tool gaps. ``agentkv sim --grid`` and ``agentkv bench --grid`` both
sweep it and both render it here: per point and arm, the mean and p95 JCT ratios against
the baseline (with intervals where repetitions give them), the headroom captured, and a
flag where the arm loses (its mean interval's low end under :data:`MEAN_FLOOR`) or costs
the tail (its p95 ratio under :data:`P95_FLOOR`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CONCURRENCIES",
    "MEAN_FLOOR",
    "OPEN_FRACTIONS",
    "P95_FLOOR",
    "POOLS",
    "Cell",
    "GridPoint",
    "long_tail_ids",
    "plot_grid",
    "pool_floored",
    "render_grid",
]

CONCURRENCIES = (2, 4, 6, 8, 12, 16)
POOLS = (0.15, 0.3, 0.5)
OPEN_FRACTIONS = (0.5, 0.8, 1.0)

#: An arm LOSES at a point when its mean-JCT ratio's interval lies below this.
MEAN_FLOOR = 0.98
#: An arm costs the tail at a point when its p95-JCT ratio is below this.
P95_FLOOR = 0.97


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One operating point: a closed loop of ``concurrency`` trajectories, or Poisson
    arrivals at ``rate_per_s`` (``open_fraction`` of the baseline's sustained rate), on
    a pool of ``pool_fraction`` of the working set; ``slice`` names a trace slice."""

    pool_fraction: float
    concurrency: int | None = None
    rate_per_s: float | None = None
    open_fraction: float | None = None
    slice: str = "all"

    @property
    def label(self) -> str:
        """A short row label: ``c12``, ``open 80%``, with the slice when not all."""
        if self.concurrency is not None:
            base = f"c{self.concurrency}"
        else:
            frac = self.open_fraction
            base = f"open {frac:.0%}" if frac is not None else f"open {self.rate_per_s:g}/s"
        return base if self.slice == "all" else f"{base} ({self.slice})"


@dataclass(frozen=True, slots=True)
class Cell:
    """One arm at one point: ratios against the baseline (above 1 is faster), each
    ``(value, ci_low, ci_high)`` (the interval None where there are no repetitions)."""

    mean_ratio: tuple[float, float | None, float | None]
    p95_ratio: tuple[float, float | None, float | None]
    headroom: float | None = None  # (JCT_B - JCT_arm) / (JCT_B - JCT_L), None without L
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def loses(self) -> bool:
        """The mean ratio's interval (or value) lies below :data:`MEAN_FLOOR`."""
        value, low, _ = self.mean_ratio
        return (low if low is not None else value) < MEAN_FLOOR

    @property
    def tail_cost(self) -> bool:
        """The p95 ratio is below :data:`P95_FLOOR`."""
        return self.p95_ratio[0] < P95_FLOOR


def long_tail_ids(gaps_by_trajectory: Mapping[str, Sequence[float]], q: float = 0.9) -> list[str]:
    """The trajectories whose longest tool gap is in the top ``1 - q`` of the trace's
    longest gaps: the slice where a paused context waits longest."""
    longest = {t: max(g) for t, g in gaps_by_trajectory.items() if g}
    if not longest:
        return []
    ranked = sorted(longest.values())
    cut = ranked[min(len(ranked) - 1, int(q * len(ranked)))]
    return sorted(t for t, v in longest.items() if v >= cut)


def pool_floored(cells: Mapping[str, Cell]) -> bool:
    """Did the pool sit at its floor at this point (a cell's ``extra["pool_floored"]``:
    the largest call's blocks, above the fraction asked for)?"""
    return any(c.extra.get("pool_floored") for c in cells.values())


def _ratio(r: tuple[float, float | None, float | None]) -> str:
    value, low, high = r
    if low is None or high is None:
        return f"{value:.2f}"
    return f"{value:.2f} [{low:.2f}, {high:.2f}]"


def render_grid(
    rows: Iterable[tuple[GridPoint, Mapping[str, Cell]]], arms: Sequence[str], baseline: str
) -> str:
    """A markdown table: one row per point, per arm ``mean x / p95 x / headroom``, with
    ``LOST`` or ``TAIL`` where an arm loses or costs the tail, and a summary line.

    A point whose pool sat at its floor (:func:`pool_floored`) shows ``(floor)`` beside its
    pool, and the summary says how many of the flags fell on such points (they still
    count: one context fills the pool there, so every policy serializes the calls)."""
    rows = list(rows)
    head = "| point | pool | " + " | ".join(f"{a} mean × | {a} p95 × | {a} headroom" for a in arms)
    out = [head + " |", "|" + "---|" * (2 + 3 * len(arms))]
    counts = {a: [0, 0, 0, 0, 0] for a in arms}  # points, lost, tail; lost, tail at the floor
    for point, cells in rows:
        floored = pool_floored(cells)
        pool = f"{point.pool_fraction:g}" + (" (floor)" if floored else "")
        parts = [point.label, pool]
        for a in arms:
            cell = cells.get(a)
            if cell is None:
                parts += ["-", "-", "-"]
                continue
            counts[a][0] += 1
            counts[a][1] += cell.loses
            counts[a][2] += cell.tail_cost
            counts[a][3] += cell.loses and floored
            counts[a][4] += cell.tail_cost and floored
            mean = _ratio(cell.mean_ratio) + (" LOST" if cell.loses else "")
            p95 = _ratio(cell.p95_ratio) + (" TAIL" if cell.tail_cost else "")
            hr = (
                "-"
                if cell.headroom is None or not math.isfinite(cell.headroom)
                else f"{cell.headroom:.0%}"
            )
            parts += [mean, p95, hr]
        out.append("| " + " | ".join(parts) + " |")
    out.append("")
    for a in arms:
        n, lost, tail, lost_floor, tail_floor = counts[a]
        at_floor = (
            f" Of these, {lost_floor} lost and {tail_floor} tail-cost points have the pool "
            "at its floor."
            if lost_floor or tail_floor
            else ""
        )
        out.append(
            f"- {a} against {baseline}: lost at {lost} of {n} points (mean interval below "
            f"{MEAN_FLOOR}), tail cost at {tail} of {n} (p95 ratio below {P95_FLOOR}).{at_floor}"
        )
    return "\n".join(out) + "\n"


def plot_grid(
    rows: Iterable[tuple[GridPoint, Mapping[str, Cell]]], arms: Sequence[str], path: str | Path
) -> Path | None:
    """A heat map per arm (rows: points; columns: pools; colour: mean and p95 ratio);
    None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = list(rows)
    labels = list(dict.fromkeys(p.label for p, _ in rows))
    pools = sorted({p.pool_fraction for p, _ in rows})
    fig, axes = plt.subplots(
        2, len(arms), figsize=(3.2 * len(arms) + 1, 0.45 * len(labels) * 2 + 2), squeeze=False
    )
    for j, arm in enumerate(arms):
        for i, (metric, title) in enumerate(((0, "mean ×"), (1, "p95 ×"))):
            grid = [[math.nan] * len(pools) for _ in labels]
            for point, cells in rows:
                cell = cells.get(arm)
                if cell is not None:
                    r = cell.mean_ratio if metric == 0 else cell.p95_ratio
                    grid[labels.index(point.label)][pools.index(point.pool_fraction)] = r[0]
            ax = axes[i][j]
            im = ax.imshow(grid, cmap="RdYlGn", vmin=0.7, vmax=1.5, aspect="auto")
            for y, line in enumerate(grid):
                for x, v in enumerate(line):
                    if math.isfinite(v):
                        ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(pools)), [f"{p:g}" for p in pools])
            ax.set_yticks(range(len(labels)), labels, fontsize=7)
            ax.set_title(f"{arm} {title}", fontsize=9)
            ax.set_xlabel("pool fraction", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6)
    out = Path(path)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out

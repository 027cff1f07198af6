"""Headroom captured, and the intervals a report states, with repetitions as the unit.

Headroom captured by an arm is ``(JCT_B - JCT_arm) / (JCT_B - JCT_L)`` on mean JCT:
0 is stock vLLM (B), 1 is the limit (L, a pool that holds the whole workload), below 0
is slower than B. It is undefined when L is not faster than B (no headroom to capture).

Every interval here is a percentile bootstrap over *units* (see
:func:`agentkv.bench.report._stats.unit_interval`): the repetition when an arm ran twice or
more, the trajectory when it ran once. Arms with as many units as B are resampled
together with B (repetition ``r`` beside repetition ``r``; with one repetition,
trajectory ``i`` beside trajectory ``i``: the same workload item).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agentkv.bench.report._stats import Interval, unit_interval

__all__ = [
    "ci_unit",
    "headroom",
    "headroom_interval",
    "jct_units",
    "ratio_vs_b",
    "stat_interval",
]

Units = Sequence[Sequence[float]]


def ci_unit(num_reps: int) -> str:
    """What a report's intervals resample: ``repetitions`` (2+) or ``trajectories``."""
    return "repetitions" if num_reps >= 2 else "trajectories"


def jct_units(per_rep: Sequence[Sequence[float]]) -> list[list[float]]:
    """Bootstrap units from each repetition's trajectory JCTs: the repetitions themselves
    when there are two or more, else one unit per trajectory of the single repetition."""
    if len(per_rep) >= 2:
        return [list(r) for r in per_rep]
    return [[v] for r in per_rep for v in r]


def _stat(name: str, a: np.ndarray) -> float:
    if a.size == 0:
        return math.nan
    if name == "mean":
        return float(np.mean(a))
    return float(np.quantile(a, int(name[1:]) / 100.0))


def stat_interval(units: Units, stat: str = "mean", *, seed: int = 0) -> Interval:
    """``stat`` (``mean`` or ``pNN``) of the pooled values with its interval over units."""
    return unit_interval([units], lambda xs: _stat(stat, xs[0]), seed=seed)


def ratio_vs_b(b: Units, arm: Units, stat: str = "mean", *, seed: int = 0) -> Interval:
    """``stat(B) / stat(arm)``: above 1 means the arm finished faster than B."""

    def ratio(xs: list[np.ndarray]) -> float:
        d = _stat(stat, xs[1])
        return _stat(stat, xs[0]) / d if d > 0 else math.nan

    return unit_interval([b, arm], ratio, seed=seed)


def headroom(jct_b: float, jct_arm: float, jct_l: float) -> float:
    """``(B - arm) / (B - L)``; NaN when L is not faster than B."""
    gap = jct_b - jct_l
    if not (gap > 0 and math.isfinite(jct_arm)):
        return math.nan
    return (jct_b - jct_arm) / gap


def headroom_interval(b: Units, arm: Units, limit: Units, *, seed: int = 0) -> Interval:
    """Headroom captured on mean JCT with its interval (NaN bounds when undefined in
    more than 5% of the resamples: L's gain over B is within noise)."""

    def captured(xs: list[np.ndarray]) -> float:
        return headroom(*(_stat("mean", x) for x in xs))

    return unit_interval([b, arm, limit], captured, seed=seed)

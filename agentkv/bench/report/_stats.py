"""Statistics of a benchmark run: quantiles, bootstrap intervals, ratios against B.

Pure functions over lists of numbers. Intervals are percentile-bootstrap intervals:
the data are resampled with replacement ``num_resamples`` times (seeded, so a report is
reproducible), the statistic is computed on each resample, and the interval is the
``alpha/2`` and ``1 - alpha/2`` quantiles of those values.

:func:`bootstrap_interval` and :func:`ratio_interval` resample single values.
:func:`unit_interval` resamples *units*, each a group of values: the benchmark's reports
use it with the repetition as the unit when an arm ran twice or more (trajectories of
one replay share the server's load and are not independent), and with the trajectory as
the unit when it ran once. Series with as many units as each other are resampled
together (the same unit indices for every series: repetition ``r`` of arm B beside
repetition ``r`` of the other arm), otherwise each on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Interval",
    "bootstrap_interval",
    "quantile",
    "ratio_interval",
    "summarize",
    "unit_interval",
]

Statistic = Callable[["np.ndarray"], float]


@dataclass(frozen=True, slots=True)
class Interval:
    """A point estimate with its confidence interval."""

    value: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, float]:
        """``{value, ci_low, ci_high}`` rounded for reports."""
        return {
            "value": round(self.value, 6),
            "ci_low": round(self.ci_low, 6),
            "ci_high": round(self.ci_high, 6),
        }


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation; NaN for no data."""
    if not values:
        return math.nan
    return float(np.quantile(np.asarray(values, dtype=float), q))


def _stat_fn(stat: str | Statistic) -> Statistic:
    if callable(stat):
        return stat
    if stat == "mean":
        return lambda a: float(np.mean(a))
    if stat.startswith("p") and stat[1:].isdigit():
        q = int(stat[1:]) / 100.0
        return lambda a: float(np.quantile(a, q))
    raise ValueError(f"unknown statistic {stat!r}: use 'mean', 'p50', 'p95', ... or a function")


def bootstrap_interval(
    values: Sequence[float],
    stat: str | Statistic = "mean",
    *,
    num_resamples: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> Interval:
    """Point estimate and percentile-bootstrap interval of ``stat`` over ``values``."""
    fn = _stat_fn(stat)
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Interval(math.nan, math.nan, math.nan)
    point = fn(data)
    if data.size == 1:
        return Interval(point, point, point)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, data.size, size=(num_resamples, data.size))
    samples = np.array([fn(data[row]) for row in idx])
    lo, hi = np.quantile(samples, [alpha / 2, 1 - alpha / 2])
    return Interval(point, float(lo), float(hi))


def ratio_interval(
    baseline: Sequence[float],
    candidate: Sequence[float],
    stat: str | Statistic = "mean",
    *,
    num_resamples: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> Interval:
    """``stat(baseline) / stat(candidate)`` with a bootstrap interval.

    For job completion times, a value above 1 means the candidate is faster.
    """
    fn = _stat_fn(stat)
    b = np.asarray(baseline, dtype=float)
    c = np.asarray(candidate, dtype=float)
    if b.size == 0 or c.size == 0:
        return Interval(math.nan, math.nan, math.nan)
    denom = fn(c)
    point = fn(b) / denom if denom > 0 else math.nan
    rng = np.random.default_rng(seed)
    bi = rng.integers(0, b.size, size=(num_resamples, b.size))
    ci = rng.integers(0, c.size, size=(num_resamples, c.size))
    ratios = []
    for rb, rc in zip(bi, ci, strict=True):
        d = fn(c[rc])
        if d > 0:
            ratios.append(fn(b[rb]) / d)
    if not ratios:
        return Interval(point, math.nan, math.nan)
    lo, hi = np.quantile(np.asarray(ratios), [alpha / 2, 1 - alpha / 2])
    return Interval(point, float(lo), float(hi))


def _pooled(units: Sequence[np.ndarray], idx: np.ndarray) -> np.ndarray:
    return np.concatenate([units[i] for i in idx]) if len(idx) else np.empty(0)


def unit_interval(
    series: Sequence[Sequence[Sequence[float]]],
    statistic: Callable[[list[np.ndarray]], float],
    *,
    num_resamples: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> Interval:
    """``statistic`` over several series of units, with a bootstrap interval over units.

    ``series[k][u]`` holds the values of unit ``u`` (a repetition, or one trajectory) of
    series ``k`` (an arm). A resample draws units with replacement, pools the values of
    the drawn units, and calls ``statistic`` with one array per series. Resamples where
    the statistic is undefined (NaN) are dropped; when more than ``alpha`` of them are,
    the interval is NaN (the data cannot bound it).
    """
    units = [[np.asarray(u, dtype=float) for u in s] for s in series]
    if not units or any(not s for s in units):
        return Interval(math.nan, math.nan, math.nan)
    point = statistic([np.concatenate(s) for s in units])
    rng = np.random.default_rng(seed)
    counts = {len(s) for s in units}
    paired = len(counts) == 1
    shared = rng.integers(0, counts.pop(), size=(num_resamples, len(units[0]))) if paired else None
    draws = [
        shared if shared is not None else rng.integers(0, len(s), size=(num_resamples, len(s)))
        for s in units
    ]
    values = np.array(
        [
            statistic([_pooled(s, d[i]) for s, d in zip(units, draws, strict=True)])
            for i in range(num_resamples)
        ]
    )
    defined = values[np.isfinite(values)]
    if defined.size < (1 - alpha) * num_resamples:
        return Interval(point, math.nan, math.nan)
    lo, hi = np.quantile(defined, [alpha / 2, 1 - alpha / 2])
    return Interval(point, float(lo), float(hi))


def summarize(values: Sequence[float], *, seed: int = 0) -> dict[str, float]:
    """p50/p95/p99/mean with the mean's and p95's intervals (keys end in ``_s`` by
    convention of the caller)."""
    mean = bootstrap_interval(values, "mean", seed=seed)
    p95 = bootstrap_interval(values, "p95", seed=seed)
    return {
        "p50": quantile(values, 0.50),
        "p95": quantile(values, 0.95),
        "p99": quantile(values, 0.99),
        "mean": mean.value,
        "mean_ci_low": mean.ci_low,
        "mean_ci_high": mean.ci_high,
        "p95_ci_low": p95.ci_low,
        "p95_ci_high": p95.ci_high,
    }

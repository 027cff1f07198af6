"""Bootstrap statistics on data whose answers are known."""

from __future__ import annotations

import math
import random

import pytest

from agentkv.bench.report._stats import bootstrap_interval, quantile, ratio_interval


def test_quantile_interpolates_linearly() -> None:
    """The median of 1..4 is 2.5; an empty sample is NaN."""
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([5.0], 0.99) == 5.0
    assert math.isnan(quantile([], 0.5))


def test_constant_data_give_a_zero_width_interval() -> None:
    """No spread, no uncertainty."""
    iv = bootstrap_interval([3.0] * 20, "mean")
    assert iv.value == iv.ci_low == iv.ci_high == 3.0


def test_mean_interval_covers_the_true_mean_and_shrinks_with_n() -> None:
    """A 95% interval of a large normal sample covers its mean; more data, narrower."""
    rng = random.Random(1)
    small = [rng.gauss(10.0, 2.0) for _ in range(30)]
    large = [rng.gauss(10.0, 2.0) for _ in range(600)]
    a = bootstrap_interval(small, "mean", seed=2)
    b = bootstrap_interval(large, "mean", seed=2)
    assert b.ci_low < 10.0 < b.ci_high
    assert a.ci_low <= a.value <= a.ci_high
    assert (b.ci_high - b.ci_low) < (a.ci_high - a.ci_low)
    # the half-width is close to 1.96 * sigma / sqrt(n)
    assert (b.ci_high - b.ci_low) / 2 == pytest.approx(1.96 * 2.0 / math.sqrt(600), rel=0.25)


def test_ratio_interval_of_a_known_speedup() -> None:
    """Baseline twice as slow: ratio near 2 and its interval holds 2; equal samples hold 1."""
    rng = random.Random(5)
    cand = [rng.uniform(1.0, 2.0) for _ in range(400)]
    base = [2.0 * x for x in cand]
    r = ratio_interval(base, cand, "mean", seed=3)
    assert r.value == pytest.approx(2.0)
    assert r.ci_low <= 2.0 <= r.ci_high
    same = ratio_interval(cand, cand, "p95", seed=3)
    assert same.value == 1.0 and same.ci_low <= 1.0 <= same.ci_high


def test_bootstrap_is_reproducible_for_a_seed() -> None:
    """A report recomputed from the same data gives the same interval."""
    data = [1.0, 4.0, 2.0, 8.0, 5.0]
    assert bootstrap_interval(data, "p95", seed=9) == bootstrap_interval(data, "p95", seed=9)
    assert math.isnan(bootstrap_interval([], "mean").value)

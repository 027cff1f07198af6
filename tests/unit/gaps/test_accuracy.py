"""Sketch accuracy on the shared real traces, and property tests of the estimates."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv import GapModel
from agentkv.gaps._cli import learn_trace
from agentkv.traces import load_trace
from tests.support.requires import unavailable

TRACES = Path(__file__).resolve().parents[4] / "shared" / "data" / "traces"
TRACE_FILES = ["openhands_swebv_claude35.jsonl", "openhands_v1_sdk_conversations.jsonl"]
NOW = 1_800_000_000.0


def _trace_path(name: str) -> Path:
    for base in (TRACES, Path("/work/shared/data/traces")):
        if (base / name).exists():
            return base / name
    unavailable(f"shared trace {name} is not available here")


def _rank_interval(x: np.ndarray, v: float) -> tuple[float, float]:
    """Fractions of the samples strictly below and at-or-below ``v``."""
    return float(np.mean(x < v)), float(np.mean(x <= v))


@pytest.mark.parametrize("name", TRACE_FILES)
def test_sketch_is_within_one_percent_rank_of_exact_quantiles(name):
    """Classes with >= 100 samples: p50/p90/p99 within 1% rank error of numpy's."""
    trace = load_trace(_trace_path(name))
    model = GapModel()
    learn_trace(model, trace, at=NOW)
    exact: dict[tuple[str, str], list[float]] = defaultdict(list)
    for traj in trace.trajectories:
        for turn in traj.turns:
            if turn.tool_name is None:
                continue
            for kind, v in (("idle", turn.tool_gap_s), ("tool", turn.tool_exec_s)):
                if v is not None:
                    exact[(kind, turn.tool_name)].append(v)
                    exact[(kind, "*")].append(v)
    checked = 0
    for (kind, cls), values in sorted(exact.items()):
        if len(values) < 100:
            continue
        x = np.asarray(values)
        est = model.estimate(cls, kind=kind, fallback=False)
        assert est.n == len(values)
        for q, got in ((0.5, est.p50), (0.9, est.p90), (0.99, est.p99)):
            below, at_or_below = _rank_interval(x, got)
            assert below - 0.01 <= q <= at_or_below + 0.01, (
                f"{name} {kind}/{cls} q={q}: sketch {got:.4g} has rank "
                f"[{below:.4f}, {at_or_below:.4f}], numpy {np.quantile(x, q):.4g}"
            )
            checked += 1
    assert checked >= 9  # both tools and the pool, at least


gaps = st.lists(
    st.floats(min_value=0.0, max_value=1e5, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=300,
)
ages = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(values=gaps, times=st.lists(ages, min_size=1, max_size=300))
def test_estimates_are_monotone_in_the_quantile(values, times):
    m = GapModel(min_samples=1, half_life_s=3600.0)
    for i, v in enumerate(values):
        m.observe("t", v, at=NOW + times[i % len(times)])
    qs = [m.quantile("t", q / 50) for q in range(51)]
    assert all(a <= b + 1e-9 * max(1.0, abs(b)) for a, b in itertools.pairwise(qs))
    est = m.estimate("t")
    assert est.p50 <= est.p90 + 1e-9 and est.p90 <= est.p99 + 1e-9
    assert min(values) - 1e-9 <= qs[0] and qs[-1] <= max(values) + 1e-9


@settings(max_examples=60, deadline=None)
@given(values=gaps, q=st.sampled_from([0.1, 0.25, 0.5, 0.75, 0.9, 0.99]), age=ages)
def test_same_age_samples_give_the_exact_quantiles(values, q, age):
    """Same age -> same weight: the estimate is the plain sample quantile (rank error)."""
    m = GapModel(min_samples=1, half_life_s=60.0)
    for v in values:
        m.observe("t", v, at=NOW - age)
    got = m.quantile("t", q)
    x = np.asarray(values)
    eps = 0.01 + 1.0 / len(x)  # the sketch's rank error, plus one sample's rank
    lo = float(np.quantile(x, max(0.0, q - eps), method="lower"))
    hi = float(np.quantile(x, min(1.0, q + eps), method="higher"))
    assert lo - 1e-9 * max(1.0, lo) <= got <= hi + 1e-9 * max(1.0, hi)

"""CostModel: the seed's formulas, load pressure, measurements, and load parsing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentkv.advice._costmodel import CostModel, LoadSnapshot, compute_pressure
from agentkv.client._load import LoadTracker, load_from_stats, parse_prometheus_load


def test_formulas_match_the_seed() -> None:
    cm = CostModel(
        bytes_per_token=1000,
        platform="cuda",
        prefill_tokens_per_s=2000,
        reload_bytes_per_s=1e6,
        overhead_s=0.01,
        kv_capacity_bytes=1e9,
    )
    load = LoadSnapshot(kv_usage=0.9, num_waiting=0, has_lower_tier=True)
    bd = cm.compute(4000, 10.0, load)
    s = 4000 * 1000
    assert bd.prefix_bytes == s
    assert bd.memory_cost_per_byte_s == pytest.approx(compute_pressure(load) / 1e9)
    assert bd.retain_cost_s == pytest.approx(s * 10.0 * bd.memory_cost_per_byte_s)
    assert bd.reload_s == pytest.approx(s / 1e6 + 0.01)
    assert bd.recompute_s == pytest.approx(4000 / 2000)
    assert bd.rebuild_s == min(bd.reload_s, bd.recompute_s)


def test_no_lower_tier_means_no_reload_option() -> None:
    bd = CostModel(platform="cpu").compute(1000, 5.0, LoadSnapshot(has_lower_tier=False))
    assert bd.reload_s is None
    assert bd.cheapest in ("retain", "recompute")


@given(st.floats(0, 1), st.floats(0, 1), st.integers(0, 100))
def test_pressure_is_monotone_in_usage_and_bounded(u1: float, u2: float, waiting: int) -> None:
    lo, hi = sorted((u1, u2))
    p_lo = compute_pressure(LoadSnapshot(kv_usage=lo, num_waiting=waiting))
    p_hi = compute_pressure(LoadSnapshot(kv_usage=hi, num_waiting=waiting))
    assert p_lo <= p_hi
    assert 0.01 <= p_lo <= 1.5


def test_waiting_requests_raise_pressure() -> None:
    idle = compute_pressure(LoadSnapshot(kv_usage=0.5))
    queued = compute_pressure(LoadSnapshot(kv_usage=0.5, num_waiting=4))
    assert queued > idle


def test_prefill_measurements_replace_then_average_the_default() -> None:
    cm = CostModel(platform="cpu")
    cm.observe_prefill(10, 1.0)  # too small to count
    assert cm.num_prefill_observations == 0
    cm.observe_prefill(1000, 1.0)
    assert cm.prefill_tokens_per_s == pytest.approx(1000)
    cm.observe_prefill(2000, 1.0)
    assert 1000 < cm.prefill_tokens_per_s < 2000
    cm.observe_prefill(1000, float("nan"))
    assert math.isfinite(cm.prefill_tokens_per_s)


def test_reload_measurement_creates_a_bandwidth() -> None:
    cm = CostModel(platform="cpu")
    assert cm.reload_bytes_per_s is None
    cm.observe_reload(2e9, 1.0)
    assert cm.reload_bytes_per_s == pytest.approx(2e9)


def test_capacity_from_capabilities() -> None:
    cm = CostModel(bytes_per_token=100)
    cm.set_capacity(num_blocks=64, block_size=32)
    assert cm.kv_capacity_bytes == 64 * 32 * 100


def test_parse_prometheus_metrics() -> None:
    text = (
        "# HELP vllm:kv_cache_usage_perc KV usage\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7\n'
        'vllm:num_requests_waiting{engine="0"} 3.0\n'
        'vllm:num_requests_waiting{engine="1"} 1.0\n'
        "vllm:other 5\n"
    )
    snap = parse_prometheus_load(text, has_lower_tier=True)
    assert snap == LoadSnapshot(kv_usage=pytest.approx(0.6), num_waiting=4, has_lower_tier=True)
    assert parse_prometheus_load("garbage{{{ nan\n") == LoadSnapshot()


def test_load_from_stats_tolerates_garbage() -> None:
    assert load_from_stats({"kv_usage": 0.4, "num_waiting": 2}) == LoadSnapshot(0.4, 2)
    assert load_from_stats({"kv_usage": "x"}) == LoadSnapshot()


def test_load_tracker_age() -> None:
    tr = LoadTracker(max_age_s=1.0)
    assert tr.needs_refresh(now_ns=0)
    tr.update(LoadSnapshot(kv_usage=0.3), now_ns=0)
    assert not tr.needs_refresh(now_ns=500_000_000)
    assert tr.needs_refresh(now_ns=1_000_000_000)
    assert tr.get().kv_usage == 0.3

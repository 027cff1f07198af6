"""The plugin's Prometheus series: ``agentkv_*`` names, base units, a lag histogram."""

from __future__ import annotations

import prometheus_client
import pytest

from agentkv._prometheus import iter_samples
from agentkv.residency import PolicySettings
from agentkv.residency._book import TrajectoryBook
from agentkv.residency._lag import LAG_BUCKETS_S
from agentkv.vllm._metrics import StatsCollector, metric_name


def _render(snapshot: dict[str, object]) -> dict[str, float]:
    registry = prometheus_client.CollectorRegistry()
    collector = StatsCollector()
    collector.snapshot = snapshot  # type: ignore[assignment]
    registry.register(collector)  # type: ignore[arg-type]
    text = prometheus_client.generate_latest(registry).decode()
    assert ":" not in "".join(line.split(" ")[0].split("{")[0] for line in text.splitlines())
    return {
        name + "".join(f"{{{k}={v}}}" for k, v in sorted(labels.items())): value
        for name, labels, value in iter_samples(text)
    }


def test_series_are_agentkv_underscore_names_in_base_units_with_a_lag_histogram() -> None:
    book: TrajectoryBook[int] = TrajectoryBook(PolicySettings(), 64)
    for lag_ms in (3.0, 40.0, 40.0, 700.0, 120_000.0):
        book.record_lag_ms(lag_ms)
    snapshot: dict[str, object] = dict(book.stats())
    snapshot.update(return_lag_ms=250.0, kv_usage=0.5, num_blocks=63, internal_errors=2)
    snapshot["hint_lag_seconds"] = book.lags.histogram()
    samples = _render(snapshot)
    assert samples["agentkv_leases_created_total"] == 0
    assert samples["agentkv_internal_errors_total"] == 2
    assert samples["agentkv_return_lag_seconds"] == 0.25
    assert samples["agentkv_num_blocks"] == 63 and samples["agentkv_kv_usage"] == 0.5
    assert samples["agentkv_hint_lag_seconds_count"] == 5
    assert samples["agentkv_hint_lag_seconds_sum"] == pytest.approx(120.783)
    assert samples["agentkv_hint_lag_seconds_bucket{le=0.005}"] == 1
    assert samples["agentkv_hint_lag_seconds_bucket{le=0.05}"] == 3
    assert samples["agentkv_hint_lag_seconds_bucket{le=1.0}"] == 4
    assert samples["agentkv_hint_lag_seconds_bucket{le=60.0}"] == 4
    assert samples["agentkv_hint_lag_seconds_bucket{le=+Inf}"] == 5
    assert not any("hint_lag_ms" in name or name.startswith("agentkv:") for name in samples)
    assert len([n for n in samples if n.startswith("agentkv_hint_lag_seconds_bucket")]) == len(
        LAG_BUCKETS_S
    ) + 1


def test_metric_names_convert_milliseconds_to_seconds() -> None:
    assert metric_name("return_lag_ms", 1500.0) == ("agentkv_return_lag_seconds", 1.5)
    assert metric_name("leases_created", 3.0) == ("agentkv_leases_created", 3.0)

"""The plugin's series in vLLM's ``/metrics``: the stats snapshot in Prometheus form.

The control route (:mod:`agentkv.vllm._control`) registers one :class:`StatsCollector`
in vLLM's registry and hands it the latest stats snapshot on each scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["StatsCollector", "metric_name"]


class StatsCollector:
    """Prometheus collector serving the last stats snapshot as ``agentkv_*`` series.

    Names follow Prometheus conventions: ``agentkv_<stat>``; counters get
    ``prometheus_client``'s ``_total``; durations are in seconds (a ``<stat>_ms`` is
    served as ``agentkv_<stat>_seconds``); the lag of lifecycle events is the histogram
    ``agentkv_hint_lag_seconds`` (the JSON stats' median ``hint_lag_ms_p50`` is not a
    series: a quantile cannot be aggregated across servers).
    """

    GAUGES = frozenset(
        {
            "leases_active",
            "retained_blocks",
            "free_blocks",
            "return_lag_ms",
            "kv_usage",
            "num_waiting",
            "num_blocks",
            "trajectories_tracked",
            "tenants_tracked",
            "hashes_interned",
            "hash_refs",
            "offload_load_bytes_per_s",
            "offload_store_bytes_per_s",
            "shadow_leases_active",
            "shadow_retained_blocks",
        }
    )
    #: Snapshot keys that are not a series of their own.
    SKIP = frozenset({"hint_lag_ms_p50"})
    HISTOGRAM = "hint_lag_seconds"

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        for name, value in sorted(self.snapshot.items()):
            if name == self.HISTOGRAM:
                hist = _histogram(value)
                if hist is not None:
                    doc = "agentkv scheduler plugin: lifecycle event lag (emitted to received)"
                    yield HistogramMetricFamily(
                        f"agentkv_{name}", doc, buckets=hist[0], sum_value=hist[1]
                    )
                continue
            if name in self.SKIP or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            series, number = metric_name(name, float(value))
            doc = f"agentkv scheduler plugin: {name.replace('_', ' ')}"
            if name in self.GAUGES:
                yield GaugeMetricFamily(series, doc, value=number)
            else:
                yield CounterMetricFamily(series, doc, value=number)


def metric_name(stat: str, value: float) -> tuple[str, float]:
    """The Prometheus series name (without a counter's ``_total``) and value in base
    units of the stats key ``stat``: ``agentkv_<stat>``, milliseconds as seconds."""
    if stat.endswith("_ms"):
        return f"agentkv_{stat[:-3]}_seconds", value / 1000.0
    return f"agentkv_{stat}", value


def _histogram(value: Any) -> tuple[list[tuple[str, float]], float] | None:
    """(cumulative buckets, sum) from the snapshot's histogram entry, or None."""
    try:
        buckets = [(str(le), float(n)) for le, n in value["buckets"]]
        total = float(value["sum_s"])
    except (KeyError, TypeError, ValueError):
        return None
    return (buckets, total) if buckets and buckets[-1][0] == "+Inf" else None

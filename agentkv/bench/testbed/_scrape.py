"""Read a server's counters: vLLM's ``/metrics`` and agentkv's ``/agentkv/v1/stats``.

Both are read before and after a replay; the report shows the difference. A route that
is missing (a stock server has no agentkv route) gives an empty mapping, never an error.
"""

from __future__ import annotations

from typing import Any

import httpx

from agentkv._protocol import STATS_PATH

__all__ = [
    "delta",
    "get_agentkv_stats",
    "get_vllm_metrics",
    "get_vllm_metrics_raw",
    "parse_prometheus",
]

#: vLLM counters the report uses (summed over label sets).
VLLM_COUNTERS = (
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_cached_total",
)


def _root(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum every sample of the Prometheus text ``text`` by sample name (read with
    ``prometheus_client``'s parser)."""
    from agentkv._prometheus import iter_samples

    out: dict[str, float] = {}
    for name, _labels, value in iter_samples(text):
        out[name] = out.get(name, 0.0) + value
    return out


def get_vllm_metrics_raw(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """Every series of ``/metrics`` summed by name; empty when it is unreachable."""
    try:
        r = httpx.get(_root(base_url) + "/metrics", timeout=timeout_s)
        r.raise_for_status()
    except httpx.HTTPError:
        return {}
    return parse_prometheus(r.text)


def get_vllm_metrics(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """vLLM's counters that the report uses; empty when ``/metrics`` is unreachable."""
    parsed = get_vllm_metrics_raw(base_url, timeout_s)
    return {k: parsed[k] for k in VLLM_COUNTERS if k in parsed}


def get_agentkv_stats(base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The plugin's lease counters; empty when the server has no agentkv route."""
    try:
        r = httpx.get(_root(base_url) + STATS_PATH, timeout=timeout_s)
        if r.status_code != 200:
            return {}
        data = r.json()
    except (httpx.HTTPError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """``after - before`` for every numeric key of ``after``."""
    out: dict[str, float] = {}
    for key, value in after.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        prev = before.get(key, 0)
        prev = prev if isinstance(prev, int | float) and not isinstance(prev, bool) else 0
        out[key] = float(value) - float(prev)
    return out

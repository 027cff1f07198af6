"""Read a server's counters: vLLM's ``/metrics`` and agentkv's ``/agentkv/v1/stats``.

Both are read before and after a replay; the report shows the difference. A route that
is missing (a stock server has no agentkv route) gives an empty mapping, never an error.
Behind a router (:func:`read_counters` on a ReplicaSet) every replica is read directly,
summed and kept per replica, beside the router's own counters; :func:`get_placement`
asks the replicas' plugins which of them holds each trajectory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from agentkv.protocol._wire import STATS_PATH
from agentkv.vllm._fanout import combine_stats

__all__ = [
    "Counters",
    "counters_delta",
    "delta",
    "get_agentkv_stats",
    "get_placement",
    "get_vllm_metrics",
    "get_vllm_metrics_raw",
    "parse_prometheus",
    "read_counters",
    "server_urls",
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


Counters = dict[str, Any]


def server_urls(server: Any) -> list[str]:
    """The root URL of a server, or of every replica of a ReplicaSet."""
    return list(getattr(server, "replica_urls", None) or [server.base_url])


def read_counters(server: Any) -> Counters:
    """vLLM's and the plugin's counters of a server, or of every replica of a ReplicaSet:
    ``{"vllm": summed, "agentkv": summed, "replicas": [{"vllm", "agentkv"}, ...],
    "router": the router's own counters}``."""
    per = [
        {"vllm": get_vllm_metrics(u), "agentkv": get_agentkv_stats(u)} for u in server_urls(server)
    ]
    vllm: dict[str, float] = {}
    for p in per:
        for key, value in p["vllm"].items():
            vllm[key] = vllm.get(key, 0.0) + value
    stats = [p["agentkv"] for p in per if p["agentkv"]]
    agentkv = combine_stats(stats) if len(stats) > 1 else (stats[0] if stats else {})
    router: dict[str, float] = {}
    metrics_url = getattr(server, "router_metrics_url", None)
    if metrics_url:
        try:
            parsed = parse_prometheus(httpx.get(metrics_url, timeout=10.0).text)
            router = {k: v for k, v in parsed.items() if k.startswith("vllm_router_")}
        except httpx.HTTPError:
            router = {}
    return {"vllm": vllm, "agentkv": agentkv, "replicas": per, "router": router}


def counters_delta(before: Counters, after: Counters) -> Counters:
    """``after - before``, in total and per replica."""
    return {
        "vllm": delta(before["vllm"], after["vllm"]),
        "agentkv": delta(before["agentkv"], after["agentkv"]),
        "replicas": [
            {"vllm": delta(b["vllm"], a["vllm"]), "agentkv": delta(b["agentkv"], a["agentkv"])}
            for b, a in zip(before["replicas"], after["replicas"], strict=True)
        ],
        "router": delta(before["router"], after["router"]),
    }


def get_placement(
    server: Any, trajectory_ids: Sequence[str], tenant: str = "bench"
) -> dict[str, int]:
    """trajectory id -> index of the replica whose plugin knows it (plugin arms only).

    The plugin keys a trajectory by the cache salt its calls carried, so each query names
    the salt of the replay's ``tenant`` (the bench's client uses the default namespace).
    """
    from agentkv.prefix._namespace import CacheNamespace
    from agentkv.protocol._wire import SALT_HEADER

    urls = server_urls(server)
    headers = {SALT_HEADER: CacheNamespace().cache_salt(tenant)}
    out: dict[str, int] = {}
    with httpx.Client(timeout=10.0, headers=headers) as client:
        for tid in trajectory_ids:
            for i, url in enumerate(urls):
                try:
                    r = client.get(f"{url}/agentkv/v1/trajectories/{tid}")
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    out[tid] = i
                    break
    return out

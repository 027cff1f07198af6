"""Metrics, sweeps, ``results.json`` and plots.

The metrics match ``agentkv bench``:

- ``prefix_reuse_ratio``: prompt tokens served from cache (pool or lower tier) / prompt
  tokens that were reusable (each turn's shared prefix with the previous turn);
- ``rebuild_tax``: reusable prefix tokens that had to be recomputed / all prefill tokens
  computed;
- ``jct_*_s``: trajectory completion time, first call to last answer, tool gaps included.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError
from agentkv._version import __version__
from agentkv.sim._config import SimConfig
from agentkv.sim._engine import RunStats, run_policy, size_pool, working_set_blocks
from agentkv.sim._policies import Policy, make_policy
from agentkv.sim._workload import (
    SimTrajectory,
    reusable_tokens,
    reuse_ceiling_tokens,
)

__all__ = [
    "find_elbow",
    "percentile",
    "plot_results",
    "simulate",
    "summarize",
    "sweep",
    "write_results",
]

PolicySpec = str | Callable[[], Policy]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def summarize(stats: RunStats, ceiling_tokens: int) -> dict[str, Any]:
    """Turn a run's raw totals into the benchmark's metrics (plus simulator extras)."""
    jct = stats.jct_s
    return {
        "prefix_reuse_ratio": _ratio(stats.cached_tokens, stats.reusable_tokens),
        "rebuild_tax": _ratio(stats.rebuilt_tokens, stats.prefill_tokens_computed),
        "jct_p50_s": percentile(jct, 50),
        "jct_p95_s": percentile(jct, 95),
        "jct_p99_s": percentile(jct, 99),
        "jct_mean_s": sum(jct) / len(jct) if jct else 0.0,
        "preemptions": stats.preemptions,
        "reuse_ceiling": _ratio(ceiling_tokens, stats.reusable_tokens),
        "cached_tokens": stats.cached_tokens,
        "lower_tier_tokens": stats.lower_tier_tokens,
        "lower_tier_load_bytes": stats.lower_tier_load_blocks * stats.block_bytes,
        "lower_tier_store_bytes": stats.lower_tier_store_blocks * stats.block_bytes,
        "reusable_tokens": stats.reusable_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "prefill_tokens_computed": stats.prefill_tokens_computed,
        "rebuilt_tokens": stats.rebuilt_tokens,
        "mean_queue_wait_s": _ratio(stats.queue_wait_s, stats.num_turns),
        "makespan_s": stats.makespan_s,
        "evictions": stats.evictions,
        "leases_forced": stats.leases_forced,
        "num_turns": stats.num_turns,
        "num_trajectories": len(jct),
        "pool_blocks": stats.pool_blocks,
        "core": dict(stats.core),
        "engine_busy_s": stats.busy_s,  # summed over replicas
        "utilization": _ratio(stats.busy_s, stats.makespan_s),  # per replica when 1
    }


def _build(spec: PolicySpec) -> Policy:
    return make_policy(spec) if isinstance(spec, str) else spec()


def _name(spec: PolicySpec) -> str:
    return spec if isinstance(spec, str) else _build(spec).name


def simulate(
    workload: Sequence[SimTrajectory],
    config: SimConfig | None = None,
    policies: Iterable[PolicySpec] = ("lru", "agentkv", "oracle"),
    *,
    working_set: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Run each policy (a fresh instance per run) and return ``{name: metrics}``.

    ``working_set`` (blocks, see :func:`working_set_blocks`) is measured when not given
    and the pool is sized by fraction.
    """
    cfg = config or SimConfig()
    ceiling = reuse_ceiling_tokens(workload, cfg.block_size)
    if working_set is None and cfg.pool_blocks is None:
        working_set = working_set_blocks(workload, cfg)
    out: dict[str, dict[str, Any]] = {}
    for spec in policies:
        policy = _build(spec)
        stats = run_policy(workload, cfg, policy, working_set=working_set)
        metrics = summarize(stats, ceiling)
        metrics["policy"] = policy.describe()
        out[policy.name] = metrics
    return out


def sweep(
    workload_for: Callable[[float | None], Sequence[SimTrajectory]],
    config: SimConfig,
    policies: Sequence[PolicySpec],
    *,
    pool_fractions: Sequence[float] = (0.5,),
    arrival_rates: Sequence[float | None] = (None,),
    replicas: Sequence[int] = (1,),
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Simulate every pool fraction x arrival rate x replica count; return ``results.json``.

    ``workload_for(rate)`` builds the workload for an arrival rate (``None``: the
    config's). ``policies`` in the result is the first sweep entry.
    """
    if not pool_fractions:
        raise ConfigError("give at least one pool fraction, e.g. --pool-fraction 0.25")
    t0 = time.perf_counter()
    entries: list[dict[str, Any]] = []
    manifest_workload: dict[str, Any] = {}
    for rate in arrival_rates:
        rate_v = config.arrival_rate_per_s if rate is None else rate
        workload = workload_for(rate_v)
        ws = working_set_blocks(workload, config.with_(arrival_rate_per_s=rate_v))
        if not manifest_workload:
            manifest_workload = {
                "num_trajectories": len(workload),
                "num_turns": sum(len(t.turns) for t in workload),
                "working_set_blocks": ws,
                "reusable_tokens": reusable_tokens(workload),
                "reuse_ceiling_tokens": reuse_ceiling_tokens(workload, config.block_size),
            }
        for n in replicas:
            for frac in pool_fractions:
                cfg = config.with_(pool_fraction=frac, replicas=n, arrival_rate_per_s=rate_v)
                entries.append(
                    {
                        "pool_fraction": frac,
                        "pool_blocks": size_pool(workload, cfg, ws),
                        "arrival_rate_per_s": rate_v,
                        "replicas": n,
                        "policies": simulate(workload, cfg, policies, working_set=ws),
                    }
                )
    return {
        "policies": entries[0]["policies"],
        "sweep": entries,
        "manifest": {
            "tool": "agentkv sim",
            "agentkv_version": __version__,
            "source": source or {},
            "workload": manifest_workload,
            "config": _config_dict(config),
            "policies": [_name(p) for p in policies],
            "pool_fractions": list(pool_fractions),
            "arrival_rates_per_s": [
                config.arrival_rate_per_s if r is None else r for r in arrival_rates
            ],
            "replicas": list(replicas),
            "wall_s": round(time.perf_counter() - t0, 3),
        },
    }


def _config_dict(config: SimConfig) -> dict[str, Any]:
    cost = config.cost
    tier = config.lower_tier
    return {
        "block_size": config.block_size,
        "pool_blocks": config.pool_blocks,
        "kv_bytes_per_token": config.kv_bytes_per_token,
        "max_num_seqs": config.max_num_seqs,
        "queue": config.queue,
        "routing": config.routing,
        "seed": config.seed,
        "prefill_tokens_per_s": cost.prefill_tokens_per_s,
        "attention_s_per_token2": cost.attention_s_per_token2,
        "decode_s_per_token": cost.decode_s_per_token,
        "step_base_s": cost.step_base_s,
        "overhead_s": cost.overhead_s,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "arrival": config.arrival,
        "concurrency": config.concurrency,
        "lower_tier": None
        if tier is None
        else {
            "capacity_blocks": tier.capacity_blocks,
            "bandwidth_bytes_per_s": tier.bandwidth_bytes_per_s,
            "latency_s": tier.latency_s,
        },
    }


def find_elbow(results: dict[str, Any], policy: str = "lru") -> float:
    """The pool fraction where ``policy``'s reuse curve bends most.

    That is the point furthest from the chord between the curve's two ends (the knee of
    a convex curve lies below the chord, of a concave one above it).
    """
    pts = sorted(
        (e["pool_fraction"], e["policies"][policy]["prefix_reuse_ratio"])
        for e in results["sweep"]
        if policy in e["policies"]
    )
    if len(pts) < 3:
        return pts[0][0] if pts else 0.0
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
    return float(max(pts, key=lambda p: (abs(p[1] - (y0 + slope * (p[0] - x0))), -p[0]))[0])


def write_results(results: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``results.json`` into ``out_dir`` (created if needed); return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def plot_results(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Plot reuse and JCT p50 against pool fraction, one line per policy (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    first = results["sweep"][0]
    entries = [
        e
        for e in results["sweep"]
        if e["replicas"] == first["replicas"]
        and e["arrival_rate_per_s"] == first["arrival_rate_per_s"]
    ]
    names = list(first["policies"])
    paths = []
    for metric, label, fname in (
        ("prefix_reuse_ratio", "prefix reuse ratio", "reuse_vs_pool.png"),
        ("jct_p50_s", "JCT p50 (s)", "jct_vs_pool.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in names:
            xs = [e["pool_fraction"] for e in entries]
            ys = [e["policies"][name][metric] for e in entries]
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xlabel("KV pool (fraction of working set)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths

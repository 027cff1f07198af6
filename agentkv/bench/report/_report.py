"""Aggregate repetitions into ``results.json`` and ``report.md``.

``results.json`` holds ``manifest``, ``arms`` (the first pool fraction: the headline)
and ``sweep`` (every pool fraction). Each run arm holds ``jct_p50_s``, ``jct_p95_s``,
``jct_p99_s``, ``jct_mean_s``, ``prefix_reuse_ratio``, ``rebuild_tax``,
``preemptions`` and ``ratio_vs_B: {value, ci_low, ci_high}`` (B's mean JCT over the
arm's: above 1 is better), ``headroom_captured: {value, ci_low, ci_high}`` when arm L
ran (``(JCT_B - JCT_arm) / (JCT_B - JCT_L)`` on mean JCT, see
:mod:`agentkv.bench.report._headroom`), ``ci_unit`` (what the intervals resample: repetitions,
or trajectories when the arm ran once) and ``reuse_vs_oracle`` (the arm's reuse over the
simulator's oracle on the same workload and pool, see :mod:`agentkv.bench.report._simcheck`);
an arm that did not run holds ``not_run: REASON`` only. ``simulator`` maps each pool
fraction to the oracle's and each arm's simulated reuse and JCT.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentkv.bench.report._calldiff import real_calls
from agentkv.bench.report._headroom import (
    ci_unit,
    headroom_interval,
    jct_units,
    ratio_vs_b,
    stat_interval,
)
from agentkv.bench.report._manifest import make_manifest
from agentkv.bench.report._replicas import replica_lines, summarize_replicas
from agentkv.bench.report._simcheck import SimInputs, sim_routing, simulate_bench
from agentkv.bench.report._simtable import fmt, simulator_lines
from agentkv.bench.report._stats import quantile
from agentkv.bench.report._testbedtable import render_testbed_lines
from agentkv.bench.run._runner import RepResult
from agentkv.client._tier import COUNTERS as TIER_COUNTERS
from agentkv.residency import Counters

__all__ = ["aggregate_arm", "build_results", "write_report"]

# Only the plugin's monotone counters add up across repetitions: its stats also carry
# levels (leases held, blocks, hashes interned, KV usage, quantiles) whose before/after
# difference means nothing and can be negative.
_COUNTERS = frozenset(f.name for f in dataclasses.fields(Counters)) | {
    "internal_errors",
    "events_unknown_trajectory",
    "control_calls",
    "control_requests_limited",  # counted by the API server's control route
    *TIER_COUNTERS,  # the plugin's tier split, where the server has a tier
}


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, 6)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _jcts(reps: list[RepResult]) -> list[float]:
    return [t.jct_s for r in reps for t in r.replay.trajectories if t.ok]


def _units(reps: list[RepResult]) -> list[list[float]]:
    """Bootstrap units of an arm: its repetitions (2+), else its trajectories."""
    ordered = sorted(reps, key=lambda r: r.rep)
    return jct_units([[t.jct_s for t in r.replay.trajectories if t.ok] for r in ordered])


def _reuse_ratio(turns: list[Any]) -> float | None:
    """Tokens served from the cache over the eligible shared prefixes of ``turns``
    (completed calls that reported usage)."""
    eligible = sum(u.eligible_prefix_tokens for u in turns)
    reused = sum(min(u.cached_tokens or 0, u.eligible_prefix_tokens) for u in turns)
    return reused / eligible if eligible else None


def _reuse_per_rep(reps: list[RepResult]) -> list[float | None]:
    """Each repetition's prefix reuse (in repetition order): the spread a simulated
    figure is compared against, since one real replay's timing differs from the next."""
    return [
        _reuse_ratio(
            [
                u
                for t in r.replay.trajectories
                for u in t.turns
                if u.ok and u.cached_tokens is not None
            ]
        )
        for r in sorted(reps, key=lambda r: r.rep)
    ]


def _per_turn_processes(reps: list[RepResult]) -> dict[str, Any] | None:
    """CPU seconds and run-queue waits per replayed turn, pooled over repetitions."""
    sampled = [r.processes for r in reps if r.processes and r.processes.get("cpu_s")]
    turns = sum(int(p.get("turns") or 0) for p in sampled)
    if not sampled or not turns:
        return None
    out: dict[str, Any] = {}
    for key in ("cpu_s", "runqueue_wait_s"):
        total: dict[str, float] = defaultdict(float)
        for p in sampled:
            for role, value in (p.get(key) or {}).items():
                total[role] += value
        out[key] = {role: value / turns for role, value in total.items()}
    loads = [x for p in sampled for x in (p.get("load_avg_1m") or []) if x is not None]
    out["load_avg_1m_range"] = [min(loads), max(loads)] if loads else None
    return out


def _per_call(with_usage: list[Any], reps: list[RepResult]) -> dict[str, Any]:
    """The arm's raw per-call figures: ``turn_samples`` (for fitting the simulator's cost
    model, ``agentkv sim --calibrate``) and ``calls_per_rep`` (every completed call's
    [cached, eligible, sent_s, latency_s] per repetition, see :mod:`agentkv.bench.report._calldiff`)."""
    return {
        "turn_samples": [
            {
                "prompt_tokens": u.prompt_tokens,
                "cached_tokens": u.cached_tokens,
                "output_tokens": u.output_tokens,
                "ttft_s": u.ttft_s,
                "latency_s": u.latency_s,
            }
            for u in with_usage
        ],
        "calls_per_rep": [
            real_calls(r.replay.trajectories) for r in sorted(reps, key=lambda r: r.rep)
        ],
    }


#: Why an arm's tier split is None.
NO_TIER_REASON = (
    "the server exported no KV offload counters (no lower tier: the CPU build, or an arm "
    "run without offload)"
)


def tier_split(scrapes: list[dict[str, float]]) -> dict[str, Any]:
    """The tier split of an arm, per repetition on average, from vLLM's own counters:
    device prefix-cache hits, lower-tier hits (``vllm:external_prefix_cache_hits``), the
    connector's loads and stores in bytes and seconds and the bandwidth they achieved;
    ``None`` figures and a ``reason`` where the server has no tier."""
    n = max(1, len(scrapes))

    def total(name: str) -> float:
        return sum(s.get(name, 0.0) for s in scrapes)

    has_tier = any("vllm:kv_offload_load_bytes_total" in s for s in scrapes)
    local = total("vllm:prefix_cache_hits_total") / n
    if not has_tier:
        return {"local_hit_tokens": local, "tier_hit_tokens": None, "load_bytes": None,
                "store_bytes": None, "load_bytes_per_s": None, "reason": NO_TIER_REASON}  # fmt: skip
    load_b, load_s = (
        total("vllm:kv_offload_load_bytes_total"),
        total("vllm:kv_offload_load_time_total"),
    )
    store_b = total("vllm:kv_offload_store_bytes_total")
    store_s = total("vllm:kv_offload_store_time_total")
    return {
        "local_hit_tokens": local,
        "tier_hit_tokens": total("vllm:external_prefix_cache_hits_total") / n,
        "load_bytes": load_b / n,
        "load_s": load_s / n,
        "store_bytes": store_b / n,
        "store_s": store_s / n,
        "load_bytes_per_s": load_b / load_s if load_s > 0 else None,
        "store_bytes_per_s": store_b / store_s if store_s > 0 else None,
        "reason": None,
    }


def aggregate_arm(
    reps: list[RepResult],
    baseline: list[RepResult],
    seed: int = 0,
    limit: list[RepResult] | None = None,
) -> dict[str, Any]:
    """Summary of one arm's repetitions (``baseline``: arm B's, for the ratios;
    ``limit``: arm L's, for the headroom captured)."""
    jct = _jcts(reps)
    turns = [u for r in reps for t in r.replay.trajectories for u in t.turns if u.ok]
    with_usage = [u for u in turns if u.cached_tokens is not None]
    recomputed = sum(max(u.eligible_prefix_tokens - (u.cached_tokens or 0), 0) for u in with_usage)
    prefill = sum(max(u.prompt_tokens - (u.cached_tokens or 0), 0) for u in with_usage)
    ttft = [u.ttft_s for u in turns if u.ttft_s is not None]
    n = len(reps)
    units = _units(reps)
    mean_ci = stat_interval(units, "mean", seed=seed)
    p95_ci = stat_interval(units, "p95", seed=seed)
    counters: dict[str, float] = defaultdict(float)
    for r in reps:
        for k, v in r.agentkv.items():
            if k in _COUNTERS:
                counters[k] += v
    preempt = sum(r.vllm.get("vllm:num_preemptions_total", 0.0) for r in reps)
    out: dict[str, Any] = {
        "repetitions": n,
        "ci_unit": ci_unit(n),
        "trajectories": len(jct),
        "failed_turns": sum(
            1 for r in reps for t in r.replay.trajectories for u in t.turns if not u.ok
        ),
        "jct_p50_s": quantile(jct, 0.5),
        "jct_p95_s": quantile(jct, 0.95),
        "jct_p99_s": quantile(jct, 0.99),
        "jct_mean_s": mean_ci.value,
        "jct_mean_ci_s": [mean_ci.ci_low, mean_ci.ci_high],
        "jct_p95_ci_s": [p95_ci.ci_low, p95_ci.ci_high],
        "achieved_rate_per_s": sum(len(r.replay.trajectories) / r.replay.wall_s for r in reps) / n,
        "ttft_p50_s": quantile(ttft, 0.5),
        "ttft_p95_s": quantile(ttft, 0.95),
        "prefix_reuse_ratio": _reuse_ratio(with_usage),
        "prefix_reuse_per_rep": _reuse_per_rep(reps),
        "rebuild_tax": recomputed / prefill if prefill else None,
        "recomputed_tokens": recomputed / n,
        "prefill_tokens": prefill / n,
        "preemptions": preempt / n,
        "preemptions_total": preempt,
        "agentkv_counters": dict(counters),
        "tier": tier_split([r.vllm for r in reps]),
        "per_turn_processes": _per_turn_processes(reps),
        "cold_verified": all(r.cold_verified for r in reps),
        "cache_resets": sorted({r.cache_reset for r in reps}),
        "client_wrapped": all(r.replay.client_wrapped for r in reps),
        "client_stats_last_rep": reps[-1].replay.client_stats if reps else None,
        "jct_samples_s": jct,
        **_per_call(with_usage, reps),
        "trajectory_starts_s": [t.started_s for r in reps for t in r.replay.trajectories if t.ok],
    }
    replicas = summarize_replicas(reps)
    if replicas is not None:
        out["replicas"] = replicas
    base = _units(baseline)
    if base and jct:
        out["ratio_vs_B"] = ratio_vs_b(base, units, "mean", seed=seed).to_dict()
        out["p95_ratio_vs_B"] = ratio_vs_b(base, units, "p95", seed=seed).to_dict()
    if base and jct and limit:
        out["headroom_captured"] = headroom_interval(
            base, units, _units(limit), seed=seed
        ).to_dict()
    return out


def build_results(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``results.json`` document."""
    cfg = raw["config"]
    by: dict[tuple[float, str], list[RepResult]] = defaultdict(list)
    for r in raw["reps"]:
        by[(r.pool_fraction, r.arm)].append(r)
    sweep: dict[str, dict[str, Any]] = {}
    limit = by[(cfg.pool_fractions[0], "L")]  # L's pool does not depend on the fraction
    for fraction in cfg.pool_fractions:
        arms: dict[str, Any] = {}
        for arm in cfg.arms:
            if arm in raw["not_run"]:
                arms[arm] = {"not_run": raw["not_run"][arm]}
                continue
            mine = limit if arm == "L" else by[(fraction, arm)]
            arms[arm] = aggregate_arm(mine, by[(fraction, "B")], cfg.seed, limit)
            arms[arm]["description"] = raw["descriptions"][arm]
        sweep[f"{fraction:g}"] = arms
    headline = sweep[f"{cfg.pool_fractions[0]:g}"]
    results: dict[str, Any] = _clean(
        {
            "format": "agentkv-bench-results/1",
            "manifest": make_manifest(raw),
            "pool_fraction": cfg.pool_fractions[0],
            "arms": headline,
            "sweep": sweep,
            **({"replicas": raw["replicas"]} if raw.get("replicas", {}).get("router") else {}),
            "testbed": raw.get("testbed") or {},
        }
    )
    return results


def _ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "–"
    return f"{fmt(r['value'])}× [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]"


def _share(r: dict[str, Any] | None) -> str:
    """A headroom share as a percentage with its interval."""
    if not r or r.get("value") is None:
        return "–"

    def pct(v: Any) -> str:
        return "?" if v is None else f"{100 * v:.0f}%"

    return f"{pct(r['value'])} [{pct(r.get('ci_low'))}, {pct(r.get('ci_high'))}]"


def _ci_sentence(reps: int) -> str:
    if reps >= 2:
        return (
            f"Intervals are 95% bootstrap intervals over the {reps} repetitions (each "
            "repetition resampled whole, the arms' repetitions side by side)."
        )
    return (
        "Intervals are 95% bootstrap intervals over trajectories: one repetition ran, so "
        "they show the spread between trajectories, not between runs; run --reps 3 or "
        "more for intervals over repetitions."
    )


def render_markdown(results: dict[str, Any], plots: list[str]) -> str:
    """``report.md`` text."""
    m = results["manifest"]
    lines = [
        "# agentkv bench report",
        "",
        f"- trace: `{m['trace']['path']}` (sha256 `{m['trace']['trace_sha256'][:16]}…`), "
        f"{m['trace']['num_trajectories']} trajectories, {m['trace']['num_turns']} turns",
        f"- arrivals: {m['arrival']['label']}",
        f"- scaling: tokens ×{m['scaling']['token_scale']:g}, time ×{m['scaling']['time_scale']:g}, "
        f"max trajectories {m['scaling']['max_trajectories']}, max turns {m['scaling']['max_turns']}",
        f"- pool: {results['pool_fraction']:g} of the working set "
        f"({m['working_set_tokens']} tokens); repetitions: {m['repetitions']}, arm order shuffled",
        f"- platform: {m['platform']['device']}, {m['platform']['system']}, "
        f"vLLM {m['vllm_version']}, agentkv {m['agentkv_version']}",
        f"- client gap model: {(m.get('gap_warmup') or {}).get('description', 'not recorded')}",
        "",
        "JCT is a trajectory's completion time (first request to last answer, tool gaps "
        "included). Ratios are B's mean (or p95) JCT over the arm's: above 1 is better than "
        "B. Headroom captured is (JCT_B - JCT_arm) / (JCT_B - JCT_L) on mean JCT: 0 is B, "
        "1 is the limit L (a pool that holds the whole workload). Reuse / oracle is the "
        "arm's prefix reuse over the simulator's oracle on the same workload and pool.",
        "",
        _ci_sentence(m["repetitions"]),
        "",
        "| arm | what | JCT p50 s | JCT p95 s | JCT p99 s | JCT mean s [95% CI] | mean vs B | p95 vs B "
        "| headroom captured | TTFT p50 s | reuse | reuse / oracle | rebuild tax "
        "| preemptions/rep | cold |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, arm in results["arms"].items():
        if "not_run" in arm:
            lines.append(f"| {name} | not run: {arm['not_run']} |" + " |" * 13)
            continue
        ci = arm.get("jct_mean_ci_s") or [None, None]
        lines.append(
            f"| {name} | {arm['description']} | {fmt(arm['jct_p50_s'])} | {fmt(arm['jct_p95_s'])} "
            f"| {fmt(arm['jct_p99_s'])} | {fmt(arm['jct_mean_s'])} [{fmt(ci[0])}, {fmt(ci[1])}] "
            f"| {_ratio(arm.get('ratio_vs_B'))} | {_ratio(arm.get('p95_ratio_vs_B'))} "
            f"| {_share(arm.get('headroom_captured'))} "
            f"| {fmt(arm['ttft_p50_s'], '.3f')} | {fmt(arm['prefix_reuse_ratio'], '.3f')} "
            f"| {fmt(arm.get('reuse_vs_oracle'), '.2f')} "
            f"| {fmt(arm['rebuild_tax'], '.3f')} | {fmt(arm['preemptions'], '.1f')} "
            f"| {'yes' if arm['cold_verified'] else 'NO'} |"
        )
    lines += _testbed_section(results)
    lines += simulator_lines(results)
    lines += ["", "## Lease counters (agentkv plugin, summed over repetitions)", ""]
    for name, arm in results["arms"].items():
        if "not_run" not in arm and arm.get("agentkv_counters"):
            c = {k: int(v) for k, v in arm["agentkv_counters"].items() if v}
            lines.append(f"- {name}: {c or 'no activity'}")
    lines += replica_lines(results)
    if len(results["sweep"]) > 1:
        lines += [
            "",
            "## Pool sweep",
            "",
            "| pool fraction | arm | JCT mean s | reuse | reuse / oracle | vs B | headroom captured |",
            "|---|---|---|---|---|---|---|",
        ]
        for frac, arms in results["sweep"].items():
            for name, arm in arms.items():
                if "not_run" not in arm:
                    lines.append(
                        f"| {frac} | {name} | {fmt(arm['jct_mean_s'])} "
                        f"| {fmt(arm['prefix_reuse_ratio'], '.3f')} "
                        f"| {fmt(arm.get('reuse_vs_oracle'), '.2f')} "
                        f"| {_ratio(arm.get('ratio_vs_B'))} | {_share(arm.get('headroom_captured'))} |"
                    )
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    lines += ["", "## Manifest", "", "```json", json.dumps(m, indent=2), "```", ""]
    return "\n".join(lines)


def _testbed_section(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Testbed costs",
        "",
        "Measured on each server right after it started, through the bench's own client: the "
        "fixed per-turn cost is the time to first token of a cached short prompt with one "
        "output token, split by vLLM's request histograms into client (request build, HTTP, "
        "first chunk back), API server (set-up, engine hops, output processing) and engine "
        "(queue + the step computing one token). A caching gain can only show above these "
        "costs.",
        "",
    ]
    testbed = results.get("testbed") or {}
    if testbed:
        lines += render_testbed_lines(testbed)
    else:
        lines.append("Not measured in this run.")
    rows = [
        (name, arm["per_turn_processes"])
        for name, arm in results["arms"].items()
        if "not_run" not in arm and arm.get("per_turn_processes")
    ]
    if rows:
        roles = ("client", "api_server", "engine_core", "worker")
        lines += [
            "",
            "During the replays, CPU ms per turn (and ms per turn spent ready to run while both "
            "cores were busy: CPU contention):",
            "",
            "| arm | client | API server | engine core | worker | load avg (1 min) |",
            "|---|---|---|---|---|---|",
        ]
        for name, p in rows:
            cells = []
            for role in roles:
                cpu = p["cpu_s"].get(role)
                wait = p["runqueue_wait_s"].get(role)
                cells.append(
                    "–" if cpu is None else f"{cpu * 1000:.0f} ({(wait or 0.0) * 1000:.0f})"
                )
            load = p.get("load_avg_1m_range") or ["–", "–"]
            lines.append(
                f"| {name} | {' | '.join(cells)} | {fmt(load[0], '.1f')}–{fmt(load[1], '.1f')} |"
            )
    return lines


def add_simulator(results: dict[str, Any], raw: dict[str, Any], path: Path | None) -> None:
    """Simulate the run's own workload per pool fraction (cost model fitted from
    ``path``, this run's results.json) and set each arm's ``reuse_vs_oracle``."""
    cfg = raw["config"]
    run = [a for a in cfg.arms if a not in raw["not_run"]]
    results["simulator"] = {}
    for pool in raw["pools"]:
        key = f"{pool['pool_fraction']:g}"
        inputs = SimInputs(
            workload=raw["workload"],
            arrival=cfg.arrival,
            block_size=pool["block_size"],
            pool_blocks=pool["pool_blocks"],
            limit_blocks=raw.get("limit_pool_blocks"),
            fp8_arms=frozenset(raw.get("fp8_arms") or ()),
            system_prefix_tokens=cfg.scaling.system_prefix_tokens,
            **sim_routing(results),
            testbed=(raw.get("testbed") or {}).get(f"B@{key}"),
            gap_warmup=raw.get("warmup"),
            real_calls={
                name: arm["calls_per_rep"]
                for name, arm in (results["sweep"].get(key) or {}).items()
                if arm.get("calls_per_rep")
            },
        )
        sim = _clean(simulate_bench(inputs, run, path))
        results["simulator"][key] = sim
        oracle = sim["oracle"]["prefix_reuse_ratio"]
        tables = [results["sweep"][key]]
        if key == f"{results['pool_fraction']:g}":
            tables.append(results["arms"])
        for name, arm in (item for t in tables for item in t.items()):
            if "not_run" in arm:
                continue
            reuse = arm.get("prefix_reuse_ratio")
            # L's pool is larger than the one the oracle ran on: no ratio for it
            fair = name != "L" and reuse is not None and oracle
            arm["reuse_vs_oracle"] = reuse / oracle if fair else None
            arm["oracle_reuse_ratio"] = oracle
            arm["sim_prefix_reuse_ratio"] = sim["arms"][name]["prefix_reuse_ratio"]


def write_report(raw: dict[str, Any], out_dir: str | Path) -> tuple[dict[str, Any], list[Path]]:
    """Write ``results.json``, ``report.md`` and the plots; return results and files."""
    from agentkv.bench.report._plots import make_plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = build_results(raw)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    add_simulator(results, raw, out / "results.json")
    plots = make_plots(results, out)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_markdown(results, [str(p) for p in plots]), "utf-8")
    return results, [out / "results.json", out / "report.md", *plots]

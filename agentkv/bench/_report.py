"""Aggregate repetitions into ``results.json`` and ``report.md``.

``results.json`` holds ``manifest``, ``arms`` (the first pool fraction: the headline)
and ``sweep`` (every pool fraction). Each run arm holds ``jct_p50_s``, ``jct_p95_s``,
``jct_p99_s``, ``jct_mean_s``, ``prefix_reuse_ratio``, ``rebuild_tax``,
``preemptions`` and ``ratio_vs_B: {value, ci_low, ci_high}`` (B's mean JCT over the
arm's: above 1 is better); an arm that did not run holds ``not_run: REASON`` only.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentkv.bench._manifest import make_manifest
from agentkv.bench._runner import RepResult
from agentkv.bench._stats import bootstrap_interval, quantile, ratio_interval

__all__ = ["aggregate_arm", "build_results", "write_report"]

# plugin figures that are levels, not counters: a before/after difference means nothing
_GAUGES = {"leases_active", "retained_blocks", "num_blocks", "free_blocks"}


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


def aggregate_arm(
    reps: list[RepResult], baseline: list[RepResult], seed: int = 0
) -> dict[str, Any]:
    """Summary of one arm's repetitions (``baseline``: arm B's, for the ratios)."""
    jct = _jcts(reps)
    turns = [u for r in reps for t in r.replay.trajectories for u in t.turns if u.ok]
    with_usage = [u for u in turns if u.cached_tokens is not None]
    eligible = sum(u.eligible_prefix_tokens for u in with_usage)
    reused = sum(min(u.cached_tokens or 0, u.eligible_prefix_tokens) for u in with_usage)
    recomputed = sum(max(u.eligible_prefix_tokens - (u.cached_tokens or 0), 0) for u in with_usage)
    prefill = sum(max(u.prompt_tokens - (u.cached_tokens or 0), 0) for u in with_usage)
    ttft = [u.ttft_s for u in turns if u.ttft_s is not None]
    n = len(reps)
    mean_ci = bootstrap_interval(jct, "mean", seed=seed)
    p95_ci = bootstrap_interval(jct, "p95", seed=seed)
    counters: dict[str, float] = defaultdict(float)
    for r in reps:
        for k, v in r.agentkv.items():
            if k not in _GAUGES and not k.endswith(("_p50", "_p95")):
                counters[k] += v
    preempt = sum(r.vllm.get("vllm:num_preemptions_total", 0.0) for r in reps)
    out: dict[str, Any] = {
        "repetitions": n,
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
        "prefix_reuse_ratio": reused / eligible if eligible else None,
        "rebuild_tax": recomputed / prefill if prefill else None,
        "recomputed_tokens": recomputed / n,
        "prefill_tokens": prefill / n,
        "preemptions": preempt / n,
        "preemptions_total": preempt,
        "agentkv_counters": dict(counters),
        "cold_verified": all(r.cold_verified for r in reps),
        "cache_resets": sorted({r.cache_reset for r in reps}),
        "client_wrapped": all(r.replay.client_wrapped for r in reps),
        "client_stats_last_rep": reps[-1].replay.client_stats if reps else None,
        "jct_samples_s": jct,
        # Raw per-call figures, for fitting the simulator's cost model (agentkv sim --calibrate).
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
        "trajectory_starts_s": [t.started_s for r in reps for t in r.replay.trajectories if t.ok],
    }
    base = _jcts(baseline)
    if base and jct:
        out["ratio_vs_B"] = ratio_interval(base, jct, "mean", seed=seed).to_dict()
        out["p95_ratio_vs_B"] = ratio_interval(base, jct, "p95", seed=seed).to_dict()
    return out


def build_results(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``results.json`` document."""
    cfg = raw["config"]
    by: dict[tuple[float, str], list[RepResult]] = defaultdict(list)
    for r in raw["reps"]:
        by[(r.pool_fraction, r.arm)].append(r)
    sweep: dict[str, dict[str, Any]] = {}
    for fraction in cfg.pool_fractions:
        arms: dict[str, Any] = {}
        for arm in cfg.arms:
            if arm in raw["not_run"]:
                arms[arm] = {"not_run": raw["not_run"][arm]}
                continue
            arms[arm] = aggregate_arm(by[(fraction, arm)], by[(fraction, "B")], seed=cfg.seed)
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
        }
    )
    return results


def _fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "–"
    if isinstance(value, float | int):
        return format(value, spec)
    return str(value)


def _ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "–"
    return f"{_fmt(r['value'])}× [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"


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
        "included). Ratios are B's mean (or p95) JCT over the arm's, with 95% bootstrap "
        "intervals: above 1 is better than B.",
        "",
        "| arm | what | JCT p50 s | JCT p95 s | JCT p99 s | JCT mean s [95% CI] | mean vs B | p95 vs B "
        "| TTFT p50 s | reuse | rebuild tax | preemptions/rep | cold |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, arm in results["arms"].items():
        if "not_run" in arm:
            lines.append(f"| {name} | not run: {arm['not_run']} |" + " |" * 11)
            continue
        ci = arm.get("jct_mean_ci_s") or [None, None]
        lines.append(
            f"| {name} | {arm['description']} | {_fmt(arm['jct_p50_s'])} | {_fmt(arm['jct_p95_s'])} "
            f"| {_fmt(arm['jct_p99_s'])} | {_fmt(arm['jct_mean_s'])} [{_fmt(ci[0])}, {_fmt(ci[1])}] "
            f"| {_ratio(arm.get('ratio_vs_B'))} | {_ratio(arm.get('p95_ratio_vs_B'))} "
            f"| {_fmt(arm['ttft_p50_s'], '.3f')} | {_fmt(arm['prefix_reuse_ratio'], '.3f')} "
            f"| {_fmt(arm['rebuild_tax'], '.3f')} | {_fmt(arm['preemptions'], '.1f')} "
            f"| {'yes' if arm['cold_verified'] else 'NO'} |"
        )
    lines += ["", "## Lease counters (agentkv plugin, summed over repetitions)", ""]
    for name, arm in results["arms"].items():
        if "not_run" not in arm and arm.get("agentkv_counters"):
            c = {k: int(v) for k, v in arm["agentkv_counters"].items() if v}
            lines.append(f"- {name}: {c or 'no activity'}")
    if len(results["sweep"]) > 1:
        lines += [
            "",
            "## Pool sweep",
            "",
            "| pool fraction | arm | JCT mean s | reuse | vs B |",
            "|---|---|---|---|---|",
        ]
        for frac, arms in results["sweep"].items():
            for name, arm in arms.items():
                if "not_run" not in arm:
                    lines.append(
                        f"| {frac} | {name} | {_fmt(arm['jct_mean_s'])} "
                        f"| {_fmt(arm['prefix_reuse_ratio'], '.3f')} | {_ratio(arm.get('ratio_vs_B'))} |"
                    )
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    lines += ["", "## Manifest", "", "```json", json.dumps(m, indent=2), "```", ""]
    return "\n".join(lines)


def write_report(raw: dict[str, Any], out_dir: str | Path) -> tuple[dict[str, Any], list[Path]]:
    """Write ``results.json``, ``report.md`` and the plots; return results and files."""
    from agentkv.bench._plots import make_plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = build_results(raw)
    plots = make_plots(results, out)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_markdown(results, [str(p) for p in plots]), "utf-8")
    return results, [out / "results.json", out / "report.md", *plots]

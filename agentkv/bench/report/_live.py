"""The live-agent bench's ``results.json`` and ``report.md``, kept apart from replay figures.

Per arm: accepted outcomes (count, rate and its difference from B with an interval),
outcomes by kind, turns per task, JCT p50/p95/p99 and mean (intervals), JCT per
accepted outcome, the worst tenant's mean JCT, prefix reuse and rebuild tax (the
client's own accounting), preemptions, output agreement with B (task transcripts,
repetition by repetition, beside B's agreement with its own repetitions; and the
agreement prompts' token ids, each prompt alone); and the same figures per task. The
document says ``"kind": "live"``; the gates of :mod:`agentkv.bench.report._gate` are
part of it.

Intervals resample repetitions (two or more), else tasks; B and an arm are resampled
together (repetition ``r`` beside repetition ``r``; task ``i`` beside task ``i``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentkv.bench.report._gate import evaluate_gates, gate_failure, render_gates
from agentkv.bench.report._headroom import ci_unit
from agentkv.bench.report._stats import Interval, quantile

__all__ = ["build_live_results", "render_live_markdown", "write_live_report"]

OUTCOMES = ("accepted", "rejected", "step_limit", "failed")


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, 6)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _units(reps: Sequence[Any]) -> list[list[Any]]:
    """Units of an arm: its repetitions' task runs (2+ repetitions), else one per task."""
    ordered = sorted(reps, key=lambda r: r.rep)
    if len(ordered) >= 2:
        return [list(r.live.tasks) for r in ordered]
    return [[t] for r in ordered for t in r.live.tasks]


def paired_interval(
    series: Sequence[Sequence[Sequence[Any]]],
    statistic: Callable[[list[list[Any]]], float],
    *,
    num_resamples: int = 1000,
    seed: int = 0,
) -> Interval:
    """``statistic`` over series of units (any objects), with a 95% bootstrap interval;
    series of equal length are resampled with the same indices (paired)."""
    if not series or any(not s for s in series):
        return Interval(math.nan, math.nan, math.nan)
    point = statistic([[x for u in s for x in u] for s in series])
    rng = np.random.default_rng(seed)
    n = {len(s) for s in series}
    values = []
    for _ in range(num_resamples):
        shared = rng.integers(0, next(iter(n)), len(series[0])) if len(n) == 1 else None
        picks = [shared if shared is not None else rng.integers(0, len(s), len(s)) for s in series]
        values.append(
            statistic([[x for i in p for x in s[i]] for s, p in zip(series, picks, strict=True)])
        )
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size < 0.95 * num_resamples:
        return Interval(point, math.nan, math.nan)
    lo, hi = np.quantile(arr, [0.025, 0.975])
    return Interval(point, float(lo), float(hi))


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if xs else math.nan


def _rate(runs: list[Any]) -> float:
    return _mean([1.0 if t.accepted else 0.0 for t in runs])


def _jct(runs: list[Any]) -> list[float]:
    return [t.jct_s for t in runs]


def _p95(runs: list[Any]) -> float:
    return quantile(_jct(runs), 0.95)


def _worst_tenant(runs: list[Any]) -> float:
    by: dict[str, list[float]] = defaultdict(list)
    for t in runs:
        by[t.tenant].append(t.jct_s)
    return max((_mean(v) for v in by.values()), default=math.nan)


def _ratio(stat: Callable[[list[Any]], float]) -> Callable[[list[list[Any]]], float]:
    def f(xs: list[list[Any]]) -> float:
        d = stat(xs[1])
        return stat(xs[0]) / d if d > 0 else math.nan

    return f


def _agreement(reps: list[Any], base: list[Any], self_base: bool) -> dict[str, Any]:
    """Share of (repetition, task) transcripts equal to B's; for B itself, share equal
    to B's first repetition (its noise floor)."""
    b_by = {(r.rep, t.task_id): t.transcript() for r in base for t in r.live.tasks}
    b_first = min((r.rep for r in base), default=0)
    same, total, differs = 0, 0, []
    for r in reps:
        if self_base and r.rep == b_first:
            continue
        for t in r.live.tasks:
            key = (b_first, t.task_id) if self_base else (r.rep, t.task_id)
            other = b_by.get(key)
            if other is None:
                continue
            total += 1
            if t.transcript() == other:
                same += 1
            else:
                step = next(
                    (
                        i
                        for i, (a, b) in enumerate(zip(t.transcript(), other, strict=False))
                        if a != b
                    ),
                    min(len(other), len(t.transcript())),
                )
                differs.append({"rep": r.rep, "task": t.task_id, "first_step": step})
    return {"share": same / total if total else math.nan, "compared": total, "differs": differs}


def _probe(reps: list[Any], base: list[Any]) -> tuple[float, list[int], int]:
    mine = next((r.probe for r in sorted(reps, key=lambda r: r.rep) if r.probe is not None), None)
    ref = next((r.probe for r in sorted(base, key=lambda r: r.rep) if r.probe is not None), None)
    if mine is None or ref is None:
        return math.nan, [], 0
    diff = [i for i, (a, b) in enumerate(zip(mine, ref, strict=False)) if a is None or a != b]
    return 1 - len(diff) / max(1, len(ref)), diff, len(ref)


def _reuse(reps: list[Any]) -> tuple[float | None, float | None]:
    eligible = sum(r.client_stats.get("eligible_prefix_tokens") or 0 for r in reps)
    reused = sum(r.client_stats.get("reused_prefix_tokens") or 0 for r in reps)
    recomputed = sum(r.client_stats.get("recomputed_prefix_tokens") or 0 for r in reps)
    prefill = sum(r.client_stats.get("prefill_tokens") or 0 for r in reps)
    return (reused / eligible if eligible else None), (recomputed / prefill if prefill else None)


def _per_task(runs: list[Any]) -> dict[str, Any]:
    by: dict[str, list[Any]] = defaultdict(list)
    for t in runs:
        by[t.task_id].append(t)
    return {
        task: {
            "runs": len(ts),
            "accepted": sum(t.accepted for t in ts),
            "outcomes": {o: sum(t.outcome == o for t in ts) for o in OUTCOMES},
            "turns_mean": _mean([len(t.steps) for t in ts]),
            "jct_mean_s": _mean(_jct(ts)),
            "answers": sorted({t.answer for t in ts if t.answer is not None}),
        }
        for task, ts in by.items()
    }


def aggregate_live_arm(
    reps: list[Any], base: list[Any], fp8: bool, seed: int = 0
) -> dict[str, Any]:
    """Summary of one arm's live repetitions (``base``: arm B's)."""
    runs = [t for r in reps for t in r.live.tasks]
    units, b_units = _units(reps), _units(base)
    jct = _jct(runs)
    accepted = sum(t.accepted for t in runs)
    steps = [s for t in runs for s in t.steps]
    reuse, tax = _reuse(reps)
    rate = paired_interval([units], lambda xs: _rate(xs[0]), seed=seed)
    mean = paired_interval([units], lambda xs: _mean(_jct(xs[0])), seed=seed)
    p95 = paired_interval([units], lambda xs: _p95(xs[0]), seed=seed)
    out: dict[str, Any] = {
        "repetitions": len(reps),
        "ci_unit": ci_unit(len(reps)).replace("trajectories", "tasks"),
        "tasks_run": len(runs),
        "accepted": accepted,
        "accepted_rate": rate.to_dict(),
        "outcomes": {o: sum(t.outcome == o for t in runs) for o in OUTCOMES},
        "invalid_steps": sum(s.kind == "invalid" for s in steps),
        "failed_steps": [
            {"rep": r.rep, "task": t.task_id, "failure": t.failure}
            for r in reps
            for t in r.live.tasks
            if t.failure
        ],
        "turns_per_task": _mean([len(t.steps) for t in runs]),
        "jct_p50_s": quantile(jct, 0.5),
        "jct_p95_s": quantile(jct, 0.95),
        "jct_p99_s": quantile(jct, 0.99),
        "jct_mean_s": mean.value,
        "jct_mean_ci_s": [mean.ci_low, mean.ci_high],
        "jct_p95_ci_s": [p95.ci_low, p95.ci_high],
        "jct_per_accepted_s": sum(jct) / accepted if accepted else None,
        "worst_tenant_jct_s": _worst_tenant(runs),
        "prefix_reuse_ratio": reuse,
        "rebuild_tax": tax,
        "preemptions": _mean([r.vllm.get("vllm:num_preemptions_total", 0.0) for r in reps]),
        "cache_resets": sorted({r.cache_reset for r in reps}),
        "fp8_kv": fp8,
        "per_task": _per_task(runs),
    }
    if base:
        out["accepted_diff_vs_B"] = paired_interval(
            [b_units, units], lambda xs: _rate(xs[1]) - _rate(xs[0]), seed=seed
        ).to_dict()
        out["ratio_vs_B"] = paired_interval(
            [b_units, units], _ratio(lambda r: _mean(_jct(r))), seed=seed
        ).to_dict()
        out["p95_ratio_vs_B"] = paired_interval([b_units, units], _ratio(_p95), seed=seed).to_dict()
        out["worst_tenant_ratio_vs_B"] = paired_interval(
            [b_units, units], _ratio(_worst_tenant), seed=seed
        ).to_dict()
        is_b = reps is base
        live = _agreement(reps, base, self_base=is_b)
        b_self = _agreement(base, base, self_base=True)
        probe, differs_at, prompts = _probe(reps, base)
        out["agreement"] = {
            "live_vs_B": 1.0 if is_b else live["share"],
            "live_compared": live["compared"],
            "live_differs": [] if is_b else live["differs"],
            "B_self": b_self["share"],
            "B_self_compared": b_self["compared"],
            "B_self_differs": b_self["differs"] if is_b else [],
            "probe_vs_B": probe,
            "probe_prompts": prompts,
            "probe_differs_at": differs_at,
        }
    return out


def measured_working_set(reps: list[Any], in_flight: int) -> int | None:
    """``in_flight`` times the mean longest context (prompt + answer tokens) of a task."""
    longest = [
        max((s.prompt_tokens or 0) + (s.completion_tokens or 0) for s in t.steps)
        for r in reps
        for t in r.live.tasks
        if t.steps
    ]
    return round(in_flight * _mean(longest)) if longest else None


def build_live_results(raw: dict[str, Any]) -> dict[str, Any]:
    """The live run's ``results.json`` document, gates included."""
    cfg = raw["config"]
    by: dict[str, list[Any]] = defaultdict(list)
    for r in raw["reps"]:
        by[r.arm].append(r)
    pool = dict(raw["pool"])
    measured = measured_working_set(by["B"], pool.get("tasks_in_flight", 1))
    pool["working_set_tokens_measured_B"] = measured
    pool["pool_fraction_of_measured"] = pool["pool_tokens"] / measured if measured else None
    arms: dict[str, Any] = {}
    for arm in cfg.arms:
        if arm in raw["not_run"]:
            arms[arm] = {"not_run": raw["not_run"][arm]}
            continue
        arms[arm] = aggregate_live_arm(by[arm], by["B"], arm in raw["fp8_arms"], cfg.seed)
        arms[arm]["description"] = raw["descriptions"][arm]
    tasks = raw["tasks"]
    results: dict[str, Any] = _clean(
        {
            "format": "agentkv-bench-live-results/1",
            "kind": "live",
            "manifest": {
                "tasks": tasks.source,
                "num_tasks": len(tasks.tasks),
                "task_ids": [t.task_id for t in tasks.tasks],
                "model": cfg.model,
                "model_dir": raw["model_dir"],
                "platform": raw["platform"],
                "arms": list(cfg.arms),
                "reps": cfg.reps,
                "seed": cfg.seed,
                "agent": {
                    "max_steps": cfg.agent.max_steps,
                    "max_tokens": cfg.agent.max_tokens,
                    "concurrency": cfg.agent.concurrency,
                    "decoding": "greedy (temperature 0), structured outputs (xgrammar)",
                },
                "max_tool_gap_s": cfg.max_gap_s,
                "pool": pool,
                "argv": raw["argv"],
                "agreement_prompts": raw["agreement_prompts"],
                "fp8_kv": raw["fp8_kv"],
            },
            "fp8_arms": raw["fp8_arms"],
            "arms": arms,
        }
    )
    results["gates"] = evaluate_gates(results)
    results["gate_failure"] = gate_failure(results["gates"])
    return results


def _f(v: Any, spec: str, scale: float = 1.0) -> str:
    return format(v * scale, spec) if isinstance(v, int | float) and math.isfinite(v) else "-"


def _iv(r: Any, spec: str, scale: float = 1.0) -> str:
    if not isinstance(r, dict):
        return "-"
    return f"{_f(r.get('value'), spec, scale)} [{_f(r.get('ci_low'), spec, scale)}, {_f(r.get('ci_high'), spec, scale)}]"


def live_table(results: dict[str, Any]) -> list[str]:
    """The per-arm table (markdown lines; the terminal prints them too)."""
    lines = [
        "| arm | accepted | rate [95% CI] | turns/task | JCT mean s [95% CI] | p50 s | p95 s [95% CI] "
        "| p99 s | s per accepted | vs B | reuse | tax | agree tasks | agree prompts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, a in results["arms"].items():
        if "not_run" in a:
            lines.append(f"| {name} | not run: {a['not_run']} |" + " |" * 13)
            continue
        ag = a.get("agreement") or {}
        p95 = a.get("jct_p95_ci_s") or [None, None]
        mean = a.get("jct_mean_ci_s") or [None, None]
        lines.append(
            f"| {name} | {a['accepted']}/{a['tasks_run']} | {_iv(a['accepted_rate'], '.0%')} "
            f"| {_f(a['turns_per_task'], '.2f')} "
            f"| {_f(a['jct_mean_s'], '.2f')} [{_f(mean[0], '.2f')}, {_f(mean[1], '.2f')}] "
            f"| {_f(a['jct_p50_s'], '.2f')} "
            f"| {_f(a['jct_p95_s'], '.2f')} [{_f(p95[0], '.2f')}, {_f(p95[1], '.2f')}] "
            f"| {_f(a['jct_p99_s'], '.2f')} | {_f(a['jct_per_accepted_s'], '.2f')} "
            f"| {_iv(a.get('ratio_vs_B'), '.2f')} | {_f(a['prefix_reuse_ratio'], '.3f')} "
            f"| {_f(a['rebuild_tax'], '.3f')} | {_f(ag.get('live_vs_B'), '.0%')} "
            f"| {_f(ag.get('probe_vs_B'), '.0%')} |"
        )
    return lines


def render_live_markdown(results: dict[str, Any]) -> str:
    """``report.md`` of a live run."""
    m = results["manifest"]
    first: dict[str, Any] = next((a for a in results["arms"].values() if "ci_unit" in a), {})
    lines = [
        "# agentkv bench — live agents",
        "",
        "Live-agent figures: a real agent on a real model, its answers deciding each next "
        "call. They are not comparable with trace-replay figures.",
        "",
        f"Model {m['model']} ({m['platform']}); {m['num_tasks']} tasks from {m['tasks']}; "
        f"{m['reps']} repetition(s), seed {m['seed']}; {m['agent']['concurrency']} tasks in "
        f"flight, at most {m['agent']['max_steps']} steps of {m['agent']['max_tokens']} tokens; "
        f"{m['agent']['decoding']}. KV pool {m['pool']['pool_blocks']} blocks of "
        f"{m['pool']['block_size']} tokens = {m['pool']['pool_fraction']} of the estimated working "
        f"set ({m['pool']['working_set_tokens_estimate']} tokens; "
        f"{_f(m['pool'].get('pool_fraction_of_measured'), '.2f')} of the one measured in B); L: "
        f"{m['pool']['limit_pool_blocks']} blocks.",
        "",
        *live_table(results),
        "",
        f"(95% bootstrap intervals over {first.get('ci_unit', '-')}; vs B = mean JCT of B / the "
        "arm's, above 1 is faster; agree tasks = task transcripts equal to B's in the same "
        f"repetition; agree prompts = {m['agreement_prompts']} prompts sent one at a time, "
        "token-identical answers)",
        "",
        "## Gates",
        "",
        *render_gates(results["gates"]),
        "",
        f"Overall: {'FAIL — ' + results['gate_failure'] if results.get('gate_failure') else 'pass'}",
        "",
        "## KV precision",
        "",
    ]
    fp8 = m["fp8_kv"]
    if not fp8.get("supported"):
        lines.append(
            f"FP8 KV is not available on this build: {fp8.get('reason')}. No FP8 figure is shown."
        )
    elif not results["fp8_arms"]:
        lines.append("No FP8 arm ran (add C or G to --arms).")
    for name in results["fp8_arms"]:
        a = results["arms"][name]
        b = results["arms"].get("B", {})
        ag = a.get("agreement") or {}
        lines.append(
            f"- {name} (FP8 KV): accepted {a['accepted']}/{a['tasks_run']} beside B's "
            f"{b.get('accepted', '-')}/{b.get('tasks_run', '-')}; task transcripts equal to B's "
            f"{_f(ag.get('live_vs_B'), '.0%')} of {ag.get('live_compared', 0)}; agreement prompts "
            f"{_f(ag.get('probe_vs_B'), '.0%')} of {ag.get('probe_prompts', 0)}"
            + (f" (differ at {ag.get('probe_differs_at')})" if ag.get("probe_differs_at") else "")
        )
    lines += [
        "",
        "## Per task",
        "",
        "| task | "
        + " | ".join(a for a in results["arms"] if "not_run" not in results["arms"][a])
        + " |",
    ]
    ran = [a for a in results["arms"] if "not_run" not in results["arms"][a]]
    lines.append("|---|" + "---|" * len(ran))
    for task in m["task_ids"]:
        cells = []
        for arm in ran:
            t = results["arms"][arm]["per_task"].get(task)
            cells.append(
                "-"
                if t is None
                else f"{t['accepted']}/{t['runs']} ok, {_f(t['turns_mean'], '.1f')} turns, "
                f"{_f(t['jct_mean_s'], '.2f')} s"
            )
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines += ["", "## Differences and failures", ""]
    for name in ran:
        a = results["arms"][name]
        ag = a.get("agreement") or {}
        for d in ag.get("B_self_differs") or []:
            lines.append(
                f"- B with itself: rep {d['rep']} task {d['task']} differs from rep 0 from step "
                f"{d['first_step']} (the noise floor of the agreement gate)"
            )
        for d in ag.get("live_differs") or []:
            lines.append(
                f"- {name}: rep {d['rep']} task {d['task']} differs from B from step {d['first_step']}"
            )
        if ag.get("probe_differs_at"):
            lines.append(f"- {name}: agreement prompts {ag['probe_differs_at']} differ from B")
        for f in a.get("failed_steps") or []:
            lines.append(f"- {name}: rep {f['rep']} task {f['task']}: {f['failure']}")
    if lines[-1] == "":
        lines.append("None.")
    return "\n".join(lines) + "\n"


def write_live_report(
    raw: dict[str, Any], out_dir: str | Path
) -> tuple[dict[str, Any], list[Path]]:
    """Write ``results.json`` and ``report.md`` of a live run; return results and files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = build_live_results(raw)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_live_markdown(results), "utf-8")
    return results, [out / "results.json", out / "report.md"]

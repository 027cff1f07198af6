"""The report's simulator section: each arm's real reuse, its spread over repetitions,
and the simulator's forecast for it (see :mod:`agentkv.bench.report._simcheck`)."""

from __future__ import annotations

from typing import Any

__all__ = ["fmt", "oracle_headroom", "pct", "reuse_spread", "simulator_lines"]


def fmt(value: Any, spec: str = ".2f") -> str:
    """``value`` formatted with ``spec``; ``–`` for a missing figure."""
    if value is None:
        return "–"
    if isinstance(value, float | int):
        return format(value, spec)
    return str(value)


_COST_SOURCE = {
    "testbed": "B's testbed figures",
    "turn_samples": "fitted to the per-call samples",
    "aggregates": "fitted to the aggregates",
    "defaults": "the simulator's defaults",
}


def simulator_lines(results: dict[str, Any]) -> list[str]:
    """The report's "simulator on this workload" section (empty when it did not run)."""
    sim = (results.get("simulator") or {}).get(f"{results['pool_fraction']:g}")
    if not sim:
        return []
    o = sim["oracle"]
    cal = sim.get("calibration") or {}
    lines = [
        "",
        "## The simulator on this workload",
        "",
        f"The same scaled trajectories, arrivals, block size and pool through `agentkv.sim`, "
        f"cost model from this run ({_COST_SOURCE.get(str(cal.get('method')), '?')}). Oracle "
        f"(`{o['policy']}`): reuse {fmt(o['prefix_reuse_ratio'], '.3f')}, "
        f"mean JCT {fmt(o['jct_mean_s'])} s." + _bound_sentence(sim),
        "",
        "| arm | simulated policy | real reuse | real reuse per repetition, min–max "
        "| simulated reuse ± sd | real − simulated (pp) | real JCT mean s "
        "| simulated JCT mean s | real headroom | simulated headroom |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, a in sim["arms"].items():
        real = results["arms"].get(name) or {}
        r, s_ = real.get("prefix_reuse_ratio"), a["prefix_reuse_ratio"]
        diff = 100 * (r - s_) if r is not None and s_ is not None else None
        hr = real.get("headroom_captured")
        lines.append(
            f"| {name} | {a['policy']} ({a['queue']}, {a['pool_blocks']} blocks) "
            f"| {fmt(r, '.3f')} | {reuse_spread(real)} | {fmt(s_, '.3f')}{_sd(a)} "
            f"| {fmt(diff, '+.1f')} | {fmt(real.get('jct_mean_s'))} | {fmt(a['jct_mean_s'])} "
            f"| {pct(hr.get('value') if isinstance(hr, dict) else None)} "
            f"| {pct(a.get('headroom'))} |"
        )
    lines += [
        "",
        "The simulated reuse is the mean over an ensemble of timings (each call's fixed "
        "latency drawn around the measured one; ± its spread from one draw to the next); "
        "the real repetitions differ in timing from one another, and their reuse spreads by "
        "the range shown. A simulated figure inside that range is as close as this run "
        "can tell.",
    ]
    return lines


def oracle_headroom(sim: dict[str, Any]) -> float | None:
    """The simulated headroom ``agentkv-oracle`` (the lease policy given every return
    time) took in a ``simulator`` report section; None where it was not simulated or B
    and L were not both run."""
    figures = (sim.get("oracles") or {}).get("agentkv-oracle") or {}
    value = figures.get("headroom")
    return float(value) if isinstance(value, int | float) else None


def _bound_sentence(sim: dict[str, Any]) -> str:
    bound = oracle_headroom(sim)
    if bound is None:
        return ""
    return (
        f" On mean JCT, `agentkv-oracle` (agentkv's policy given every return time) takes "
        f"{pct(bound)} of the simulated headroom between B and L: what the lease policy "
        "would take on this workload and pool with perfect forecasts. Read an arm's "
        "headroom against it as well as against L."
    )


def pct(value: Any) -> str:
    """A share as a whole percentage (``0.25`` -> ``25%``); ``–`` for a missing figure."""
    return f"{100 * float(value):.0f}%" if isinstance(value, int | float) else "–"


def _sd(arm: dict[str, Any]) -> str:
    """`` ± sd`` of an arm's simulated reuse over its ensemble ('' with one draw)."""
    ens = arm.get("ensemble") or {}
    if int(ens.get("runs_per_rep") or 1) < 2:
        return ""
    return f" ± {fmt(ens.get('reuse_sd'), '.3f')}"


def reuse_spread(arm: dict[str, Any]) -> str:
    """``min–max`` of an arm's per-repetition reuse, or ``–`` with fewer than two."""
    values = [v for v in arm.get("prefix_reuse_per_rep") or [] if v is not None]
    if len(values) < 2:
        return "–"
    return f"{min(values):.3f}–{max(values):.3f}"

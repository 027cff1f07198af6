"""The promotion gate: is any agentkv arm worse than stock vLLM (arm B) beyond its interval?

Pure functions over a ``results.json`` document (a replay's or a live run's). For every
arm that ran other than B, A (no prefix caching, an ablation) and L (the limit), four
gates, each ``pass``, ``fail`` or ``n/a`` with a one-line detail:

- ``accepted_outcomes`` (live only): fails when the arm's accepted-outcome rate minus
  B's has its whole interval below 0;
- ``p95_jct``: fails when ``p95(B) / p95(arm)`` has its whole interval below 1;
- ``worst_tenant_jct``: the same on the mean JCT of the slowest tenant (a replay has one
  tenant, so there it is the mean JCT);
- ``output_agreement`` (live only): an arm that keeps B's KV precision must give B's
  answers: it fails when its answers agree with B's less often than B's own repetitions
  agree with each other, or when any agreement prompt's answer differs from B's (the
  differing prompt indices are named). An FP8 arm changes the numbers by design: its
  agreement is reported, and its quality gate is ``accepted_outcomes``.

A gate without an interval (too few repetitions or tasks) compares nothing and passes,
saying so. :func:`gate_failure` is the one-line reason ``agentkv bench --gate`` prints
before exiting non-zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["GATES", "evaluate_gates", "gate_failure", "render_gates"]

GATES = ("accepted_outcomes", "p95_jct", "worst_tenant_jct", "output_agreement")
_NOT_GATED = ("A", "B", "L")


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _interval_text(r: Mapping[str, Any], unit: str = "x") -> str:
    def f(v: Any) -> str:
        return f"{v:.2f}" if _finite(v) else "-"

    return f"{f(r.get('value'))}{unit} [{f(r.get('ci_low'))}, {f(r.get('ci_high'))}]"


def _below(r: Any, bound: float, what: str, unit: str = "x") -> tuple[str, str]:
    """``fail`` when the whole interval of ``r`` lies below ``bound``."""
    if not isinstance(r, Mapping) or not _finite(r.get("value")):
        return "n/a", f"{what}: not measured"
    text = f"{what} {_interval_text(r, unit)}"
    if not _finite(r.get("ci_high")):
        return "pass", text + " (no interval: nothing to compare)"
    if r["ci_high"] < bound:
        return "fail", text + f", all below {bound:g}"
    return "pass", text


def _agreement(arm: Mapping[str, Any], fp8: bool) -> tuple[str, str]:
    agree = arm.get("agreement")
    if not isinstance(agree, Mapping):
        return "n/a", "output agreement: not measured (replay answers are forced lengths)"
    live, base = agree.get("live_vs_B"), agree.get("B_self")
    probe, diff = agree.get("probe_vs_B"), agree.get("probe_differs_at") or []
    parts = []
    if _finite(live):
        parts.append(
            f"tasks {live:.0%} (B with itself {base:.0%})" if _finite(base) else f"tasks {live:.0%}"
        )
    if _finite(probe):
        parts.append(f"prompts {probe:.0%}" + (f", differ at {diff}" if diff else ""))
    text = "output agreement with B: " + ("; ".join(parts) or "none measured")
    if fp8:
        return "n/a", text + " (FP8 KV: reported; judged on accepted outcomes)"
    floor = base if isinstance(base, int | float) and _finite(base) else 1.0
    worse_live = isinstance(live, int | float) and _finite(live) and live < floor - 1e-9
    if worse_live or diff:
        return "fail", text
    return "pass", text


def evaluate_gates(results: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every gate of every gated arm: ``{"arm", "gate", "status", "detail"}``."""
    arms = results.get("arms") or {}
    live = results.get("kind") == "live"
    fp8 = set(results.get("fp8_arms") or results.get("manifest", {}).get("fp8_arms") or [])
    out: list[dict[str, str]] = []
    for name, arm in arms.items():
        if name in _NOT_GATED or not isinstance(arm, Mapping) or "not_run" in arm:
            continue
        checks: dict[str, tuple[str, str]] = {}
        if live:
            checks["accepted_outcomes"] = _below(
                arm.get("accepted_diff_vs_B"), 0.0, "accepted rate - B's", unit=""
            )
        else:
            checks["accepted_outcomes"] = ("n/a", "accepted outcomes: replay has no outcomes")
        checks["p95_jct"] = _below(arm.get("p95_ratio_vs_B"), 1.0, "p95 JCT B/arm")
        worst = arm.get("worst_tenant_ratio_vs_B") if live else arm.get("ratio_vs_B")
        checks["worst_tenant_jct"] = _below(worst, 1.0, "worst tenant's JCT B/arm")
        checks["output_agreement"] = _agreement(arm, name in fp8)
        for gate in GATES:
            status, detail = checks[gate]
            out.append({"arm": name, "gate": gate, "status": status, "detail": detail})
    return out


def gate_failure(gates: list[dict[str, str]]) -> str | None:
    """The one-line reason the gate fails (the first failing gate), or None."""
    failed = [g for g in gates if g["status"] == "fail"]
    if not failed:
        return None
    g = failed[0]
    more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
    return f"gate failed: arm {g['arm']} {g['gate']}: {g['detail']}{more}"


def render_gates(gates: list[dict[str, str]]) -> list[str]:
    """The report's gate table (markdown lines)."""
    if not gates:
        return ["No agentkv arm to gate (only B, A or L ran)."]
    lines = ["| arm | gate | result | detail |", "|---|---|---|---|"]
    lines += [f"| {g['arm']} | {g['gate']} | {g['status']} | {g['detail']} |" for g in gates]
    return lines

"""Tool-gap scale from the machine's measured prefill rate.

What agentkv saves is recompute: a context evicted during a tool gap is rebuilt when the
turn returns. How much that matters depends on how long a rebuild takes next to the gap
itself, and the rebuild's cost is the machine's. A CPU that prefills the tiny model at
35,000 tokens/s rebuilds the demo's mean context (about 1,800 tokens) in 0.05 s; one
without AVX-512, at 2,800 tokens/s, in 0.66 s. With the same gaps the first shows little
of what a policy can win and the second a lot.

:class:`GapScaleRule` picks the time scale after the first servers are up, from the
prefill rate their testbed measurement found (``testbed[ARM@FRACTION].prefill``): the
gaps are scaled so that rebuilding the workload's mean context takes at least
``rebuild_share`` of its mean tool gap, never above ``max_scale`` (slow machines keep the
usual scale, so the run does not grow longer) nor below ``min_scale``. Only the gaps
change: token counts, and so the pool plan, do not.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from agentkv._errors import ConfigError
from agentkv.traces import Trace
from agentkv.workload._workload import Scaling, Workload, make_workload

__all__ = ["GapScaleRule", "describe_gap_scale", "measured_prefill_rate"]


@dataclass(frozen=True)
class GapScaleRule:
    """How a run scales its tool gaps from the measured prefill rate (see the module)."""

    rebuild_share: float = 0.25
    max_scale: float = 0.3
    min_scale: float = 0.05

    def __post_init__(self) -> None:
        if not self.rebuild_share > 0.0:
            raise ConfigError(f"rebuild_share must be above 0, got {self.rebuild_share}")
        if not 0.0 < self.min_scale <= self.max_scale:
            raise ConfigError(
                "gap scales need 0 < min_scale <= max_scale, got "
                f"{self.min_scale} and {self.max_scale}"
            )

    def resolve(
        self, trace: Trace, scaling: Scaling, prefill_tokens_per_s: float | None
    ) -> tuple[Scaling, dict[str, Any]]:
        """``scaling`` with its ``time_scale`` chosen for this machine, and a record of
        why (the figures it came from). Without a usable rate the scale is ``max_scale``
        and the record says so."""
        unit = make_workload(trace, replace(scaling, time_scale=1.0))
        context = _mean_prompt_tokens(unit)
        gaps = [t.tool_gap_s for tr in unit.trajectories for t in tr.turns if t.tool_gap_s]
        gap = statistics.fmean(gaps) if gaps else 0.0
        record: dict[str, Any] = {
            "rule": {
                "rebuild_share": self.rebuild_share,
                "max_scale": self.max_scale,
                "min_scale": self.min_scale,
            },
            "prefill_tokens_per_s": prefill_tokens_per_s,
            "mean_context_tokens": round(context),
            "mean_gap_s_unscaled": gap,
        }
        if not prefill_tokens_per_s or prefill_tokens_per_s <= 0:
            record.update(time_scale=self.max_scale, reason="prefill rate not measured")
            return replace(scaling, time_scale=self.max_scale), record
        rebuild = context / prefill_tokens_per_s
        record["rebuild_s"] = rebuild
        if gap <= 0:
            record.update(time_scale=self.max_scale, reason="the workload has no tool gaps")
            return replace(scaling, time_scale=self.max_scale), record
        wanted = rebuild / (self.rebuild_share * gap)
        scale = min(self.max_scale, max(self.min_scale, wanted))
        if scale >= self.max_scale:
            reason = "rebuilds are dear here: the usual scale"
        elif scale <= self.min_scale:
            reason = "rebuilds are cheap here: the smallest scale"
        else:
            reason = "gaps shortened so a rebuild stays a real share of a gap"
        record.update(time_scale=scale, reason=reason)
        return replace(scaling, time_scale=scale), record


def _mean_prompt_tokens(workload: Workload) -> float:
    prompts = [t.prompt_tokens for tr in workload.trajectories for t in tr.turns]
    return statistics.fmean(prompts) if prompts else 0.0


def measured_prefill_rate(testbed: dict[str, Any], prefer: str = "B") -> float | None:
    """The fresh-prompt prefill rate a run's testbed measured, ``prefer``'s server first
    (entries are keyed ``ARM@FRACTION``); None when no entry has one."""
    keys = sorted(testbed, key=lambda k: (k.split("@", 1)[0] != prefer, k))
    for key in keys:
        entry = testbed.get(key) or {}
        rate = (entry.get("prefill") or {}).get("tokens_per_s")
        if isinstance(rate, int | float) and rate > 0:
            return float(rate)
    return None


def describe_gap_scale(record: dict[str, Any]) -> str:
    """One sentence on a :meth:`GapScaleRule.resolve` record: the scale and what it came
    from."""
    scale = record.get("time_scale")
    head = f"tool gaps x{scale:.2g}"
    rate = record.get("prefill_tokens_per_s")
    rebuild = record.get("rebuild_s")
    if not rate or rebuild is None:
        return f"{head} ({record.get('reason', 'no measurement')})"
    share = (record.get("rule") or {}).get("rebuild_share", 0.0)
    return (
        f"{head}: this machine prefilled {rate:,.0f} tokens/s (measured on the first server), "
        f"so the mean context of {record.get('mean_context_tokens', 0):,} tokens rebuilds in "
        f"{rebuild:.2f} s; gaps are scaled so a rebuild takes at least {share:.0%} of the "
        f"mean gap ({record.get('reason')})"
    )

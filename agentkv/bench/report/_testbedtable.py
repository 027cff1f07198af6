"""The report's testbed section: each server's measured costs, one table row per server
(the figures are :mod:`agentkv.bench.testbed._costs`')."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentkv.bench.testbed._costs import ROLES

__all__ = ["render_testbed_lines"]


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def _rate(value: Any) -> str:
    return "–" if value is None else f"{value:,.0f}"


def render_testbed_lines(testbed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Markdown lines for the report's testbed section (one table row per server)."""
    lines = [
        "| server | fixed turn TTFT ms (client / API server / engine) | cached turn TTFT ms "
        "at the workload's context | prefill tokens/s: fresh / on that context | decode step "
        "ms: short batch 1 / context batch 1 / context batch N | CPU ms per fixed turn "
        "(client / API server / engine core / worker) | load avg |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in testbed.items():
        if "error" in t:
            lines.append(f"| {name} | not measured: {t['error']} |" + " |" * 5)
            continue
        fixed = t.get("fixed_turn") or {}
        split = fixed.get("split") or {}
        long = t.get("cached_long_turn") or {}
        pre = t.get("prefill") or {}
        dec = t.get("decode") or {}
        cpu = fixed.get("cpu_s_per_turn") or {}
        load = t.get("load_avg_1m") or [None, None]
        lines.append(
            f"| {name} | {_ms(fixed.get('client_ttft_s_p50'))} ({_ms(split.get('client_s'))} / "
            f"{_ms(split.get('api_server_s'))} / {_ms(split.get('engine_s'))}) "
            f"| {_ms(long.get('client_ttft_s_p50'))} at {long.get('prompt_tokens', '–')} tokens "
            f"| {_rate(pre.get('tokens_per_s'))} / {_rate(pre.get('at_context_tokens_per_s'))} "
            f"| {_ms(dec.get('short_batch_1_step_s'))} / {_ms(dec.get('batch_1_step_s'))} / "
            f"{_ms(dec.get('batch_n_step_s'))} (N={dec.get('batch_n', '–')}) "
            f"| {' / '.join(_ms(cpu.get(r)) for r in ROLES)} "
            f"| {' → '.join('–' if x is None else f'{x:.1f}' for x in load)} |"
        )
    return lines

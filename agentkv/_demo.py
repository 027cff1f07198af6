"""``agentkv demo``: the whole loop on one machine, no GPU, in under ten minutes.

Builds the tiny local model (once) and replays the bundled real-trace subset (twelve
OpenHands trajectories, see ``agentkv/bench/data/README.md``) against four real vLLM
servers, started together:

- B: stock vLLM with prefix caching, the baseline;
- E: B + agentkv's lease policy (predicted retention, program-level admission);
- G: everything the platform has (E + program-aware scheduling, FP8 KV where the CPU
  supports it);
- L: the limit, B with a pool that holds the whole workload.

The regime is the one agentkv is for: all twelve trajectories in flight at once, a KV
pool of 0.3 of their working set (pressure: contexts cannot all stay resident across
tool gaps), and contexts up to ~3.4k tokens, where recomputing a prefix costs the CPU
model real time (docs/benchmark.md says why this setting). How much real time depends on
the CPU (one with AVX-512 prefills ten times as fast as one without), so the tool gaps'
scale follows from the prefill rate measured on the first server: at most x0.3, shorter
where a rebuild would be a negligible share of a gap (:mod:`agentkv.bench.run._gapscale`);
the output says which scale it chose and why.
It prints each arm's figures, E's and G's speed-up over B and the share of the headroom
between B and L they capture, each with its 95% interval, and says plainly when an arm
is slower than B or its interval includes no change.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from agentkv._errors import AgentKVError

__all__ = [
    "DEMO_ARMS",
    "DEMO_TRACE",
    "add_arguments",
    "demo_config",
    "demo_trace_path",
    "print_side_by_side",
    "run",
    "verdict",
]

DEMO_TRACE = "openhands_swebv_subset.jsonl"
DEMO_ARMS = ("B", "E", "G", "L")
_HEADS = {"B": "B: stock vLLM", "E": "E: agentkv leases", "G": "G: agentkv all", "L": "L: limit"}


def demo_trace_path() -> str:
    """Where the embedded demo trace lies inside the installed package."""
    return str(resources.files("agentkv.bench").joinpath("data", DEMO_TRACE))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``agentkv demo`` options."""
    parser.add_argument(
        "--out", default="agentkv-demo", help="output directory (default ./agentkv-demo)"
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=1,
        help="repetitions per arm (default 1, about 8 minutes; each more adds about 4; "
        "with 2 or more the intervals are over repetitions)",
    )
    parser.add_argument(
        "--plain", action="store_true", help="plain progress lines, no progress bar"
    )


def demo_config(out_dir: str, reps: int) -> Any:
    """The demo's :class:`~agentkv.bench.run._runner.BenchConfig`: a fixed workload
    whose tool gaps are scaled from the machine's measured prefill rate."""
    from agentkv.bench.run._gapscale import GapScaleRule
    from agentkv.bench.run._runner import BenchConfig
    from agentkv.workload._arrival import Arrival
    from agentkv.workload._workload import Scaling

    return BenchConfig(
        trace_path=demo_trace_path(),
        arms=DEMO_ARMS,
        reps=reps,
        pool_fractions=(0.3,),
        scaling=Scaling(token_scale=0.15, time_scale=0.3, max_trajectories=12, max_turns=6),
        arrival=Arrival("closed", concurrency=12),
        out_dir=out_dir,
        max_parallel_starts=len(DEMO_ARMS),
        gap_scale=GapScaleRule(max_scale=0.3),
    )


def _row(label: str, values: list[str]) -> str:
    return f"{label:<28}" + "".join(f"{v:>20}" for v in values)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _interval(r: dict[str, Any] | None, spec: str, scale: float = 1.0, unit: str = "") -> str:
    if not r or r.get("value") is None:
        return "-"
    lo, hi = r.get("ci_low"), r.get("ci_high")
    bounds = "?" if lo is None or hi is None else f"{lo * scale:{spec}}-{hi * scale:{spec}}"
    return f"{r['value'] * scale:{spec}}{unit} [{bounds}]"


def print_side_by_side(results: dict[str, Any]) -> None:
    """Print the demo's arms next to each other."""
    arms = results["arms"]
    names = [n for n in DEMO_ARMS if n in arms and "not_run" not in arms[n]]
    print(_row("", [_HEADS[n] for n in names]))
    rows = [
        ("trajectory JCT mean (s)", "jct_mean_s", ".1f"),
        ("trajectory JCT p95 (s)", "jct_p95_s", ".1f"),
        ("prefix reuse ratio", "prefix_reuse_ratio", ".3f"),
        ("reuse / simulator oracle", "reuse_vs_oracle", ".2f"),
        ("recomputed tokens / rep", "recomputed_tokens", ".0f"),
        ("preemptions / rep", "preemptions", ".1f"),
    ]
    for label, key, spec in rows:
        print(_row(label, [_fmt(arms[n].get(key), spec) for n in names]))
    print(
        _row(
            "mean JCT vs B [95% CI]",
            [_interval(arms[n].get("ratio_vs_B"), ".2f", unit="x") for n in names],
        )
    )
    print(
        _row(
            "headroom captured [95% CI]",
            [_interval(arms[n].get("headroom_captured"), ".0f", 100, "%") for n in names],
        )
    )
    for name, arm in arms.items():
        if "not_run" in arm:
            print(f"{name}: not run: {arm['not_run']}")


def verdict(name: str, arm: dict[str, Any], limit_gain: dict[str, Any] | None) -> str:
    """One plain sentence on ``arm`` against B: faster, slower, or no clear difference."""
    r = arm.get("ratio_vs_B")
    if not r or r.get("value") is None:
        return f"{name}: no comparison with B (no completed trajectories)"
    ratio = (
        f"{r['value']:.2f}x (95% CI {_fmt(r.get('ci_low'), '.2f')}-{_fmt(r.get('ci_high'), '.2f')})"
    )
    lo, hi = r.get("ci_low"), r.get("ci_high")
    if lo is not None and lo > 1:
        text = f"{name} finished trajectories faster than stock vLLM: {ratio}"
    elif hi is not None and hi < 1:
        text = f"{name} LOST: it finished trajectories slower than stock vLLM: {ratio}"
    else:
        text = (
            f"{name} shows no clear difference from stock vLLM (the interval includes 1): {ratio}"
        )
    h = arm.get("headroom_captured")
    if limit_gain is not None and h and h.get("value") is not None:
        text += f"; it captured {_interval(h, '.0f', 100, '%')} of the headroom between B and L"
    return text


def _print_verdicts(results: dict[str, Any]) -> None:
    arms = results["arms"]
    limit = arms.get("L") or {}
    gain = limit.get("ratio_vs_B") if "not_run" not in limit else None
    print()
    if gain and gain.get("ci_low") is not None and gain["ci_low"] <= 1:
        print(
            "L (a pool that holds everything) was not clearly faster than B: caching had "
            "little to win in this run, so headroom captured means little."
        )
    for name in ("E", "G"):
        if name in arms and "not_run" not in arms[name]:
            print(verdict(name, arms[name], gain))
    unit = next((a.get("ci_unit") for a in arms.values() if "ci_unit" in a), None)
    if unit == "trajectories":
        print(
            "(one repetition: the intervals are over its 12 trajectories, not over runs; "
            "--reps 3 gives intervals over repetitions)"
        )
    elif unit:
        print("(intervals over repetitions)")


def run(args: argparse.Namespace) -> int:
    """Run ``agentkv demo``; returns the exit status."""
    from agentkv.bench.report._report import write_report
    from agentkv.bench.run._gapscale import describe_gap_scale
    from agentkv.bench.run._progress import ProgressDisplay
    from agentkv.bench.run._runner import run_bench

    t0 = time.monotonic()
    try:
        from agentkv.models import ensure_tiny_model

        print("agentkv demo: building the tiny local model (once) ...", file=sys.stderr)
        ensure_tiny_model()
        cfg = demo_config(args.out, args.reps)
        print(
            "agentkv demo: 12 real OpenHands trajectories all in flight (first 6 turns, tokens "
            "x0.15, tool gaps at most x0.3, scaled from this machine's measured prefill rate), "
            "KV pool at 0.3 of their working set; arms B, E, G and the limit L, servers "
            "started together",
            file=sys.stderr,
        )
        with ProgressDisplay("demo", force_plain=args.plain) as progress:
            raw = run_bench(cfg, progress)
        results, files = write_report(raw, cfg.out_dir)
    except AgentKVError as exc:
        print(f"agentkv demo: {exc}", file=sys.stderr)
        return 1
    print()
    gap = (results.get("manifest") or {}).get("gap_scale")
    if gap:
        print(describe_gap_scale(gap))
        print()
    print_side_by_side(results)
    _print_verdicts(results)
    out = Path(cfg.out_dir)
    print(f"\nreport: {out / 'report.md'}")
    print("plots:  " + ", ".join(str(f) for f in files if f.suffix == ".png"))
    print(f"results: {out / 'results.json'}   ({time.monotonic() - t0:.0f} s)")
    return 0

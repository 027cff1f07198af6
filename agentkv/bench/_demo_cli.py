"""``agentkv demo``: the whole loop on one machine, no GPU, in a few minutes.

Builds the tiny local model (once), replays the bundled real-trace subset (OpenHands
trajectories, see ``agentkv/bench/data/README.md``) against two real vLLM servers --
arm B (stock prefix caching) and arm G (the agentkv profile: lifecycle hints and
program-aware scheduling) -- with the KV pool at the memory elbow, and prints a side
by side table. The full report and plots land in ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from agentkv._errors import AgentKVError

__all__ = ["DEMO_TRACE", "add_arguments", "demo_config", "demo_trace_path", "run"]

DEMO_TRACE = "openhands_swebv_subset.jsonl"


def demo_trace_path() -> str:
    """Where the embedded demo trace lies inside the installed package."""
    return str(resources.files("agentkv.bench").joinpath("data", DEMO_TRACE))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``agentkv demo`` options."""
    parser.add_argument(
        "--out", default="agentkv-demo", help="output directory (default ./agentkv-demo)"
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions per arm (default 3)")
    parser.add_argument(
        "--plain", action="store_true", help="plain progress lines, no progress bar"
    )


def demo_config(out_dir: str, reps: int) -> Any:
    """The demo's :class:`~agentkv.bench._runner.BenchConfig` (a small, fixed workload)."""
    from agentkv.bench._driver import Arrival
    from agentkv.bench._runner import BenchConfig
    from agentkv.bench._workload import Scaling

    return BenchConfig(
        trace_path=demo_trace_path(),
        arms=("B", "G"),
        reps=reps,
        pool_fractions=(0.5,),
        scaling=Scaling(token_scale=0.05, time_scale=0.2, max_trajectories=6, max_turns=8),
        arrival=Arrival("closed", concurrency=3),
        out_dir=out_dir,
    )


def _row(label: str, values: list[str]) -> str:
    return f"{label:<26}" + "".join(f"{v:>22}" for v in values)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_side_by_side(results: dict[str, Any]) -> None:
    """Print arms B and G next to each other."""
    arms = results["arms"]
    names = [n for n in ("B", "G") if n in arms]
    heads = {"B": "B: stock vLLM", "G": "G: agentkv"}
    print(_row("", [heads[n] for n in names]))
    rows = [
        ("trajectory JCT mean (s)", "jct_mean_s", ".2f"),
        ("trajectory JCT p50 (s)", "jct_p50_s", ".2f"),
        ("trajectory JCT p95 (s)", "jct_p95_s", ".2f"),
        ("prefix reuse ratio", "prefix_reuse_ratio", ".3f"),
        ("rebuild tax", "rebuild_tax", ".3f"),
        ("preemptions / rep", "preemptions", ".1f"),
        ("recomputed tokens / rep", "recomputed_tokens", ".0f"),
    ]
    for label, key, spec in rows:
        print(_row(label, [_fmt(arms[n].get(key), spec) for n in names]))
    r = arms.get("G", {}).get("ratio_vs_B")
    if r:
        print(
            f"\nG vs B, mean JCT: {r['value']:.2f}x (95% CI {r['ci_low']:.2f}-{r['ci_high']:.2f}; "
            "above 1 means agentkv finished trajectories faster)"
        )


def run(args: argparse.Namespace) -> int:
    """Run ``agentkv demo``; returns the exit status."""
    from agentkv.bench._progress import ProgressDisplay
    from agentkv.bench._report import write_report
    from agentkv.bench._runner import run_bench

    t0 = time.monotonic()
    try:
        from agentkv.models import ensure_tiny_model

        print("agentkv demo: building the tiny local model (once) ...", file=sys.stderr)
        ensure_tiny_model()
        cfg = demo_config(args.out, args.reps)
        print(
            "agentkv demo: replaying 6 real OpenHands trajectories (first 8 turns, tokens x0.05, "
            "tool gaps x0.2, 3 concurrent) on arms B and G, pool at half the working set",
            file=sys.stderr,
        )
        with ProgressDisplay("demo", force_plain=args.plain) as progress:
            raw = run_bench(cfg, progress)
        results, files = write_report(raw, cfg.out_dir)
    except AgentKVError as exc:
        print(f"agentkv demo: {exc}", file=sys.stderr)
        return 1
    print()
    print_side_by_side(results)
    out = Path(cfg.out_dir)
    print(f"\nreport: {out / 'report.md'}")
    print("plots:  " + ", ".join(str(f) for f in files if f.suffix == ".png"))
    print(f"results: {out / 'results.json'}   ({time.monotonic() - t0:.0f} s)")
    return 0

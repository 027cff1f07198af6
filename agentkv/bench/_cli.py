"""``agentkv bench``: replay an agent trace against real vLLM servers, arm by arm, or
(``--live``) run a real agent on a real model against them; ``--gate`` is the promotion gate."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentkv._errors import AgentKVError, ConfigError
from agentkv.workload._flags import (
    add_grid_arguments,
    add_workload_arguments,
    positive_float,
    positive_int,
    scaling_from_args,
)

__all__ = [
    "add_arguments",
    "config_from_args",
    "live_config_from_args",
    "print_live_table",
    "print_table",
    "run",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``agentkv bench`` options."""
    workload = add_workload_arguments(
        parser,
        pool_fractions=(0.5,),
        block_size=32,
        notes={
            "--pool-fraction": "the first is the headline",
            "--seed": "the prompts and the arm order included",
            "--trace": "needed unless --live",
        },
        trace_required=False,
    )
    workload.add_argument(
        "--max-output-tokens",
        type=positive_int,
        default=None,
        help="cap each answer's length (default: none)",
    )
    workload.add_argument(
        "--system-prefix-tokens",
        type=int,
        default=0,
        help="common prefix of every trajectory's first prompt (default 0)",
    )
    workload.add_argument(
        "--rate",
        type=positive_float,
        default=0.5,
        help="open loop: trajectory arrivals per second (default 0.5)",
    )
    parser.add_argument(
        "--arms",
        default="B,E,F,G,L",
        help="arms to run, e.g. A,B,E,F,G,L or B,E,G,R,R+ (B is always added; L, the limit, "
        "is needed for headroom captured)",
    )
    parser.add_argument(
        "--reps", type=positive_int, default=5, help="repetitions per arm (default 5)"
    )
    parser.add_argument(
        "--model", default=None, help="model path or id (default: the tiny local model)"
    )
    parser.add_argument(
        "--out", default="agentkv-bench", help="output directory (default ./agentkv-bench)"
    )
    parser.add_argument(
        "--plain", action="store_true", help="plain progress lines, no progress bar"
    )
    parser.add_argument(
        "--warm-gaps",
        choices=["train", "none"],
        default="train",
        help="each replay's gap model first learns the trace's trajectories that are not "
        "replayed (train, the default) or starts cold with the shipped priors (none)",
    )
    parser.add_argument(
        "--warm-from",
        metavar="TRACE",
        help="another trace of the same harness: each replay's gap model first learns the "
        "idle gaps of all its trajectories, scaled like the workload (the warm model a "
        "harness keeps after earlier runs; not the replayed trace, not with --warm-gaps none)",
    )
    parser.add_argument(
        "--gate",
        action="store_true",
        help="promotion gate: exit 1 with a one-line reason when an agentkv arm is worse than "
        "B beyond its interval on accepted outcomes (live), p95 JCT, the worst tenant's JCT "
        "or output agreement (live); the report shows each gate",
    )
    _add_live_arguments(parser)
    _add_replica_arguments(parser)
    _add_testbed_arguments(parser)
    add_grid_arguments(
        parser,
        grid_help="run the protocol at every grid point: one run per --grid-concurrency over "
        "every --pool-fraction, then open-loop runs at --grid-open fractions of B's "
        "sustained rate; writes each run's folder and grid.md, grid.json and grid.png "
        "(--arrival, --concurrency and --rate are ignored)",
        open_help="open-loop rates as fractions of B's sustained rate, measured in the "
        "highest-concurrency run",
        pools=False,
    )


def _add_live_arguments(parser: argparse.ArgumentParser) -> None:
    live = parser.add_argument_group("live agents (--live)")
    live.add_argument(
        "--live",
        action="store_true",
        help="run a real agent on a real model (default: the embedded smollm2) instead of "
        "replaying a trace: bundled tasks whose tools really run, each judged by its checker "
        "(--trace and the workload flags are ignored)",
    )
    live.add_argument(
        "--tasks", default=None, help="with --live: a task file of your own (JSON Lines)"
    )
    live.add_argument("--live-concurrency", type=int, default=6, help="tasks in flight (default 6)")
    live.add_argument(
        "--max-steps", type=int, default=4, help="model calls per task at most (default 4)"
    )
    live.add_argument(
        "--step-tokens", type=int, default=48, help="output tokens per step at most (default 48)"
    )
    live.add_argument(
        "--live-pool-fraction",
        type=float,
        default=0.3,
        help="KV pool as a fraction of the estimated working set (default 0.3, the demo's)",
    )


def _add_testbed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cpu-layout",
        choices=["split", "vllm"],
        default="split",
        help="CPU build: keep the engine core on the model worker's cores and the API "
        "server and client off them (split, default), or leave vLLM's placement (vllm)",
    )
    parser.add_argument(
        "--no-testbed",
        action="store_true",
        help="skip measuring the testbed's own costs on each server (about 15 s each)",
    )
    parser.add_argument(
        "--time-scale-from-prefill",
        action="store_true",
        help="choose the tool gaps' scale from the first servers' measured prefill rate, "
        "at most --time-scale: shorter gaps where rebuilding the mean context would take "
        "under a quarter of the mean gap (what `agentkv demo` does; needs the testbed)",
    )


def _add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="run every arm as N replicas behind vllm-router, each with its share of the pool",
    )
    parser.add_argument(
        "--routing",
        choices=["session", "sticky", "round_robin"],
        default="session",
        help="with --replicas: the router's policy (session = consistent hash on the "
        "trajectory; sticky = each trajectory stays on the replica with the fewest live "
        "trajectories at its first call)",
    )


def config_from_args(args: argparse.Namespace) -> object:
    """Build a :class:`~agentkv.bench.run._runner.BenchConfig` from parsed arguments."""
    from agentkv.bench.run._arms import parse_arms
    from agentkv.bench.run._gapscale import GapScaleRule
    from agentkv.bench.run._runner import BenchConfig
    from agentkv.workload._arrival import Arrival

    scaling = scaling_from_args(args)
    gap_scale = None
    if getattr(args, "time_scale_from_prefill", False):
        gap_scale = GapScaleRule(
            max_scale=scaling.time_scale, min_scale=min(0.05, scaling.time_scale)
        )
    arrival = Arrival(args.arrival, args.concurrency, args.rate, args.seed)
    return BenchConfig(
        trace_path=args.trace,
        arms=tuple(parse_arms(args.arms)),
        reps=args.reps,
        pool_fractions=tuple(args.pool_fraction),
        scaling=scaling,
        arrival=arrival,
        seed=args.seed,
        out_dir=args.out,
        block_size=args.block_size,
        model=args.model,
        warm_gaps=args.warm_gaps,
        warm_from=args.warm_from,
        replicas=args.replicas,
        routing=args.routing,
        measure_testbed=not args.no_testbed,
        cpu_layout=args.cpu_layout,
        gap_scale=gap_scale,
    )


def _num(value: object, spec: str) -> str:
    return "-" if not isinstance(value, int | float) else format(value, spec)


def _interval(r: object, spec: str, scale: float = 1.0, unit: str = "") -> str:
    if not isinstance(r, dict) or r.get("value") is None:
        return "-"
    v, lo, hi = (None if r.get(k) is None else r[k] * scale for k in ("value", "ci_low", "ci_high"))
    return f"{_num(v, spec)}{unit} [{_num(lo, spec)}, {_num(hi, spec)}]"


def print_table(results: dict[str, object]) -> None:
    """The terminal summary: one row per arm (also used by ``agentkv demo``)."""
    arms = results["arms"]
    assert isinstance(arms, dict)
    print(
        f"{'arm':<4} {'JCT mean s':>10} {'p95 s':>8} {'vs B (95% CI)':>22} "
        f"{'headroom captured':>20} {'reuse':>6} {'/oracle':>7} {'tax':>6} {'preempt':>8}"
    )
    for name, a in arms.items():
        if "not_run" in a:
            print(f"{name:<4} not run: {a['not_run']}")
            continue
        print(
            f"{name:<4} {_num(a['jct_mean_s'], '.2f'):>10} {_num(a['jct_p95_s'], '.2f'):>8} "
            f"{_interval(a.get('ratio_vs_B'), '.2f', unit='x'):>22} "
            f"{_interval(a.get('headroom_captured'), '.0f', 100, '%'):>20} "
            f"{_num(a['prefix_reuse_ratio'], '.3f'):>6} {_num(a.get('reuse_vs_oracle'), '.2f'):>7} "
            f"{_num(a['rebuild_tax'], '.3f'):>6} {_num(a['preemptions'], '.1f'):>8}"
        )
    first = next((a for a in arms.values() if "ci_unit" in a), None)
    if first is not None:
        print(f"(95% bootstrap intervals over {first['ci_unit']})")


def live_config_from_args(args: argparse.Namespace) -> object:
    """Build a :class:`~agentkv.bench.live._runner.LiveConfig` from parsed arguments."""
    from agentkv.bench.live._agent import AgentOptions
    from agentkv.bench.live._runner import LiveConfig
    from agentkv.bench.run._arms import parse_arms

    if getattr(args, "time_scale_from_prefill", False):
        raise ConfigError(
            "--time-scale-from-prefill scales a trace's tool gaps; a live run's tools take "
            "the time they take"
        )
    out = args.out if args.out != "agentkv-bench" else "agentkv-bench-live"
    return LiveConfig(
        tasks_path=args.tasks,
        arms=tuple(parse_arms(args.arms)),
        reps=args.reps,
        seed=args.seed,
        pool_fraction=args.live_pool_fraction,
        model=args.model or "smollm2",
        agent=AgentOptions(
            max_steps=args.max_steps,
            max_tokens=args.step_tokens,
            concurrency=args.live_concurrency,
        ),
        out_dir=out,
        cpu_layout=args.cpu_layout,
    )


def print_live_table(results: dict[str, Any]) -> None:
    """The terminal summary of a live run: the per-arm table and the gates."""
    from agentkv.bench.report._live import live_table

    print("live agents (not comparable with replay figures)")
    for line in live_table(results):
        print(line)
    _print_gates(results["gates"])


def _print_gates(gates: list[dict[str, str]]) -> None:
    for g in gates:
        print(f"gate {g['arm']} {g['gate']}: {g['status']} ({g['detail']})")


def _run_live(args: argparse.Namespace) -> int:
    from agentkv.bench.live._runner import LiveConfig, run_live
    from agentkv.bench.report._live import write_live_report
    from agentkv.bench.run._progress import ProgressDisplay

    try:
        cfg = live_config_from_args(args)
        assert isinstance(cfg, LiveConfig)
        with ProgressDisplay("bench --live", force_plain=args.plain) as progress:
            raw = run_live(cfg, progress)
        results, files = write_live_report(raw, cfg.out_dir)
    except AgentKVError as exc:
        print(f"agentkv bench: {exc}", file=sys.stderr)
        return 1
    print_live_table(results)
    print("wrote " + ", ".join(str(f) for f in files))
    if args.gate and results.get("gate_failure"):
        print(f"agentkv bench: {results['gate_failure']}", file=sys.stderr)
        return 1
    return 0


def _gate_replay(results: dict[str, Any], files: list[Any]) -> str | None:
    """Add the gates to a replay's results.json and report.md; return the failure."""
    import json

    from agentkv.bench.report._gate import evaluate_gates, gate_failure, render_gates

    gates = evaluate_gates(results)
    results["gates"], results["gate_failure"] = gates, gate_failure(gates)
    for f in files:
        if f.name == "results.json":
            f.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        elif f.name == "report.md":
            verdict = results["gate_failure"] or "pass"
            text = "\n## Gates\n\n" + "\n".join(render_gates(gates)) + f"\n\nOverall: {verdict}\n"
            f.write_text(f.read_text("utf-8") + text, encoding="utf-8")
    _print_gates(gates)
    return results["gate_failure"]  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    """Run ``agentkv bench``; returns the exit status."""
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ImportError:
        print(
            "agentkv bench needs numpy and matplotlib: pip install 'agentkv-cache[bench]'",
            file=sys.stderr,
        )
        return 2
    if args.live:
        return _run_live(args)
    if args.trace is None:
        print("agentkv bench: give --trace FILE (a trace to replay) or --live", file=sys.stderr)
        return 2
    from agentkv.bench.report._report import write_report
    from agentkv.bench.run._progress import ProgressDisplay
    from agentkv.bench.run._runner import BenchConfig, run_bench

    try:
        cfg = config_from_args(args)
        assert isinstance(cfg, BenchConfig)
        if args.grid:
            from agentkv.bench._grid import run_bench_grid
            from agentkv.workload._grid import render_grid

            with ProgressDisplay("bench", force_plain=args.plain) as progress:
                rows, files = run_bench_grid(cfg, args.grid_concurrency, args.grid_open, progress)
            print(render_grid(rows, [a for a in cfg.arms if a not in ("B", "L")], "B"))
            print("wrote " + ", ".join(str(f) for f in files))
            return 0
        with ProgressDisplay("bench", force_plain=args.plain) as progress:
            raw = run_bench(cfg, progress)
        results, files = write_report(raw, cfg.out_dir)
    except AgentKVError as exc:
        print(f"agentkv bench: {exc}", file=sys.stderr)
        return 1
    print_table(results)
    print("wrote " + ", ".join(str(f) for f in files))
    if args.gate:
        failure = _gate_replay(results, files)
        if failure:
            print(f"agentkv bench: {failure}", file=sys.stderr)
            return 1
    return 0

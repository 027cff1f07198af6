"""``agentkv sim``: simulate KV-cache policies on a trace and write results.json and plots."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agentkv._errors import AgentKVError
from agentkv.sim._calibrate import Calibration, fit_calibration
from agentkv.sim._config import SimConfig, SimCost, TierConfig
from agentkv.sim._grid import OPEN_TRAJECTORIES, grid_json, run_sim_grid
from agentkv.sim._policies import POLICIES
from agentkv.sim._report import plot_results, sweep, write_results
from agentkv.sim._routing import ROUTINGS, load_placement
from agentkv.sim._workload import from_trace, stable_arrival_rate
from agentkv.traces import load_trace
from agentkv.workload._flags import (
    add_grid_arguments,
    add_workload_arguments,
    non_negative_int,
    positive_int,
    scaling_from_args,
)
from agentkv.workload._grid import plot_grid, pool_floored, render_grid

__all__ = ["add_arguments", "run"]


#: Tokens per KV block when neither ``--block-size`` nor a ``--calibrate`` run gives one.
DEFAULT_BLOCK_SIZE = 128
DEFAULT_POOL_FRACTIONS = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``agentkv sim`` options."""
    workload = add_workload_arguments(
        parser,
        pool_fractions=DEFAULT_POOL_FRACTIONS,
        block_size=DEFAULT_BLOCK_SIZE,
        recorded="--calibrate",
    )
    workload.add_argument(
        "--arrival-rate",
        type=float,
        nargs="+",
        default=None,
        metavar="R",
        help="Poisson: trajectories started per second, several values sweep (default: half "
        "the rate that would keep the simulated server busy)",
    )
    parser.add_argument(
        "--policies",
        default="lru,agentkv-v1,agentkv,oracle",
        help=f"comma-separated, from: {', '.join(POLICIES)} (default lru,agentkv-v1,agentkv,oracle)",
    )
    parser.add_argument(
        "--pool-blocks",
        type=int,
        default=None,
        help="fixed pool size per replica (with --calibrate: the bench's pool unless given; "
        "not with --grid, which sweeps --grid-pools)",
    )
    _add_replica_arguments(parser)
    parser.add_argument(
        "--overhead-s",
        type=float,
        default=None,
        help="fixed latency per call outside the engine (default 0, or the calibration's)",
    )
    parser.add_argument(
        "--queue",
        choices=("fcfs", "priority", "plas"),
        default="fcfs",
        help="waiting-queue order: arrival order (fcfs, the default), the policy's priority "
        "for the trajectory, or program-level attained service (plas: least model time so "
        "far first)",
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=64, help="concurrent calls per replica (default 64)"
    )
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=None,
        help="prefill tokens per second of one replica (default 26000, or the calibration's)",
    )
    parser.add_argument(
        "--decode-s-per-token",
        type=float,
        default=None,
        help="engine step time added per decoding call in the batch (default 0.00036, or the "
        "calibration's)",
    )
    parser.add_argument(
        "--attention-s-per-token2",
        type=float,
        default=None,
        help="prefill attention time per new token per context token (default 0, or the "
        "calibration's)",
    )
    parser.add_argument(
        "--calibrate",
        metavar="RESULTS_JSON",
        default=None,
        help="fit the cost model (and block and pool size) from an `agentkv bench` results.json",
    )
    parser.add_argument(
        "--lower-tier-blocks", type=int, default=0, help="lower (CPU) tier capacity; 0: none"
    )
    parser.add_argument(
        "--lower-tier-gb-per-s",
        type=float,
        default=16.0,
        help="lower tier bandwidth in GB/s (default 16)",
    )
    parser.add_argument(
        "--lower-tier-store",
        choices=("evict", "compute"),
        default="evict",
        help="when blocks are written to the lower tier: as the pool evicts them (evict, the "
        "default) or as turns compute them (compute: vLLM's native offloading connector)",
    )
    parser.add_argument(
        "--kv-bytes-per-token",
        type=int,
        default=131_072,
        help="KV bytes per token, which sizes lower-tier transfers (default 131072)",
    )
    parser.add_argument("--out", default="sim-results", help="output folder (default sim-results)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    grid = add_grid_arguments(
        parser,
        grid_help="sweep the operating grid instead (closed-loop concurrency x pool, open-loop "
        "arrivals at fractions of stock's sustained rate, a long-tail-gap slice) and write "
        "grid.md, grid.json and grid.png; --pool-fraction, --concurrency, --arrival and "
        "--arrival-rate are ignored",
        open_help="open-loop rates as fractions of stock LRU's sustained rate",
        pools=True,
    )
    grid.add_argument(
        "--grid-repetitions",
        type=positive_int,
        default=3,
        metavar="N",
        help="runs per point: closed loops start the trajectories in another order each "
        "time, open loops draw other arrivals; ratios are the runs' geometric mean with a "
        "95%% interval (default 3)",
    )
    grid.add_argument(
        "--grid-open-trajectories",
        type=non_negative_int,
        default=OPEN_TRAJECTORIES,
        metavar="N",
        help="arrivals per open-loop run: the trace's trajectories cycled to N, each copy a "
        "new trajectory, so the loop reaches a steady state (default %(default)s; 0: the "
        "trace's own trajectories once)",
    )


def _add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replicas",
        type=int,
        nargs="+",
        default=[1],
        metavar="N",
        help="replicas behind a router, the pool split among them; several values sweep "
        "(default 1)",
    )
    parser.add_argument(
        "--routing",
        choices=ROUTINGS,
        default="session",
        help="how calls reach replicas: round_robin; session (consistent hash on the "
        "trajectory, the default); sticky (a trajectory's first call pins it to the replica "
        "with the fewest live trajectories); prefix (where the longest cached prefix is, "
        "unless that replica is much busier than the least loaded)",
    )
    parser.add_argument(
        "--placement",
        metavar="RESULTS_JSON",
        default=None,
        help="session routing: follow the trajectory -> replica split an `agentkv bench "
        "--replicas` run observed (its results.json) instead of the simulator's own ring",
    )


def _cost(args: argparse.Namespace, cal: Calibration | None) -> SimCost:
    base = cal.cost if cal is not None else SimCost()
    return SimCost(
        overhead_s=base.overhead_s if args.overhead_s is None else args.overhead_s,
        prefill_tokens_per_s=args.prefill_tokens_per_s or base.prefill_tokens_per_s,
        decode_s_per_token=base.decode_s_per_token
        if args.decode_s_per_token is None
        else args.decode_s_per_token,
        attention_s_per_token2=base.attention_s_per_token2
        if args.attention_s_per_token2 is None
        else args.attention_s_per_token2,
        step_base_s=base.step_base_s,
    )


def _arrival(args: argparse.Namespace, cal: Calibration | None) -> tuple[str, int]:
    recorded = (cal.arrival or {}) if cal is not None else {}
    process = args.arrival or str(recorded.get("process") or "closed")
    concurrency = args.concurrency or int(recorded.get("concurrency") or 4)
    return process, concurrency


def run(args: argparse.Namespace) -> int:
    """Run the sweep, print a table, write results.json and plots; return the exit status."""
    try:
        names = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = [n for n in names if n not in POLICIES]
        if unknown:
            print(
                f"agentkv sim: unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}",
                file=sys.stderr,
            )
            return 2
        if args.grid and args.pool_blocks is not None:
            print(
                "agentkv sim: --grid sweeps the pools of --grid-pools; drop --pool-blocks",
                file=sys.stderr,
            )
            return 2
        cal = fit_calibration(args.calibrate) if args.calibrate else None
        if cal is not None:
            print(f"calibration ({cal.method}): {cal.describe()}")
        trace = load_trace(args.trace)
        process, concurrency = _arrival(args, cal)
        tier = None
        if args.lower_tier_blocks > 0:
            tier = TierConfig(
                args.lower_tier_blocks,
                args.lower_tier_gb_per_s * 1e9,
                store=args.lower_tier_store,
            )
        config = SimConfig(
            block_size=args.block_size or (cal and cal.block_size) or DEFAULT_BLOCK_SIZE,
            # A grid sweeps its own pools (--grid-pools): the bench's pool does not pin it.
            pool_blocks=args.pool_blocks
            if args.pool_blocks is not None or cal is None or args.grid
            else cal.pool_blocks,
            max_num_seqs=args.max_num_seqs,
            queue=args.queue,
            routing=args.routing,
            arrival=process,  # type: ignore[arg-type]
            concurrency=concurrency,
            seed=args.seed,
            cost=_cost(args, cal),
            lower_tier=tier,
            kv_bytes_per_token=args.kv_bytes_per_token,
            placement=tuple(sorted(load_placement(args.placement).items()))
            if args.placement
            else (),
        )
        skipped = len(trace.trajectories) - len(trace.with_tokens().trajectories)
        scaling = scaling_from_args(args, cal.scaling if cal is not None else None)
        if args.grid:
            return _run_grid(args, trace, scaling, config, names)
        rates = args.arrival_rate
        if process == "poisson" and rates is None:
            base = from_trace(trace, arrival_rate_per_s=None, scaling=scaling)
            rates = [stable_arrival_rate(base, config.cost)]
        config = config.with_(arrival_rate_per_s=(rates or [None])[0])
        results = sweep(
            lambda rate: from_trace(
                trace, arrival_rate_per_s=rate, seed=args.seed, scaling=scaling
            ),
            config,
            names,
            pool_fractions=args.pool_fraction,
            arrival_rates=rates or [None],
            replicas=args.replicas,
            source={
                "trace": str(args.trace),
                "sha256": trace.sha256,
                "trajectories_skipped_without_tokens": skipped,
                "negative_gaps_clamped": trace.num_negative_gaps_clamped,
                "scaling": scaling.to_dict(),
                "arrival": process,
                "concurrency": concurrency,
                "calibration": None if cal is None else cal.describe(),
            },
        )
    except AgentKVError as exc:
        print(f"agentkv sim: {exc}", file=sys.stderr)
        return 2
    print(format_table(results))
    path = write_results(results, args.out)
    print(f"wrote {path}")
    if not args.no_plots:
        try:
            for p in plot_results(results, args.out):
                print(f"wrote {p}")
        except ImportError:
            print("matplotlib is not installed: plots skipped (pip install 'agentkv-cache[bench]')")
    return 0


def _run_grid(
    args: argparse.Namespace, trace: Any, scaling: Any, config: SimConfig, names: list[str]
) -> int:
    """``--grid``: every policy at every grid point against stock LRU."""
    policies = [n for n in names if n != "lru"]
    rows = run_sim_grid(
        lambda rate, rep=0: from_trace(
            trace, arrival_rate_per_s=rate, seed=args.seed + rep, scaling=scaling
        ),
        config,
        policies,
        concurrencies=args.grid_concurrency,
        pools=args.grid_pools,
        open_fractions=args.grid_open,
        repetitions=args.grid_repetitions,
        open_trajectories=args.grid_open_trajectories,
        progress=lambda msg: print(f"  {msg}", flush=True),
    )
    table = render_grid(rows, policies, "lru (stock vLLM)")
    floored = sorted(
        {
            f"{p.label} pool {p.pool_fraction:g}"
            for p, cells in rows
            if pool_floored(cells)
        }
    )
    if floored:
        table += (
            "\n- The pool sits at its floor (the largest call's blocks, above the fraction) at: "
            + ", ".join(floored)
            + "; rows of one concurrency at such pools are the same run.\n"
        )
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grid.md").write_text(
        f"# Simulator grid: {args.trace}\n\nRatios are LRU's JCT over the policy's (above 1 "
        "is faster); headroom is (LRU - policy) / (LRU - limit) on mean JCT. "
        f"{args.grid_repetitions} run(s) per point (closed loops: other start orders; open "
        "loops: other arrivals): ratios are their geometric mean with a 95% interval.\n\n" + table
    )
    (out / "grid.json").write_text(json.dumps(grid_json(rows), indent=1) + "\n")
    print(f"wrote {out / 'grid.md'}")
    if not args.no_plots:
        png = plot_grid(rows, policies, out / "grid.png")
        print(f"wrote {png}" if png else "matplotlib is not installed: heat map skipped")
    return 0


def format_table(results: dict[str, object]) -> str:
    """A plain-text table: one row per sweep entry and policy."""
    head = (
        f"{'pool':>6} {'rate':>5} {'rep':>3}  {'policy':<14} {'reuse':>6} {'tax':>6} "
        f"{'jct_mean_s':>10} {'jct_p95_s':>10} {'preempt':>7} {'held':>5} "
        f"{'tier_hit':>8} {'load_GB':>7} {'store_GB':>8}"
    )
    lines = [head, "-" * len(head)]
    for e in results["sweep"]:  # type: ignore[index, attr-defined]
        rate = e["arrival_rate_per_s"]
        rate_s = "-" if rate is None else f"{rate:.2g}"
        for name, m in e["policies"].items():
            lines.append(
                f"{e['pool_fraction']:>6.2f} {rate_s:>5} {e['replicas']:>3}  "
                f"{name:<14} {m['prefix_reuse_ratio']:>6.3f} {m['rebuild_tax']:>6.3f} "
                f"{m['jct_mean_s']:>10.1f} {m['jct_p95_s']:>10.1f} {m['preemptions']:>7} "
                f"{m.get('core', {}).get('turns_held', 0):>5} "
                f"{_share(m.get('lower_tier_tokens', 0), m.get('prompt_tokens', 0)):>8} "
                f"{m.get('lower_tier_load_bytes', 0) / 1e9:>7.1f} "
                f"{m.get('lower_tier_store_bytes', 0) / 1e9:>8.1f}"
            )
    return "\n".join(lines)


def _main() -> None:  # pragma: no cover - `python -m agentkv.sim._cli`
    parser = argparse.ArgumentParser(prog="agentkv sim")
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))


if __name__ == "__main__":  # pragma: no cover
    _main()


def _share(part: float, whole: float) -> str:
    """``part / whole`` as a ratio (``-`` when ``whole`` is 0)."""
    return f"{part / whole:.3f}" if whole else "-"

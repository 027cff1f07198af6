"""``agentkv sim``: simulate KV-cache policies on a trace and write results.json and plots."""

from __future__ import annotations

import argparse
import sys

from agentkv._errors import AgentKVError
from agentkv.sim._calibrate import Calibration, fit_calibration
from agentkv.sim._config import SimConfig, SimCost, TierConfig
from agentkv.sim._policies import POLICIES
from agentkv.sim._report import plot_results, sweep, write_results
from agentkv.sim._workload import from_trace
from agentkv.traces import load_trace

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``agentkv sim`` options."""
    parser.add_argument("--trace", required=True, help="agentkv trace file (JSON Lines)")
    parser.add_argument(
        "--policies",
        default="lru,agentkv,oracle",
        help=f"comma-separated, from: {', '.join(POLICIES)} (default lru,agentkv,oracle)",
    )
    parser.add_argument(
        "--pool-fraction",
        type=float,
        nargs="+",
        default=[0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0],
        metavar="F",
        help="KV pool sizes as fractions of the working set (default 0.05 ... 1.0)",
    )
    parser.add_argument(
        "--pool-blocks",
        type=int,
        default=None,
        help="fixed pool size per replica (with --calibrate: the bench's pool unless given)",
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[1], metavar="N")
    parser.add_argument(
        "--routing", choices=("round_robin", "session", "prefix"), default="session"
    )
    parser.add_argument(
        "--arrival-rate",
        type=float,
        nargs="+",
        default=[0.5],
        metavar="R",
        help="trajectories started per second (Poisson; default 0.5)",
    )
    parser.add_argument("--queue", choices=("fcfs", "priority", "plas"), default="fcfs")
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per KV block (default 128, or the bench's with --calibrate)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=64, help="concurrent calls per replica")
    parser.add_argument("--prefill-tokens-per-s", type=float, default=None)
    parser.add_argument("--decode-s-per-token", type=float, default=None)
    parser.add_argument("--attention-s-per-token2", type=float, default=None)
    parser.add_argument(
        "--calibrate",
        metavar="RESULTS_JSON",
        default=None,
        help="fit the cost model (and block and pool size) from an `agentkv bench` results.json",
    )
    parser.add_argument(
        "--lower-tier-blocks", type=int, default=0, help="lower (CPU) tier capacity; 0: none"
    )
    parser.add_argument("--lower-tier-gb-per-s", type=float, default=16.0)
    parser.add_argument("--kv-bytes-per-token", type=int, default=131_072)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="sim-results", help="output folder (default sim-results)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def _cost(args: argparse.Namespace, cal: Calibration | None) -> SimCost:
    base = cal.cost if cal is not None else SimCost()
    return SimCost(
        overhead_s=base.overhead_s,
        prefill_tokens_per_s=args.prefill_tokens_per_s or base.prefill_tokens_per_s,
        decode_s_per_token=base.decode_s_per_token
        if args.decode_s_per_token is None
        else args.decode_s_per_token,
        attention_s_per_token2=base.attention_s_per_token2
        if args.attention_s_per_token2 is None
        else args.attention_s_per_token2,
    )


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
        cal = fit_calibration(args.calibrate) if args.calibrate else None
        if cal is not None:
            print(f"calibration ({cal.method}): {cal.describe()}")
        trace = load_trace(args.trace)
        tier = None
        if args.lower_tier_blocks > 0:
            tier = TierConfig(args.lower_tier_blocks, args.lower_tier_gb_per_s * 1e9)
        config = SimConfig(
            block_size=args.block_size or (cal and cal.block_size) or 128,
            pool_blocks=args.pool_blocks
            if args.pool_blocks is not None or cal is None
            else cal.pool_blocks,
            max_num_seqs=args.max_num_seqs,
            queue=args.queue,
            routing=args.routing,
            arrival_rate_per_s=args.arrival_rate[0],
            seed=args.seed,
            cost=_cost(args, cal),
            lower_tier=tier,
            kv_bytes_per_token=args.kv_bytes_per_token,
        )
        skipped = len(trace.trajectories) - len(trace.with_tokens().trajectories)
        results = sweep(
            lambda rate: from_trace(trace, arrival_rate_per_s=rate, seed=args.seed),
            config,
            names,
            pool_fractions=args.pool_fraction,
            arrival_rates=args.arrival_rate,
            replicas=args.replicas,
            source={
                "trace": str(args.trace),
                "sha256": trace.sha256,
                "trajectories_skipped_without_tokens": skipped,
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
            print("matplotlib is not installed: plots skipped (pip install 'agentkv[bench]')")
    return 0


def format_table(results: dict[str, object]) -> str:
    """A plain-text table: one row per sweep entry and policy."""
    head = f"{'pool':>6} {'rate':>5} {'rep':>3}  {'policy':<10} {'reuse':>6} {'tax':>6} {'jct_p50_s':>10} {'jct_p95_s':>10} {'preempt':>7}"
    lines = [head, "-" * len(head)]
    for e in results["sweep"]:  # type: ignore[index, attr-defined]
        for name, m in e["policies"].items():
            lines.append(
                f"{e['pool_fraction']:>6.2f} {e['arrival_rate_per_s']:>5.2g} {e['replicas']:>3}  "
                f"{name:<10} {m['prefix_reuse_ratio']:>6.3f} {m['rebuild_tax']:>6.3f} "
                f"{m['jct_p50_s']:>10.1f} {m['jct_p95_s']:>10.1f} {m['preemptions']:>7}"
            )
    return "\n".join(lines)


def _main() -> None:  # pragma: no cover - `python -m agentkv.sim._cli`
    parser = argparse.ArgumentParser(prog="agentkv sim")
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))


if __name__ == "__main__":  # pragma: no cover
    _main()

"""KV pressure in the simulator: every policy on the bench's own workload, with its limit.

The workload is what ``agentkv bench`` replays (issue 12's setting by default): closed
loop of ``--concurrency`` trajectories, each cut to ``--max-turns`` turns, tokens and tool
gaps scaled, a pool of ``--pool-fraction`` of the bench's working set, block size 32, and
the testbed's cost model (prefill 26k tokens/s, decode step 4 ms at batch 1 to 8 ms at
batch 12, a fixed ``--overhead-s`` per call outside the engine). Each repetition replays a
different slice of ``--trajectories`` trajectories of the trace (``--slices`` of them), as
the bench's repetitions would average over noise; figures are means over slices.

Columns: prefix reuse; mean and p95 JCT; headroom captured = (JCT_lru - JCT_x) /
(JCT_lru - JCT_limit), where the limit is the same workload with a pool that holds
everything (pool fraction 2.0); reuse against the best oracle (the block-level Belady
oracle or agentkv's core fed with exact return times, whichever reuses more).

    python benchmarks/sim_pressure.py [--trace T.jsonl ...] [--overhead-s 0.5] ...
    python benchmarks/sim_pressure.py --synthetic   # a generated workload instead
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentkv.sim import SimConfig, SimCost, SimTrajectory, simulate, synthesize
from agentkv.sim._workload import bench_pool_blocks, from_workload
from agentkv.traces import Trace, load_trace
from agentkv.workload import Scaling, Workload, make_workload

TRACES = (
    "/work/shared/data/traces/openhands_swebv_claude35.jsonl",
    "/work/shared/data/traces/openhands_v1_sdk_conversations.jsonl",
)
POLICIES = (
    "lru",
    "agentkv-v1",
    "agentkv",
    "ttl-fixed",
    "infercept",
    "kvflow",
    "oracle",
    "agentkv-oracle",
)
ORACLES = ("oracle", "agentkv-oracle")
LIMIT_FRACTION = 2.0


def _slices(trace: Trace, size: int, count: int) -> list[Trace]:
    """``count`` slices of ``size`` trajectories, spread over the trace (wrapping)."""
    usable = trace.with_tokens().trajectories
    n = len(usable)
    step = max(1, n // count)
    out = []
    for i in range(count):
        idx = [(i * step + j) % n for j in range(min(size, n))]
        out.append(replace(trace, trajectories=tuple(usable[j] for j in idx)))
    return out


def _synthetic(size: int, count: int, turns: int) -> list[tuple[SimTrajectory, ...]]:
    return [
        synthesize(size, turns, seed=100 + i, arrival_rate_per_s=None, system_prompt_tokens=2000)
        for i in range(count)
    ]


def evaluate(
    workloads: Sequence[tuple[tuple[SimTrajectory, ...], int, int]],
    policies: Sequence[str | Callable[[], Any]],
    config: SimConfig,
) -> dict[str, dict[str, float]]:
    """Mean metrics per policy over ``(workload, pool_blocks, limit_blocks)`` slices."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for sim_wl, pool, limit_pool in workloads:
        res = simulate(sim_wl, config.with_(pool_blocks=pool), policies)
        lim = simulate(sim_wl, config.with_(pool_blocks=limit_pool), ["lru"])["lru"]
        res["limit"] = lim
        lru_j, lim_j = res["lru"]["jct_mean_s"], lim["jct_mean_s"]
        best = max((res[o]["prefix_reuse_ratio"] for o in ORACLES if o in res), default=0.0)
        for name, m in res.items():
            head = (lru_j - m["jct_mean_s"]) / (lru_j - lim_j) if lru_j > lim_j else 0.0
            rows.setdefault(name, []).append(
                {
                    "reuse": m["prefix_reuse_ratio"],
                    "jct": m["jct_mean_s"],
                    "p95": m["jct_p95_s"],
                    "head": head,
                    "vs_oracle": m["prefix_reuse_ratio"] / best if best > 0 else 0.0,
                    "vs_lru": m["prefix_reuse_ratio"] / max(1e-9, res["lru"]["prefix_reuse_ratio"]),
                    "preempt": m["preemptions"],
                    "held": m.get("core", {}).get("turns_held", 0),
                    "util": m.get("utilization", 0.0),
                }
            )
    out = {
        name: {k: statistics.fmean(r[k] for r in rs) for k in rs[0]} for name, rs in rows.items()
    }
    for m in out.values():  # a ratio of means, not a mean of ratios
        m["vs_lru"] = m["reuse"] / max(1e-9, out["lru"]["reuse"])
    return out


def _print(title: str, table: dict[str, dict[str, float]]) -> None:
    print(f"\n### {title}")
    print(
        "| policy | reuse | JCT mean s | JCT p95 s | headroom | reuse/oracle | reuse/lru "
        "| preempt | held | busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, m in table.items():
        print(
            f"| {name} | {m['reuse']:.3f} | {m['jct']:.1f} | {m['p95']:.1f} | {m['head']:.2f} | "
            f"{m['vs_oracle']:.2f} | {m['vs_lru']:.1f}x | {m['preempt']:.0f} | {m['held']:.0f} "
            f"| {m['util']:.2f} |"
        )
    sys.stdout.flush()


def workloads_for(
    args: argparse.Namespace, trace_path: str | None
) -> list[tuple[tuple[SimTrajectory, ...], int, int]]:
    """The slices of one trace (or the synthetic workload), with their pools."""
    out = []
    if trace_path is None:
        for wl in _synthetic(args.trajectories, args.slices, args.max_turns):
            from agentkv.sim import working_set_blocks

            cfg = SimConfig(
                block_size=args.block_size, arrival="closed", concurrency=args.concurrency
            )
            ws = working_set_blocks(wl, cfg)
            out.append((wl, max(1, int(ws * args.pool_fraction)), ws * 2))
        return out
    scaling = Scaling(
        token_scale=args.token_scale, time_scale=args.time_scale, max_turns=args.max_turns
    )
    for part in _slices(load_trace(trace_path), args.trajectories, args.slices):
        bench_wl: Workload = make_workload(part, scaling)
        pool = bench_pool_blocks(bench_wl, args.concurrency, args.pool_fraction, args.block_size)
        limit = bench_pool_blocks(bench_wl, args.concurrency, LIMIT_FRACTION, args.block_size)
        out.append((from_workload(bench_wl, arrival_rate_per_s=None), pool, limit))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", nargs="*", default=list(TRACES))
    p.add_argument("--synthetic", action="store_true", help="a synthetic workload instead")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--trajectories", type=int, default=12, help="trajectories per slice")
    p.add_argument("--slices", type=int, default=3)
    p.add_argument("--max-turns", type=int, default=12)
    p.add_argument("--token-scale", type=float, default=0.5)
    p.add_argument("--time-scale", type=float, default=0.3)
    p.add_argument("--pool-fraction", type=float, default=0.3)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--overhead-s", type=float, default=0.5)
    p.add_argument("--prefill-tokens-per-s", type=float, default=26000.0)
    args = p.parse_args(argv)
    cost = SimCost(overhead_s=args.overhead_s, prefill_tokens_per_s=args.prefill_tokens_per_s)
    config = SimConfig(
        block_size=args.block_size,
        arrival="closed",
        concurrency=args.concurrency,
        cost=cost,
        max_num_seqs=128,
    )
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    sources: list[str | None] = [None] if args.synthetic else list(args.trace)
    for src in sources:
        t0 = time.perf_counter()
        table = evaluate(workloads_for(args, src), policies, config)
        name = "synthetic" if src is None else Path(src).stem
        _print(
            f"{name}: {args.concurrency} concurrent x {args.max_turns} turns, tokens x{args.token_scale}, "
            f"gaps x{args.time_scale}, pool {args.pool_fraction}, overhead {args.overhead_s} s "
            f"({args.slices} slices of {args.trajectories}; {time.perf_counter() - t0:.0f} s)",
            table,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

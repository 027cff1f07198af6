"""Does re-warming evicted prefixes ahead of their return pay? The simulator's answer.

On the bench's workload (as ``benchmarks/sim_pressure.py`` builds it: closed loop, each
trace cut into slices of 12 trajectories x 12 turns, tokens x0.5, gaps x0.3, block 32),
``agentkv`` is run as it ships and with the core's experimental ``rewarm`` on (when no
turn waits and fewer than ``min_running`` calls run, the evicted part of the paused
context expected back soonest is recomputed into free blocks and leased), for a few
horizons, at several concurrencies and pools. Printed: mean JCT, reuse, tokens spent
on re-warms, and re-warmed blocks used by the next turn versus given up first.

    python benchmarks/sim_rewarm.py [--slices 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from sim_pressure import TRACES, workloads_for

from agentkv.sim import Policy, SimConfig, SimCost, make_policy
from agentkv.sim._engine import run_policy
from agentkv.sim._policies import AgentKVPolicy
from agentkv.sim._rewarm import Rewarm

SETTINGS = ((12, 0.3, 0.5), (4, 0.3, 0.5), (12, 0.5, 0.5), (4, 0.3, 0.0))


def _policies(horizons: list[float]) -> dict[str, Callable[[], Policy]]:
    out: dict[str, Callable[[], Policy]] = {
        "lru": lambda: make_policy("lru"),
        "agentkv": lambda: make_policy("agentkv"),
    }
    for h in horizons:
        setting = Rewarm(horizon_turns=h)
        out[f"rewarm h={h:g}"] = lambda r=setting: AgentKVPolicy(rewarm=r)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", nargs="*", default=list(TRACES))
    p.add_argument("--slices", type=int, default=4)
    p.add_argument("--horizons", default="1,2,4", help="re-warm horizons, in mean turn times")
    args = p.parse_args(argv)
    horizons = [float(x) for x in args.horizons.split(",")]
    print("| trace | conc | pool | overhead s | policy | JCT mean s | reuse | re-warm tokens "
          "| blocks re-warmed | used | wasted |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for trace in args.trace:
        for conc, pool, overhead in SETTINGS:
            ns = argparse.Namespace(trajectories=12, slices=args.slices, max_turns=12,
                                    token_scale=0.5, time_scale=0.3, pool_fraction=pool,
                                    block_size=32, concurrency=conc)  # fmt: skip
            cfg = SimConfig(block_size=32, arrival="closed", concurrency=conc,
                            cost=SimCost(overhead_s=overhead), max_num_seqs=128)  # fmt: skip
            slices = workloads_for(ns, trace)
            for name, make in _policies(horizons).items():
                jct, reuse, tok, blk, used, wasted = [], [], 0, 0, 0, 0
                for wl, pool_blocks, _ in slices:
                    st = run_policy(wl, cfg.with_(pool_blocks=pool_blocks), make())
                    jct.append(statistics.mean(st.jct_s))
                    reuse.append(st.cached_tokens / max(1, st.reusable_tokens))
                    tok += st.rewarm_tokens
                    blk += st.core.get("rewarm_blocks", 0)
                    used += st.core.get("rewarm_blocks_used", 0)
                    wasted += st.core.get("rewarm_blocks_wasted", 0)
                print(f"| {Path(trace).stem} | {conc} | {pool} | {overhead} | {name} "
                      f"| {statistics.mean(jct):.1f} | {statistics.mean(reuse):.3f} | {tok} "
                      f"| {blk} | {used} | {wasted} |")  # fmt: skip
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

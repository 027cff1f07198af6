"""Routing across replicas against agentkv's admission, in the simulator: lru vs agentkv.

The setting of the real 2-replica runs in docs/scale-out.md (OpenHands SWE-bench trace,
12 trajectories x 6 turns, tokens x0.05, gaps x0.2, 12 in flight, block size 32, 50
blocks per replica = pool 0.3 of each replica's share), with the cost model fitted from
run 5's round-robin results (2,590 prefill tokens/s, 11.2 ms engine step, 20 ms fixed
cost per call). Cells:

- ``single``: one server, pool 50 and pool 100 (one replica's pool, and both together);
- ``session``: 2 replicas, consistent hash on the trajectory;
- ``round_robin``: 2 replicas, call n to replica n mod 2;
- ``random``: 2 replicas, each call to a replica drawn at random (3 seeds, mean);
- ``recorded``: with ``--recorded RESULTS.json``, every call to the replica it reached in
  a real run (one simulation per recorded repetition, mean).

Reuse is the bench's: cached tokens over the block-aligned shared prefixes. Needs no
server. Run: ``python benchmarks/sim_affinity.py [--trace PATH] [--recorded RESULTS.json]``
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from agentkv.bench.report._simcheck import eligible_total, sim_routing
from agentkv.sim import SimConfig, SimCost, from_workload, simulate
from agentkv.traces import load_trace
from agentkv.workload import Scaling, make_workload

TRACE = "/work/shared/data/traces/openhands_swebv_claude35.jsonl"
COST = SimCost(
    prefill_tokens_per_s=2590.0, decode_s_per_token=0.0, step_base_s=0.0112, overhead_s=0.02
)
POLICIES = ("lru", "agentkv")


def _random_calls(workload: Any, seed: int) -> tuple[tuple[str, int, int], ...]:
    rng = random.Random(seed)
    return tuple(
        (t.trajectory_id, k, rng.randrange(2)) for t in workload for k in range(len(t.turns))
    )


def _recorded(path: Path) -> list[tuple[tuple[str, int, int], ...]]:
    """Arm E's calls per repetition, each to the replica it reached (the bench's reading)."""
    routing = sim_routing(json.loads(path.read_text()))
    return list(routing.get("call_placements", {}).get("E", ()))


def cells(
    workload: Any, recorded: list[tuple[tuple[str, int, int], ...]]
) -> list[tuple[str, SimConfig | list[SimConfig]]]:
    """The (label, config or configs to average) of every cell."""
    base = SimConfig(
        block_size=32,
        pool_blocks=50,
        max_num_seqs=256,
        arrival="closed",
        concurrency=12,
        cost=COST,
    )
    two = base.with_(replicas=2)
    out: list[tuple[str, SimConfig | list[SimConfig]]] = [
        ("single, pool 50", base),
        ("single, pool 100", base.with_(pool_blocks=100)),
        ("2 replicas, session", two.with_(routing="session")),
        ("2 replicas, round robin", two.with_(routing="round_robin")),
        (
            "2 replicas, random (3 seeds)",
            [two.with_(call_placement=_random_calls(workload, s)) for s in range(3)],
        ),
    ]
    if recorded:
        label = f"2 replicas, as run 5 routed ({len(recorded)} reps)"
        out.append((label, [two.with_(call_placement=c) for c in recorded]))
    return out


def run_cell(workload: Any, configs: list[SimConfig], denom: int) -> dict[str, dict[str, float]]:
    """Mean JCT, reuse and admission counters per policy over ``configs``."""
    out: dict[str, dict[str, float]] = {}
    for policy in POLICIES:
        rows = [simulate(workload, c, [policy])[policy] for c in configs]
        n = len(rows)
        out[policy] = {
            "jct_mean_s": sum(r["jct_mean_s"] for r in rows) / n,
            "reuse": sum(r["cached_tokens"] for r in rows) / n / denom,
            "turns_held": sum(r["core"].get("turns_held", 0) for r in rows) / n,
            "leases_reused": sum(r["core"].get("leases_reused", 0) for r in rows) / n,
            "leases_created": sum(r["core"].get("leases_created", 0) for r in rows) / n,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--recorded", type=Path, default=None, help="a real run's results.json")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    scaling = Scaling(token_scale=0.05, time_scale=0.2, max_trajectories=12, max_turns=6)
    bench_workload = make_workload(load_trace(args.trace), scaling)
    workload = from_workload(bench_workload, arrival_rate_per_s=None)
    denom = eligible_total(bench_workload, 32)
    recorded = _recorded(args.recorded) if args.recorded else []
    print(
        f"{'cell':<36} {'lru JCT s':>9} {'agentkv JCT s':>13} {'JCT B/E':>7} "
        f"{'lru reuse':>9} {'agentkv reuse':>13} {'held':>5} {'lease reused/made':>17}"
    )
    figures: dict[str, Any] = {}
    for label, cfg in cells(workload, recorded):
        res = run_cell(workload, cfg if isinstance(cfg, list) else [cfg], denom)
        figures[label] = res
        b, e = res["lru"], res["agentkv"]
        print(
            f"{label:<36} {b['jct_mean_s']:>9.2f} {e['jct_mean_s']:>13.2f} "
            f"{b['jct_mean_s'] / e['jct_mean_s']:>6.2f}x {b['reuse']:>9.3f} {e['reuse']:>13.3f} "
            f"{e['turns_held']:>5.0f} {e['leases_reused']:>8.0f}/{e['leases_created']:<8.0f}"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()

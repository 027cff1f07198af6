"""How fast the simulator runs: 10,000 trajectories x 80 turns (stock LRU policy).

Synthesizes the workload deterministically (seed 0), simulates it on one replica with a
fixed pool, and prints wall and CPU time (``time.process_time``: the machine is shared,
so wall time also counts other processes) and the figures.
Run: ``python benchmarks/sim_scale.py [--trajectories N] [--turns K]``.
"""

from __future__ import annotations

import argparse
import time

from agentkv.sim import (
    LRUPolicy,
    SimConfig,
    SimCost,
    max_request_blocks,
    reuse_ceiling_tokens,
    run_policy,
    summarize,
    synthesize,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=80)
    parser.add_argument("--policy", default="lru")
    args = parser.parse_args()

    t0, c0 = time.perf_counter(), time.process_time()
    workload = synthesize(
        args.trajectories, args.turns, seed=0, arrival_rate_per_s=1.0, system_prompt_tokens=1500
    )
    t_synth, c_synth = time.perf_counter() - t0, time.process_time() - c0
    block_size = 256
    # a fixed pool (no reference run): room for ~400 live contexts of ~16k tokens
    pool_blocks = max(400 * 64, max_request_blocks(workload, block_size) + 1)
    cfg = SimConfig(
        block_size=block_size,
        pool_blocks=pool_blocks,
        max_num_seqs=256,
        cost=SimCost(prefill_tokens_per_s=400_000.0, decode_s_per_token=0.01),
    )
    from agentkv.sim import make_policy

    policy = LRUPolicy() if args.policy == "lru" else make_policy(args.policy)
    t1, c1 = time.perf_counter(), time.process_time()
    stats = run_policy(workload, cfg, policy)
    t_sim, c_sim = time.perf_counter() - t1, time.process_time() - c1
    m = summarize(stats, reuse_ceiling_tokens(workload, block_size))
    turns = args.trajectories * args.turns
    print(
        f"workload: {args.trajectories} trajectories x {args.turns} turns = {turns} calls "
        f"(synthesized in {t_synth:.1f} s wall, {c_synth:.1f} s CPU)"
    )
    print(f"policy {policy.name}, pool {pool_blocks} blocks of {block_size} tokens")
    print(
        f"simulated in {t_sim:.1f} s wall, {c_sim:.1f} s CPU ({turns / c_sim:,.0f} calls per "
        f"CPU second); total with synthesis {t_synth + t_sim:.1f} s wall, "
        f"{c_synth + c_sim:.1f} s CPU"
    )
    print(
        f"reuse {m['prefix_reuse_ratio']:.3f}  rebuild_tax {m['rebuild_tax']:.3f}  "
        f"jct_p50 {m['jct_p50_s']:.1f} s  jct_p95 {m['jct_p95_s']:.1f} s  "
        f"preemptions {m['preemptions']}  simulated span {m['makespan_s']:.0f} s"
    )


if __name__ == "__main__":
    main()

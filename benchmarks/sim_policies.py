"""Policies on the shared traces at the elbow of the pool-size curve.

For each trace: sweep the pool from 10% to 100% of the working set, find the elbow (the
pool fraction where stock LRU's reuse curve bends most), and print the prefix reuse of
lru, ttl-fixed, agentkv and the Belady oracle there, with agentkv's fraction of the
oracle. Run: ``python benchmarks/sim_policies.py [TRACE ...]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentkv.sim import SimConfig, find_elbow, from_trace, sweep
from agentkv.traces import load_trace

TRACES = (
    "/work/shared/data/traces/openhands_swebv_claude35.jsonl",
    "/work/shared/data/traces/openhands_v1_sdk_conversations.jsonl",
)
POLICIES = ("lru", "ttl-fixed", "agentkv", "oracle")
FRACTIONS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)


def main(paths: list[str]) -> None:
    config = SimConfig()
    print(
        f"config: block {config.block_size} tokens, prefill {config.cost.prefill_tokens_per_s:.0f} tok/s, "
        f"decode {config.cost.decode_s_per_token} s/token, {config.arrival_rate_per_s} trajectories/s, "
        f"max_num_seqs {config.max_num_seqs}, seed {config.seed}"
    )
    header = (
        f"{'trace':<38} {'elbow':>5} "
        + " ".join(f"{p:>9}" for p in POLICIES)
        + f" {'agentkv/oracle':>14}"
    )
    print(header)
    print("-" * len(header))
    for path in paths:
        trace = load_trace(path)
        res = sweep(
            lambda rate, trace=trace: from_trace(trace, arrival_rate_per_s=rate, seed=config.seed),
            config,
            POLICIES,
            pool_fractions=FRACTIONS,
        )
        elbow = find_elbow(res, "lru")
        entry = next(e for e in res["sweep"] if e["pool_fraction"] == elbow)
        reuse = {p: entry["policies"][p]["prefix_reuse_ratio"] for p in POLICIES}
        frac = reuse["agentkv"] / reuse["oracle"] if reuse["oracle"] else 0.0
        print(
            f"{Path(path).name:<38} {elbow:>5.2f} "
            + " ".join(f"{reuse[p]:>9.3f}" for p in POLICIES)
            + f" {frac:>14.3f}"
        )
        for e in res["sweep"]:
            cells = " ".join(f"{e['policies'][p]['prefix_reuse_ratio']:>9.3f}" for p in POLICIES)
            print(f"{'  pool ' + format(e['pool_fraction'], '.2f'):<38} {'':>5} {cells}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(TRACES))

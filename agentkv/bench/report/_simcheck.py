"""The simulator on the bench's own workload: the oracle's reuse, and each arm's forecast.

After a run, the bench's scaled workload (the same trajectories, turns, scaling and
arrivals) goes through :mod:`agentkv.sim` with the bench's block size and pool, and the
cost model this run measured: B's server's testbed figures (marginal prefill tokens/s,
the decode step at the run's batch, the fixed per-turn cost; see
:mod:`agentkv.bench.testbed._costs`), or, when the testbed was not measured, a fit of this
run's own ``results.json`` (what ``agentkv sim --calibrate`` does). Two things come
back:

- the oracle's prefix reuse: the best of the simulator's Belady policies (``oracle``,
  which evicts the block used furthest in the future, and ``agentkv-oracle``, the
  policy core given exact return times) on the same pool. Each arm's measured reuse is
  reported against it;
- each arm's simulated reuse and mean JCT (B: ``lru``; E: ``agentkv``; F: ``lru`` with
  the plugin's priority queue; G: ``agentkv`` with it; L: ``lru`` on L's pool; FP8 arms
  get twice the blocks), for comparing simulated and real arms directly;
- the headroom each simulated arm and oracle takes between the simulated B and L
  (:func:`add_sim_headroom`). ``agentkv-oracle``'s is the bound for a lease policy on
  this workload and pool: where it is small, no forecast can take much of L's gain.

Behind a router (``--replicas N``) the simulator runs N replicas with the per-replica
pool and the same routing; under session routing it follows the trajectory -> replica
split the run recorded (from an arm with the plugin), else its own hash ring. Where the
run recorded the replica of every call (each replica tags its answers, see
:mod:`agentkv.bench.testbed._servedby`), each repetition of an arm is simulated with its own
calls routed as they ran, and the arm's figures are the mean over repetitions: under
round robin, which replica a call reached depends on every request the router saw.

The simulator is deterministic, and which contexts survive a pause hangs on the order in
which a few calls reach the scheduler: one simulated timing is one draw, as one real
repetition is. So each simulated repetition is run :data:`ENSEMBLE_RUNS` times with every
call's fixed latency drawn from ``overhead_s`` x [1 - :data:`OVERHEAD_JITTER`, 1 +
:data:`OVERHEAD_JITTER`] (seeds 1, 2, ...); an arm's figures are the mean, and
``ensemble.reuse_sd`` the spread of the arm's reuse from one draw to the next.

Reuse here is in the bench's own units: tokens served from the cache over the
block-aligned shared prefixes the server could have served (``eligible_prefix_tokens``),
so the figures compare with the bench's ``prefix_reuse_ratio`` as they are.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentkv.bench.report._calldiff import call_diff
from agentkv.bench.report._headroom import headroom
from agentkv.workload._arrival import Arrival
from agentkv.workload._workload import Workload, eligible_prefix_tokens

if TYPE_CHECKING:  # pragma: no cover
    from agentkv.sim._config import Routing

__all__ = [
    "ORACLES",
    "SIM_POLICY",
    "SimInputs",
    "add_sim_headroom",
    "cost_from_testbed",
    "eligible_total",
    "sim_routing",
    "simulate_bench",
]

ORACLES = ("oracle", "agentkv-oracle")
#: Simulated timings per repetition, and how far each call's fixed latency is drawn
#: around the measured one (the testbed's fixed turn ranged 8-17 ms on a 2-core machine).
ENSEMBLE_RUNS = 6
OVERHEAD_JITTER = 0.5
# arm -> (simulator policy, queue order)
SIM_POLICY: dict[str, tuple[str, str]] = {
    "A": ("lru", "fcfs"),
    "B": ("lru", "fcfs"),
    "C": ("lru", "fcfs"),
    "D": ("lru", "fcfs"),
    "E": ("agentkv", "fcfs"),
    "F": ("lru", "priority"),
    "G": ("agentkv", "priority"),
    "L": ("lru", "fcfs"),
    # The router's own admission is not modelled: R is B's policy, R+ G's.
    "R": ("lru", "fcfs"),
    "R+": ("agentkv", "priority"),
}

#: The simulator's routing for each ``--routing`` value (a run's split is followed anyway).
_SIM_ROUTING: dict[str, Routing] = {"round_robin": "round_robin", "sticky": "sticky"}


@dataclass(frozen=True)
class SimInputs:
    """What the simulator needs from one pool fraction of a bench run."""

    workload: Workload
    arrival: Arrival
    block_size: int
    pool_blocks: int
    limit_blocks: int | None
    fp8_arms: frozenset[str]
    system_prefix_tokens: int = 0
    # Router mode (``--replicas``): per-replica pools, the router's policy, and the
    # trajectory -> replica split the run recorded (session routing; else the sim's ring).
    replicas: int = 1
    routing: str = "session"
    placement: tuple[tuple[str, int], ...] = ()
    testbed: Mapping[str, Any] | None = None  # B's server's testbed costs, when measured
    # arm -> per repetition, (trajectory id, turn, replica) of each call whose replica the
    # run recorded: the arm is simulated once per repetition, following it call by call
    call_placements: Mapping[str, tuple[tuple[tuple[str, int, int], ...], ...]] = field(
        default_factory=dict
    )
    # arm -> per repetition, each completed call's [cached, eligible, sent_s, latency_s]
    # ("<trajectory index>/<turn position>" keys, see agentkv.bench.report._calldiff)
    real_calls: Mapping[str, Sequence[Mapping[str, Sequence[Any]]]] = field(default_factory=dict)
    # the client's gap-model warm-up every replay started from (agentkv.workload._warm): the
    # simulated agentkv policies start from the same model (None: cold, priors only)
    gap_warmup: Any = None


def sim_routing(results: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`SimInputs` fields for a run behind a router, from its results (none for one
    server): the replicas, the routing, the trajectory -> replica split an arm with
    the plugin recorded, and each arm's recorded replica of every call per repetition."""
    setup = results.get("replicas") or {}
    if not setup.get("router"):
        return {}
    placement: dict[str, int] = {}
    for arm in (results.get("arms") or {}).values():
        by_index = (arm.get("replicas") or {}).get("placement_by_index")
        if by_index:
            placement = {f"t{int(i)}": int(r) for i, r in by_index.items()}
            break
    return {
        "replicas": int(setup["replicas"]),
        "routing": str(setup.get("routing") or "session"),
        "placement": tuple(sorted(placement.items())),
        "call_placements": {
            name: per_rep
            for name, arm in (results.get("arms") or {}).items()
            if (per_rep := _call_placements(arm))
        },
    }


def _call_placements(arm: Mapping[str, Any]) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """An arm's ``call_replicas_per_rep`` as simulator call placements (empty when any
    repetition recorded none: then the simulator routes by the routing policy)."""
    per_rep = (arm.get("replicas") or {}).get("call_replicas_per_rep") or []
    out = []
    for calls in per_rep:
        if not calls:
            return ()
        out.append(tuple(sorted((*_sim_call(key), int(replica)) for key, replica in calls.items())))
    return tuple(out)


def _sim_call(key: object) -> tuple[str, int]:
    """A recorded ``"<trajectory index>/<turn position>"`` key as the simulator's
    (trajectory id, turn)."""
    traj, _, turn = str(key).partition("/")
    return f"t{int(traj)}", int(turn)


def _call_times(real: Mapping[str, Sequence[Any]]) -> tuple[tuple[str, int, float], ...]:
    """One repetition's recorded send times as simulator ``call_times`` (empty when a
    call recorded none, e.g. a results.json from before send times were kept)."""
    if any(len(call) < 3 or call[2] is None for call in real.values()):
        return ()
    return tuple(sorted((*_sim_call(key), max(0.0, float(call[2]))) for key, call in real.items()))


def _sim_arm(
    run: Callable[..., dict[str, Any]], inputs: SimInputs, arm: str, draws: int = 1
) -> dict[str, Any]:
    """One arm's simulated figures: its policy ``draws`` times per recorded repetition
    (calls routed as they ran, when recorded; see :data:`ENSEMBLE_RUNS`), the
    call-by-call diff against the real calls, and, where the run recorded every call's
    send time, the same runs with each call sent when it was (``replayed``: what the
    cache model gives for the real send order)."""
    policy, queue = SIM_POLICY.get(arm, ("lru", "fcfs"))
    blocks = inputs.pool_blocks * (2 if arm in inputs.fp8_arms else 1)
    if arm == "L" and inputs.limit_blocks is not None:
        blocks = inputs.limit_blocks
    recorded = inputs.call_placements.get(arm) or ((),)
    drawn = [
        [run(policy, jitter_seed=k, queue=queue, pool_blocks=blocks, call_placement=c)
         for k in range(1, draws + 1)]
        for c in recorded
    ]  # fmt: skip
    runs = [_mean_of(d) for d in drawn]  # one per repetition, its calls from the first draw
    out = {**_mean_of(runs), "queue": queue, "ensemble": _ensemble(drawn)}
    real = inputs.real_calls.get(arm) or ()
    routes = None
    if recorded[0]:
        routes = [{f"{t[1:]}/{turn}": r for t, turn, r in calls} for calls in recorded]
    if real:
        out["call_diff"] = call_diff(real, [r["calls"] for r in runs], routes)
    if len(runs) > 1 or recorded[0]:
        out["routed_as_recorded"] = True  # each repetition's calls, as they ran
        out["prefix_reuse_per_rep"] = [r["prefix_reuse_ratio"] for r in runs]
    times = [_call_times(rep) for rep in real]
    if times and all(times):
        replayed = [
            run(
                policy,
                queue=queue,
                pool_blocks=blocks,
                call_placement=recorded[min(i, len(recorded) - 1)],
                call_times=sent,
            )
            for i, sent in enumerate(times)
        ]
        mean = _mean_of(replayed)
        out["replayed"] = {
            "prefix_reuse_ratio": mean["prefix_reuse_ratio"],
            "jct_mean_s": mean["jct_mean_s"],
            "prefix_reuse_per_rep": [r["prefix_reuse_ratio"] for r in replayed],
            "call_diff": call_diff(real, [r["calls"] for r in replayed], routes),
        }
    return out


def _ensemble(drawn: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """How much an arm's simulated reuse moves from one draw of the latencies to the
    next: the standard deviation, over draws, of the reuse averaged over repetitions."""
    per_draw = [
        statistics.fmean(rep[k]["prefix_reuse_ratio"] or 0.0 for rep in drawn)
        for k in range(len(drawn[0]))
    ]
    sd = statistics.stdev(per_draw) if len(per_draw) > 1 else 0.0
    return {"runs_per_rep": len(per_draw), "overhead_jitter": OVERHEAD_JITTER, "reuse_sd": sd}


def _mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One simulated arm from its runs (one per recorded repetition): means of the figures."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0])
    for key in ("prefix_reuse_ratio", "jct_mean_s"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = sum(values) / len(values) if values else None
    return out


def _without_calls(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in figures.items() if k != "calls"}


def eligible_total(workload: Workload, block_size: int) -> int:
    """The block-aligned shared prefix tokens of every turn (the bench's reuse denominator)."""
    return sum(
        eligible_prefix_tokens(u.shared_prefix_tokens, u.prompt_tokens, block_size)
        for t in workload.trajectories
        for u in t.turns
    )


def cost_from_testbed(testbed: Mapping[str, Any] | None) -> Any:
    """A :class:`~agentkv.sim.SimCost` from a server's testbed figures, or None when
    they are incomplete: prefill at the marginal fresh rate, every engine step the
    measured decode step at the run's batch (vLLM's inter-token latency there, else the
    client's figure), the fixed per-turn cost as the overhead."""
    from agentkv.sim import SimCost

    tb = testbed or {}
    rate = (tb.get("prefill") or {}).get("tokens_per_s")
    decode = tb.get("decode") or {}
    # the engine's inter-token latency first: older results' client figure can be ~0
    step = decode.get("server_itl_s_batch_n") or decode.get("batch_n_step_s")
    fixed = (tb.get("fixed_turn") or {}).get("client_ttft_s_p50")
    if not (rate and rate > 0 and step and step > 0):
        return None
    return SimCost(
        prefill_tokens_per_s=rate, decode_s_per_token=0.0, step_base_s=step, overhead_s=fixed or 0.0
    )


def _cost(
    results_path: Path | None, testbed: Mapping[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    from agentkv._errors import ConfigError
    from agentkv.sim import SimCost, fit_calibration

    measured = cost_from_testbed(testbed)
    if measured is not None:
        return measured, {
            "method": "testbed",
            "prefill_tokens_per_s": round(measured.prefill_tokens_per_s, 1),
            "step_base_s": round(measured.step_base_s, 6),
            "overhead_s": round(measured.overhead_s, 6),
        }
    if results_path is None:
        return SimCost(), {"method": "defaults", "notes": ["no results.json to fit"]}
    try:
        cal = fit_calibration(results_path)
    except ConfigError as exc:
        return SimCost(), {"method": "defaults", "notes": [str(exc)]}
    return cal.cost, cal.describe()


def simulate_bench(
    inputs: SimInputs, arms: list[str], results_path: Path | None = None
) -> dict[str, Any]:
    """Run the oracles and each arm's policy; return the ``simulator`` report section."""
    from agentkv.sim import SimConfig, from_workload, make_policy, run_policy, summarize

    poisson = inputs.arrival.process == "poisson"
    rate = inputs.arrival.rate_per_s if poisson else None
    workload = from_workload(inputs.workload, arrival_rate_per_s=rate, seed=inputs.arrival.seed)
    cost, calibration = _cost(results_path, inputs.testbed)
    base = SimConfig(
        block_size=inputs.block_size,
        pool_blocks=inputs.pool_blocks,
        max_num_seqs=256,
        arrival="poisson" if poisson else "closed",
        concurrency=max(1, inputs.arrival.concurrency),
        system_prefix_tokens=inputs.system_prefix_tokens,
        arrival_rate_per_s=rate,
        seed=inputs.arrival.seed,
        cost=cost,
        replicas=inputs.replicas,
        routing=_SIM_ROUTING.get(inputs.routing, "session"),
        placement=inputs.placement,
    )
    denom = eligible_total(inputs.workload, inputs.block_size)

    def run(policy: str, jitter_seed: int | None = None, **changes: Any) -> dict[str, Any]:
        if jitter_seed is not None:  # the engine draws nothing without a fixed latency
            changes.update(
                jitter_seed=jitter_seed, cost=replace(cost, overhead_jitter=OVERHEAD_JITTER)
            )
        warm = inputs.gap_warmup
        gaps = warm.make_model() if warm is not None else None
        stats = run_policy(workload, base.with_(**changes), make_policy(policy, gap_model=gaps))
        m = summarize(stats, 0)
        return {
            "policy": policy,
            "prefix_reuse_ratio": m["cached_tokens"] / denom if denom else None,
            "jct_mean_s": m["jct_mean_s"],
            "pool_blocks": m["pool_blocks"],
            "calls": stats.calls,
        }

    oracles = {name: _without_calls(run(name)) for name in ORACLES}
    best = max(oracles.values(), key=lambda o: o["prefix_reuse_ratio"] or 0.0)
    draws = ENSEMBLE_RUNS if cost.overhead_s > 0 else 1  # nothing to draw without a latency
    per_arm = {arm: _without_calls(_sim_arm(run, inputs, arm, draws)) for arm in arms}
    add_sim_headroom(per_arm, oracles)
    return {
        "oracle": best,
        "oracles": oracles,
        "arms": per_arm,
        "eligible_prefix_tokens": denom,
        "calibration": calibration,
    }


def add_sim_headroom(arms: dict[str, dict[str, Any]], oracles: dict[str, dict[str, Any]]) -> None:
    """Set ``headroom`` on every simulated arm and oracle: ``(B - x) / (B - L)`` on the
    simulated mean JCTs, B and L as simulated here (None without both, or where the
    simulated L is not faster than B). ``agentkv-oracle``'s figure is the share a lease
    policy that knew every return time would take on this workload and pool: the bound to
    read an arm's headroom against, beside L's."""
    b = (arms.get("B") or {}).get("jct_mean_s")
    lim = (arms.get("L") or {}).get("jct_mean_s")
    for figures in (*arms.values(), *oracles.values()):
        jct = figures.get("jct_mean_s")
        value = None
        if b is not None and lim is not None and jct is not None:
            h = headroom(b, jct, lim)
            value = None if math.isnan(h) else h
        figures["headroom"] = value

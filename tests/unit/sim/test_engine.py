"""The simulator's engine: metrics, determinism, the oracle bound, pools, tiers, routing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv._errors import ConfigError
from agentkv.sim import (
    Router,
    SimConfig,
    SimCost,
    SimTrajectory,
    SimTurn,
    TierConfig,
    reuse_ceiling_tokens,
    simulate,
    synthesize,
)

# Model work is instant here, so request timing does not depend on cache hits and every
# policy sees the same request stream: the setting in which Belady's rule is optimal.
INSTANT = SimCost(prefill_tokens_per_s=1e15, decode_s_per_token=0.0, step_base_s=0.0)
NO_ORACLE = ("lru", "ttl-fixed", "infercept", "kvflow")


def _two_turns() -> tuple[SimTrajectory, ...]:
    # 129 tokens of context: vLLM computes KV for all but the last sampled token, 8 blocks.
    turns = (
        SimTurn(prompt_tokens=100, output_tokens=29, shared_tokens=0, tool_class="bash", gap_s=2.0),
        SimTurn(
            prompt_tokens=200, output_tokens=10, shared_tokens=128, tool_class=None, gap_s=None
        ),
    )
    return (SimTrajectory("a", 0.0, turns),)


def test_metrics_follow_the_benchmark_definitions() -> None:
    cost = SimCost(prefill_tokens_per_s=1000.0, decode_s_per_token=0.01, step_base_s=0.0)
    cfg = SimConfig(block_size=16, pool_blocks=100, cost=cost)
    m = simulate(_two_turns(), cfg, ["lru"])["lru"]
    assert m["prefix_reuse_ratio"] == 1.0  # 128 shared tokens, 8 whole blocks, all cached
    assert m["rebuild_tax"] == 0.0
    assert m["prefill_tokens_computed"] == 100 + 72
    # The step that ends a prefill samples the first token; each later token is a step.
    expected_jct = 0.100 + 0.28 + 2.0 + 0.072 + 0.09
    assert m["jct_p50_s"] == pytest.approx(expected_jct)
    assert m["jct_p95_s"] == pytest.approx(expected_jct)


def test_a_pool_with_no_room_recomputes_and_pays_the_rebuild_tax() -> None:
    # 17 blocks: enough for one call, so the first turn's blocks get evicted by the second.
    cfg = SimConfig(block_size=16, pool_blocks=1, cost=INSTANT)
    turns = (
        SimTurn(100, 29, 0, "bash", 1.0),
        SimTurn(300, 10, 128, None, None),
    )
    m = simulate((SimTrajectory("a", 0.0, turns),), cfg, ["lru"])["lru"]
    assert m["pool_blocks"] == 21  # floor: the largest call (310 tokens) plus one block
    assert m["prefix_reuse_ratio"] == 1.0  # 21 blocks still hold the 8-block prefix
    tiny = simulate(
        (SimTrajectory("a", 0.0, turns), SimTrajectory("b", 0.5, turns)),
        cfg,
        ["lru"],
    )["lru"]
    assert tiny["prefix_reuse_ratio"] < 1.0
    assert tiny["rebuild_tax"] > 0.0


def _workloads() -> st.SearchStrategy[tuple[SimTrajectory, ...]]:
    return st.builds(
        lambda n, k, seed: synthesize(
            n, k, seed=seed, arrival_rate_per_s=2.0, system_prompt_tokens=300, compaction_every=4
        ),
        st.integers(2, 8),
        st.integers(1, 6),
        st.integers(0, 10_000),
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workloads(), st.sampled_from([0.1, 0.3, 0.6]), st.sampled_from([1, 2]))
def test_simulation_is_deterministic_for_a_seed(workload, fraction, replicas) -> None:  # type: ignore[no-untyped-def]
    cfg = SimConfig(block_size=32, pool_fraction=fraction, replicas=replicas, routing="prefix")
    names = ["lru", "ttl-fixed", "infercept", "kvflow", "oracle"]
    assert simulate(workload, cfg, names) == simulate(workload, cfg, names)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workloads(), st.sampled_from([0.05, 0.2, 0.4, 0.7]))
def test_oracle_reuse_is_at_least_every_other_policys(workload, fraction) -> None:  # type: ignore[no-untyped-def]
    cfg = SimConfig(block_size=32, pool_fraction=fraction, cost=INSTANT, max_num_seqs=1000)
    res = simulate(workload, cfg, [*NO_ORACLE, "oracle"])
    for name in NO_ORACLE:
        assert res["oracle"]["cached_tokens"] >= res[name]["cached_tokens"], name


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workloads())
def test_an_infinite_pool_gives_every_policy_the_full_reuse(workload) -> None:  # type: ignore[no-untyped-def]
    cfg = SimConfig(block_size=32, pool_blocks=10**6 // 32, max_num_seqs=1000)
    ceiling = reuse_ceiling_tokens(workload, 32)
    for name, m in simulate(workload, cfg, [*NO_ORACLE, "oracle"]).items():
        assert m["cached_tokens"] == ceiling, name
        assert m["preemptions"] == 0


def test_the_same_seed_gives_the_same_workload_and_another_seed_does_not() -> None:
    assert synthesize(5, 4, seed=3) == synthesize(5, 4, seed=3)
    assert synthesize(5, 4, seed=3) != synthesize(5, 4, seed=4)


def test_a_crowded_pool_preempts_running_calls() -> None:
    workload = synthesize(30, 4, seed=1, arrival_rate_per_s=None, system_prompt_tokens=1000)
    cfg = SimConfig(block_size=32, pool_fraction=0.05, max_num_seqs=64)
    assert simulate(workload, cfg, ["lru"])["lru"]["preemptions"] > 0


def test_a_lower_tier_serves_evicted_prefixes() -> None:
    workload = synthesize(20, 6, seed=2, arrival_rate_per_s=1.0, system_prompt_tokens=1000)
    base = SimConfig(block_size=32, pool_fraction=0.1)
    tiered = base.with_(lower_tier=TierConfig(capacity_blocks=100_000))
    without = simulate(workload, base, ["lru"])["lru"]
    with_tier = simulate(workload, tiered, ["lru"])["lru"]
    assert with_tier["lower_tier_tokens"] > 0
    assert with_tier["prefix_reuse_ratio"] > without["prefix_reuse_ratio"]


def test_session_routing_is_a_consistent_hash() -> None:
    four, five = Router("session", 4), Router("session", 5)
    ids = [f"traj-{i}" for i in range(400)]
    assert [four.session_replica(i) for i in ids] == [
        Router("session", 4).session_replica(i) for i in ids
    ]
    moved = sum(four.session_replica(i) != five.session_replica(i) for i in ids)
    assert moved < len(ids) / 2  # about 1/5 move, not most of them
    assert len({four.session_replica(i) for i in ids}) == 4


def test_sticky_routing_pins_live_trajectories_to_the_least_loaded_replica() -> None:
    router = Router("sticky", 2)
    first = [router.route(f"t{i}", [], 0, [], turn=0) for i in range(4)]
    assert first == [0, 1, 0, 1]  # fewest pinned, ties to the lowest index
    assert router.route("t1", [], 0, [], turn=5) == 1  # stays where it was pinned
    router.finish("t1")
    router.finish("t3")
    assert [router.route(f"n{i}", [], 0, [], turn=0) for i in range(3)] == [1, 1, 0]
    router.finish("never-seen")  # harmless
    # a recorded split wins, as under session routing
    assert Router("sticky", 2, placement={"x": 1}).route("x", [], 0, [], turn=0) == 1


def test_affinity_routing_beats_round_robin_on_reuse() -> None:
    workload = synthesize(16, 6, seed=5, arrival_rate_per_s=1.0, system_prompt_tokens=1000)
    cfg = SimConfig(block_size=32, pool_fraction=1.0, replicas=4)
    rr = simulate(workload, cfg.with_(routing="round_robin"), ["lru"])["lru"]
    for mode in ("session", "sticky", "prefix"):
        m = simulate(workload, cfg.with_(routing=mode), ["lru"])["lru"]
        assert m["prefix_reuse_ratio"] > rr["prefix_reuse_ratio"], mode


@pytest.mark.parametrize("queue", ["fcfs", "priority", "plas"])
def test_every_queue_order_completes_every_trajectory(queue: str) -> None:
    workload = synthesize(10, 5, seed=7, arrival_rate_per_s=None)
    m = simulate(workload, SimConfig(block_size=32, pool_fraction=0.3, queue=queue), ["lru"])["lru"]
    assert m["num_trajectories"] == 10 and m["num_turns"] == 50


def test_bad_settings_say_what_to_do() -> None:
    with pytest.raises(ConfigError, match="replicas"):
        SimConfig(replicas=0)
    with pytest.raises(ConfigError, match="choose from"):
        simulate(_two_turns(), SimConfig(), ["nope"])


# -- closed loop, the bench's workload, the policy core ----------------------------------
def _closed(concurrency: int, **kw: object) -> SimConfig:
    base = SimConfig(block_size=32, pool_fraction=0.5, arrival="closed", concurrency=concurrency)
    return base.with_(**kw)


def test_closed_loop_keeps_n_trajectories_in_flight() -> None:
    """A new trajectory starts when one ends; JCT counts from its own start."""
    turns = (SimTurn(320, 10, 0, "bash", 1.0), SimTurn(400, 10, 300, None, None))
    workload = tuple(SimTrajectory(f"t{i}", 100.0 * i, turns) for i in range(6))
    cost = SimCost(prefill_tokens_per_s=1e9, decode_s_per_token=0.0, step_base_s=0.001)
    closed = simulate(workload, _closed(2, cost=cost, pool_blocks=1000), ["lru"])["lru"]
    # Each trajectory takes ~1 s (the gap); in pairs, 6 take ~3 s whatever start_s says.
    assert closed["num_trajectories"] == 6
    assert 2.9 < closed["makespan_s"] < 3.5
    assert closed["jct_p99_s"] < 1.2
    one = simulate(workload, _closed(1, cost=cost, pool_blocks=1000), ["lru"])["lru"]
    assert one["makespan_s"] > 5.9


def test_recorded_send_times_replace_arrivals_and_gaps_but_not_causality() -> None:
    """``call_times`` replays a real run's sends: each trajectory starts when it did (not
    closed loop) and a later turn goes at its recorded time, or when its previous turn
    ends in the simulation if that is later; calls without a time keep the tool gap."""
    turns = (SimTurn(320, 10, 0, "bash", 1.0), SimTurn(400, 10, 300, None, None))
    workload = tuple(SimTrajectory(f"t{i}", 0.0, turns) for i in range(6))
    cost = SimCost(prefill_tokens_per_s=1e9, decode_s_per_token=0.0, step_base_s=0.001)
    cfg = _closed(2, cost=cost, pool_blocks=1000)

    def run(times: tuple[tuple[str, int, float], ...]) -> dict[str, float]:
        return dict(simulate(workload, cfg.with_(call_times=times), ["lru"])["lru"])

    late = run(tuple((f"t{i}", turn, 10.0 * i + 5.0 * turn) for i in range(6) for turn in (0, 1)))
    assert late["makespan_s"] == pytest.approx(55.0, abs=0.05)  # t5's turn 1, sent at 55 s
    assert late["jct_mean_s"] == pytest.approx(5.0, abs=0.05)
    # Recorded before the previous turn could have ended: sent as soon as it has.
    early = run(tuple((f"t{i}", turn, 10.0 * i) for i in range(6) for turn in (0, 1)))
    assert early["jct_mean_s"] < 0.05 and early["makespan_s"] == pytest.approx(50.0, abs=0.05)
    # Only turn 0 recorded: the start follows the record, turn 1 the tool gap (1 s).
    starts = run(tuple((f"t{i}", 0, 10.0 * i) for i in range(6)))
    assert starts["jct_mean_s"] == pytest.approx(1.0, abs=0.05)
    with pytest.raises(ConfigError, match="call_times"):
        SimConfig(call_times=(("t0", 0, -1.0),))
    with pytest.raises(ConfigError, match="call_times"):
        SimConfig(call_times=(("t0", 0, float("nan")),))


def test_overhead_delays_every_call_and_the_server_sees_it_as_idle_time() -> None:
    turns = (SimTurn(320, 10, 0, "bash", 1.0), SimTurn(400, 10, 300, None, None))
    cost = SimCost(prefill_tokens_per_s=1e9, decode_s_per_token=0.0, step_base_s=0.0)
    base = simulate(
        (SimTrajectory("a", 0.0, turns),),
        SimConfig(block_size=32, pool_blocks=100, cost=cost),
        ["lru"],
    )
    slow = simulate(
        (SimTrajectory("a", 0.0, turns),),
        SimConfig(
            block_size=32,
            pool_blocks=100,
            cost=SimCost(
                prefill_tokens_per_s=1e9, decode_s_per_token=0.0, step_base_s=0.0, overhead_s=0.5
            ),
        ),
        ["lru"],
    )
    assert slow["lru"]["jct_mean_s"] == pytest.approx(base["lru"]["jct_mean_s"] + 1.0)


def test_the_bench_workload_and_pool_carry_over_unchanged() -> None:
    from agentkv.sim import bench_pool_blocks, from_trace, from_workload
    from agentkv.traces import Trace, TraceTrajectory, TraceTurn
    from agentkv.workload import Scaling, make_workload
    from agentkv.workload._pool import plan_pool

    tt = TraceTurn(0.0, 1000, 50, 0, "bash", -0.0)
    t2 = TraceTurn(1.0, 1500, 40, 1040, None, None)
    trace = Trace((TraceTrajectory(0, (tt, t2)), TraceTrajectory(1, (tt, t2))))
    scaling = Scaling(token_scale=0.5, time_scale=0.3, max_turns=2)
    bench = make_workload(trace, scaling)
    sim = from_workload(bench, arrival_rate_per_s=None)
    assert [(u.prompt_tokens, u.output_tokens, u.shared_tokens, u.gap_s) for u in sim[0].turns] == [
        (p.prompt_tokens, p.output_tokens, p.shared_prefix_tokens, p.tool_gap_s)
        for p in bench.trajectories[0].turns
    ]
    assert from_trace(trace, scaling=scaling, arrival_rate_per_s=None) == sim
    plan, _ = plan_pool(bench.working_set_tokens(2), 0.3, bench.max_context_tokens, 32)
    assert bench_pool_blocks(bench, 2, 0.3, 32) == plan.pool_blocks


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workloads(), st.sampled_from([0.2, 0.4]), st.integers(1, 6))
def test_closed_loop_simulation_is_deterministic_for_a_seed(workload, fraction, n) -> None:  # type: ignore[no-untyped-def]
    cfg = _closed(n, pool_fraction=fraction, cost=SimCost(overhead_s=0.2))
    names = ["lru", "agentkv-v1", "agentkv", "agentkv-oracle"]
    first = simulate(workload, cfg, names)
    assert first == simulate(workload, cfg, names)
    for m in first.values():
        assert m["num_trajectories"] == len(workload)
        assert m["num_turns"] == sum(len(t.turns) for t in workload)


def test_agentkv_holds_back_turns_that_would_thrash() -> None:
    """Under pressure, admission keeps contexts resident: reuse far above LRU's."""
    workload = synthesize(12, 8, seed=4, arrival_rate_per_s=None, system_prompt_tokens=3000)
    cfg = _closed(12, pool_fraction=0.3, cost=SimCost(overhead_s=0.2), max_num_seqs=128)
    res = simulate(workload, cfg, ["lru", "agentkv-v1", "agentkv"])
    assert res["agentkv"]["prefix_reuse_ratio"] > 2 * res["lru"]["prefix_reuse_ratio"]
    assert res["agentkv"]["core"]["turns_held"] > 0
    assert res["agentkv"]["preemptions"] < res["lru"]["preemptions"]
    # The first policy's leases are granted and handed back under pressure.
    v1 = res["agentkv-v1"]["core"]
    assert v1["leases_pressure_released"] > v1["leases_reused"]


def test_a_replica_whose_waiting_calls_are_all_held_wakes_up_again() -> None:
    """Round robin sends a trajectory's next call to the replica that does not hold its
    context; admission there may hold every waiting call while nothing runs. The replica
    must wake at the hold's end (or a lease deadline) instead of stalling for good (this
    setting stalled with 2 calls left before)."""
    from agentkv.sim import SimCost, from_workload
    from agentkv.workload import PlannedTrajectory, PlannedTurn, Scaling, Workload

    turns = tuple(
        PlannedTurn(k, 200 * (k + 1), 20, 220 * k, "bash" if k < 3 else None,
                    0.5 if k < 3 else None)
        for k in range(4)
    )  # fmt: skip
    bench = Workload(tuple(PlannedTrajectory(i, turns) for i in range(6)), Scaling(), "x", "t")
    cost = SimCost(prefill_tokens_per_s=2500, step_base_s=0.011, overhead_s=0.02,
                   decode_s_per_token=0.0)  # fmt: skip
    cfg = SimConfig(block_size=32, pool_blocks=40, arrival="closed", concurrency=8,
                    replicas=2, routing="round_robin", cost=cost)  # fmt: skip
    out = simulate(from_workload(bench), cfg, ["agentkv-oracle"])["agentkv-oracle"]
    assert out["jct_mean_s"] > 0


def test_the_tool_start_event_updates_the_forecast_and_offers_a_lease_again() -> None:
    """The controller's ``on_tool_start`` (plugin and simulator alike): a paused context's forecast becomes the running
    tool's; one left without a lease (declined or released under pressure) is offered a
    lease again on the blocks still cached; a trajectory already back is left alone."""
    from agentkv.residency import Forecast
    from agentkv.sim._engine import Engine
    from agentkv.sim._policies import AgentKVPolicy

    turns = (SimTurn(100, 28, 0, "bash", 1.0), SimTurn(200, 10, 128, None, None))
    cfg = SimConfig(block_size=16, pool_blocks=40, cost=INSTANT)
    eng = Engine((SimTrajectory("a", 0.0, turns),), cfg, AgentKVPolicy(), 40)
    r, keys = eng.replicas[0], [11, 12, 13, 14]
    blocks = r.pool.allocate(4)
    assert blocks is not None
    r.pool.assign_keys(blocks, keys)
    r.pool.free_blocks(blocks[::-1])  # cached, no lease: e.g. one declined at the finish
    st = r.ctl.book.state("a", 1.0)
    r.ctl.book.set_hashes(st, [k.to_bytes(8, "little") for k in keys])
    r.ctl.core.on_finished(st, 1.0, Forecast(9.0, 9.0, 9.0), len(keys))
    free = r.pool.num_free
    eng.tool_started(1.01, r, 0, Forecast(0.1, 0.2, 0.3), keys)
    assert st.forecast is not None and st.forecast.p50_s == 0.1
    assert r.ctl.counters.forecasts_updated == 1
    assert st.lease is not None and st.lease.blocks == blocks
    assert r.pool.num_free == free - 4  # the lease holds them now

    r.ctl.reset()  # the lease ends (e.g. under pressure) and its blocks are freed
    assert st.lease is None and r.pool.num_free == free
    r.ctl.core.on_waiting(st, 1.05)  # its next call arrived before the event
    eng.tool_started(1.06, r, 0, Forecast(5.0, 5.0, 5.0), keys)
    assert st.lease is None and st.forecast is not None and st.forecast.p50_s == 0.1
    assert r.ctl.counters.forecasts_updated == 1


def test_agentkv_runs_see_one_tool_start_event_per_pause() -> None:
    workload = synthesize(6, 5, seed=2, arrival_rate_per_s=None, system_prompt_tokens=500)
    cfg = _closed(6, pool_fraction=2.0, cost=SimCost(overhead_s=0.01))
    core = simulate(workload, cfg, ["agentkv"])["agentkv"]["core"]
    pauses = sum(len(t.turns) - 1 for t in workload)
    assert 0 < core["forecasts_updated"] <= pauses


def test_a_jittered_latency_is_drawn_per_call_and_repeats_for_a_seed() -> None:
    """``overhead_jitter`` draws each call's fixed latency around ``overhead_s``: the same
    seed gives the same run, another seed another timing; 0 keeps every call the same."""
    workload = synthesize(6, 5, seed=2, arrival_rate_per_s=None, system_prompt_tokens=500)
    cost = SimCost(overhead_s=0.05)
    fixed = simulate(workload, _closed(6, pool_fraction=0.4, cost=cost), ["lru"])["lru"]
    jittered = SimCost(overhead_s=0.05, overhead_jitter=0.5)
    runs = [
        simulate(workload, _closed(6, pool_fraction=0.4, cost=jittered, jitter_seed=s), ["lru"])
        for s in (1, 1, 2)
    ]
    assert runs[0]["lru"]["jct_mean_s"] == runs[1]["lru"]["jct_mean_s"]
    assert runs[0]["lru"]["jct_mean_s"] != runs[2]["lru"]["jct_mean_s"]
    assert runs[0]["lru"]["jct_mean_s"] != fixed["jct_mean_s"]
    with pytest.raises(ConfigError, match="overhead_jitter"):
        SimConfig(cost=SimCost(overhead_jitter=1.5))


def test_a_waiting_call_is_admitted_only_when_its_whole_prompt_fits() -> None:
    """vLLM 0.32 (``scheduler_reserve_full_isl``): a waiting call whose first chunk fits
    but whose whole prompt does not stays waiting; it allocates only the chunk's blocks."""
    from agentkv.sim._engine import Engine
    from agentkv.sim._policies import Policy
    from agentkv.sim._steps import SimCall

    turns = (SimTurn(400, 8, 0, None, None),)  # 25 blocks of 16
    cfg = SimConfig(block_size=16, pool_blocks=30, max_num_batched_tokens=64, cost=INSTANT)
    eng = Engine((SimTrajectory("a", 0.0, turns),), cfg, Policy(), 30)
    r = eng.replicas[0]
    taken = r.pool.allocate(10)  # another call's blocks: 20 free
    assert taken is not None
    call = SimCall(0, 0, eng.chain.extend([], 0, 408, 16), 400, 8)
    assert eng.steps.admit(0.0, r, call, 64) is None  # the 4-block chunk fits, 25 blocks do not
    r.pool.free_blocks(taken)
    assert eng.steps.admit(0.0, r, call, 64) is not None
    assert len(call.blocks) == 4

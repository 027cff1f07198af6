"""The benchmark across replicas: arms R and R+, router flags, counters summed per replica."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv import ConfigError
from agentkv.bench.report._replicas import summarize_replicas
from agentkv.bench.run._arms import arm_description, arm_options, arm_unavailable, parse_arms
from agentkv.bench.run._replicas import client_options, program_scheduling_args, router_policy
from agentkv.bench.run._runner import BenchConfig
from agentkv.bench.testbed._scrape import counters_delta, read_counters
from agentkv.workload._pool import plan_pool
from tests.support.bench_fakes import platform_info
from tests.support.client_fakes import FakeServer


def test_r_arms_parse_and_take_b_and_g_profiles() -> None:
    """R is stock vLLM (B's profile) and R+ runs the plugin with G's settings except its
    own admission (the router admits programs); both need the router."""
    assert parse_arms("E,G,R,R+") == ["B", "E", "G", "R", "R+"]
    cpu = platform_info("cpu", fp8=False)
    plan, _ = plan_pool(10_000, 0.3, 1_000, 32)
    b, g, r, rp = (arm_options(a, plan, cpu) for a in ("B", "G", "R", "R+"))
    assert r == b
    assert rp == {**g, "admission": False} and g["admission"]
    assert rp["agentkv_plugin"] and rp["lifecycle_hints"] and rp["program_scheduling"]
    assert "no FP8" in arm_description("R+", cpu)
    assert arm_unavailable("R", cpu) is None  # vllm-router is installed with the dev extras


def test_router_mode_and_routing_validation() -> None:
    assert not BenchConfig("t", arms=("B", "E")).router_mode()
    assert BenchConfig("t", arms=("B",), replicas=2).router_mode()
    assert BenchConfig("t", arms=("B", "R")).router_mode()
    with pytest.raises(ConfigError):
        BenchConfig("t", routing="random")
    with pytest.raises(ConfigError):
        BenchConfig("t", replicas=0)
    with pytest.raises(ConfigError, match="wrong replica"):
        BenchConfig("t", arms=("B", "R+"), replicas=2, routing="sticky")
    assert BenchConfig("t", arms=("B", "E"), replicas=2, routing="sticky").router_mode()
    assert router_policy("session") == "consistent_hash"
    assert router_policy("sticky") == "sticky_least_loaded"
    assert router_policy("round_robin") == "round_robin"
    assert client_options("R", None) == {"agentic_context": True}
    assert client_options("G", None) == {}


def test_program_scheduling_flags_carry_the_replica_pool_and_testbed_costs() -> None:
    plan, _ = plan_pool(20_000, 0.3, 1_000, 32)
    args = program_scheduling_args(plan, "session")
    assert args[0] == "--enable-program-scheduling"  # 0.1.17 needs it before the JSON
    config = json.loads(args[args.index("--program-scheduling-config-json") + 1])
    assert config["token_capacity_per_dp_rank"] == plan.pool_tokens()
    assert config["global_queue"] is False and config["binding_strategy"] == "consistent_hash"
    assert len(config["prefill_cost_model"]) == 4 and len(config["decode_throughput_model"]) == 3
    rr = json.loads(program_scheduling_args(plan, "round_robin")[2])
    assert rr["binding_strategy"] == "program_round_robin"


def test_counters_are_summed_over_replicas_and_kept_per_replica() -> None:
    a, b = FakeServer("agentkv"), FakeServer("agentkv")
    try:
        a.stats_extra = {"events_received": 3, "events_unknown_trajectory": 0, "kv_usage": 0.5,
                         "num_blocks": 10}  # fmt: skip
        b.stats_extra = {"events_received": 4, "events_unknown_trajectory": 1, "kv_usage": 0.1,
                         "num_blocks": 10}  # fmt: skip
        rs = SimpleNamespace(replica_urls=[a.base_url[:-3], b.base_url[:-3]])
        before = read_counters(rs)
        a.stats_extra["events_received"] = 5
        after = read_counters(rs)
        assert after["agentkv"]["events_received"] == 9
        assert after["agentkv"]["kv_usage"] == pytest.approx(0.3)
        assert len(after["replicas"]) == 2 and after["router"] == {}
        moved = counters_delta(before, after)
        assert moved["agentkv"]["events_received"] == 2
        assert [p["agentkv"]["events_received"] for p in moved["replicas"]] == [2, 0]
    finally:
        a.close()
        b.close()


def _rep(
    per: list[dict[str, Any]], placement: dict[str, int], calls: dict[str, int] | None = None
) -> Any:
    return SimpleNamespace(per_replica=per, placement=placement, call_replicas=calls or {},
                           router={"vllm_router_requests_total": 6.0})  # fmt: skip


def test_replica_summary_sums_only_the_routers_counters_never_its_gauges() -> None:
    rep = SimpleNamespace(per_replica=[{"vllm": {}, "agentkv": {}}], placement={},
                          call_replicas={}, router={"vllm_router_requests_total": 6.0,
                                                    "vllm_router_active_sessions": -3.0,
                                                    "vllm_router_queue_depth": -1.0})  # fmt: skip
    summary = summarize_replicas([rep, rep])
    assert summary is not None
    assert summary["router_counters"] == {"vllm_router_requests_total": 12.0}
    assert all(v >= 0 for v in summary["router_counters"].values())


def test_replica_summary() -> None:
    part = {"vllm": {"vllm:prompt_tokens_total": 100.0, "vllm:prompt_tokens_cached_total": 40.0},
            "agentkv": {"events_received": 3.0, "events_unknown_trajectory": 0.0}}  # fmt: skip
    other = {"vllm": {"vllm:prompt_tokens_total": 50.0}, "agentkv": {}}
    summary = summarize_replicas([_rep([part, other], {"t0": 0, "t1": 1, "t2": 0})] * 2)
    assert summary is not None
    assert [p["prompt_tokens"] for p in summary["per_replica"]] == [200.0, 100.0]
    assert summary["trajectories_held"] == [4, 2]
    assert summary["events_received"] == 6.0 and summary["events_unknown_trajectory"] == 0.0
    assert summary["router_counters"] == {"vllm_router_requests_total": 12.0}
    assert summary["call_replicas_per_rep"] is None  # no replica named its calls
    assert summarize_replicas([_rep([], {})]) is None
    calls = [_rep([part], {}, {"0/0": 1, "0/1": 0}), _rep([part], {}, {"0/0": 0})]
    summary = summarize_replicas(calls)
    assert summary is not None
    assert summary["call_replicas_per_rep"] == [{"0/0": 1, "0/1": 0}, {"0/0": 0}]


def test_replicas_tag_their_answers_and_calls_map_back_to_replicas() -> None:
    """Every replica runs the served-by middleware (after any extra vLLM args); a
    call's tag (the replica's port) maps to its index, and an untagged, malformed or
    foreign tag maps to nothing."""
    from agentkv.bench.run._driver import TrajectoryResult, TurnResult
    from agentkv.bench.testbed._servedby import SERVED_BY_MIDDLEWARE, call_replicas, tagged

    opts = tagged({"extra_args": ["--max-num-seqs", "8"], "pool_blocks": 3})
    assert opts["extra_args"] == ["--max-num-seqs", "8", "--middleware", SERVED_BY_MIDDLEWARE]
    assert opts["pool_blocks"] == 3 and tagged({})["extra_args"][-1] == SERVED_BY_MIDDLEWARE

    def turn(tag: str | None) -> TurnResult:
        return TurnResult(0, 10, 1, 0, 0, 0, 0.1, 0.2, True, tag)

    trajs = [TrajectoryResult(0, 0.0, 1.0), TrajectoryResult(4, 0.0, 1.0)]
    trajs[0].turns = [turn("9001"), turn(" 9000 "), turn(None)]
    trajs[1].turns = [turn("not-a-port"), turn("9002"), turn("9001")]
    assert call_replicas(trajs, [9000, 9001]) == {"0/0": 1, "0/1": 0, "4/2": 1}


def test_only_stock_arms_share_replicas_and_stay_adjacent() -> None:
    import random

    from agentkv.bench.run._replicas import ReplicaServers

    cpu = platform_info("cpu", fp8=False)
    plan, _ = plan_pool(10_000, 0.3, 1_000, 32)
    cfg = BenchConfig("t", arms=("B", "E", "G", "R", "R+"), replicas=2)
    servers = ReplicaServers(cfg, plan, lambda arm: arm_options(arm, plan, cpu), lambda k, d: None)
    assert servers.profile_key("B") == servers.profile_key("R")
    assert servers.profile_key("G") != servers.profile_key("R+")
    for seed in range(20):
        order = servers.order(cfg.arms, random.Random(seed))
        assert sorted(order) == sorted(cfg.arms)
        assert abs(order.index("B") - order.index("R")) == 1


def _three_trajectories() -> Any:
    from agentkv.workload import PlannedTrajectory, PlannedTurn, Scaling, Workload

    turns = (
        PlannedTurn(0, 300, 25, 0, "bash", 0.5),
        PlannedTurn(1, 400, 20, 320, "bash", 0.5),
        PlannedTurn(2, 500, 20, 420, None, None),
    )
    trajs = tuple(PlannedTrajectory(i, turns) for i in range(3))
    return Workload(trajs, Scaling(), "abc" * 10, "t.jsonl")


def test_simulator_check_runs_the_replicas_routing_and_recorded_split() -> None:
    """Behind a router the bench's simulator check runs N replicas with the per-replica
    pool: session routing keeps every prefix, round robin loses some, and a recorded
    placement (all three trajectories on one replica) is followed, not the sim's ring."""
    from agentkv.bench.report._simcheck import SimInputs, simulate_bench
    from agentkv.workload import Arrival

    w = _three_trajectories()

    def reuse(pool: int, routing: str, placement: Any = ()) -> float:
        inputs = SimInputs(
            w, Arrival("closed", 3), 32, pool, None, frozenset(),
            replicas=2, routing=routing, placement=placement,
        )  # fmt: skip
        sim = simulate_bench(inputs, ["B", "R+"])
        assert set(sim["arms"]) == {"B", "R+"} and sim["arms"]["R+"]["queue"] == "priority"
        return float(sim["arms"]["B"]["prefix_reuse_ratio"])

    assert reuse(200, "session") == pytest.approx(1.0)
    assert reuse(200, "round_robin") < 0.95
    crowded = (("t0", 0), ("t1", 0), ("t2", 0))
    assert reuse(26, "session", crowded) < reuse(26, "session", (("t0", 0), ("t1", 1), ("t2", 1)))


def test_sim_routing_reads_replicas_routing_and_the_recorded_split() -> None:
    """A results.json behind a router gives the simulator its replicas, routing and the
    first recorded trajectory -> replica split; one server gives nothing."""
    from agentkv.bench.report._simcheck import sim_routing

    results = {
        "replicas": {"replicas": 2, "router": True, "routing": "round_robin"},
        "arms": {
            "B": {"replicas": {"placement_by_index": None}},
            "E": {"replicas": {"placement_by_index": {"1": 1, "0": 0}}},
        },
    }
    assert sim_routing(results) == {
        "replicas": 2,
        "routing": "round_robin",
        "placement": (("t0", 0), ("t1", 1)),
        "call_placements": {},
    }
    assert sim_routing({"replicas": None, "arms": {}}) == {}
    # Each repetition's recorded calls, as (sim trajectory id, turn, replica); an arm
    # with a repetition that recorded nothing is routed by the routing policy instead.
    results["arms"]["B"]["replicas"]["call_replicas_per_rep"] = [{"1/0": 1, "0/2": 0}, {"0/0": 1}]
    results["arms"]["E"]["replicas"]["call_replicas_per_rep"] = [{"0/0": 1}, {}]
    assert sim_routing(results)["call_placements"] == {
        "B": ((("t0", 2, 0), ("t1", 0, 1)), (("t0", 0, 1),)),
    }


def test_simulator_check_follows_each_repetitions_recorded_calls() -> None:
    """Under round robin the simulator routes each call where the run says it went: all
    of a trajectory's calls on one replica keep every prefix, alternating replicas lose
    them; with two repetitions the arm's reuse is their mean, each one kept."""
    from agentkv.bench.report._simcheck import SimInputs, simulate_bench
    from agentkv.workload import Arrival

    w = _three_trajectories()
    together = tuple((f"t{i}", turn, i % 2) for i in range(3) for turn in range(3))
    apart = tuple((f"t{i}", turn, (i + turn) % 2) for i in range(3) for turn in range(3))

    def arm_b(*reps: Any) -> dict[str, Any]:
        inputs = SimInputs(
            w, Arrival("closed", 3), 32, 200, None, frozenset(),
            replicas=2, routing="round_robin", call_placements={"B": reps},
        )  # fmt: skip
        return dict(simulate_bench(inputs, ["B", "E"])["arms"]["B"])

    kept, lost, both = arm_b(together), arm_b(apart), arm_b(together, apart)
    assert kept["prefix_reuse_ratio"] == pytest.approx(1.0) and kept["routed_as_recorded"]
    assert lost["prefix_reuse_ratio"] < 0.5
    assert both["prefix_reuse_per_rep"] == [kept["prefix_reuse_ratio"], lost["prefix_reuse_ratio"]]
    assert both["prefix_reuse_ratio"] == pytest.approx(
        (kept["prefix_reuse_ratio"] + lost["prefix_reuse_ratio"]) / 2
    )


def test_placement_queries_name_the_replay_tenants_cache_salt() -> None:
    """The plugin keys trajectories by the cache salt their calls carried: the placement
    query sends the bench tenant's salt, and finds each trajectory on its replica."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    import agentkv
    from agentkv.bench.testbed._scrape import get_placement
    from agentkv.prefix._secret import install_secret
    from agentkv.protocol._wire import SALT_HEADER

    salt = agentkv.CacheNamespace().cache_salt("bench", secret=install_secret())
    holds = [{"t-0"}, {"t-1", "t-2"}]
    servers = []
    for held in holds:

        class Handler(BaseHTTPRequestHandler):
            known = held

            def do_GET(self) -> None:
                tid = self.path.rsplit("/", 1)[-1]
                ok = self.headers.get(SALT_HEADER) == salt and tid in self.known
                self.send_response(200 if ok else 404)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
    try:
        urls = [f"http://127.0.0.1:{h.server_address[1]}" for h in servers]
        found = get_placement(SimpleNamespace(replica_urls=urls), ["t-0", "t-1", "t-2"])
        assert found == {"t-0": 0, "t-1": 1, "t-2": 1}
    finally:
        for h in servers:
            h.shutdown()
            h.server_close()


def test_call_diff_names_the_calls_where_simulator_and_server_disagree() -> None:
    """Call by call, per group: with every trajectory on one replica the simulator keeps
    every prefix, so a call the real server missed counts as sim_only; with calls
    alternating replicas the simulator loses prefixes the real server kept (real_only),
    and those calls fall in the other_replica group."""
    from agentkv.bench.report._simcheck import SimInputs, simulate_bench
    from agentkv.workload import Arrival

    w = _three_trajectories()
    together = tuple((f"t{i}", turn, i % 2) for i in range(3) for turn in range(3))
    apart = tuple((f"t{i}", turn, (i + turn) % 2) for i in range(3) for turn in range(3))
    # eligible (32-token blocks): turn 1 min(320, 399) -> 320, turn 2 min(420, 499) -> 416
    full = {f"{i}/{t}": [e, e] for i in range(3) for t, e in ((1, 320), (2, 416))}
    missed = {**full, "0/2": [0, 416]}

    def diff(placement: Any, real: dict[str, list[int]]) -> dict[str, Any]:
        inputs = SimInputs(
            w, Arrival("closed", 3), 32, 200, None, frozenset(), replicas=2,
            routing="round_robin", call_placements={"B": (placement,)}, real_calls={"B": [real]},
        )  # fmt: skip
        return dict(simulate_bench(inputs, ["B"])["arms"]["B"]["call_diff"])

    kept = diff(together, missed)
    assert set(kept) == {"same_replica"}  # turn 0 has no eligible prefix here
    row = kept["same_replica"]
    assert row["calls"] == 6 and row["eligible_tokens"] == 3 * (320 + 416)
    assert row["sim_reuse"] == pytest.approx(1.0)
    assert row["real_reuse"] == pytest.approx(1 - 416 / (3 * 736))
    assert (row["sim_only"], row["real_only"]) == (1, 0)
    lost = diff(apart, full)
    assert set(lost) == {"other_replica"}
    assert lost["other_replica"]["real_reuse"] == pytest.approx(1.0)
    assert lost["other_replica"]["sim_reuse"] < 0.5 and lost["other_replica"]["real_only"] >= 3


def test_call_diff_on_one_server_and_with_unmatched_calls() -> None:
    """One server: later turns are same_replica, turn 0 first_turn; calls the simulator did
    not run, or with nothing eligible, are left out; no simulated run, no figures."""
    from agentkv.bench.report._calldiff import call_diff

    real = [{"0/0": [32, 64], "0/1": [0, 320], "0/2": [0, 0], "5/1": [320, 320]}]
    sim = [{("t0", 0): (0, 64), ("t0", 1): (0, 320), ("t0", 2): (0, 0)}]
    out = call_diff(real, sim)
    assert out["first_turn"] == {
        "calls": 1, "eligible_tokens": 64, "real_reuse": 0.5, "sim_reuse": 1.0,
        "sim_only": 0, "real_only": 0,
    }  # fmt: skip
    assert out["same_replica"]["calls"] == 1 and out["same_replica"]["sim_only"] == 1
    assert call_diff(real, []) == {}


def test_simulator_check_replays_the_recorded_send_times() -> None:
    """Where the run recorded when each call was sent, the arm is also simulated with
    every call sent then (``replayed``: reuse, JCT and call diff for the real send order);
    calls recorded without send times (older results) get no replay."""
    from agentkv.bench.report._simcheck import SimInputs, simulate_bench
    from agentkv.workload import Arrival

    w = _three_trajectories()
    together = tuple((f"t{i}", turn, i % 2) for i in range(3) for turn in range(3))
    eligible = {0: 0, 1: 320, 2: 416}

    def arm_b(real: dict[str, list[Any]]) -> dict[str, Any]:
        inputs = SimInputs(
            w, Arrival("closed", 3), 32, 200, None, frozenset(), replicas=2,
            routing="round_robin", call_placements={"B": (together,)}, real_calls={"B": [real]},
        )  # fmt: skip
        return dict(simulate_bench(inputs, ["B"])["arms"]["B"])

    # Sent 100 s apart, turn after turn: each trajectory takes about 200 s.
    timed = {f"{i}/{t}": [e, e, 100.0 * t, 1.0] for i in range(3) for t, e in eligible.items()}
    out = arm_b(timed)
    replay = out["replayed"]
    assert replay["prefix_reuse_ratio"] == pytest.approx(1.0)
    assert replay["prefix_reuse_per_rep"] == [replay["prefix_reuse_ratio"]]
    assert replay["jct_mean_s"] == pytest.approx(200.0, abs=1.0)
    assert out["jct_mean_s"] < 10.0  # the closed-loop run keeps the trace's 0.5 s gaps
    assert replay["call_diff"]["same_replica"]["real_reuse"] == pytest.approx(1.0)
    untimed = {k: v[:2] for k, v in timed.items()}
    assert "replayed" not in arm_b(untimed) and "call_diff" in arm_b(untimed)

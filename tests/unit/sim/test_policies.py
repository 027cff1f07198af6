"""Simulator policies: each decides as its model system does; agentkv runs the SDK's code."""

from __future__ import annotations

import pytest

from agentkv.advice._advisor import Advisor
from agentkv.gaps._model import GapModel
from agentkv.sim import (
    POLICIES,
    AgentKVLeasePolicy,
    AgentKVPolicy,
    InferCeptPolicy,
    KVFlowPolicy,
    OraclePolicy,
    SimConfig,
    TTLFixedPolicy,
    TurnView,
    make_policy,
    simulate,
    synthesize,
)


def _view(**changes: object) -> TurnView:
    base = dict(
        now_s=10.0,
        trajectory_id="t",
        turn_id=3,
        tool_class="bash",
        terminal=False,
        context_tokens=4096,
        context_blocks=32,
        kv_usage=0.5,
        num_waiting=0,
        has_lower_tier=False,
        attained_service_s=1.0,
        recompute_s=0.2,
        load_s=0.01,
        used_blocks=100,
        future_next_use_s=12.0,
        future_shared_blocks=30,
    )
    base.update(changes)
    return TurnView(**base)  # type: ignore[arg-type]


def test_ttl_fixed_retains_only_tools_with_a_short_average() -> None:
    p = TTLFixedPolicy(threshold_s=2.0)
    assert p.after_turn(_view()).kind == "free"  # no history yet
    p.on_resume("t", "bash", 0.5)
    a = p.after_turn(_view())
    assert a.kind == "retain" and a.ttl_s == 2.0
    p.on_resume("t", "slow", 30.0)
    assert p.after_turn(_view(tool_class="slow")).kind == "free"
    assert p.after_turn(_view(terminal=True)).kind == "free"


def test_infercept_picks_the_least_memory_time_waste() -> None:
    p = InferCeptPolicy()
    p.on_resume("t", "bash", 0.05)  # a short tool: preserving wastes little
    assert p.after_turn(_view()).kind == "retain"
    p.on_resume("t", "long", 500.0)  # a long tool: discard beats holding the blocks
    assert p.after_turn(_view(tool_class="long")).kind == "release"
    swap = p.after_turn(_view(tool_class="long", has_lower_tier=True, load_s=0.001))
    assert swap.kind == "offload"


def test_kvflow_and_oracle_order_eviction_by_next_use() -> None:
    kv = KVFlowPolicy()
    kv.on_resume("t", "bash", 4.0)
    assert kv.after_turn(_view()).priority == -(10.0 + 4.0)
    assert kv.after_turn(_view(terminal=True)).kind == "release"
    o = OraclePolicy()
    a = o.after_turn(_view())
    assert a.priority == -12.0 and a.priority_blocks == 30
    assert o.after_turn(_view(future_next_use_s=None)).priority < -1e17


def test_every_named_policy_builds() -> None:
    assert {make_policy(n).name for n in POLICIES} == set(POLICIES)


# --- agentkv: the SDK's own GapModel and Advisor, no copy -----------------------------


def test_agentkv_v1_policy_uses_the_sdk_gap_model_and_advisor() -> None:
    p = make_policy("agentkv-v1")
    assert isinstance(p, AgentKVLeasePolicy)
    assert isinstance(p.gap_model, GapModel)
    assert isinstance(p.advisor, Advisor)
    assert p.core_settings().retention == "hint" and not p.core_settings().admission
    for _ in range(20):
        p.on_resume("t", "bash", 0.4)
    a = p.after_turn(_view())
    assert a.kind == "retain" and 0 < a.ttl_s <= 600
    assert p.after_turn(_view(terminal=True)).kind == "release"


def test_agentkv_policy_forecasts_the_gap_from_the_sdk_gap_model() -> None:
    p = make_policy("agentkv")
    assert isinstance(p, AgentKVPolicy) and isinstance(p.gap_model, GapModel)
    assert p.core_settings().retention == "predicted" and p.core_settings().admission
    for gap_s in (0.2, 0.4, 0.6) * 10:
        p.on_resume("t", "bash", gap_s)
    a = p.after_turn(_view())
    assert a.kind == "retain" and a.forecast is not None
    assert a.forecast.p50_s <= a.forecast.p90_s <= a.forecast.p99_s
    assert 0.2 <= a.forecast.p50_s <= 0.6
    assert p.after_turn(_view(terminal=True)).kind == "release"


def test_a_warmed_gap_model_answers_from_the_first_turn() -> None:
    """make_policy hands a given gap model (e.g. warmed like the bench's replays) to the
    policies that learn one, so their first forecast comes from it, not the priors."""
    warm = GapModel(half_life_s=None)
    for _ in range(40):
        warm.observe("bash", 30.0)
    p = make_policy("agentkv", gap_model=warm)
    assert isinstance(p, AgentKVPolicy) and p.gap_model is warm
    forecast = p.after_turn(_view()).forecast
    assert forecast is not None and forecast.p50_s == pytest.approx(30.0, rel=0.2)
    cold = make_policy("agentkv").after_turn(_view()).forecast
    assert cold is not None and cold.p50_s < 20.0
    assert make_policy("agentkv-v1", gap_model=warm).gap_model is warm  # type: ignore[attr-defined]
    assert make_policy("lru", gap_model=warm).name == "lru"  # nothing to warm


def test_agentkv_policy_sends_the_gap_after_the_call_then_the_running_tools() -> None:
    """As the SDK does: the call carried the forecast of the gap that follows calls sent
    after the same tool (its answer's tool is not known when it is sent: the gap model's
    ``next`` kind); the tool-start event brings the running tool's own forecast as an
    update when it differs."""
    p = make_policy("agentkv")
    for _ in range(30):  # edit (0.05 s), then the tests (5 s), in turn
        p.on_resume("t", "edit", 0.05)
        p.on_resume("t", "bash", 5.0)
    a = p.after_turn(_view(prev_tool_class="edit", tool_class="bash"))
    assert a.forecast is not None and a.forecast.p50_s == pytest.approx(5.0, rel=0.2)
    assert a.update is None  # the running tool's forecast is what the call carried
    b = p.after_turn(_view(prev_tool_class="edit", tool_class="edit"))
    assert b.forecast is not None and b.forecast.p50_s == pytest.approx(5.0, rel=0.2)
    assert b.update is not None and b.update.p50_s == pytest.approx(0.05, rel=0.2)
    first = p.after_turn(_view(prev_tool_class=None, tool_class="edit")).forecast
    assert first is not None and 0.05 <= first.p50_s <= 5.0  # no tool yet: all tools
    after_bash = p.after_turn(_view(prev_tool_class="bash", tool_class="edit"))
    assert after_bash.forecast is not None
    assert after_bash.forecast.p50_s == pytest.approx(0.05, rel=0.2)
    assert after_bash.update is None
    assert p.after_turn(_view(terminal=True)).update is None
    oracle = make_policy("agentkv-oracle").after_turn(_view())
    assert oracle.update is None  # the oracle knows the return already


def test_agentkv_oracle_forecasts_the_true_return() -> None:
    a = make_policy("agentkv-oracle").after_turn(_view(now_s=10.0, future_next_use_s=12.5))
    assert a.forecast is not None and a.forecast.p50_s == a.forecast.p99_s == 2.5


def test_agentkv_policies_run_in_a_simulation() -> None:
    workload = synthesize(12, 8, seed=3, arrival_rate_per_s=1.0, system_prompt_tokens=800)
    cfg = SimConfig(block_size=32, pool_fraction=0.5)
    res = simulate(workload, cfg, ["lru", "agentkv-v1", "agentkv"])
    actions = res["agentkv-v1"]["policy"]["advice_actions"]
    assert actions.get("retain", 0) > 0 and actions.get("release", 0) == 12
    for name in ("agentkv", "agentkv-v1"):
        assert 0.0 <= res[name]["prefix_reuse_ratio"] <= 1.0
        assert res[name]["num_trajectories"] == 12
    assert res["agentkv"]["core"]["leases_created"] > 0

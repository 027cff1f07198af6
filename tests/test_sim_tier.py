"""The lower tier in the policy: eviction cost learned from reloads, and tier prefetch."""

from __future__ import annotations

import pytest

from agentkv.residency import PolicyCore, PolicySettings
from agentkv.sim import SimConfig, SimCost, TierConfig, synthesize
from agentkv.sim._engine import run_policy
from agentkv.sim._policies import AgentKVPolicy
from agentkv.sim._prefetch import TierPrefetch


def _core() -> PolicyCore[int]:
    core: PolicyCore[int] = PolicyCore(PolicySettings(), 100)
    core.observe_step(10.0, 1.0)  # 0.1 s to prefill a block
    return core


def test_without_a_tier_an_eviction_costs_a_recompute() -> None:
    core = _core()
    assert core.eviction_s_per_block == pytest.approx(0.1) and core.eviction_weight == 1.0


def test_a_tier_makes_evictions_cheaper_only_as_often_as_it_held_the_blocks() -> None:
    core = _core()
    core.reload_s_per_block = 0.01
    assert core.eviction_weight == 1.0  # no reload seen yet: assume a recompute
    for _ in range(20):
        core.observe_reload(10, 5)  # the tier held half of what turns missed
    assert core.tier_hit_rate == pytest.approx(0.5)
    assert core.eviction_s_per_block == pytest.approx(0.5 * 0.01 + 0.5 * 0.1)
    limit = max(core.settings.aging_s, core.settings.aging_turns * core.turn_s)
    assert core.hold_limit_s() == pytest.approx(limit * core.eviction_weight)


def _tiered() -> SimConfig:
    return SimConfig(block_size=32, arrival="closed", concurrency=6, pool_fraction=0.3,
                     lower_tier=TierConfig(capacity_blocks=2000), kv_bytes_per_token=65536,
                     cost=SimCost(overhead_s=0.05))  # fmt: skip


def test_tier_prefetch_loads_paused_contexts_and_accounts_every_block() -> None:
    workload = synthesize(10, 6, seed=5, arrival_rate_per_s=None, system_prompt_tokens=400)
    runs = [run_policy(workload, _tiered(), AgentKVPolicy(tier_prefetch=TierPrefetch()))
            for _ in range(2)]  # fmt: skip
    first, second = runs
    assert first.jct_s == second.jct_s  # deterministic
    c = first.core
    assert c["prefetches"] > 0 and c["prefetch_blocks"] > 0
    assert c["prefetch_blocks_used"] + c["prefetch_blocks_wasted"] <= c["prefetch_blocks"]
    assert len(first.jct_s) == 10


def test_without_a_tier_prefetch_does_nothing() -> None:
    workload = synthesize(6, 4, seed=5, arrival_rate_per_s=None, system_prompt_tokens=400)
    cfg = _tiered().with_(lower_tier=None)
    on = run_policy(workload, cfg, AgentKVPolicy(tier_prefetch=TierPrefetch()))
    off = run_policy(workload, cfg, AgentKVPolicy())
    assert on.jct_s == off.jct_s and on.core["prefetches"] == 0

"""The lower tier in the policy: eviction cost learned from reloads, and tier prefetch."""

from __future__ import annotations

import pytest

from agentkv.residency import Forecast, PolicyCore, PolicySettings
from agentkv.residency._strategies import FurthestReturn, TierAwareReturn
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
    # Half the misses served, the cutoff at two thirds: a quarter of the bound is left.
    assert core.hold_limit_s() == pytest.approx(limit * (1.0 - 0.5 / (2.0 / 3.0)))


@pytest.mark.parametrize(("served", "factor"), [(0, 1.0), (2, 0.75), (8, 0.0), (10, 0.0)])
def test_the_hold_bound_shrinks_with_what_the_tier_serves_and_ends_at_the_cutoff(
    served: int, factor: float
) -> None:
    """``tier_hold_cutoff`` 0.8: with the tier serving ``served`` of 10 missed blocks the
    bound keeps 1 - share / 0.8 of itself, and nothing from 0.8 on; without a reload
    seen (share 0) the bound is whole."""
    core: PolicyCore[int] = PolicyCore(PolicySettings(tier_hold_cutoff=0.8), 100)
    core.observe_step(10.0, 1.0)
    core.reload_s_per_block = 0.01
    for _ in range(40):
        core.observe_reload(10, served)
    assert core.tier_hold_factor() == pytest.approx(factor, abs=0.02)
    assert core.hold_limit_s() == pytest.approx(core.settings.aging_s * factor, abs=0.2)


def test_a_tier_that_serves_most_misses_holds_no_turn_back() -> None:
    """A busy engine (a call running) holds a turn that does not fit beside the leases;
    once the tier has served most of what turns missed, the same turn is admitted at
    once, since admitting it costs the evicted context only a reload."""
    def plan(core: PolicyCore[int]) -> set[str]:
        res = core.book.state("res", 0.0)
        core.on_waiting(res, 0.0)
        core.on_scheduled(res, 0.0)
        core.on_finished(res, 1.0, Forecast(p50_s=5.0, p90_s=8.0, p99_s=9.0))
        core.book.set_lease(res, list(range(60)), 10_000, 1.0)
        big = core.book.state("big", 1.0)
        core.on_waiting(big, 1.0)
        return core.plan_admission([(big, 50)], 1.0, free_blocks=10, num_running=1)

    without = _core()
    assert plan(without) == {"big"}
    tiered = _core()
    tiered.reload_s_per_block = 0.01
    for _ in range(40):
        tiered.observe_reload(10, 9)
    assert tiered.tier_hold_factor() == 0.0
    assert plan(tiered) == set()


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


# -- the victim rule with a lower tier -----------------------------------------------------
def _leased(core: PolicyCore[int], name: str, gap_s: float, blocks: list[int]) -> None:
    st = core.book.state(name, 0.0)
    core.on_finished(st, 0.0, Forecast(gap_s, 2 * gap_s, 4 * gap_s))
    core.book.set_hashes(st, [bytes([b]) for b in blocks], None)
    core.book.set_lease(st, blocks, 600_000, 0.0)


def _tier_core(held: dict[str, float], reload_s: float | None = 0.01) -> PolicyCore[int]:
    core = _core()  # 0.1 s to recompute a block
    core.reload_s_per_block = reload_s
    core.tier_share = lambda st: held.get(st.trajectory_id, 0.0)
    return core


def test_a_lease_the_tier_holds_whole_gives_way_before_one_it_does_not() -> None:
    """Even when the lease the tier holds is due back sooner: losing it costs a reload."""
    core = _tier_core({"held": 1.0})
    _leased(core, "held", 1.0, [1, 2])
    _leased(core, "cold", 10.0, [3, 4])
    victim = core.next_victim(None, 0.0)
    assert victim is not None and victim.trajectory_id == "held"
    core.tier_share = None  # no tier: furthest return again
    victim = core.next_victim(None, 0.0)
    assert victim is not None and victim.trajectory_id == "cold"


def test_between_partly_held_leases_the_cheapest_wait_per_rebuild_second_goes() -> None:
    """'half' is back in 4 s but half of it reloads (cost 0.055 s/block: 73 s of wait per
    second of rebuild); 'none' is back in 5 s and recomputes whole (0.1 s/block: 50)."""
    core = _tier_core({"half": 0.5})
    _leased(core, "half", 4.0, [1, 2])
    _leased(core, "none", 5.0, [3, 4])
    victim = core.next_victim(None, 0.0)
    assert victim is not None and victim.trajectory_id == "half"
    assert core.block_cost_s(0.5) == pytest.approx(0.5 * 0.01 + 0.5 * 0.1)
    # A reload never counts as dearer than the recompute it replaces.
    assert _tier_core({}, reload_s=1.0).block_cost_s(1.0) == pytest.approx(0.1)


def test_without_a_tier_the_tier_aware_order_is_furthest_return() -> None:
    fr, ta = FurthestReturn(), TierAwareReturn()
    core = _core()
    _leased(core, "a", 1.0, [1, 2])
    _leased(core, "b", 3.0, [3])
    order = [st.trajectory_id for st in core.book.iter_leased()]
    assert sorted(order, key=lambda k: fr.rank(core, core.book.get(k), 0.5)) == sorted(  # type: ignore[arg-type]
        order, key=lambda k: ta.rank(core, core.book.get(k), 0.5)[1:]  # type: ignore[arg-type]
    )
    assert isinstance(PolicyCore(PolicySettings(), 10).strategies.victims, TierAwareReturn)


def test_the_controller_reads_the_tier_through_the_port_and_offload_advice_is_honoured() -> None:
    """The simulator's port reports what its tier holds; an ``offload`` advice between
    turns ends the lease, writes the tier and demotes the context."""
    from agentkv.residency._controller import ResidencyController
    from agentkv.residency._strategies import FinishIntent
    from agentkv.sim._blockport import SimBlockPort, hash_of
    from agentkv.sim._pool import make_pool
    from agentkv.sim._pool_common import LowerTier

    tier = LowerTier(capacity_blocks=100, block_bytes=1024)
    pool = make_pool(8, lower_tier=tier)
    port = SimBlockPort(pool)
    ctl: ResidencyController[int] = ResidencyController(
        PolicyCore(PolicySettings(), 8), port, lower_tier=True
    )
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.assign_keys(blocks, [11, 12, 13])
    pool.free_blocks(blocks[::-1])
    hashes = [hash_of(k) for k in (11, 12, 13)]
    st = ctl.on_arrive("t", 0.0)
    ctl.on_finish("t", FinishIntent("default", forecast=Forecast(1.0, 2.0, 3.0)), 0.0,
                  hashes=hashes, computed_from=0)  # fmt: skip
    assert st.lease is not None and ctl.core.tier_share is not None
    assert ctl.core.tier_share(st) == 0.0
    tier.store(11)
    assert ctl.core.tier_share(st) == pytest.approx(1 / 3)
    assert ctl.on_advice(st, FinishIntent("offload"), 0.5) is None
    assert st.lease is None and st.last_outcome == "offloaded"
    assert ctl.counters.offloads == 1 and all(k in tier for k in (11, 12, 13))

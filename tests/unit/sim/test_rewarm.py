"""Re-warm (a simulator experiment): its choice of context and the used/wasted counts."""

from __future__ import annotations

import math

import pytest

from agentkv.residency import Forecast, PolicyCore, PolicySettings
from agentkv.sim import SimConfig, SimCost, synthesize
from agentkv.sim._engine import run_policy
from agentkv.sim._policies import AgentKVPolicy
from agentkv.sim._rewarm import Rewarm, plan_rewarm


def _core(**kw: object) -> PolicyCore[int]:
    core: PolicyCore[int] = PolicyCore(PolicySettings(**kw), num_blocks=100)  # type: ignore[arg-type]
    core.turn_s = 2.0
    return core


def _paused(core: PolicyCore[int], name: str, at: float, gap_s: float) -> object:
    st = core.book.state(name, at)
    core.on_finished(st, at, Forecast(gap_s, 2 * gap_s, 4 * gap_s))
    return st


def test_rewarm_picks_the_soonest_return_within_the_horizon_that_fits() -> None:
    core = _core()
    soon, later, far = (_paused(core, n, 0.0, g) for n, g in (("a", 1.0), ("b", 3.0), ("c", 50.0)))
    pick = plan_rewarm(core, [(later, 10), (soon, 10), (far, 10)], 0.5, free_blocks=50,
                            num_waiting=0, num_running=0)  # fmt: skip
    assert pick is soon
    # too big for the free pool (beside the 5-block reserve): the next one
    pick = plan_rewarm(core, [(soon, 46), (later, 10)], 0.5, free_blocks=50, num_waiting=0,
                            num_running=0)  # fmt: skip
    assert pick is later
    # beyond the horizon (2 turns of 2 s): nothing
    assert plan_rewarm(core, [(far, 10)], 0.5, free_blocks=50, num_waiting=0, num_running=0) is None


def test_rewarm_needs_spare_compute() -> None:
    core = _core()
    st = _paused(core, "a", 0.0, 1.0)
    kw = {"free_blocks": 50}
    assert plan_rewarm(core, [(st, 5)], 0.1, num_waiting=1, num_running=0, **kw) is None
    assert plan_rewarm(core, [(st, 5)], 0.1, num_waiting=0, num_running=2, **kw) is None
    assert plan_rewarm(core, [(st, 5)], 0.1, num_waiting=0, num_running=0, **kw) is st


def test_rewarmed_blocks_count_as_used_when_the_turn_takes_the_lease_else_wasted() -> None:
    core = _core()
    a, b = core.book.state("a", 0.0), core.book.state("b", 0.0)
    for st, blocks in ((a, [1, 2, 3, 4]), (b, [5, 6, 7, 8])):
        core.on_finished(st, 0.0, Forecast(1, 2, 4))
        core.book.set_lease(st, blocks, 60_000, 0.0)
        core.book.note_ahead(st, 3, "rewarm")
    core.on_scheduled(a, 1.0)
    core.book.trim_lease(b, 2)  # two of b's three re-warmed tail blocks given up
    core.book.end_lease(b, "expired")
    c = core.counters
    assert (c.rewarms, c.rewarm_blocks, c.rewarm_blocks_used, c.rewarm_blocks_wasted) == (
        2,
        6,
        3,
        3,
    )


def test_simulated_rewarm_is_deterministic_and_accounts_every_block() -> None:
    workload = synthesize(8, 6, seed=3, arrival_rate_per_s=None, system_prompt_tokens=512)
    cfg = SimConfig(block_size=32, arrival="closed", concurrency=4, pool_fraction=0.4,
                    cost=SimCost(overhead_s=0.3))  # fmt: skip

    def run() -> tuple[list[float], dict[str, int], int]:
        pol = AgentKVPolicy(rewarm=Rewarm(horizon_turns=4.0))
        st = run_policy(workload, cfg, pol)
        return st.jct_s, st.core, st.rewarm_tokens

    first, second = run(), run()
    assert first == second
    core = first[1]
    assert core["rewarm_blocks_used"] + core["rewarm_blocks_wasted"] <= core["rewarm_blocks"]
    assert core["rewarms"] > 0 and len(first[0]) == 8


@pytest.mark.timeout(120)
def test_rewarm_behind_a_scattering_router_ends_and_skips_roaming_contexts() -> None:
    """Behind round robin over two replicas no trajectory is expected back at the replica
    that saw its last turn (its return there is never): a re-warm must not be planned for
    it, nor a wake scheduled at that never (the run used to spin at time infinity)."""
    workload = synthesize(8, 6, seed=3, arrival_rate_per_s=None, system_prompt_tokens=512)
    cfg = SimConfig(block_size=32, arrival="closed", concurrency=6, pool_fraction=0.3,
                    replicas=2, routing="round_robin", cost=SimCost(overhead_s=0.05))  # fmt: skip
    st = run_policy(workload, cfg, AgentKVPolicy(rewarm=Rewarm()))
    assert len(st.jct_s) == 8 and all(math.isfinite(j) for j in st.jct_s)
    assert math.isfinite(st.makespan_s)

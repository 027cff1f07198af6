"""Tenancy under volume, in the residency core (pure): floods of made-up ids or salts,
tenants at their share's edge, stale forecasts, a neighbour's long turns, crashed clients."""

from __future__ import annotations

import math

from agentkv.residency import Forecast, PolicyCore, PolicySettings
from agentkv.residency._controller import ResidencyController
from agentkv.residency._strategies import FinishIntent
from agentkv.sim._blockport import SimBlockPort, hash_of
from agentkv.sim._pool_lru import LRUBlockPool


def _core(**kw: object) -> PolicyCore[int]:
    return PolicyCore(PolicySettings(**kw), num_blocks=100)  # type: ignore[arg-type]


def test_a_flood_of_new_salts_forgets_idle_states_never_a_leased_trajectory() -> None:
    """Finding: 5 salts x 1,024 aborted requests pushed every other tenant out of the
    global trajectory bound, leases and all (victim 160 -> 0 cached tokens)."""
    core = _core(max_trajectories=8, max_trajectories_per_tenant=4)
    victim = core.book.state("victim", 0.0, tenant="v")
    core.book.set_lease(victim, list(range(10)), 60_000, 0.0)
    for i in range(5 * 64):  # made-up salts, each a few trajectories, none leased
        core.book.state(f"x{i}", 1.0 + i, tenant=f"attacker{i % 5}")
    assert core.book.get("victim") is victim and victim.lease is not None
    assert len(victim.lease.blocks) == 10 and len(core.book) == 8
    assert core.counters.trajectories_evicted > 0


def test_a_tenant_flood_under_its_own_quota_forgets_its_idle_states_first() -> None:
    core = _core(max_trajectories_per_tenant=3)
    kept = core.book.state("mine-leased", 0.0, tenant="t")
    core.book.set_lease(kept, [1, 2], 60_000, 0.0)
    for i in range(6):
        core.book.state(f"mine{i}", 1.0 + i, tenant="t")
    assert core.book.get("mine-leased") is kept and kept.lease is not None


def test_two_tenants_at_their_share_cannot_leave_a_third_with_nothing() -> None:
    """Finding: two attacker salts exactly at their share (0.5 of the cap each) were not
    "over share", so the victim's lease was capped to 0 (6 -> 0 blocks)."""
    core = _core(max_retained_fraction=0.6, tenant_retained_share=0.5)  # cap 60, share 30
    for name in ("a1", "a2"):
        st = core.book.state(name, 0.0, tenant=name)
        core.book.set_lease(st, list(range(30)), 60_000, 0.0)
    assert core.book.retained_blocks == core.book.retained_cap
    victim = core.book.state("v", 1.0, tenant="v")
    core.on_finished(victim, 1.0, Forecast(1, 2, 4))
    assert core.plan_lease(victim, 6, 1.0) == 6  # an equal part among three: 20 blocks
    assert core.counters.leases_reclaimed >= 1


def test_past_its_p99_a_forecast_is_believed_no_more() -> None:
    """Finding: a 1 ms forecast kept a lease "due now" forever, so honest leases went first
    under pressure (192 -> 32 cached tokens)."""
    core = _core(retention="predicted", trim=False)
    liar = core.book.state("liar", 0.0, tenant="a")
    core.on_finished(liar, 0.0, Forecast(0.001, 0.001, 0.001))
    core.book.set_lease(liar, list(range(10)), 600_000, 0.0)
    honest = core.book.state("honest", 9.0, tenant="b")
    core.on_finished(honest, 9.0, Forecast(3.0, 6.0, 12.0))
    core.book.set_lease(honest, list(range(10, 20)), 600_000, 9.0)
    now = 10.0  # the liar has been away 10 s against its 1 ms forecast
    assert core.returns.expected_return_s(liar, now) >= now + 10.0
    assert core.returns.expected_return_s(honest, now) == 12.0
    assert core.pressure_release(None, now) == 10 and liar.lease is None
    assert honest.lease is not None


def test_a_neighbours_long_turns_do_not_stretch_another_tenants_holds() -> None:
    """Finding: a neighbour's long decodes stretched another tenant's hold from 10 s to
    479 s (the hold limit followed one turn-time average for all tenants)."""
    core = _core(aging_s=10.0, aging_turns=8.0)
    for i in range(20):  # the neighbour's turns take a minute each
        st = core.book.state(f"slow{i}", 0.0, tenant="neighbour")
        core.on_scheduled(st, 0.0)
        core.on_finished(st, 60.0, None)
    quick = core.book.state("quick", 0.0, tenant="me")
    core.on_scheduled(quick, 0.0)
    core.on_finished(quick, 0.5, None)
    assert core.hold_limit_s("neighbour") >= 8 * 59.0
    assert core.hold_limit_s("me") == 10.0  # max(aging_s, 8 x 0.5 s)


def test_under_predicted_retention_a_lease_lasts_the_advised_ttl() -> None:
    """Finding: a crashed client's lease lived max_ttl_ms (600 s) whatever TTL it had
    advised, and outranked live tenants."""
    pool = LRUBlockPool(20)
    core: PolicyCore[int] = PolicyCore(PolicySettings(retention="predicted"), 20)
    ctl = ResidencyController(core, SimBlockPort(pool))
    keys = [1, 2, 3]
    ctl.on_arrive("t", 0.0, turn=0, request_id="r")
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.assign_keys(blocks, keys)
    ctl.on_finish("t", FinishIntent("retain", 5_000, Forecast(1, 2, 4)), 1.0,
                  hashes=[hash_of(k) for k in keys], computed_from=0, request_id="r")  # fmt: skip
    pool.free_blocks(blocks[::-1])
    st = ctl.book.get("t")
    assert st is not None and st.lease is not None
    assert math.isclose(st.lease.deadline_s, 6.0)
    assert ctl.expire(6.0) == 1 and st.lease is None

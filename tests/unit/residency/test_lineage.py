"""Lineage in the policy core: the critical path and a parent waiting on a child's join
order pressure victims, defer a joining parent's expiry (to a hard cap) and exempt the
turns the join waits on from admission's holds (pure)."""

from __future__ import annotations

from agentkv.residency import Forecast, PolicyCore, PolicySettings
from agentkv.residency._book import TrajState


def _core(**kw: object) -> PolicyCore[int]:
    return PolicyCore(PolicySettings(**kw), num_blocks=100)  # type: ignore[arg-type]


def _paused(
    b: PolicyCore[int], name: str, at: float, gap_s: float, blocks: list[int], ttl_ms: int = 600_000
) -> TrajState[int]:
    s = b.book.state(name, at)
    b.on_finished(s, at, Forecast(gap_s, 2 * gap_s, 4 * gap_s))
    b.book.set_lease(s, blocks, ttl_ms, at)
    return s


def _running_child(b: PolicyCore[int], name: str, parent: str, at: float) -> TrajState[int]:
    child = b.book.state(name, at)
    assert b.book.set_lineage(child, parent, None)
    b.on_waiting(child, at)
    b.on_scheduled(child, at)
    return child


# -- links ------------------------------------------------------------------------------
def test_a_parent_links_only_within_its_own_tenant() -> None:
    b = _core()
    parent = b.book.state("p", 0.0, tenant="A")
    mine, theirs = b.book.state("c1", 0.0, tenant="A"), b.book.state("c2", 0.0, tenant="B")
    assert b.book.set_lineage(mine, "p", True) and mine.parent_key == "p"
    assert mine.critical_path is True
    assert not b.book.set_lineage(theirs, "p", None)  # another tenant's trajectory
    assert theirs.parent_key is None
    assert [c.trajectory_id for c in b.book.children(parent)] == ["c1"]
    assert not b.book.set_lineage(mine, "nobody", False)  # a parent never seen here
    assert mine.parent_key is None and mine.critical_path is False
    assert not list(b.book.children(parent))
    assert not b.book.set_lineage(parent, "p", None)  # never its own parent


def test_forgetting_a_parent_unlinks_its_children() -> None:
    b = _core()
    parent = b.book.state("p", 0.0)
    child = b.book.state("c", 0.0)
    b.book.set_lineage(child, "p", None)
    b.book.forget_trajectory(parent)
    assert child.parent_key is None
    again = b.book.state("p", 1.0)  # a new trajectory of that id has no children
    assert not list(b.book.children(again)) and not b.book.joining(again)


def test_a_parent_joins_while_a_child_is_active_and_not_after_it_finished() -> None:
    b = _core()
    parent = _paused(b, "p", 0.0, 1.0, [1, 2])
    child = _running_child(b, "c", "p", 0.5)
    assert b.book.joining(parent)
    b.on_finished(child, 1.0, None)  # paused without a lease: nothing of it is active
    assert not b.book.joining(parent)
    b.on_waiting(child, 1.5)  # its next turn waits
    assert b.book.joining(parent)
    child.closed = True  # finished (the controller's on_end)
    assert not b.book.joining(parent)


# -- pressure victims ---------------------------------------------------------------------
def test_victims_off_the_critical_path_first_and_a_joining_parent_last() -> None:
    """Expected back last (the plain order's first victim): the joining parent, then the
    critical lease; lineage reverses that, and counts each choice that spared one."""
    b = _core()
    parent = _paused(b, "parent", 0.0, 90.0, [1])
    crit = _paused(b, "crit", 0.0, 60.0, [2])
    plain = _paused(b, "plain", 0.0, 5.0, [3])
    off = _paused(b, "off", 0.0, 1.0, [4])
    _running_child(b, "child", "parent", 0.0)
    b.book.set_lineage(crit, None, True)
    b.book.set_lineage(off, None, False)
    assert plain.critical_path is None
    order = []
    while (victim := b.next_victim(None, 0.0)) is not None:
        order.append(victim.trajectory_id)
        assert b.pressure_release(None, 0.0) == 1
    assert order == ["off", "plain", "crit", "parent"]
    # "off" and "plain" were taken past the joining parent, "crit" past the parent too
    assert b.counters.lineage_protected == 3
    assert b.counters.leases_pressure_released == 4 and parent.lease is None


def test_without_lineage_the_victim_order_is_unchanged_and_nothing_is_counted() -> None:
    b = _core()
    for name, gap in (("a", 1.0), ("b", 30.0), ("c", 5.0)):
        _paused(b, name, 0.0, gap, [ord(name)])
    order = []
    while (victim := b.next_victim(None, 0.0)) is not None:
        order.append(victim.trajectory_id)
        b.pressure_release(None, 0.0)
    assert order == ["b", "c", "a"]  # expected back last first
    assert b.counters.lineage_protected == 0


def test_a_critical_lease_gives_way_only_within_the_tenant_chosen_first() -> None:
    """Tenants over their share still go first: lineage orders inside that choice."""
    b = _core(max_retained_fraction=0.1, tenant_retained_share=0.5)
    greedy = [b.book.state(f"g{i}", 0.0, tenant="G") for i in range(2)]
    for i, s in enumerate(greedy):
        b.on_finished(s, 0.0, Forecast(1.0, 2.0, 4.0))
        b.book.set_lease(s, [10 + 3 * i, 11 + 3 * i, 12 + 3 * i], 600_000, 0.0)
        b.book.set_lineage(s, None, True)
    modest = _paused(b, "m", 0.0, 100.0, [50])
    modest.tenant = ""  # the unsalted tenant, within its share
    assert "G" in b.book.tenants_over_share()
    victim = b.next_victim(None, 0.0)
    assert victim is not None and victim.tenant == "G"


# -- expiry ------------------------------------------------------------------------------
def test_a_joining_parents_lease_outlives_its_ttl_until_the_hard_cap() -> None:
    b = _core(max_ttl_ms=5_000)
    parent = _paused(b, "p", 0.0, 1.0, [1, 2], ttl_ms=1_000)
    _running_child(b, "c", "p", 0.5)
    assert b.book.expire(2.0) == 0 and parent.lease is not None
    assert b.book.expire(4.9) == 0
    assert b.counters.lineage_expiry_deferred == 1  # once per lease, not per step
    assert b.book.expire(5.0) == 1  # created at 0.0 + max_ttl_ms: the hard cap
    assert parent.last_outcome == "expired" and b.counters.leases_expired == 1


def test_the_hard_cap_is_also_the_pause_lifetime() -> None:
    b = _core(max_ttl_ms=10_000, max_lease_lifetime_ms=3_000)
    parent = _paused(b, "p", 0.0, 1.0, [1], ttl_ms=1_000)
    _running_child(b, "c", "p", 0.0)
    assert b.book.hard_deadline_s(parent) == 3.0
    assert b.book.expire(2.9) == 0 and b.book.expire(3.0) == 1


def test_a_parent_lease_expires_at_its_deadline_once_the_child_is_done() -> None:
    b = _core(max_ttl_ms=5_000)
    parent = _paused(b, "p", 0.0, 1.0, [1], ttl_ms=1_000)
    child = _running_child(b, "c", "p", 0.5)
    assert b.book.expire(1.5) == 0
    child.closed = True
    b.on_finished(child, 1.6, None)
    assert b.book.expire(1.7) == 1 and parent.lease is None
    # A lease without children expires at its deadline as before, nothing deferred.
    lone = _paused(b, "lone", 2.0, 1.0, [2], ttl_ms=1_000)
    assert b.book.expire(3.0) == 1 and lone.lease is None
    assert b.counters.lineage_expiry_deferred == 1


# -- admission ---------------------------------------------------------------------------
def _held_setup(b: PolicyCore[int]) -> TrajState[int]:
    _paused(b, "res", 0.0, 1.0, [1, 2, 3])
    big = b.book.state("big", 1.0)
    b.on_waiting(big, 1.0)
    return big


def test_a_turn_on_the_critical_path_is_not_held() -> None:
    b = _core(reserve_fraction=0.0, aging_s=5.0)
    big = _held_setup(b)
    assert b.plan_admission([(big, 50)], 1.0, free_blocks=10, num_running=3) == {"big"}
    b.book.set_lineage(big, None, True)
    assert b.plan_admission([(big, 50)], 1.1, free_blocks=10, num_running=3) == set()
    b.book.set_lineage(big, None, False)  # marked off the path: held as any other turn
    assert b.plan_admission([(big, 50)], 1.2, free_blocks=10, num_running=3) == {"big"}


def test_a_parent_back_from_a_join_is_not_held_and_takes_the_room_first() -> None:
    b = _core(reserve_fraction=0.0, aging_s=5.0)
    parent = b.book.state("p", 0.0)
    b.on_finished(parent, 0.0, Forecast(1.0, 2.0, 4.0))
    child = _running_child(b, "c", "p", 0.2)
    b.on_finished(child, 0.8, None)
    child.closed = True  # the join: the child is done
    other = b.book.state("o", 1.0)
    b.on_waiting(other, 1.0)
    b.on_waiting(parent, 1.0)
    assert parent.join_return and not other.join_return
    # Queue order: "o" first. Without lineage "o" would take the room and "p" wait.
    held = b.plan_admission([(other, 6), (parent, 6)], 1.0, free_blocks=10, num_running=3)
    assert held == {"o"}
    assert b.plan_admission([(other, 6), (parent, 50)], 1.0, free_blocks=10, num_running=3) == {
        "o"
    }  # does not fit, still not held
    b.on_scheduled(parent, 1.1)
    assert not parent.join_return  # the next pause starts afresh


def test_a_parent_whose_pause_saw_no_child_returns_as_any_turn() -> None:
    b = _core(reserve_fraction=0.0, aging_s=5.0)
    parent = b.book.state("p", 0.0)
    child = _running_child(b, "c", "p", 0.0)
    b.on_finished(child, 0.5, None)
    b.on_finished(parent, 1.0, Forecast(1.0, 2.0, 4.0))  # paused after the child's turn
    other = b.book.state("o", 2.0)
    b.on_waiting(other, 2.0)
    b.on_waiting(parent, 2.0)
    assert not parent.join_return
    held = b.plan_admission([(other, 6), (parent, 6)], 2.0, free_blocks=10, num_running=3)
    assert held == {"p"}


def test_the_lineage_counters_are_in_the_stats() -> None:
    b = _core(max_ttl_ms=5_000)
    _paused(b, "p", 0.0, 1.0, [1], ttl_ms=1_000)
    _running_child(b, "c", "p", 0.0)
    b.book.expire(2.0)
    stats = b.stats()
    assert stats["lineage_expiry_deferred"] == 1 and stats["lineage_protected"] == 0


def test_a_return_from_a_join_that_never_ran_does_not_carry_over() -> None:
    """The parent's waiting turn was aborted: its next pause starts without the mark."""
    b = _core()
    parent = b.book.state("p", 0.0)
    b.on_finished(parent, 0.0, Forecast(1.0, 2.0, 4.0))
    _running_child(b, "c", "p", 0.2)
    parent.live_requests["r1"] = True
    b.on_waiting(parent, 1.0)
    assert parent.join_return
    del parent.live_requests["r1"]  # the request ended without running
    b.on_finished(parent, 1.2, None)
    assert not parent.join_return

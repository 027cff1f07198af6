"""The policy core: lease bookkeeping, pressure victims, admission and priority (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.residency import Forecast, PolicyCore, PolicySettings
from agentkv.residency._book import bound_priority


def _core(**kw: object) -> PolicyCore[int]:
    return PolicyCore(PolicySettings(**kw), num_blocks=100)  # type: ignore[arg-type]


# -- bookkeeping (the plugin's semantics) ------------------------------------------------
def test_lease_ttl_is_capped_and_expires_lazily() -> None:
    b = _core(max_ttl_ms=1000)
    s = b.book.state("t", 0.0)
    b.book.set_lease(s, [1, 2, 3], ttl_ms=10**9, now_s=0.0)
    assert s.lease is not None and s.lease.deadline_s == 1.0
    assert b.book.expire(0.5) == 0 and b.book.retained_blocks == 3
    assert b.book.expire(1.0) == 1 and s.last_outcome == "expired"
    assert b.book.drain_frees() == [[1, 2, 3]] and b.book.drain_frees() == []


def test_retained_cap_truncates_new_leases_to_a_prefix() -> None:
    b = _core(max_retained_fraction=0.1, retention="hint")
    a = b.book.state("a", 0)
    assert b.plan_lease(a, 8, 0) == 8
    b.book.set_lease(a, list(range(8)), 1000, 0)
    assert b.plan_lease(b.book.state("b", 0), 8, 0) == 2
    assert b.counters.leases_capped == 1
    assert b.plan_lease(a, 12, 0) == 10  # its own lease is replaced, not added


def test_hint_retention_leases_only_what_was_advised() -> None:
    from agentkv.residency._strategies import FinishIntent

    b = _core(retention="hint")
    sizing = b.strategies.sizing
    assert sizing.finish_action(FinishIntent(), lower_tier=False, pending_retain=False) == "none"
    advised = FinishIntent("retain", 1000)
    assert sizing.finish_action(advised, lower_tier=False, pending_retain=False) == "lease"
    assert b.plan_lease(b.book.state("a", 0), 8, 0) == 8


def test_hint_pressure_releases_earliest_deadline_first_and_spares_requester() -> None:
    b = _core(retention="hint")
    for name, ttl in (("a", 5000), ("b", 1000), ("c", 3000)):
        b.book.set_lease(b.book.state(name, 0), [ord(name)], ttl, 0)
    assert b.pressure_release("b", 0.0) == 1
    assert b.book.get("c").last_outcome == "pressure_released"  # type: ignore[union-attr]
    assert b.pressure_release("b", 0.0) and b.book.get("a").lease is None  # type: ignore[union-attr]
    # The requester's own lease goes last (its prefix may no longer match).
    assert b.pressure_release("b", 0.0) == 1 and b.book.get("b").lease is None  # type: ignore[union-attr]
    assert b.pressure_release("b", 0.0) == 0
    assert b.counters.leases_pressure_released == 3


def test_replacing_a_lease_frees_the_old_blocks_once() -> None:
    b = _core()
    s = b.book.state("t", 0)
    b.book.set_lease(s, [1, 2], 1000, 0)
    b.book.set_lease(s, [1, 2, 3], 1000, 0)
    assert b.book.drain_frees() == [[1, 2]] and b.book.retained_blocks == 3


def test_shared_prefix_is_seen_across_trajectories() -> None:
    b = _core()
    a, c = b.book.state("a", 0), b.book.state("c", 0)
    b.book.set_hashes(a, [b"sys", b"a1"])
    b.book.set_hashes(c, [b"sys", b"c1"])
    assert b.book.shared_with_others(b"sys", a) and not b.book.shared_with_others(b"a1", a)
    b.book.set_hashes(c, [])
    assert not b.book.shared_with_others(b"sys", a)


def test_trajectory_index_is_bounded_and_frees_forgotten_leases() -> None:
    """Idle states go first; a leased one only when every other is leased too."""
    b = _core(max_trajectories=2)
    b.book.set_lease(b.book.state("a", 0), [1], 1000, 0)
    b.book.state("b", 1)
    b.book.state("c", 2)
    assert b.book.get("b") is None and b.book.get("a") is not None and len(b.book) == 2
    b.book.set_lease(b.book.get("c"), [2], 1000, 2)  # type: ignore[arg-type]
    b.book.state("d", 3)
    assert b.book.get("a") is None and len(b.book) == 2 and b.book.drain_frees() == [[1]]


def test_leased_states_lists_only_trajectories_holding_a_lease() -> None:
    b = _core()
    b.book.set_lease(b.book.state("a", 0), [1], 1000, 0)
    b.book.state("b", 0)
    assert [s.trajectory_id for s in b.book.leased_states()] == ["a"]
    b.book.end_lease(b.book.get("a"), "released")  # type: ignore[arg-type]
    assert b.book.leased_states() == []


def test_scheduling_a_turn_hands_its_lease_over_once() -> None:
    b = _core()
    s = b.book.state("t", 0)
    b.book.set_lease(s, [1, 2], 1000, 0)
    b.on_waiting(s, 1.0)
    b.on_scheduled(s)
    b.on_scheduled(s)
    assert b.counters.leases_reused == 1 and b.book.drain_frees() == [[1, 2]]
    assert s.waiting_since_s is None


# -- predicted retention ------------------------------------------------------------------
def _paused(b: PolicyCore[int], name: str, at: float, gap_s: float, blocks: list[int]) -> None:
    s = b.book.state(name, at)
    b.on_finished(s, at, Forecast(gap_s, 2 * gap_s, 4 * gap_s))
    b.book.set_lease(s, blocks, 600_000, at)


def test_expected_return_walks_the_quantiles_as_a_pause_gets_long() -> None:
    b = _core()
    s = b.book.state("t", 0)
    b.on_finished(s, 10.0, Forecast(1.0, 5.0, 20.0))
    assert b.returns.expected_return_s(s, 10.0) == 11.0
    assert b.returns.expected_return_s(s, 12.0) == 15.0
    assert b.returns.expected_return_s(s, 16.0) == 30.0
    # past p99 (at 30 s): no sooner than it has been away (30 s), at least another p99
    assert b.returns.expected_return_s(s, 40.0) == 70.0
    b.on_waiting(s, 41.0)
    assert b.returns.expected_return_s(s, 41.0) == 41.0


def test_predicted_pressure_gives_up_the_lease_expected_back_last() -> None:
    b = _core()
    _paused(b, "soon", 0.0, 1.0, [1, 2])
    _paused(b, "late", 0.0, 10.0, [3, 4])
    _paused(b, "recent", 0.9, 1.0, [5, 6])  # same tool, paused later: back later
    assert b.pressure_release(None, 0.95) == 2
    assert b.book.get("late").lease is None  # type: ignore[union-attr]
    assert b.pressure_release(None, 0.95) == 2
    assert b.book.get("recent").lease is None  # type: ignore[union-attr]
    assert b.book.get("soon").lease is not None  # type: ignore[union-attr]


def test_predicted_pressure_trims_the_tail_and_keeps_the_prefix() -> None:
    b = _core()
    _paused(b, "a", 0.0, 5.0, [1, 2, 3, 4, 5])
    assert b.pressure_release(None, 0.0, need_blocks=2) == 2
    lease = b.book.get("a").lease  # type: ignore[union-attr]
    assert lease is not None and lease.blocks == [1, 2, 3]
    assert b.book.drain_frees() == [[4, 5]] and b.book.retained_blocks == 3
    assert b.counters.leases_trimmed == 1


def test_a_lease_the_pool_cannot_keep_is_declined_or_shortened() -> None:
    b = _core(reserve_fraction=0.0)
    _paused(b, "soon", 0.0, 1.0, [1, 2])
    late = b.book.state("late", 0.5)
    b.on_finished(late, 0.5, Forecast(30.0, 60.0, 90.0))
    # Waiting work needs 6 blocks and only 2 are free: the latest return keeps 10 - 4.
    assert b.plan_lease(late, 10, 0.5, free_blocks=2, demand_blocks=6) == 6
    assert b.counters.leases_declined == 1
    assert b.plan_lease(late, 10, 0.5, free_blocks=20, demand_blocks=6) == 10
    early = b.book.state("early", 0.5)
    b.on_finished(early, 0.5, Forecast(0.1, 0.2, 0.3))
    # Someone else returns later: they are the ones to give way, under pressure.
    assert b.plan_lease(early, 10, 0.5, free_blocks=2, demand_blocks=6) == 10


# -- admission ---------------------------------------------------------------------------
def test_admission_holds_turns_that_do_not_fit_beside_the_leases() -> None:
    b = _core(reserve_fraction=0.0, aging_s=5.0)
    _paused(b, "res", 0.0, 1.0, [1, 2, 3])
    res, big, small = b.book.state("res", 1), b.book.state("big", 1), b.book.state("small", 1)
    for s in (res, big, small):
        b.on_waiting(s, 1.0)
    held = b.plan_admission([(res, 1), (big, 50), (small, 5)], 1.0, free_blocks=10, num_running=3)
    assert held == {"big"} and b.counters.turns_held == 1
    # Still held while waiting less than aging_s; admitted once it has waited that long.
    assert b.plan_admission([(big, 50)], 5.9, free_blocks=10, num_running=3) == {"big"}
    assert b.plan_admission([(big, 50)], 6.0, free_blocks=10, num_running=3) == set()
    assert b.counters.turns_held == 1 and b.counters.holds_aged_out == 1
    assert b.counters.held_ms == 5000  # waiting since 1.0 s, released at 6.0 s


def test_admitted_turns_use_up_the_free_budget() -> None:
    b = _core(reserve_fraction=0.0)
    one, two = b.book.state("one", 0), b.book.state("two", 0)
    for s in (one, two):
        b.on_waiting(s, 0.0)
    assert b.plan_admission([(one, 6), (two, 6)], 0.0, free_blocks=10, num_running=3) == {"two"}


@pytest.mark.parametrize("running", [0, 1])
def test_admission_is_work_conserving_when_the_engine_is_nearly_idle(running: int) -> None:
    b = _core(reserve_fraction=0.0, min_running=2)
    big = b.book.state("big", 0)
    b.on_waiting(big, 0.0)
    assert b.plan_admission([(big, 500)], 0.0, free_blocks=10, num_running=running) == set()


def _learn_turn_time(b: PolicyCore[int], turn_s: float) -> None:
    w = b.book.state("warm-up", 0.0)
    b.on_waiting(w, 0.0)
    b.on_scheduled(w, 0.0)
    b.on_finished(w, turn_s, None)
    assert b.turn_s == turn_s


@pytest.mark.parametrize("running", [0, 1])
@pytest.mark.parametrize(
    ("back_in_s", "wait_turns", "held"), [(1.5, 1.0, True), (30.0, 1.0, False), (1.5, 0.0, False)]
)
def test_a_nearly_idle_engine_holds_a_turn_only_for_a_context_due_back_soon(
    running: int, back_in_s: float, wait_turns: float, held: bool
) -> None:
    """Below ``min_running`` a turn that does not fit is admitted (the engine must not
    idle), unless a resident context is due back within ``idle_wait_turns`` mean turn
    times and waiting for it to return and run its turn (1.5 s + 2 s) costs less than
    recomputing it twice over (40 blocks at 0.1 s): admitting would evict that context
    just before its trajectory needs it."""
    b = _core(reserve_fraction=0.0, min_running=2, idle_wait_turns=wait_turns)
    _learn_turn_time(b, 2.0)
    b.observe_step(10.0, 1.0)
    _paused(b, "res", 2.0, back_in_s, list(range(40)))
    big = b.book.state("big", 2.0)
    b.on_waiting(big, 2.0)
    got = b.plan_admission([(big, 45)], 2.0, free_blocks=10, num_running=running)
    assert got == ({"big"} if held else set())
    if held:  # a bounded wait: the hold ends when the aging limit passes
        assert (
            b.plan_admission(
                [(big, 45)], 2.0 + b.hold_limit_s(), free_blocks=10, num_running=running
            )
            == set()
        )


@pytest.mark.parametrize(
    ("s_per_block", "held"), [(0.1, True), (0.001, False)], ids=["recompute-dear", "cheap"]
)
def test_a_nearly_idle_engine_waits_only_when_waiting_costs_less_than_recomputing(
    s_per_block: float, held: bool
) -> None:
    """Below ``min_running``, with the prefill cost learned from the engine's steps, a
    turn that does not fit is held for a context due back soon only when that wait is
    shorter than recomputing what admitting the turn could evict (the larger of its
    shortfall, 35 blocks, and the context due back, 40 blocks: 4 s at 0.1 s a block,
    40 ms at 1 ms a block, counted twice: its owner and the engine's next turn wait for
    it) against the wait for that context to come back in 1.5 s and run its 2 s turn."""
    b = _core(reserve_fraction=0.0, min_running=2)
    _learn_turn_time(b, 2.0)
    b.observe_step(0.0, 5.0)  # decode-only steps teach nothing
    assert b.prefill_s_per_block == 0.0
    _paused(b, "res0", 2.0, 1.5, [])  # without a learned prefill cost nothing is held
    w0 = b.book.state("w0", 2.0)
    b.on_waiting(w0, 2.0)
    assert b.plan_admission([(w0, 45)], 2.0, free_blocks=10, num_running=1) == set()
    for _ in range(3):
        b.observe_step(20.0, 20 * s_per_block)
    assert b.prefill_s_per_block == pytest.approx(s_per_block)
    _paused(b, "res", 2.0, 1.5, list(range(40)))
    big = b.book.state("big", 2.0)
    b.on_waiting(big, 2.0)
    got = b.plan_admission([(big, 45)], 2.0, free_blocks=10, num_running=1)
    assert got == ({"big"} if held else set())
    # With room for it, nothing is held whatever the costs.
    assert b.plan_admission([(big, 10)], 2.0, free_blocks=10, num_running=1) == set()


def test_a_turn_may_take_leases_expected_back_after_it() -> None:
    b = _core(reserve_fraction=0.0)
    _paused(b, "slow", 0.0, 30.0, list(range(40)))  # back in ~30 s
    _paused(b, "fast", 0.0, 0.5, list(range(40, 60)))  # back in ~0.5 s
    x = b.book.state("x", 0.0)
    b.on_finished(x, 0.0, Forecast(1.0, 2.0, 4.0))
    b.on_waiting(x, 0.1)
    # 10 free + the 40 blocks of "slow" (back later than x would be) cover 45.
    assert b.plan_admission([(x, 45)], 0.1, free_blocks=10, num_running=3) == set()
    # 10 + 40 do not cover 55, and "fast" returns before x would: held.
    y = b.book.state("y", 0.0)
    b.on_finished(y, 0.0, Forecast(1.0, 2.0, 4.0))
    b.on_waiting(y, 0.1)
    assert b.plan_admission([(y, 55)], 0.1, free_blocks=10, num_running=3) == {"y"}
    # Without a forecast of its own a turn cannot claim anyone's lease.
    z = b.book.state("z", 0.0)
    b.on_waiting(z, 0.1)
    assert b.plan_admission([(z, 45)], 0.1, free_blocks=10, num_running=3) == {"z"}


def test_growth_of_active_contexts_is_kept_free() -> None:
    b = _core(reserve_fraction=0.0)
    s = b.book.state("s", 0.0)
    b.on_finished(s, 0.0, None, context_blocks=10)
    b.on_waiting(s, 1.0)
    b.on_scheduled(s, 1.0)
    b.on_finished(s, 3.0, None, context_blocks=16)
    b.book.set_lease(s, list(range(16)), 600_000, 3.0)
    assert s.growth_blocks == 6 and b.growth_reserve() == 6 and b.turn_s == 2.0
    x = b.book.state("x", 3.0)
    b.on_waiting(x, 3.0)
    assert b.plan_admission([(x, 5)], 3.0, free_blocks=10, num_running=3) == {"x"}
    assert b.plan_admission([(x, 4)], 3.0, free_blocks=10, num_running=3) == set()


def test_admission_off_holds_nothing() -> None:
    b = _core(admission=False)
    big = b.book.state("big", 0)
    b.on_waiting(big, 0.0)
    assert b.plan_admission([(big, 500)], 0.0, free_blocks=0, num_running=3) == set()


# -- priority ----------------------------------------------------------------------------
@given(st.integers(-(10**12), 10**12), st.integers(0, 10**12), st.booleans())
def test_priority_is_always_bounded(advised: int, attained: int, resumed: bool) -> None:
    b = _core(priority_bound=8)
    s = b.book.state("t", 0)
    s.attained_tokens = attained
    if resumed:
        s.hashes = [b"h"]
    assert -8 <= b.assign_priority(s, advised, 0) <= 8
    assert b.aged_priority() < -8


def test_priority_prefers_resumed_and_penalizes_attained_service() -> None:
    b = _core(priority_bound=8, service_quantum_tokens=1000)
    fresh = b.book.state("fresh", 0)
    resumed = b.book.state("resumed", 0)
    resumed.hashes = [b"h"]
    hog = b.book.state("hog", 0)
    hog.hashes = [b"h2"]
    hog.attained_tokens = 1_000_000
    assert b.assign_priority(resumed, None, 0) < b.assign_priority(fresh, None, 0)
    assert b.assign_priority(hog, None, 0) > b.assign_priority(resumed, None, 0)
    assert bound_priority(100, 8) == 8


# -- invariants under random operation sequences -------------------------------------------
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["lease", "pressure", "expire", "schedule", "trim", "forget", "release"]),
        st.integers(0, 5),  # trajectory
        st.integers(0, 40),  # size / amount
        st.floats(0.0, 5.0),  # time step
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_OPS, st.sampled_from(["hint", "predicted"]), st.floats(0.05, 1.0))
def test_leases_end_once_blocks_free_once_and_the_cap_holds(
    ops: list[tuple[str, int, int, float]], retention: str, cap: float
) -> None:
    b = _core(retention=retention, max_retained_fraction=cap, max_ttl_ms=3000)
    held: dict[int, str] = {}  # block -> owner; every block is handed out once
    next_block = 0
    freed: list[int] = []
    now = 0.0
    for op, t, n, dt in ops:
        now += dt
        s = b.book.state(f"t{t}", now)
        if op == "lease":
            b.on_finished(s, now, Forecast(1.0, 2.0, 4.0))
            k = b.plan_lease(s, n, now, free_blocks=n, demand_blocks=n // 2)
            blocks = list(range(next_block, next_block + k))
            next_block += k
            held.update(dict.fromkeys(blocks, s.trajectory_id))
            if blocks:
                b.book.set_lease(s, blocks, 10**6, now)
        elif op == "pressure":
            b.pressure_release(None, now, n or None)
        elif op == "expire":
            b.book.expire(now)
        elif op == "schedule":
            b.on_waiting(s, now)
            b.on_scheduled(s)
        elif op == "trim":
            b.book.trim_lease(s, n)
        elif op == "forget":
            b.book.forget_trajectory(s)
        else:
            b.book.release_all()
        assert b.book.retained_blocks <= b.book.retained_cap
        assert b.book.retained_blocks == sum(len(x.lease.blocks) for x in b.book.leased_states())
        for x in b.book.leased_states():
            assert x.lease is not None and x.lease.deadline_s <= now + 3.0 + 1e-9
        for blocks in b.book.drain_frees():
            freed.extend(blocks)
    b.book.release_all()
    for blocks in b.book.drain_frees():
        freed.extend(blocks)
    assert sorted(freed) == sorted(held)  # every leased block is given back exactly once
    c = b.counters
    ended = (
        c.leases_reused + c.leases_expired + c.leases_pressure_released + c.leases_released
    ) + c.leases_replaced
    assert ended == c.leases_created  # every lease ended exactly once


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 200), st.floats(0.0, 3.0)), min_size=1, max_size=30),
    st.floats(0.5, 20.0),
    st.floats(0.0, 10.0),
)
def test_a_held_turn_waits_at_most_the_hold_limit(
    needs: list[tuple[int, float]], aging_s: float, turn_s: float
) -> None:
    """The limit is ``aging_s``, or ``aging_turns`` mean turn times on a slow engine."""
    b = _core(aging_s=aging_s, reserve_fraction=0.0)
    b.turn_s = turn_s
    aging_s = max(aging_s, b.settings.aging_turns * turn_s)
    assert b.hold_limit_s() == aging_s
    now = 0.0
    states = []
    for i, (need, _) in enumerate(needs):
        s = b.book.state(f"w{i}", now)
        b.on_waiting(s, now)
        states.append((s, need))
    for _, dt in needs:
        now += dt
        held = b.plan_admission(states, now, free_blocks=10, num_running=2)
        for s, _ in states:
            assert s.trajectory_id not in held or now - (s.waiting_since_s or 0.0) < aging_s
    held = b.plan_admission(states, aging_s + 1e-6, free_blocks=0, num_running=2)
    assert held == set()

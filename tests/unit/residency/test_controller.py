"""The residency controller's lifecycle moments over the simulator's pool (pure)."""

from __future__ import annotations

from agentkv.residency import Forecast, PolicyCore, PolicySettings
from agentkv.residency._controller import ResidencyController
from agentkv.residency._strategies import FinishIntent
from agentkv.sim._blockport import SimBlockPort, hash_of
from agentkv.sim._pool_lru import LRUBlockPool


def _ctl(**kw: object) -> tuple[ResidencyController[int], LRUBlockPool]:
    pool = LRUBlockPool(20)
    core: PolicyCore[int] = PolicyCore(PolicySettings(**kw), 20)  # type: ignore[arg-type]
    return ResidencyController(core, SimBlockPort(pool)), pool


def _compute(pool: LRUBlockPool, keys: list[int]) -> list[int]:
    blocks = pool.allocate(len(keys))
    assert blocks is not None
    pool.assign_keys(blocks, keys)
    return blocks


def test_a_retain_after_the_blocks_left_is_counted_late_and_leases_what_is_left() -> None:
    ctl, pool = _ctl(retention="hint")
    keys = [1, 2, 3, 4]
    ctl.on_arrive("t", 0.0, turn=0, request_id="r0")
    blocks = _compute(pool, keys)
    ctl.on_admitted("t", 0.0)
    what = ctl.on_finish("t", FinishIntent(), 1.0, hashes=[hash_of(k) for k in keys],
                         computed_from=0, request_id="r0")  # fmt: skip
    pool.free_blocks(blocks[::-1])
    assert what == "none" and ctl.book.get("t").lease is None  # type: ignore[union-attr]
    assert pool.allocate(18) is not None  # other work evicts the deepest two blocks
    st = ctl.book.get("t")
    assert st is not None
    assert ctl.retain(st, 5_000, 2.0) is None  # accepted: the prefix still cached is leased
    assert st.lease is not None and len(st.lease.blocks) == 2
    assert ctl.counters.hints_late == 1 and ctl.counters.hint_late_blocks == 2


def test_a_retain_in_time_is_not_late() -> None:
    ctl, pool = _ctl(retention="hint")
    keys = [1, 2, 3]
    ctl.on_arrive("t", 0.0, turn=0, request_id="r0")
    blocks = _compute(pool, keys)
    ctl.on_finish("t", FinishIntent("retain", 5_000, Forecast(1, 2, 4)), 1.0,
                  hashes=[hash_of(k) for k in keys], computed_from=0, request_id="r0")  # fmt: skip
    pool.free_blocks(blocks[::-1])
    st = ctl.book.get("t")
    assert st is not None and st.lease is not None and len(st.lease.blocks) == 3
    assert ctl.counters.hints_late == 0


def _leased(ctl: ResidencyController[int], pool: LRUBlockPool, ttl_ms: int) -> None:
    keys = [1, 2, 3]
    ctl.on_arrive("t", 0.0, turn=0, request_id="r0")
    blocks = _compute(pool, keys)
    ctl.on_admitted("t", 0.0)
    ctl.on_finish("t", FinishIntent("retain", ttl_ms, Forecast(1, 2, 4)), 1.0,
                  hashes=[hash_of(k) for k in keys], computed_from=0, request_id="r0")  # fmt: skip
    pool.free_blocks(blocks[::-1])


def test_a_lease_whose_turn_waits_in_the_queue_does_not_expire_and_is_reused() -> None:
    """The trajectory came back within its TTL and its turn waits for admission (a full
    engine, a held turn): the queue's wait is not the pause the TTL bounds, so the lease
    outlives its deadline until the turn is admitted and reuses it."""
    ctl, pool = _ctl(retention="hint")
    _leased(ctl, pool, 2_000)  # deadline 3.0 s
    ctl.on_arrive("t", 2.5, turn=1, request_id="r1")
    assert ctl.expire(10.0) == 0
    st = ctl.book.get("t")
    assert st is not None and st.lease is not None and len(st.lease.blocks) == 3
    ctl.on_admitted("t", 10.5)
    assert ctl.counters.leases_reused == 1 and ctl.counters.leases_expired == 0


def test_a_lease_expires_once_its_waiting_turn_ends_without_running() -> None:
    """An aborted waiting request gives the lease back to its deadline; a trajectory not
    back by its deadline loses it as before."""
    ctl, pool = _ctl(retention="hint")
    _leased(ctl, pool, 2_000)
    ctl.on_arrive("t", 2.5, turn=1, request_id="r1")
    ctl.on_finish("t", FinishIntent(), 4.0, hashes=[hash_of(k) for k in (1, 2, 3)],
                  computed_from=3, leasable=False, request_id="r1")  # fmt: skip
    assert ctl.expire(4.1) == 1 and ctl.counters.leases_expired == 1
    ctl2, pool2 = _ctl(retention="hint")
    _leased(ctl2, pool2, 2_000)
    assert ctl2.expire(3.5) == 1  # never came back: expires at its deadline

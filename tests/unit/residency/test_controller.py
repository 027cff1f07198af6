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

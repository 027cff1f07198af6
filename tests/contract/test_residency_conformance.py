"""Conformance: one lifecycle script through the residency controller over vLLM's real
``BlockPool`` and over the simulator's pool; state, counters and cache must be equal.

The plugin and the simulator drive the same :class:`ResidencyController`; what differs is
only the block-pool adapter behind it (:class:`VllmBlockPort`, :class:`SimBlockPort`).
This script exercises every lifecycle moment — arrivals, admission, finishes with advice,
tool-start forecasts, a retain, pressure (a trim and a whole lease), release of a shared
prefix, a trajectory's end, expiry, admission planning — with two tenants, and after
every step compares each trajectory's state, the counters, the free-block count and
which blocks are still cached. Marked ``server``: it imports vLLM (and torch).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv.residency import Forecast, PolicyCore, PolicySettings
from agentkv.residency._controller import ResidencyController
from agentkv.residency._strategies import FinishIntent
from agentkv.sim._blockport import SimBlockPort, hash_of, key_of
from agentkv.sim._pool_lru import LRUBlockPool
from tests.support.requires import require_vllm

pytestmark = pytest.mark.server

BLOCK = 16
NUM_BLOCKS = 40


class _SimEngine:
    """Requests on the simulator's LRU pool."""

    def __init__(self) -> None:
        self.pool = LRUBlockPool(NUM_BLOCKS)
        self.port = SimBlockPort(self.pool)
        self.held: dict[str, list[int]] = {}

    def hits(self, keys: list[int]) -> list[int]:
        return self.pool.lookup(keys, len(keys))

    def run(self, rid: str, keys: list[int], hit: list[int]) -> None:
        self.pool.take(hit)
        new = self.pool.allocate(len(keys) - len(hit))
        assert new is not None
        self.pool.assign_keys(new, keys[len(hit) :])
        self.held[rid] = hit + new

    def free(self, rid: str) -> None:
        self.pool.free_blocks(self.held.pop(rid)[::-1])

    def cached(self) -> set[int]:
        return set(self.pool.cached)


class _VllmEngine:
    """Requests on vLLM's own BlockPool (one KV-cache group, a null block)."""

    def __init__(self) -> None:
        from vllm.v1.core.block_pool import BlockPool

        from agentkv.vllm._blockport import VllmBlockPort

        self.pool = BlockPool(NUM_BLOCKS + 1, True, BLOCK)
        self.port = VllmBlockPort(self.pool, [0])
        self.held: dict[str, list[Any]] = {}
        self.keys: set[int] = set()

    def hits(self, keys: list[int]) -> list[Any]:
        return self.port.cached_prefix([hash_of(k) for k in keys])

    def run(self, rid: str, keys: list[int], hit: list[Any]) -> None:
        self.pool.touch(hit)
        blocks = hit + self.pool.get_new_blocks(len(keys) - len(hit))
        request = SimpleNamespace(block_hashes=[hash_of(k) for k in keys], request_id=rid)
        self.pool.cache_full_blocks(request, blocks, len(hit), len(keys), BLOCK, 0)
        self.held[rid] = blocks
        self.keys.update(keys)

    def free(self, rid: str) -> None:
        self.pool.free_blocks(reversed(self.held.pop(rid)))

    def cached(self) -> set[int]:
        return {k for k in self.keys if self.port.is_cached(hash_of(k))}


class _Harness:
    """One engine, one controller, the driver's part of each lifecycle moment."""

    def __init__(self, engine: Any, settings: PolicySettings) -> None:
        self.engine = engine
        core: PolicyCore[Any] = PolicyCore(settings, NUM_BLOCKS)
        self.ctl: ResidencyController[Any] = ResidencyController(core, engine.port)
        self.hit: dict[str, int] = {}

    def arrive(self, traj: str, rid: str, now: float, turn: int, tenant: str = "") -> None:
        self.ctl.on_arrive(traj, now, tenant=tenant, turn=turn, request_id=rid)

    def admit(self, traj: str, rid: str, keys: list[int], now: float) -> None:
        """Admit the request as an engine does: the pressure override first, then blocks."""
        hit = self.engine.hits(keys)
        need = len(keys) - len(hit)
        port = self.ctl.port
        while port.num_free() - self._free_among(hit) < need:
            short = need - (port.num_free() - self._free_among(hit))
            assert self.ctl.give_way(traj, short, now), "the override ran out of leases"
            hit = self.engine.hits(keys)  # a trim may have cut the cached prefix
            need = len(keys) - len(hit)
        self.engine.run(rid, keys, hit)
        self.hit[rid] = len(hit)
        self.ctl.on_admitted(traj, now)

    def _free_among(self, blocks: list[Any]) -> int:
        ref = getattr(self.engine.pool, "refcount", None)
        if ref is not None:
            return sum(1 for b in blocks if ref(b) == 0)
        return sum(1 for b in blocks if b.ref_cnt == 0)

    def finish(
        self, traj: str, rid: str, keys: list[int], intent: FinishIntent, now: float, tenant: str = ""
    ) -> None:
        what = self.ctl.on_finish(
            traj,
            intent,
            now,
            hashes=[hash_of(k) for k in keys],
            computed_from=self.hit.pop(rid),
            tenant=tenant,
            request_id=rid,
        )
        self.engine.free(rid)
        self.ctl.after_free(traj, what)

    def turn(
        self, traj: str, rid: str, keys: list[int], intent: FinishIntent, now: float, **kw: Any
    ) -> None:
        self.arrive(traj, rid, now, kw.pop("turn", 0), kw.get("tenant", ""))
        self.admit(traj, rid, keys, now + 0.01)
        self.finish(traj, rid, keys, intent, now + 0.5, **kw)

    def snapshot(self) -> dict[str, Any]:
        book = self.ctl.book
        trajs = {}
        for st in book.iter_states():
            lease = st.lease
            trajs[st.trajectory_id] = (
                st.tenant,
                None if lease is None else (len(lease.blocks), lease.deadline_s),
                st.last_outcome,
                [key_of(h) for h in st.hashes],
                st.own_from,
                st.closed,
                st.pending_deadline_s,
                st.forecast,
                st.paused_at_s,
                st.held,
                st.running,
                st.context_blocks,
                dict(st.live_requests),
            )
        return {
            "trajectories": trajs,
            "counters": dict(vars(self.ctl.counters)),
            "retained": book.retained_blocks,
            "free": self.ctl.port.num_free(),
            "cached": sorted(self.engine.cached()),
        }


def _fc(p50: float) -> Forecast:
    return Forecast(p50, 2 * p50, 4 * p50)


def _script(h: _Harness, check: Callable[[str], None]) -> None:
    sys_prefix = [1, 2, 3]
    a = [*sys_prefix, 10, 11, 12, 13]
    b = [*sys_prefix, 20, 21, 22, 23, 24]
    c = [30, 31, 32, 33, 34, 35]
    retain = FinishIntent("retain", 30_000, _fc(2.0))
    h.turn("A", "a0", a, retain, 0.0, tenant="t1")
    check("A's first turn leaves a lease")
    h.turn("B", "b0", b, FinishIntent("retain", 20_000, _fc(8.0)), 1.0, tenant="t1")
    h.turn("C", "c0", c, FinishIntent("retain", 10_000, _fc(30.0)), 2.0, tenant="t2")
    check("three paused contexts, two tenants")

    st_b = h.ctl.book.get("B")
    assert st_b is not None
    h.ctl.on_tool_start(st_b, _fc(0.5), 3.0)
    check("a tool-start forecast for B")

    a1 = [*a, 14, 15, 16]
    h.arrive("A", "a1", 4.0, 1, "t1")
    held = h.ctl.plan_admission([(h.ctl.book.state("A", 4.0), 3)], 4.0, free_blocks=h.ctl.port.num_free(), num_running=0)
    assert held == set()
    h.admit("A", "a1", a1, 4.01)
    check("A's next turn takes its lease over")

    big = list(range(100, 122))  # more than the free pool: leases give way
    h.arrive("D", "d0", 4.1, 0, "t2")
    h.admit("D", "d0", big, 4.1)
    check("pressure: leases give way for D")
    h.finish("D", "d0", big, FinishIntent("release"), 4.6, tenant="t2")
    check("D released at once")
    h.finish("A", "a1", a1, FinishIntent("retain", 30_000, _fc(1.0)), 4.8, tenant="t1")
    check("A pauses again")

    st_c = h.ctl.book.get("C")
    assert st_c is not None
    h.ctl.retain(st_c, 5_000, 5.0)
    check("an out-of-band retain for C")
    st_a = h.ctl.book.get("A")
    assert st_a is not None
    h.ctl.on_advice(st_a, FinishIntent("release", reason="terminal_state"), 5.2)
    check("A released: only its own blocks are demoted, not the shared prefix B computed")

    h.arrive("B", "b1", 5.5, 1, "t1")
    h.ctl.on_end(h.ctl.book.state("B", 5.5))
    check("B ends while a turn of it waits")
    h.admit("B", "b1", [*b, 25], 5.6)
    h.finish("B", "b1", [*b, 25], retain, 6.0, tenant="t1")
    check("the late turn of B gets no lease")

    h.ctl.expire(1000.0)
    check("every lease expired")


@pytest.mark.parametrize("retention", ["hint", "predicted"])
def test_the_plugin_and_the_simulator_adapters_behave_alike(retention: str) -> None:
    require_vllm()
    settings = PolicySettings(retention=retention, reserve_fraction=0.0)  # type: ignore[arg-type]
    sim, real = _Harness(_SimEngine(), settings), _Harness(_VllmEngine(), settings)
    # the script on each, then compared step by step
    snapshots: dict[str, list[tuple[str, dict[str, Any]]]] = {"sim": [], "vllm": []}
    for name, h in (("sim", sim), ("vllm", real)):
        _script(h, lambda label, h=h, name=name: snapshots[name].append((label, h.snapshot())))
    assert len(snapshots["sim"]) == len(snapshots["vllm"]) > 10
    for (label, want), (_, got) in zip(snapshots["sim"], snapshots["vllm"], strict=True):
        assert got == want, label
    last = snapshots["sim"][-1][1]
    counters = last["counters"]
    # the script reached every moment it means to check
    assert counters["leases_created"] >= 4 and counters["leases_reused"] >= 1
    assert counters["leases_trimmed"] + counters["leases_pressure_released"] >= 1
    assert counters["leases_refused"] >= 1 and counters["forecasts_updated"] >= 1
    assert counters["blocks_demoted"] >= 1
    assert last["retained"] == 0
    after_release = dict(snapshots["sim"])["A released: only its own blocks are demoted, not the shared prefix B computed"]
    assert {1, 2, 3} <= set(after_release["cached"])

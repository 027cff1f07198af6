"""The plugin inside vLLM's real Scheduler and AsyncScheduler, stepped with no model.

The engine core is replaced by a loop that samples one token per scheduled request (none
for a non-final chunk of a prompt), so the scheduler's own queues, block pool, prefix
cache and preemption run as in a server.
It checks that the policy core's decisions land where vLLM looks: leases keep a paused
context cached, a turn that does not fit beside the leases is held back (and stays a
waiting request), and it is admitted once the engine would otherwise be idle.
Each test runs over both scheduler classes (``tests/support/offline_scheduler.py``).
Marked ``server``: it imports vLLM and torch (about a minute on two cores).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.offline_scheduler import (
    Stepper,
    block_hasher,
    hinted_request,
    make_plugin_scheduler,
)
from tests.support.requires import require_vllm

pytestmark = pytest.mark.server

BLOCK = 16
NUM_BLOCKS = 61


def _make_scheduler(base: str, groups: int = 1) -> Any:
    # max_model_len: what the pool holds (60 usable blocks), so that the longest prompt
    # here (40 blocks) is one the engine would accept.
    return make_plugin_scheduler(
        base,
        block_size=BLOCK,
        num_blocks=NUM_BLOCKS,
        groups=groups,
        max_model_len=(NUM_BLOCKS - 1) * BLOCK,
    )


@pytest.fixture
def scheduler(monkeypatch_module: pytest.MonkeyPatch, scheduler_base_name: str) -> Iterator[Any]:
    """A fresh plugin scheduler per test: the leases one test leaves behind fill the
    retained cap and would decide what the next one is granted."""
    require_vllm()
    for key, value in {
        "RETENTION": "predicted",
        "ADMISSION": "1",
        "RESERVE_FRACTION": "0",
        "MAX_RETAINED_FRACTION": "0.9",
    }.items():
        monkeypatch_module.setenv(f"AGENTKV_SCHED_{key}", value)
    yield _make_scheduler(scheduler_base_name)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


class _Driver:
    """Adds requests with agentkv hints and steps the scheduler with fake samples."""

    def __init__(self, scheduler: Any) -> None:
        self.s = scheduler
        self.hasher = block_hasher(BLOCK)
        self.stepper = Stepper(scheduler)

    def add(self, rid: str, traj: str, tokens: list[int], out: int = 4, **extra: str | int) -> None:
        hint: dict[str, Any] = {
            "agentkv_trajectoryId": traj, "agentkv_action": "retain", "agentkv_ttlMs": 2000
        }  # fmt: skip
        hint.update(extra)
        self.s.add_request(hinted_request(rid, tokens, hint, self.hasher, out=out))

    def step(self) -> Any:
        return self.stepper.step()

    def drain(self) -> None:
        self.stepper.drain(1000)


def test_leases_keep_paused_contexts_and_admission_holds_what_does_not_fit(scheduler: Any) -> None:
    d = _Driver(scheduler)
    core = scheduler.agentkv.ctl.book
    a, b = list(range(100, 260)), list(range(300, 460))  # 10 blocks each
    d.add("a1", "A", a)
    d.add("b1", "B", b)
    d.drain()
    assert core.leases_active == 2 and core.retained_blocks == 20
    d.add("a2", "A", [*a, 7, 7, 7, *range(600, 640)])
    d.drain()
    assert core.counters.leases_reused == 1  # A's next turn took its lease over

    # C and D decode for a while; E (40 blocks) does not fit beside the leases.
    d.add("c1", "C", list(range(700, 740)), out=60)
    d.add("d1", "D", list(range(800, 840)), out=60)
    d.step()
    d.step()
    d.add("e1", "E", list(range(900, 1540)), out=2)
    held_steps = 0
    while not any(r.req_id == "e1" for r in d.step().scheduled_new_reqs):
        held_steps += 1
        assert scheduler.has_requests()
        assert "e1" in [r.request_id for r in scheduler.waiting]
        assert held_steps < 300
    assert held_steps > 10 and core.counters.turns_held == 1
    assert len(scheduler.running) <= 2  # admitted once fewer than two calls ran
    d.drain()
    assert scheduler.agentkv.internal_errors == 0
    assert core.retained_blocks <= core.retained_cap


def _key(scheduler: Any, trajectory_id: str) -> str:
    """The book's key of an unsalted request's trajectory (keys are tenant-scoped)."""
    return str(scheduler.agentkv.scoper.key(None, trajectory_id))


def test_the_gap_forecast_ranks_paused_contexts_and_a_tool_started_event_refines_it(
    scheduler: Any,
) -> None:
    import json

    d = _Driver(scheduler)
    core = scheduler.agentkv.ctl.book
    d.add("f1", "F", list(range(2000, 2064)), agentkv_predictedGapMs=1500, agentkv_predictedGapP90Ms=4000)
    # A release advised under pressure is the client's guess: predicted retention ranks.
    d.add("g1", "G", list(range(2100, 2164)), agentkv_action="release",
          agentkv_reason="capacity_pressure", agentkv_predictedGapMs=90_000)  # fmt: skip
    d.drain()
    f, g = core.get(_key(scheduler, "F")), core.get(_key(scheduler, "G"))
    assert f.forecast.p50_s == 1.5 and f.forecast.p90_s == 4.0 and f.lease is not None
    assert g.forecast.p50_s == 90.0 and g.lease is not None
    ev = {"trajectory_id": "F", "event": "tool_started", "emitted_at_ms": None,
          "action": "retain", "ttl_ms": 5000, "gap_ms": 30_000.0, "gap_p90_ms": 60_000.0}  # fmt: skip
    deadline = f.lease.deadline_s
    answer = json.loads(scheduler.agentkv_handle(json.dumps({"op": "events", "events": [ev]})))
    assert answer["accepted"] == 1
    assert (f.forecast.p50_s, f.forecast.p90_s) == (30.0, 60.0)
    assert f.lease.deadline_s == deadline  # the forecast ranks; the lease's length stays
    assert core.counters.forecasts_updated == 1
    assert scheduler.agentkv.internal_errors == 0


def test_two_kv_cache_groups_are_counted_per_group_and_the_prefix_walk_is_cached(
    scheduler: Any,  # sets the environment (predicted retention, admission)
    scheduler_base_name: str,
) -> None:
    two = _make_scheduler(scheduler_base_name, groups=2)
    d = _Driver(two)
    core = two.agentkv.ctl.book
    a = list(range(3000, 3160))  # 10 blocks
    d.add("h1", "H", a)
    d.drain()
    st = core.get(_key(two, "H"))
    assert len(st.hashes) == 10
    assert core.retained_blocks == 20  # each block hash holds one block in each group
    assert st.context_blocks == 20
    d.add("h2", "H", [*a, *range(4000, 4048)])  # 3 more blocks, in two groups
    req = next(r for r in two.waiting if r.request_id == "h2")
    full = two.agentkv.port.cached_count(list(req.block_hashes))
    total = -(-req.num_tokens // BLOCK)
    assert two.agentkv.admission.need_blocks(req) == 2 * (total - full)
    assert two.agentkv.admission.hits["h2"] == full  # remembered, then revalidated
    assert two.agentkv.admission.prefix_hits(req) == full
    d.drain()
    assert two.agentkv.internal_errors == 0


def test_pressure_gives_up_only_the_blocks_an_allocation_lacks(
    scheduler: Any,  # sets the environment (predicted retention)
    scheduler_base_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn that does not fit beside three leases (30 of 60 blocks) lacks 2 blocks: the
    override trims one lease by 2 and keeps the rest. Giving up the allocation's size
    (its 32 blocks, then retry) ended a whole lease for those 2 blocks."""
    monkeypatch.setenv("AGENTKV_SCHED_ADMISSION", "0")  # no holding back: vLLM allocates
    s = _make_scheduler(scheduler_base_name)
    d = _Driver(s)
    core = s.agentkv.ctl.book
    for i, traj in enumerate("PQR"):
        d.add(f"{traj}1", traj, list(range(5000 + 200 * i, 5160 + 200 * i)), out=1)
    d.drain()
    assert core.leases_active == 3 and core.retained_blocks == 30
    trimmed, released = core.counters.leases_trimmed, core.counters.leases_pressure_released
    d.add("x1", "X", list(range(6000, 6500)), out=4)  # 32 uncached blocks, 30 free
    assert any(r.req_id == "x1" for r in d.step().scheduled_new_reqs)
    assert core.counters.leases_trimmed == trimmed + 1
    assert core.counters.leases_pressure_released == released
    assert core.leases_active == 3 and core.retained_blocks == 28
    d.drain()
    assert s.agentkv.internal_errors == 0


def test_vllm_reports_blocks_held_only_by_leases_as_free(scheduler: Any) -> None:
    """vLLM's own kv_cache_usage (what /metrics and routers read) leaves out leased blocks
    no request holds: a router would otherwise see a pool full of leases and hold back the
    requests whose allocations would make them give way."""
    d = _Driver(scheduler)
    book = scheduler.agentkv.ctl.book
    d.add("u1", "U", list(range(8000, 8160)))  # 10 blocks, leased when it finishes
    d.drain()
    assert book.retained_blocks == 10
    pool = scheduler.kv_cache_manager.block_pool
    raw = 1.0 - pool.get_num_free_blocks() / (pool.num_gpu_blocks - 1)
    assert raw == pytest.approx(10 / 60)
    scheduler.agentkv.usage(fresh=True)  # walk now, not at the next refresh
    assert scheduler.kv_cache_manager.usage == pytest.approx(0.0)
    assert scheduler.get_kv_cache_usage() == pytest.approx(0.0)  # the engine core reports this
    d.add("u2", "V", list(range(9000, 9080)), out=50)  # 5 blocks a running request holds
    d.step()
    scheduler.agentkv.usage(fresh=True)
    assert scheduler.kv_cache_manager.usage == pytest.approx(5 / 60, abs=1 / 60)
    assert scheduler.agentkv.internal_errors == 0

"""Issue 13 inside vLLM's real Scheduler and AsyncScheduler (priority policy), no model.

The engine core is replaced by a loop that samples one token per scheduled request (none
for a non-final chunk of a prompt), so the real block pool, prefix cache, free queue and
waiting heap decide what happens.
Checked here: tenants' trajectories with one id stay apart (finding 2), release demotes
only blocks the trajectory computed (3), aging stays inside the request's own tier (5),
aborted requests and late turns get no lease (7). Each test runs over both scheduler
classes (``tests/support/offline_scheduler.py``). Marked ``server``: it imports vLLM.
"""

from __future__ import annotations

import json
import time
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


@pytest.fixture(scope="module")
def scheduler(monkeypatch_module: pytest.MonkeyPatch, scheduler_base_name: str) -> Iterator[Any]:
    require_vllm()
    monkeypatch_module.setenv("AGENTKV_SCHED_AGING_S", "0.2")
    yield make_plugin_scheduler(
        scheduler_base_name,
        block_size=BLOCK,
        num_blocks=NUM_BLOCKS,
        max_num_seqs=1,  # one at a time: the waiting heap's order is what runs next
        policy="priority",
    )


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


class _Driver:
    def __init__(self, scheduler: Any) -> None:
        self.s = scheduler
        self.hasher = block_hasher(BLOCK)
        self.stepper = Stepper(scheduler)
        self.order = self.stepper.admitted

    def add(
        self,
        rid: str,
        tokens: list[int],
        hint: dict[str, Any] | None = None,
        *,
        salt: str | None = None,
        priority: int = 0,
        out: int = 2,
    ) -> None:
        self.s.add_request(
            hinted_request(rid, tokens, hint, self.hasher, out=out, salt=salt, priority=priority)
        )

    def step(self) -> Any:
        return self.stepper.step()

    def drain(self) -> None:
        self.stepper.drain(2000)

    def query(self, traj: str, salt: str | None = None) -> dict[str, Any]:
        op = {"op": "trajectory", "trajectory_id": traj, "cache_salt": salt}
        return dict(json.loads(self.s.agentkv_handle(json.dumps(op))))

    def event(self, traj: str, kind: str, salt: str | None = None, **extra: Any) -> Any:
        ev = {"trajectory_id": traj, "event": kind, "cache_salt": salt, **extra}
        return json.loads(self.s.agentkv_handle(json.dumps({"op": "events", "events": [ev]})))

    def cached(self, tokens: list[int], salt: str | None = None) -> list[Any]:
        """The blocks still cached for the longest prefix of ``tokens``."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        probe = Request("probe", tokens, SamplingParams(max_tokens=1), None, cache_salt=salt,
                        block_hasher=self.hasher)  # fmt: skip
        pool = self.s.kv_cache_manager.block_pool
        out: list[Any] = []
        for h in probe.block_hashes:
            got = pool.get_cached_block(h, [0])
            if not got:
                break
            out.extend(got)
        return out


def _retain(traj: str, **extra: Any) -> dict[str, Any]:
    return {"agentkv_trajectoryId": traj, "agentkv_action": "retain", "agentkv_ttlMs": 60_000, **extra}


def test_finding2_one_id_in_two_tenants_is_two_trajectories(scheduler: Any) -> None:
    d = _Driver(scheduler)
    d.add("t2-a", list(range(100, 164)), _retain("1"), salt="tenant-a")
    d.drain()
    assert d.query("1", "tenant-a")["leased_blocks"] == 4
    assert d.query("1", "tenant-b")["error"]  # B cannot read A's "1"
    assert d.event("1", "trajectory_finished", "tenant-b")["accepted"] == 0
    assert d.query("1", "tenant-a")["leased_blocks"] == 4  # nor release it
    d.add("t2-b", list(range(200, 232)), _retain("1"), salt="tenant-b")
    d.drain()
    assert d.query("1", "tenant-a")["leased_blocks"] == 4  # nor overwrite it
    assert d.query("1", "tenant-b")["leased_blocks"] == 2
    for salt in ("tenant-a", "tenant-b"):
        assert d.event("1", "trajectory_finished", salt)["accepted"] == 1


def test_finding3_release_keeps_blocks_it_only_hit_in_the_cache(scheduler: Any) -> None:
    d = _Driver(scheduler)
    popular = list(range(1000, 1160))  # ten blocks an unhinted user computed
    d.add("t3-victim", popular)
    d.drain()
    demoted = scheduler.agentkv.ctl.counters.blocks_demoted
    d.add("t3-attack", [*popular, *range(2000, 2032)], {"agentkv_trajectoryId": "flush",
                                                         "agentkv_action": "release"})  # fmt: skip
    d.drain()
    assert scheduler.agentkv.ctl.counters.blocks_demoted - demoted == 2  # its own two blocks only
    head = scheduler.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()[:2]
    popular_ids = {b.block_id for b in d.cached(popular)}
    assert len(popular_ids) == 10 and not popular_ids & {b.block_id for b in head}


def test_finding5_aging_moves_a_request_ahead_of_its_band_not_across_tiers(scheduler: Any) -> None:
    d = _Driver(scheduler)
    d.add("t5-run", list(range(3000, 3016)), out=30)  # occupies the only seat
    d.step()
    d.add("t5-batch", list(range(3100, 3116)), {"agentkv_trajectoryId": "batch"}, priority=1000)
    d.add("t5-gateway", list(range(3200, 3216)), {"agentkv_trajectoryId": "gw", "agentkv_priority": -8},
          priority=8)  # fmt: skip
    time.sleep(0.3)  # both waited past aging_s
    d.add("t5-fresh", list(range(3300, 3316)), priority=16)
    d.drain()
    assert d.order[-3:] == ["t5-gateway", "t5-fresh", "t5-batch"]
    assert 0 <= d.query("gw")["last_priority"] <= 16  # the gateway's 8, moved inside its band
    assert 992 <= d.query("batch")["last_priority"] <= 1008


def test_finding7_aborted_requests_and_late_turns_get_no_lease(scheduler: Any) -> None:
    from vllm.v1.request import RequestStatus

    d = _Driver(scheduler)
    refused = scheduler.agentkv.ctl.counters.leases_refused
    d.add("t7-abort", list(range(4000, 4064)), _retain("ab"), out=50)
    d.step()
    scheduler.finish_requests("t7-abort", RequestStatus.FINISHED_ABORTED)
    assert d.query("ab")["leased_blocks"] == 0
    d.add("t7-run", list(range(4100, 4164)), _retain("late", agentkv_turnId=0), out=20)
    d.step()
    assert d.event("late", "trajectory_cancelled")["accepted"] == 1  # while it runs
    d.drain()
    assert d.query("late")["leased_blocks"] == 0  # it finished after the cancel
    d.add("t7-late", list(range(4100, 4180)), _retain("late", agentkv_turnId=3))
    d.drain()
    assert d.query("late")["leased_blocks"] == 0 and d.query("late")["closed"]
    assert d.event("late", "tool_started", action="retain", ttl_ms=60_000)["rejected"]
    assert scheduler.agentkv.ctl.counters.leases_refused - refused == 4
    # A turn 0 after the end: a retry of the ended run, or the id's new run. A retry
    # must not reopen the tombstone (a lease would outlive the run), so neither gets a
    # lease; turn 1 following it shows a new run, and the id reopens.
    for rid in ("t7-retry", "t7-new"):
        d.add(rid, list(range(4100, 4180)), _retain("late", agentkv_turnId=0))
        d.drain()
        assert d.query("late")["leased_blocks"] == 0 and d.query("late")["closed"]
    d.add("t7-new1", list(range(4100, 4200)), _retain("late", agentkv_turnId=1))
    d.drain()
    assert d.query("late")["leased_blocks"] > 0 and not d.query("late")["closed"]
    assert scheduler.agentkv.internal_errors == 0


def test_a_client_priority_beyond_the_bound_is_clamped(scheduler: Any) -> None:
    """A request's own priority is client-set: -2**62 no longer jumps every queue. It is
    clamped to -max_client_priority (1000 by default), so a gateway's top tier that
    arrived first still runs first, and the clamp is counted."""
    d = _Driver(scheduler)
    before = d.s.agentkv.ctl.counters.priorities_clamped
    d.add("t9-run", list(range(4000, 4016)), out=30)  # occupies the only seat
    d.step()
    d.add("t9-gateway", list(range(4100, 4116)), {"agentkv_trajectoryId": "gw9"}, priority=-1000)
    d.add("t9-evil", list(range(4200, 4216)), {"agentkv_trajectoryId": "evil"}, priority=-(2**62))
    d.drain()
    assert d.order[-2:] == ["t9-gateway", "t9-evil"]
    assert d.s.agentkv.ctl.counters.priorities_clamped == before + 1


def test_the_source_the_salt_gate_sets_groups_the_tenant_for_shares(scheduler: Any) -> None:
    """The plugin reads the request's source (set by the API server's salt gate) and
    divides shares by it: two salts of one source are one source's tenants."""
    d = _Driver(scheduler)
    book, scoper = scheduler.agentkv.ctl.book, scheduler.agentkv.scoper
    for i, salt in enumerate(("sybil-1", "sybil-2")):
        d.add(f"src-{i}", list(range(5000 + 100 * i, 5032 + 100 * i)),
              _retain(f"s{i}", agentkv_source="bearer:abc"), salt=salt)  # fmt: skip
    d.add("src-v", list(range(5400, 5432)), _retain("v", agentkv_source="addr:xyz"), salt="v9")
    d.drain()
    groups = {salt: book._groups.get(scoper.tenant(salt)) for salt in ("sybil-1", "sybil-2", "v9")}
    assert groups == {"sybil-1": "src:bearer:abc", "sybil-2": "src:bearer:abc", "v9": "src:addr:xyz"}
    for salt, tid in (("sybil-1", "s0"), ("sybil-2", "s1"), ("v9", "v")):
        d.event(tid, "trajectory_finished", salt)


def test_another_tenants_parent_id_links_nothing(scheduler: Any) -> None:
    """Lineage is scoped like the trajectory: tenant B naming A's trajectory as its parent
    links nothing (A's lease is not taken for a joining parent, B's state has no parent),
    while A's own subagent naming it does, for as long as the subagent runs."""
    d = _Driver(scheduler)
    plugin = scheduler.agentkv
    book, scoper = plugin.ctl.book, plugin.scoper
    d.add("lin-boss", list(range(6000, 6064)), _retain("boss"), salt="lin-a")
    d.drain()
    boss = book.get(scoper.key("lin-a", "boss"))
    assert boss is not None and boss.lease is not None
    spy_hint = _retain("spy", agentkv_parentTrajectoryId="boss", agentkv_criticalPath=1)
    d.add("lin-spy", list(range(6100, 6132)), spy_hint, salt="lin-b", out=20)
    d.step()
    spy = book.get(scoper.key("lin-b", "spy"))
    assert spy is not None and spy.running and spy.critical_path is True
    assert spy.parent_key is None and not list(book.children(boss))
    assert not book.joining(boss) and book.lineage_level(boss) == 2
    d.drain()
    d.add("lin-sub", list(range(6200, 6232)), _retain("sub", agentkv_parentTrajectoryId="boss"),
          salt="lin-a", out=20)  # fmt: skip
    d.step()
    sub = book.get(scoper.key("lin-a", "sub"))
    assert sub is not None and sub.parent_key == boss.trajectory_id
    assert book.joining(boss) and book.lineage_level(boss) == 0
    d.drain()
    assert plugin.internal_errors == 0
    for salt, tid in (("lin-a", "boss"), ("lin-a", "sub"), ("lin-b", "spy")):
        assert d.event(tid, "trajectory_finished", salt)["accepted"] == 1

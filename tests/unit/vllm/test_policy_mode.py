"""The plugin's policy modes inside vLLM's real Scheduler and AsyncScheduler, no model.

- ``shadow`` changes nothing vLLM does: the same sequence of requests leaves the block
  pool (free queue order, block by block), the admission order and every request's
  priority exactly as stock vLLM leaves them, while ``shadow_*`` counters show the
  leases, reuses, releases and pressure give-ways the policy would have made; ``act``
  on the same sequence differs (the lease keeps the victim's context cached).
- the control operation ``mode`` switches at run time: leaving ``act`` gives every
  leased block back to vLLM, ``off`` reads no hint, and no reference leaks across
  switches.
- the request's own client-set priority is clamped in every mode (finding: -2**62 was
  accepted).

Marked ``server``: it imports vLLM.
"""

from __future__ import annotations

import json
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
NUM_BLOCKS = 41


def _scheduler(base: str, mode: str | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    require_vllm()
    if mode is not None:
        monkeypatch.setenv("AGENTKV_SCHED_MODE", mode)
    else:
        monkeypatch.delenv("AGENTKV_SCHED_MODE", raising=False)
    return make_plugin_scheduler(
        base, block_size=BLOCK, num_blocks=NUM_BLOCKS, max_num_seqs=4, policy="priority",
        plugin=mode is not None,
    )  # fmt: skip


class _Driver:
    def __init__(self, scheduler: Any) -> None:
        self.s = scheduler
        self.hasher = block_hasher(BLOCK)
        self.stepper = Stepper(scheduler)
        self.trace: list[Any] = []  # what vLLM did, step by step
        self.priorities: dict[str, int] = {}

    @property
    def pool(self) -> Any:
        return self.s.kv_cache_manager.block_pool

    def add(self, rid: str, tokens: list[int], hint: dict[str, Any] | None = None, *,
            priority: int = 0, out: int = 2, salt: str | None = "tenant") -> None:  # fmt: skip
        request = hinted_request(rid, tokens, hint, self.hasher, out=out, salt=salt,
                                 priority=priority)  # fmt: skip
        self.s.add_request(request)
        self.priorities[rid] = int(request.priority)

    def drain(self) -> None:
        for _ in range(2000):
            if not (self.s.running or self.s.waiting):
                self.stepper.flush()
                if not self.stepper.busy:
                    return
                continue
            out = self.stepper.step()
            self.trace.append(
                (
                    [r.req_id for r in out.scheduled_new_reqs],
                    [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()],
                    sorted(out.num_scheduled_tokens.items()),
                )
            )
        raise AssertionError("the scheduler did not drain")

    def residency(self) -> tuple[Any, ...]:
        """The pool as vLLM holds it: free queue order, reference counts, cached hashes."""
        blocks = self.pool.blocks
        return (
            [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()],
            [b.ref_cnt for b in blocks],
            [b.block_hash is not None for b in blocks],
        )

    def op(self, **op: Any) -> dict[str, Any]:
        return dict(json.loads(self.s.agentkv_handle(json.dumps(op))))

    def stats(self) -> dict[str, Any]:
        return self.op(op="stats")


def _retain(traj: str, **extra: Any) -> dict[str, Any]:
    return {"agentkv_trajectoryId": traj, "agentkv_action": "retain", "agentkv_ttlMs": 60_000,
            "agentkv_priority": -3, **extra}  # fmt: skip


VICTIM = list(range(1000, 1128))  # 8 blocks


def _sequence(d: _Driver) -> None:
    """A trajectory's turn with a retain, then traffic that needs the whole pool (a
    decode's allocation fails: stock vLLM preempts), then the trajectory's next turn."""
    d.add("victim-0", VICTIM, _retain("v"))
    d.drain()
    d.add("filler-a", list(range(2000, 2288)), out=64)  # 18 blocks each, growing by 4:
    d.add("filler-b", list(range(3000, 3288)), out=64)  # a decode's allocation fails
    d.drain()
    d.add("victim-1", VICTIM + list(range(5000, 5032)), _retain("v", agentkv_turnId=1))
    d.add("other", list(range(6000, 6016)), {"agentkv_trajectoryId": "o"}, priority=-(2**62))
    d.drain()
    if hasattr(d.s, "agentkv_handle"):  # stock vLLM has no control route
        d.op(op="events", events=[{"trajectory_id": "v", "event": "trajectory_finished",
                                   "cache_salt": "tenant"}])  # fmt: skip


def test_shadow_mode_leaves_vllm_exactly_as_stock_while_counting_what_it_would_do(
    scheduler_base_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {}
    for mode in (None, "shadow", "act"):
        d = _Driver(_scheduler(scheduler_base_name, mode, monkeypatch))
        _sequence(d)
        runs[mode] = d
    stock, shadow, act = runs[None], runs["shadow"], runs["act"]
    assert shadow.trace == stock.trace  # admission order, free queue, tokens: every step
    assert shadow.residency() == stock.residency()
    assert shadow.priorities == {**stock.priorities, "other": -1000}  # only the clamp
    assert act.trace != stock.trace  # the same sequence under act: the lease kept blocks
    s = shadow.stats()
    assert s["policy_mode"] == "shadow" and s["internal_errors"] == 0
    assert s["shadow_leases_created"] >= 1  # leases it would take
    assert s["shadow_leases_pressure_released"] + s["shadow_leases_trimmed"] >= 1  # override
    assert s["shadow_leases_released"] >= 1 and s["shadow_blocks_demoted"] >= 1  # release
    assert s["shadow_hints_received"] == 3 and s["shadow_priority_boosts"] >= 1
    assert s["leases_created"] == 0 and s["leases_active"] == 0 == s["retained_blocks"]
    assert s["hints_received"] == 0 and s["priorities_clamped"] == 1
    a = act.stats()
    assert a["leases_created"] >= 1 and a["shadow_leases_created"] == 0


def test_the_mode_switch_gives_leased_blocks_back_and_leaks_no_reference(
    scheduler_base_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _Driver(_scheduler(scheduler_base_name, "act", monkeypatch))
    free_all = d.pool.get_num_free_blocks()
    d.add("v0", VICTIM, _retain("v"))
    d.drain()
    leased = d.op(op="trajectory", trajectory_id="v", cache_salt="tenant")["leased_blocks"]
    assert leased == 8 and d.pool.get_num_free_blocks() == free_all - 8
    assert d.op(op="mode", mode="off") == {"mode": "off", "previous": "act", "mode_switches": 1}
    assert d.pool.get_num_free_blocks() == free_all  # the lease gave its blocks back
    assert d.op(op="trajectory", trajectory_id="v", cache_salt="tenant")["status"] == 404
    before = d.stats()["hints_received"]
    d.add("v1", VICTIM, _retain("v", agentkv_turnId=1))
    d.drain()
    assert d.stats()["hints_received"] == before  # off reads no hint
    assert d.pool.get_num_free_blocks() == free_all
    assert d.op(op="mode", mode="shadow")["previous"] == "off"
    d.add("v2", VICTIM, _retain("v", agentkv_turnId=2))
    d.drain()
    assert d.stats()["shadow_leases_active"] == 1
    assert d.pool.get_num_free_blocks() == free_all  # a shadow lease holds nothing
    d.op(op="mode", mode="act")  # the shadow lease ends without dropping a reference
    assert all(b.ref_cnt >= 0 for b in d.pool.blocks)
    assert d.pool.get_num_free_blocks() == free_all
    d.add("v3", VICTIM, _retain("v", agentkv_turnId=3))
    d.drain()
    assert d.op(op="trajectory", trajectory_id="v", cache_salt="tenant")["leased_blocks"] == 8
    s = d.stats()
    assert s["mode_switches"] == 3 and s["policy_mode"] == "act" and s["internal_errors"] == 0
    assert d.op(op="mode", mode="sideways")["status"] == 400
    caps = d.op(op="capabilities")
    assert caps["policy_mode"] == "act" and caps["features"]["policy_modes"] == [
        "act", "shadow", "off"
    ]  # fmt: skip


def test_a_client_priority_is_clamped_in_every_mode(
    scheduler_base_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding: the request's own priority is client-set; -2**62 was accepted and jumped
    every queue. It is clamped into +-max_client_priority whatever the policy mode."""
    monkeypatch.setenv("AGENTKV_SCHED_MAX_CLIENT_PRIORITY", "50")
    for mode in ("act", "shadow", "off"):
        d = _Driver(_scheduler(scheduler_base_name, mode, monkeypatch))
        d.add("evil", [1, 2, 3], priority=-(2**62))
        d.add("low", [4, 5, 6], priority=2**40)
        assert (d.priorities["evil"], d.priorities["low"]) == (-50, 50)
        assert d.stats()["priorities_clamped"] == 2

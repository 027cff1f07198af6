"""Per-hint outcomes inside vLLM's real Scheduler and AsyncScheduler, no model: the
plugin records each hint's verdict when the request arrives and its result when the
turn's lease is taken up, given up or runs out, per tenant scope; the control
operations answer them (``outcomes``, and with each events post). Marked ``server``: it
imports vLLM."""

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


@pytest.fixture(scope="module")
def scheduler(scheduler_base_name: str) -> Iterator[Any]:
    require_vllm()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTKV_SCHED_RETENTION", "hint")
        yield make_plugin_scheduler(scheduler_base_name, block_size=BLOCK, num_blocks=61)


class _Driver:
    def __init__(self, scheduler: Any) -> None:
        self.s = scheduler
        self.hasher = block_hasher(BLOCK)
        self.stepper = Stepper(scheduler)

    def run(self, rid: str, tokens: list[int], hint: dict[str, Any], salt: str | None) -> None:
        self.s.add_request(hinted_request(rid, tokens, hint, self.hasher, salt=salt))
        self.stepper.drain(2000)

    def op(self, **op: Any) -> dict[str, Any]:
        return dict(json.loads(self.s.agentkv_handle(json.dumps(op))))

    def outcomes(self, traj: str, salt: str | None) -> list[dict[str, Any]]:
        answer = self.op(op="outcomes", trajectory_id=traj, cache_salt=salt)
        return list(answer.get("turns", []))


def _hint(traj: str, turn: int, action: str = "retain", **extra: Any) -> dict[str, Any]:
    return {"agentkv_trajectoryId": traj, "agentkv_turnId": turn, "agentkv_action": action,
            "agentkv_ttlMs": 60_000, **extra}  # fmt: skip


def _phases(turns: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(t["turnId"], t["verdict"], t["result"]) for t in turns]


def test_a_retained_turn_is_accepted_then_applied_when_the_next_turn_reuses_it(
    scheduler: Any,
) -> None:
    d = _Driver(scheduler)
    prompt = list(range(100, 164))
    d.run("o1-0", prompt, _hint("job", 0), "tenant-a")
    assert _phases(d.outcomes("job", "tenant-a")) == [(0, "accepted", None)]  # leased, waiting
    assert d.outcomes("job", "tenant-b") == []  # another scope sees nothing
    assert d.op(op="outcomes", trajectory_id="job", cache_salt="tenant-b")["status"] == 404
    d.run("o1-1", [*prompt, *range(300, 316)], _hint("job", 1), "tenant-a")
    turns = d.outcomes("job", "tenant-a")
    assert _phases(turns) == [(0, "accepted", "applied"), (1, "accepted", None)]
    assert "reused" in turns[0]["resultReason"]
    ev = {"trajectory_id": "job", "event": "trajectory_finished", "cache_salt": "tenant-a"}
    answer = d.op(op="events", events=[ev])
    (entry,) = answer["hint_outcomes"]  # the events answer carries them, after the events
    assert entry["index"] == 0
    assert _phases(entry["turns"]) == [(0, "accepted", "applied"), (1, "accepted", "expired")]
    assert scheduler.agentkv.internal_errors == 0


def test_rejected_and_unsupported_hints_say_so(scheduler: Any) -> None:
    d = _Driver(scheduler)
    d.run("o2-bad", list(range(400, 432)), _hint("bad", 0, agentkv_ttlMs=-5), "tenant-a")
    (bad,) = d.outcomes("bad", "tenant-a")
    assert (bad["verdict"], bad["result"]) == ("rejected", None) and "ttlMs" in bad["verdictReason"]
    d.run("o2-pre", list(range(500, 532)), _hint("pre", 0, "prefetch"), "tenant-a")
    (pre,) = d.outcomes("pre", "tenant-a")
    assert pre["verdict"] == "unsupported" and "prefetch" in pre["verdictReason"]
    stats = d.op(op="stats")
    assert stats["hint_rejected"] >= 1 and stats["hint_unsupported"] >= 1


def test_an_unused_lease_expires_and_an_aborted_retain_fails(scheduler: Any) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    d = _Driver(scheduler)
    d.run("o3-0", list(range(600, 664)), _hint("short", 0, agentkv_ttlMs=50), None)
    time.sleep(0.1)
    d.stepper.step()  # the lease expires at the top of a step
    assert _phases(d.outcomes("short", None)) == [(0, "accepted", "expired")]
    params = SamplingParams(max_tokens=50, min_tokens=50, ignore_eos=True,
                            extra_args=_hint("abort", 0))  # fmt: skip
    d.s.add_request(Request("o3-ab", list(range(700, 764)), params, None, block_hasher=d.hasher))
    d.stepper.step()
    d.s.finish_requests("o3-ab", RequestStatus.FINISHED_ABORTED)
    d.stepper.drain(2000)
    (ab,) = d.outcomes("abort", None)
    assert (ab["verdict"], ab["result"]) == ("accepted", "failed") and "aborted" in ab[
        "resultReason"
    ]


def test_in_shadow_mode_a_hint_is_unsupported(scheduler: Any) -> None:
    d = _Driver(scheduler)
    assert d.op(op="mode", mode="shadow")["previous"] == "act"
    try:
        d.run("o4-0", list(range(800, 832)), _hint("sh", 0), "tenant-a")
        (sh,) = d.outcomes("sh", "tenant-a")
        assert sh["verdict"] == "unsupported" and "shadow" in sh["verdictReason"]
    finally:
        d.op(op="mode", mode="act")

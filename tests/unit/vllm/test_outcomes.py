"""Per-hint outcomes on the server, as pure logic: the verdict at the request, the result
when the lease ends, and the log's bounds (issue 31, "safe rollout, server side")."""

from __future__ import annotations

from agentkv.protocol._hints import Hint, decode_hint
from agentkv.vllm._outcomes import OutcomeLog, hint_verdict, lease_result

FEATURES = {"mode": "act", "lifecycle": True, "lower_tier": False, "priorities": True}


def test_the_verdict_says_accepted_or_why_not() -> None:
    assert hint_verdict(Hint("t", action="retain"), **FEATURES) == ("accepted", None)
    assert hint_verdict(Hint("t", action="prefetch"), **FEATURES)[0] == "unsupported"
    assert hint_verdict(Hint("t", action="offload"), **FEATURES)[0] == "unsupported"
    assert hint_verdict(Hint("t", action="offload"), **{**FEATURES, "lower_tier": True})[0] == (
        "accepted"
    )
    no_lifecycle = {**FEATURES, "lifecycle": False}
    assert hint_verdict(Hint("t", action="retain"), **no_lifecycle)[0] == "unsupported"
    for mode in ("shadow", "off"):
        verdict, reason = hint_verdict(Hint("t"), **{**FEATURES, "mode": mode})
        assert verdict == "unsupported" and reason is not None and mode in reason
    verdict, reason = hint_verdict(Hint("t", priority=-2), **{**FEATURES, "priorities": False})
    assert verdict == "accepted" and reason is not None and "priority" in reason


def test_a_rejected_hint_keeps_the_id_it_named_and_nothing_else() -> None:
    hint = decode_hint({"agentkv_trajectoryId": "t-9", "agentkv_turnId": 3, "agentkv_ttlMs": -5})
    assert hint is not None and hint.rejected and hint.trajectory_id == ""
    assert (hint.rejected_id, hint.turn_id) == ("t-9", 3)
    bad_id = decode_hint({"agentkv_trajectoryId": 7, "agentkv_action": "retain"})
    assert bad_id is not None and bad_id.rejected and bad_id.rejected_id is None


def test_lease_endings_map_to_the_second_phase() -> None:
    assert lease_result("reused")[0] == "applied"
    assert lease_result("expired")[0] == "expired"
    assert lease_result("released")[0] == "expired"
    assert lease_result("pressure_released")[0] == "failed"
    assert lease_result(None)[0] == "expired"  # forgotten


def test_the_log_settles_once_replaces_a_retried_turn_and_is_bounded() -> None:
    log = OutcomeLog(max_trajectories=2, max_turns=3)
    first = log.record("k1", 0, "accepted")
    log.await_lease("k1", first)
    log.lease_ended("k1", "reused")
    log.lease_ended("k1", "expired")  # nothing waits any more
    assert (first.result, log.awaiting) == ("applied", {})
    log.settle(first, "failed")
    assert first.result == "applied"  # settled once
    log.record("k1", 0, "rejected", "ttlMs must be ...")  # a retry of turn 0 replaces it
    assert [o["verdict"] for o in log.get("k1")] == ["rejected"]
    for turn in range(1, 6):
        log.record("k1", turn, "accepted")
    assert [o["turnId"] for o in log.get("k1")] == [3, 4, 5]
    second = log.record("k2", 0, "accepted")
    log.await_lease("k2", second)
    log.record("k3", 0, "accepted")  # the least recently touched trajectory goes
    assert log.get("k1") == [] and "k2" in log.awaiting
    log.reset("mode switch")
    assert second.result == "expired" and log.awaiting == {}
    assert log.stats()["hint_accepted"] == 8 and log.stats()["hint_applied"] == 1


def test_a_newer_lease_settles_the_one_it_replaced() -> None:
    log = OutcomeLog()
    old, new = log.record("k", 0, "accepted"), log.record("k", 1, "accepted")
    log.await_lease("k", old)
    log.await_lease("k", new)
    assert old.result == "expired" and log.awaiting == {"k": new}

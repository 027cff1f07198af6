"""Per-hint outcomes on the client: the server's two phases folded into the turn records
and ``agentkv.stats()`` (issue 31, "safe rollout, server side")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

import agentkv
from agentkv.advice._advisor import Advisor
from agentkv.client import _accounting, _lifecycle
from agentkv.client._lifecycle import LifecycleChannel
from agentkv.gaps._model import GapModel
from tests.support.client_fakes import FakeServer


@pytest.fixture
def channel() -> Iterator[LifecycleChannel]:
    ch = LifecycleChannel(timeout_s=0.3, max_attempts=2, down_backoff_s=0.1)
    _lifecycle.set_channel(ch)
    yield ch
    _lifecycle.reset_channel()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer("agentkv")
    yield s
    s.close()


def _wire(turn: int, verdict: str, result: str | None = None) -> dict[str, Any]:
    return {"turnId": turn, "verdict": verdict, "verdictReason": None, "result": result,
            "resultReason": "the next turn reused the leased context" if result else None}  # fmt: skip


def test_outcomes_fold_into_awaiting_records_once_and_are_counted() -> None:
    first = _accounting.expect_hint_outcome("s", "t", 0)
    second = _accounting.expect_hint_outcome("s", "t", 1)
    other_scope = _accounting.expect_hint_outcome("other", "t", 0)
    assert _accounting.apply_hint_outcomes("s", "t", [_wire(0, "accepted")]) == 1
    assert first.verdict == "accepted" and first.result is None  # lease still held
    changed = _accounting.apply_hint_outcomes(
        "s", "t", [_wire(0, "accepted", "applied"), _wire(1, "unsupported"), _wire(7, "accepted")]
    )
    assert changed == 2
    assert first.result == "applied" and first.result_reason
    assert second.verdict == "unsupported" and second.result is None
    assert other_scope.verdict is None  # another tenant's "t" is not this one's
    # Settled turns hear nothing more; garbage is ignored.
    assert _accounting.apply_hint_outcomes("s", "t", [_wire(0, "rejected", "failed")]) == 0
    assert _accounting.apply_hint_outcomes("s", "t", "nonsense") == 0
    assert _accounting.apply_hint_outcomes("s", "t", [{"turnId": "0", "verdict": "accepted"}]) == 0
    assert agentkv.stats().hint_outcomes == {"accepted": 1, "applied": 1, "unsupported": 1}


def test_a_result_needs_an_accepted_verdict() -> None:
    holder = _accounting.expect_hint_outcome(None, "t", 0)
    _accounting.apply_hint_outcomes(None, "t", [_wire(0, "rejected", "applied")])
    assert holder.verdict == "rejected" and holder.result is None


def test_the_awaited_outcomes_are_bounded() -> None:
    _accounting._ledger.max_hints = 3
    holders = [_accounting.expect_hint_outcome(None, "t", i) for i in range(5)]
    _accounting.apply_hint_outcomes(None, "t", [_wire(i, "accepted") for i in range(5)])
    assert [h.verdict for h in holders] == [None, None, "accepted", "accepted", "accepted"]


def test_the_events_answer_fills_in_the_turn_records_and_stats(
    channel: LifecycleChannel, server: FakeServer
) -> None:
    """A wrapped call's record carries a hint outcome; the server's answer to the next
    events post of its trajectory settles it (accepted, then applied)."""
    gaps = GapModel()
    for _ in range(20):
        gaps.observe("shell", 0.5)
    server.hint_outcomes = lambda events: [
        {"index": 0, "turns": [_wire(0, "accepted", "applied"), _wire(1, "accepted")]}
    ]
    raw = openai.OpenAI(base_url=server.base_url, api_key="k")
    client = agentkv.wrap_openai(raw, advisor=Advisor(gaps))

    @agentkv.tool(tool_class="shell")
    def run() -> str:
        return "ok"

    with agentkv.trajectory("traj-o1"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        run()
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert channel.flush(3)
    raw.close()
    first, second = _accounting.get_records("traj-o1")
    assert first.hint is not None and (first.hint.verdict, first.hint.result) == (
        "accepted",
        "applied",
    )
    assert second.hint is not None and second.hint.verdict == "accepted"
    assert first.to_dict()["hint"]["result"] == "applied"
    assert agentkv.stats().hint_outcomes == {"accepted": 2, "applied": 1}


def test_no_hint_outcome_without_an_agentkv_server() -> None:
    stock = FakeServer("stock")
    try:
        raw = openai.OpenAI(base_url=stock.base_url, api_key="k")
        client = agentkv.wrap_openai(raw)
        with agentkv.trajectory("traj-o2"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        raw.close()
    finally:
        stock.close()
    (rec,) = _accounting.get_records("traj-o2")
    assert rec.hint is None and agentkv.stats().hint_outcomes == {}

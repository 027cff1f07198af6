"""The advisor decides each call afresh: advice follows its models, load and settings at once."""

from __future__ import annotations

from agentkv.advice._advisor import Advisor, TrajectoryState
from agentkv.advice._costmodel import CostModel, LoadSnapshot
from agentkv.gaps._model import GapModel


def _state(turn: int = 1, tool: str | None = "shell:pytest", tokens: int = 0) -> TrajectoryState:
    return TrajectoryState("t", turn, tool_class=tool, prefix_tokens=tokens, resumed=turn > 0)


def test_advice_follows_the_gap_model_after_it_learns() -> None:
    """Advice memoised before the model learned is not served after it learned."""
    model = GapModel(min_samples=3)
    advisor = Advisor(model)
    assert advisor.advise(_state()).action == "default"
    assert advisor.advise(_state(2)).action == "default"  # served from the memo
    for _ in range(3):
        model.observe("shell:pytest", 0.5)
    advice = advisor.advise(_state(3))
    assert advice.action == "retain"
    assert advice.turn_id == 3


def test_advice_follows_imported_gap_state() -> None:
    """State imported into the gap model (as from a store) starts a new memo."""
    learned = GapModel(min_samples=3)
    for _ in range(3):
        learned.observe("shell:pytest", 0.5)
    model = GapModel(min_samples=3)
    advisor = Advisor(model)
    assert advisor.advise(_state()).action == "default"
    model.import_records(learned.export_records())
    assert advisor.advise(_state()).action == "retain"


def test_advice_follows_the_cost_model_figures() -> None:
    """A cost-model figure set or learned after a decision changes the next decision."""
    model = GapModel(min_samples=3)
    for _ in range(5):
        model.observe("shell:pytest", 100.0)  # a long gap: the cost model decides
    cost = CostModel(bytes_per_token=1, kv_capacity_bytes=1e3, prefill_tokens_per_s=1e9)
    advisor = Advisor(model, cost)
    state = _state(tokens=1000)
    assert advisor.advise(state).action == "default"  # memory dear, rebuild cheap
    cost.prefill_tokens_per_s = 1e-3  # rebuilding is now very slow
    assert advisor.advise(state).action == "retain"
    cost.set_capacity(num_blocks=1, block_size=1)
    cost.prefill_tokens_per_s = 1e9
    assert advisor.advise(state).action == "default"
    # learned: 0.1 token/s, so rebuilding (10,000 s) clearly costs more than holding; at
    # 1 token/s the two tied and a last-digit rounding of the gap's p50 decided the test
    cost.observe_prefill(100_000, 1e6)
    assert advisor.advise(state).action == "retain"


def test_advice_follows_load_and_settings() -> None:
    """A new load snapshot or a changed setting is decided afresh."""
    model = GapModel(min_samples=3)
    for _ in range(5):
        model.observe("shell:pytest", 100.0)
    advisor = Advisor(model)
    idle = LoadSnapshot()
    assert advisor.advise(_state(), load=idle).action == "default"
    assert advisor.advise(_state(), load=LoadSnapshot(num_waiting=3)).action == "release"
    assert advisor.advise(_state(), load=idle).action == "default"
    advisor.short_gap_s = 1000.0
    advice = advisor.advise(_state(), load=idle)
    assert advice.action == "retain"
    advisor.max_ttl_ms = 1000
    assert advisor.advise(_state(), load=idle).ttl_ms == 1000


def test_memoised_advice_carries_each_calls_identity_and_priority() -> None:
    """Reused decisions still carry the call's trajectory, turn and priority."""
    model = GapModel(min_samples=3)
    for _ in range(3):
        model.observe("shell:pytest", 0.5)
    advisor = Advisor(model)
    first = advisor.advise(TrajectoryState("a", 0, tool_class="shell:pytest"))
    second = advisor.advise(_state(4))
    assert (first.trajectory_id, first.turn_id, first.priority) == ("a", 0, None)
    assert (second.trajectory_id, second.turn_id, second.priority) == ("t", 4, -1)
    assert first.ttl_ms == second.ttl_ms


def test_an_unhashable_state_is_still_advised() -> None:
    """Odd input the memo cannot key on is decided afresh, as before (never raises)."""
    model = GapModel(min_samples=3)
    for _ in range(3):
        model.observe("shell:pytest", 0.5)
    advisor = Advisor(model)
    odd = TrajectoryState("t", 1, tool_class="shell:pytest", p_next=[0.5])  # type: ignore[arg-type]
    assert advisor.advise(odd).action == "retain"

"""Synthesized prompts reproduce the trace's prefix structure exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.bench.run._synth import PromptSynthesizer, common_prefix_tokens
from agentkv.traces import Trace, TraceTrajectory, TraceTurn
from agentkv.workload import PlannedTrajectory, PlannedTurn, Scaling, make_workload


@st.composite
def trajectories(draw: st.DrawFn) -> PlannedTrajectory:
    n = draw(st.integers(1, 8))
    turns: list[PlannedTurn] = []
    prev_ctx = 0
    for i in range(n):
        prompt = draw(st.integers(1, 300))
        out = draw(st.integers(1, 20))
        shared = 0 if i == 0 else draw(st.integers(0, min(prompt, prev_ctx)))
        turns.append(PlannedTurn(i, prompt, out, shared, "bash", 0.0 if i < n - 1 else None))
        prev_ctx = prompt + out
    return PlannedTrajectory(draw(st.integers(0, 1000)), tuple(turns))


@settings(max_examples=150, deadline=None)
@given(trajectories(), st.integers(0, 40))
def test_shared_prefix_between_consecutive_prompts_equals_the_trace(
    traj: PlannedTrajectory, system: int
) -> None:
    """Turn k shares exactly shared_prefix_tokens with turn k-1's prompt + answer."""
    synth = PromptSynthesizer(seed=7, vocab_low=16, vocab_high=64, system_prefix_tokens=system)
    prompts = synth.trajectory_prompts(traj)
    for k, turn in enumerate(traj.turns):
        assert len(prompts[k]) == turn.prompt_tokens
        assert all(16 <= t < 64 for t in prompts[k])
        if k:
            prev = traj.turns[k - 1]
            context = prompts[k - 1] + synth.placeholder_output(traj.traj_idx, prev)
            assert common_prefix_tokens(prompts[k], context) == turn.shared_prefix_tokens


def test_answer_ids_from_the_server_are_extended() -> None:
    """With real answer ids, a turn sharing more than the previous prompt reuses the answer."""
    synth = PromptSynthesizer(seed=1)
    t0 = PlannedTurn(0, 50, 5, 0, "bash", 0.1)
    t1 = PlannedTurn(1, 80, 5, 53, None, None)
    p0 = synth.prompt(4, t0, None)
    answer = [900, 901, 902, 903, 904]
    p1 = synth.prompt(4, t1, p0 + answer)
    assert p1[:53] == p0 + answer[:3]
    assert p1[53] != answer[3]


def test_prompts_are_deterministic_and_trajectories_differ() -> None:
    """Same seed, same prompts; two trajectories share only the system prefix."""
    traj_a = PlannedTrajectory(1, (PlannedTurn(0, 100, 4, 0, None, None),))
    traj_b = PlannedTrajectory(2, (PlannedTurn(0, 100, 4, 0, None, None),))
    s = PromptSynthesizer(seed=3, system_prefix_tokens=32)
    assert s.trajectory_prompts(traj_a) == PromptSynthesizer(
        seed=3, system_prefix_tokens=32
    ).trajectory_prompts(traj_a)
    a, b = s.trajectory_prompts(traj_a)[0], s.trajectory_prompts(traj_b)[0]
    assert a[:32] == b[:32] == s.system_prefix()
    assert common_prefix_tokens(a, b) < 40


def test_scaling_keeps_the_structure_valid() -> None:
    """Scaled shared prefixes never exceed the previous context nor the prompt."""
    turns = (
        TraceTurn(0.0, 2154, 118, 0, "bash", 1.2),
        TraceTurn(7.6, 13902, 374, 2272, "edit", 0.1),  # shares more than the previous prompt
        TraceTurn(18.0, 14300, 74, 14276, None, None),
    )
    trace = Trace((TraceTrajectory(0, turns),), "x", "h")
    w = make_workload(trace, Scaling(token_scale=0.01, time_scale=0.5, max_turns=3))
    t = w.trajectories[0].turns
    assert [u.prompt_tokens for u in t] == [22, 139, 143]
    assert t[1].shared_prefix_tokens == min(23, t[0].context_tokens)
    assert t[2].shared_prefix_tokens <= min(t[1].context_tokens, t[2].prompt_tokens)
    assert t[0].tool_gap_s == 0.6 and t[2].tool_gap_s is None
    assert w.max_context_tokens == max(u.context_tokens for u in t)
    assert w.working_set_tokens(4) == w.max_context_tokens

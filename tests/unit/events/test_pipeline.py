"""The event pipeline feeds the process's gap learner: tool durations and KV idle gaps."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentkv
from agentkv.events import _pipeline
from agentkv.testing import reset


def test_tool_durations_and_idle_gaps_are_learned_without_any_sink() -> None:
    @agentkv.tool(tool_class="shell:pytest")
    def run() -> None:
        pass

    agentkv.configure(gap_model=agentkv.GapModel(min_samples=1))
    with agentkv.trajectory("t"):
        for _ in range(4):
            with agentkv.model_call():
                pass
            run()
    model = _pipeline.ensure_gap_model()
    assert model is not None
    tool = model.estimate("shell:pytest", kind="tool")
    assert (tool.n, tool.source) == (4, "shell:pytest")
    # three idle gaps (turns 1..3), each after the tool ran
    idle = model.estimate("shell:pytest", kind="idle")
    assert (idle.n, idle.source) == (3, "shell:pytest")


def test_cancelled_tools_are_not_learned_and_learning_can_be_turned_off() -> None:
    agentkv.configure(learn_gaps=False)
    with agentkv.trajectory("t"), agentkv.tool_call("quiet"):
        pass
    assert _pipeline.ensure_gap_model() is None
    agentkv.configure(learn_gaps=True, gap_model=agentkv.GapModel(min_samples=1))
    with agentkv.trajectory("t"):
        try:
            with agentkv.tool_call("interrupted"):
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
    model = _pipeline.ensure_gap_model()
    assert model is not None
    assert model.estimate("interrupted", kind="tool").n == 0
    assert model.estimate("quiet", kind="tool").n == 0


def test_configure_accepts_a_user_gap_model() -> None:
    mine = agentkv.GapModel(min_samples=1)
    agentkv.configure(gap_model=mine)
    with agentkv.trajectory("t"), agentkv.tool_call("db"):
        pass
    assert _pipeline.ensure_gap_model() is mine
    assert mine.estimate("db", kind="tool").n == 1


def test_gaps_namespace_env_names_the_persistent_learners_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mp = monkeypatch
    mp.setenv("AGENTKV_HOME", str(tmp_path))
    mp.delenv("AGENTKV_GAPS_PERSIST")
    mp.setenv("AGENTKV_GAPS_NAMESPACE", "my-app")
    model = _pipeline.ensure_gap_model()
    assert model is not None and model.wait_open(10) and model.store is not None
    assert model.namespace == "my-app"
    model.close()


def test_the_learner_persists_under_agentkv_home_by_default_and_can_opt_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mp = monkeypatch
    mp.setenv("AGENTKV_HOME", str(tmp_path))
    mp.delenv("AGENTKV_GAPS_PERSIST")
    mp.delenv("AGENTKV_GAPS_NAMESPACE", raising=False)
    model = _pipeline.ensure_gap_model()
    assert model is not None and model.wait_open(10) and model.store is not None
    assert model.namespace == "default"
    assert str(tmp_path) in str(model.store.path)
    # The shipped per-family priors answer for a class it has not learned.
    assert model.estimate("execute_bash").source == "prior:shell"
    model.close()
    reset()
    mp.setenv("AGENTKV_GAPS_PERSIST", "0")
    model = _pipeline.ensure_gap_model()
    assert model is not None and model.store is None

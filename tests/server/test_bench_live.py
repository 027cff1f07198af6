"""The live agent against a real server: one bundled task end to end on SmolLM2."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentkv.bench.live._agent import AgentOptions, run_tasks
from agentkv.bench.live._tasks import load_tasks
from agentkv.bench.live._tools import GapSampler, ToolBox
from agentkv.testing import capture_events

pytestmark = pytest.mark.server


def test_a_bundled_task_runs_end_to_end_and_its_steps_are_recorded(smollm2_server: Any) -> None:
    """The model's first step calls the task's tool (held to the step schema by structured
    outputs), the tool really runs, the answer is judged; the trajectory's events carry
    the tool's start and finish."""
    tasks = load_tasks()
    task = next(t for t in tasks.tasks if t.task_id == "calc-product")
    with capture_events() as events:
        live = asyncio.run(
            run_tasks(
                smollm2_server.openai_base_url,
                smollm2_server.model,
                [task],
                lambda: ToolBox(tasks.root, GapSampler([0.0])),
                AgentOptions(max_steps=3, max_tokens=32, concurrency=1),
            )
        )
    (run,) = live.tasks
    assert run.outcome in ("accepted", "rejected", "step_limit"), run.failure
    first = run.steps[0]
    assert first.kind == "tool" and first.tool == "calc", first.output
    assert first.token_ids and first.prompt_tokens
    if run.outcome != "step_limit":
        assert run.steps[-1].kind == "answer" and run.answer is not None
    kinds = [e.event for e in events if e.trajectory_id == run.trajectory_id]
    assert (
        "tool_started" in kinds and "tool_finished" in kinds and kinds[-1] == "trajectory_finished"
    )

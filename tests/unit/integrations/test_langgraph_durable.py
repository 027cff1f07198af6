"""Durable threads: a LangGraph thread resumed from its checkpointer in a new process
continues its trajectory's turn count (the next model call is a resumed turn).

Each phase runs in a fresh Python process: ``create_agent`` with ``AgentKVMiddleware``, a
real ``ChatOpenAI`` on the scripted in-memory endpoint (``tests.support.integration_fakes``)
and LangGraph's ``InMemorySaver`` backed by files (its ``PersistentDict`` factory), so the
only thing the second process shares with the first is the checkpointed graph state.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.durable_phases import run_phase

PHASE = r"""
import sys
from tests.support.durable_phases import SCRIPTS, file_saver, report, tools
from tests.support.integration_fakes import FakeOpenAI
from langchain.agents import create_agent
from langchain_openai import ChatOpenAI
from langgraph.types import Command

from agentkv.integrations.langgraph import AgentKVMiddleware
from agentkv.testing import capture_events

folder, phase = sys.argv[1], sys.argv[2]
fake = FakeOpenAI(SCRIPTS[phase], loop_last=False)
llm = ChatOpenAI(model="agentkv-tiny", base_url=fake.base_url, api_key="-",
                 http_client=fake.sync_http(), max_retries=0)
with file_saver(folder) as saver:
    agent = create_agent(llm, tools=tools(),
                         middleware=[AgentKVMiddleware(backend="vllm")], checkpointer=saver)
    config = {"configurable": {"thread_id": sys.argv[3]}}
    with capture_events() as events:
        if phase == "resumed":
            agent.invoke(Command(resume="a.py"), config)
        else:
            agent.invoke({"messages": [("user", phase)]}, config)
report(events, fake.xargs())
"""


def _phase(folder: Path, phase: str, thread: str) -> dict[str, list[object]]:
    return run_phase(PHASE, str(folder), phase, thread)


def test_thread_resumed_in_a_new_process_continues_its_turns(tmp_path: Path) -> None:
    first = _phase(tmp_path, "first", "durable-1")
    assert first["turns"] == [0, 1]
    second = _phase(tmp_path, "second", "durable-1")
    assert second["turns"] == [2]  # turn 2 of the thread, not a new turn 0
    assert second["events"] == [
        ["durable-1", 2, "model_started", None],
        ["durable-1", 2, "tool_started", "human"],
    ]


def test_interrupt_resumed_in_a_new_process_continues_its_turns(tmp_path: Path) -> None:
    """The count written with the model call's own step survives an interrupt (the run
    never reached its end) and a resume with ``Command(resume=...)`` elsewhere."""
    first = _phase(tmp_path, "interrupted", "durable-2")
    assert first["turns"] == [0]
    resumed = _phase(tmp_path, "resumed", "durable-2")
    assert resumed["turns"] == [1]
    assert resumed["events"] == [
        ["durable-2", 0, "tool_started", "ask_user"],  # the resumed tool of turn 0
        ["durable-2", 0, "tool_finished", "ask_user"],
        ["durable-2", 1, "model_started", None],
        ["durable-2", 1, "tool_started", "human"],
    ]


def test_other_threads_start_at_turn_zero(tmp_path: Path) -> None:
    """A stored count belongs to its own thread: a new thread on the same store starts at 0."""
    _phase(tmp_path, "first", "durable-3")
    other = _phase(tmp_path, "second", "durable-4")
    assert other["turns"] == [0]


def test_continue_turns_only_moves_forward_and_ignores_bad_counts() -> None:
    """A restored count never lowers a live trajectory's count; junk in the state is ignored."""
    from agentkv.events._context import Trajectory, continue_turns

    traj = Trajectory("t")
    assert continue_turns(traj, 3) and (traj.num_model_calls, traj.turn_id) == (3, 2)
    for bad in (2, 3, -1, True, "7", None, 4.0):
        assert not continue_turns(traj, bad)
    assert (traj.num_model_calls, traj.turn_id) == (3, 2)

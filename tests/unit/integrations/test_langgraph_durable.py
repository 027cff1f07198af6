"""Durable threads: a LangGraph thread resumed from its checkpointer in a new process
continues its trajectory's turn count (the next model call is a resumed turn).

Each phase runs in a fresh Python process: ``create_agent`` with ``AgentKVMiddleware``, a
real ``ChatOpenAI`` on the scripted in-memory endpoint (``tests.support.integration_fakes``)
and LangGraph's ``InMemorySaver`` backed by files (its ``PersistentDict`` factory), so the
only thing the second process shares with the first is the checkpointed graph state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PHASE = r"""
import json, os, sys
from tests.support.integration_fakes import FakeOpenAI
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict
from langgraph.types import Command, interrupt

from agentkv.integrations.langgraph import AgentKVMiddleware
from agentkv.testing import capture_events

folder, phase = sys.argv[1], sys.argv[2]
names = iter(("storage", "writes", "blobs"))

def factory(*args):
    d = PersistentDict(*args, filename=os.path.join(folder, next(names)))
    if os.path.exists(d.filename):
        d.load()
    return d

@tool
def grep(pattern: str) -> str:
    '''Search the code for a pattern.'''
    return "3 matches"

@tool
def ask_user(question: str) -> str:
    '''Ask the user.'''
    return str(interrupt(question))

SCRIPTS = {
    "first": [[("grep", {"pattern": "a"})], "first answer"],
    "second": ["second answer"],
    "interrupted": [[("ask_user", {"question": "which file?"})]],
    "resumed": ["thanks"],
}
fake = FakeOpenAI(SCRIPTS[phase], loop_last=False)
llm = ChatOpenAI(model="agentkv-tiny", base_url=fake.base_url, api_key="-",
                 http_client=fake.sync_http(), max_retries=0)
with InMemorySaver(factory=factory) as saver:
    agent = create_agent(llm, tools=[grep, ask_user],
                         middleware=[AgentKVMiddleware(backend="vllm")], checkpointer=saver)
    config = {"configurable": {"thread_id": sys.argv[3]}}
    with capture_events() as events:
        if phase == "resumed":
            agent.invoke(Command(resume="a.py"), config)
        else:
            agent.invoke({"messages": [("user", phase)]}, config)
print(json.dumps({
    "events": [[e.trajectory_id, e.turn_id, e.event, e.tool_class] for e in events],
    "turns": [x.get("agentkv_turnId") for x in fake.xargs()],
}))
"""


def _phase(folder: Path, phase: str, thread: str) -> dict[str, list[object]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", PHASE, str(folder), phase, thread],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, list[object]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


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

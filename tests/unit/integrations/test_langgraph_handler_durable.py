"""Durable threads under the callback handler alone: a LangGraph thread resumed from its
checkpointer in a new process continues its trajectory's turn count.

Each phase runs in a fresh Python process: a hand-built graph (``StateGraph`` over
``MessagesState``, the stock ``ToolNode``) with ``AgentKVCallbackHandler`` and no
middleware, a real ``ChatOpenAI`` wrapped by ``wrap_chat_openai`` on the scripted
in-memory endpoint (``tests.support.integration_fakes``) and LangGraph's ``InMemorySaver``
backed by files (its ``PersistentDict`` factory), so the only thing the second process
shares with the first is the checkpointed graph state. The handler reads the thread's
checkpoint either through its ``checkpointer`` argument or from the run's config.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.durable_phases import run_phase

PHASE = r"""
import sys
from tests.support.durable_phases import SCRIPTS, file_saver, report, tools
from tests.support.integration_fakes import FakeOpenAI
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from agentkv.integrations.langgraph import AgentKVCallbackHandler, wrap_chat_openai
from agentkv.testing import capture_events

folder, phase, thread, source = sys.argv[1:5]
fake = FakeOpenAI(SCRIPTS[phase], loop_last=False)
llm = wrap_chat_openai(ChatOpenAI(model="agentkv-tiny", base_url=fake.base_url, api_key="-",
                                  http_client=fake.sync_http(), max_retries=0), backend="vllm")
TOOLS = tools()
model = llm.bind_tools(TOOLS)

def call_model(state):
    return {"messages": [model.invoke(state["messages"])]}

builder = StateGraph(MessagesState)
builder.add_node("model", call_model)
builder.add_node("tools", ToolNode(TOOLS))
builder.add_edge(START, "model")
builder.add_conditional_edges("model", tools_condition)
builder.add_edge("tools", "model")
with file_saver(folder) as saver:
    graph = builder.compile(checkpointer=saver)
    handler = AgentKVCallbackHandler(checkpointer=saver if source == "argument" else None)
    config = {"configurable": {"thread_id": thread}, "callbacks": [handler]}
    with capture_events() as events:
        if phase == "resumed":
            graph.invoke(Command(resume="a.py"), config)
        else:
            graph.invoke({"messages": [("user", phase)]}, config)
report(events, fake.xargs())
"""


def _phase(folder: Path, phase: str, thread: str, source: str) -> dict[str, list[object]]:
    return run_phase(PHASE, str(folder), phase, thread, source)


@pytest.mark.parametrize("source", ["argument", "config"])
def test_handler_thread_resumed_in_a_new_process_continues_its_turns(
    tmp_path: Path, source: str
) -> None:
    """The second process's first model call is turn 2 (a resumed turn), read from the
    checkpoint through the handler's ``checkpointer`` or the run's config."""
    first = _phase(tmp_path, "first", "hd-1", source)
    assert first["turns"] == [0, 1]
    second = _phase(tmp_path, "second", "hd-1", source)
    assert second["turns"] == [2]  # turn 2 of the thread, not a new turn 0
    assert second["events"] == [
        ["hd-1", 2, "model_started", None],
        ["hd-1", 2, "tool_started", "human"],
    ]


@pytest.mark.parametrize("source", ["argument", "config"])
def test_handler_interrupt_resumed_in_a_new_process_continues_its_turns(
    tmp_path: Path, source: str
) -> None:
    """An interrupted tool resumed with ``Command(resume=...)`` in a new process is turn
    0's tool; the model call after it is turn 1."""
    first = _phase(tmp_path, "interrupted", "hd-2", source)
    assert first["turns"] == [0]
    resumed = _phase(tmp_path, "resumed", "hd-2", source)
    assert resumed["turns"] == [1]
    assert resumed["events"] == [
        ["hd-2", 0, "tool_started", "ask_user"],
        ["hd-2", 0, "tool_finished", "ask_user"],
        ["hd-2", 1, "model_started", None],
        ["hd-2", 1, "tool_started", "human"],
    ]


def test_handler_other_threads_on_the_same_store_start_at_turn_zero(tmp_path: Path) -> None:
    """A checkpoint belongs to its own thread: a new thread on the same store starts at 0."""
    _phase(tmp_path, "first", "hd-3", "config")
    other = _phase(tmp_path, "second", "hd-4", "config")
    assert other["turns"] == [0]

"""The callback handler finds the thread in ``config["configurable"]["thread_id"]``.

LangGraph 1.x passes callbacks no config, only ``metadata``, and copies a ``thread_id``
into it only when it is truthy (1.2; 1.0 only for str/int/float/bool); a plain LangChain
runnable copies none. The handler then reads the thread from LangChain's runnable config
at the run's first model or tool call. Real runnables and graphs, langchain-core's fake
chat model.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agentkv
from agentkv.integrations.langgraph import AgentKVCallbackHandler, end_thread
from agentkv.testing import capture_events


@tool
def grep(pattern: str) -> str:
    """Search the code for a pattern."""
    return f"3 matches for {pattern}"


class _Fake(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _rows(events: list[agentkv.TrajectoryEvent]) -> list[tuple[str, int, str, str | None]]:
    return [(e.trajectory_id, e.turn_id, e.event, e.tool_class) for e in events]


def test_plain_runnable_thread_from_configurable_is_one_conversation() -> None:
    """A LangChain chain invoked twice with ``configurable.thread_id``: one trajectory
    named by the thread, turns continue, the time between runs is the idle tool."""
    chain = RunnableLambda(lambda q: [("user", str(q))]) | _Fake(
        messages=iter([AIMessage("one"), AIMessage("two")])
    )
    handler = AgentKVCallbackHandler(model_events=True)
    config: Any = {"configurable": {"thread_id": "chat-7"}, "callbacks": [handler]}
    with capture_events() as events:
        chain.invoke("hi", config)
        chain.invoke("again", config)
        assert end_thread("chat-7")
    assert _rows(events) == [
        ("chat-7", 0, "model_started", None),
        ("chat-7", 0, "tool_started", "human"),
        ("chat-7", 0, "tool_finished", "human"),
        ("chat-7", 1, "model_started", None),
        ("chat-7", 1, "tool_started", "human"),
        ("chat-7", 1, "tool_finished", "human"),
        ("chat-7", 1, "trajectory_finished", None),
    ]


def test_plain_runnable_tool_run_finds_the_configurable_thread() -> None:
    """A tool called through a chain (no model) lands in the configured thread too."""
    chain = RunnableLambda(lambda q: {"pattern": q}) | grep
    handler = AgentKVCallbackHandler(tool_classes={"grep": "search"})
    with capture_events() as events:
        chain.invoke("TODO", {"configurable": {"thread_id": "t-tool"}, "callbacks": [handler]})
    assert _rows(events) == [
        ("t-tool", 0, "tool_started", "search"),
        ("t-tool", 0, "tool_finished", "search"),
        ("t-tool", 0, "tool_started", "human"),
    ]


def test_graph_thread_id_langgraph_leaves_out_of_metadata() -> None:
    """``thread_id=0`` is a valid LangGraph thread that LangGraph does not copy into the
    callbacks' metadata: the graph's runs still form the conversation ``"0"``."""
    call = {"name": "grep", "args": {"pattern": "a"}, "id": "c1"}
    llm = _Fake(messages=iter([AIMessage(content="", tool_calls=[call]), AIMessage("done")]))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([grep]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    handler = AgentKVCallbackHandler(tool_classes={"grep": "search"}, model_events=True)
    with capture_events() as events:
        g.compile().invoke(
            {"messages": [("user", "go")]},
            {"configurable": {"thread_id": 0}, "callbacks": [handler]},
        )
    assert _rows(events) == [
        ("0", 0, "model_started", None),
        ("0", 0, "tool_started", "search"),
        ("0", 0, "tool_finished", "search"),
        ("0", 1, "model_started", None),
        ("0", 1, "tool_started", "human"),
    ]


def test_metadata_thread_still_wins_and_thread_less_runs_still_end() -> None:
    """A thread named in ``metadata`` is used as before; a run with no thread anywhere
    is a trajectory of its own, finished at its end."""
    chain = RunnableLambda(lambda q: [("user", str(q))]) | _Fake(
        messages=iter([AIMessage("one"), AIMessage("two")])
    )
    handler = AgentKVCallbackHandler(model_events=True)
    with capture_events() as events:
        chain.invoke(
            "hi",
            {
                "metadata": {"thread_id": "from-meta"},
                "configurable": {"thread_id": "from-conf"},
                "callbacks": [handler],
            },
        )
        chain.invoke("hi", {"callbacks": [handler]})
    first = [e for e in events if e.trajectory_id == "from-meta"]
    assert [e.event for e in first] == ["model_started", "tool_started"]
    rest = [e for e in events if e.trajectory_id != "from-meta"]
    assert rest and rest[0].trajectory_id.startswith("lg-")
    assert [e.event for e in rest] == ["model_started", "trajectory_finished"]


async def test_async_runnable_thread_from_configurable() -> None:
    """``ainvoke`` reads the configured thread the same way."""
    chain = RunnableLambda(lambda q: [("user", str(q))]) | _Fake(messages=iter([AIMessage("one")]))
    handler = AgentKVCallbackHandler(model_events=True)
    with capture_events() as events:
        await chain.ainvoke("hi", {"configurable": {"thread_id": "a-7"}, "callbacks": [handler]})
    assert _rows(events) == [
        ("a-7", 0, "model_started", None),
        ("a-7", 0, "tool_started", "human"),
    ]

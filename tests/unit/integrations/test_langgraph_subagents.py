"""Subagents under the LangGraph callback handler: a graph run inside a tool call is a
child trajectory of the caller, as with the middleware.

Real LangGraph graphs (the stock ``ToolNode``, a compiled subgraph invoked from a tool)
with langchain-core's fake chat model; one test puts a real ``ChatOpenAI`` on the
scripted in-memory endpoint of tests/integration_fakes.py to read the hints on the wire.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agentkv
from agentkv.integrations.langgraph import AgentKVCallbackHandler, wrap_chat_openai
from agentkv.testing import capture_events
from tests.support.integration_fakes import FakeOpenAI


class _Fake(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _calls(*names_args: tuple[str, dict[str, Any]]) -> AIMessage:
    calls = [{"name": n, "args": a, "id": f"c{i}"} for i, (n, a) in enumerate(names_args)]
    return AIMessage(content="", tool_calls=calls)


def _agent_graph(llm: Any, tools: list[Any], *, name: str | None = None, saver: Any = None) -> Any:
    """model -> tools -> model ... as a hand-built graph with the stock ToolNode."""
    bound = llm.bind_tools(tools) if tools else llm

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    if tools:
        g.add_node("tools", ToolNode(tools))
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
    g.add_edge(START, "agent")
    return g.compile(checkpointer=saver, name=name)


def _rows(events: list[agentkv.TrajectoryEvent]) -> list[tuple[str, int, str, str | None]]:
    return [(e.trajectory_id, e.turn_id, e.event, e.tool_class) for e in events]


def _research_tool(sub: Any) -> Any:
    @tool
    def research(question: str) -> str:
        """Ask the research subagent."""
        out = sub.invoke({"messages": [("user", question)]})
        return str(out["messages"][-1].content)

    return research


def test_subgraph_invoked_from_a_tool_is_a_child_trajectory() -> None:
    """The subagent's model call is its own turn 0 in ``p/researcher-<hash8>`` with
    parent ``p``, inside the caller's tool call; the caller's turns are not advanced."""
    sub = _agent_graph(_Fake(messages=iter([AIMessage(content="found it")])), [], name="researcher")
    research = _research_tool(sub)
    llm = _Fake(messages=iter([_calls(("research", {"question": "q"})), AIMessage("done")]))
    graph = _agent_graph(llm, [research], saver=InMemorySaver())
    handler = AgentKVCallbackHandler(tool_classes={"research": "subagent"}, model_events=True)
    with capture_events() as events:
        graph.invoke(
            {"messages": [("user", "go")]},
            {"configurable": {"thread_id": "p"}, "callbacks": [handler]},
        )
    child = [e for e in events if e.trajectory_id != "p"]
    assert child, _rows(events)
    cid = child[0].trajectory_id
    assert cid.startswith("p/researcher-") and len(cid) == len("p/researcher-") + 8
    assert [(e.trajectory_id, e.turn_id, e.event) for e in child] == [
        (cid, 0, "model_started"),
        (cid, 0, "trajectory_finished"),
    ]
    assert all(e.parent_trajectory_id == "p" for e in child)
    parent = [e for e in events if e.trajectory_id == "p"]
    assert _rows(parent) == [
        ("p", 0, "model_started", None),
        ("p", 0, "tool_started", "subagent"),
        ("p", 0, "tool_finished", "subagent"),
        ("p", 1, "model_started", None),
        ("p", 1, "tool_started", "human"),
    ]
    assert all(e.parent_trajectory_id is None for e in parent)
    # The child ran entirely inside the caller's tool call.
    start = events.index(parent[1])
    end = events.index(parent[2])
    assert all(start < events.index(e) < end for e in child)


def test_subagent_tools_are_its_own_tool_events() -> None:
    """A subagent with tools of its own: its tool calls and turns are in the child."""

    @tool
    def grep(pattern: str) -> str:
        """Search."""
        return "3 matches"

    sub_llm = _Fake(messages=iter([_calls(("grep", {"pattern": "x"})), AIMessage("found")]))
    sub = _agent_graph(sub_llm, [grep], name="searcher")
    llm = _Fake(messages=iter([_calls(("research", {"question": "q"})), AIMessage("done")]))
    graph = _agent_graph(llm, [_research_tool(sub)])
    handler = AgentKVCallbackHandler(tool_classes={"grep": "search"}, model_events=True)
    with capture_events() as events:
        graph.invoke(
            {"messages": [("user", "go")]},
            {"configurable": {"thread_id": "p2"}, "callbacks": [handler]},
        )
    child = [e for e in events if e.trajectory_id.startswith("p2/searcher-")]
    assert [(e.turn_id, e.event, e.tool_class) for e in child] == [
        (0, "model_started", None),
        (0, "tool_started", "search"),
        (0, "tool_finished", "search"),
        (1, "model_started", None),
        (1, "trajectory_finished", None),
    ]
    assert [e.event for e in events if e.trajectory_id == "p2"] == [
        "model_started",
        "tool_started",
        "tool_finished",
        "model_started",
        "tool_started",  # human
    ]


def test_parallel_subagent_calls_are_two_children() -> None:
    """Two calls of one subagent in one model turn (the ToolNode runs them at once):
    two child trajectories with ids of their own, each finished."""
    sub_llm = _Fake(messages=iter([AIMessage("a"), AIMessage("b")]))
    sub = _agent_graph(sub_llm, [], name="researcher")
    turn = _calls(("research", {"question": "q1"}), ("research", {"question": "q2"}))
    llm = _Fake(messages=iter([turn, AIMessage("done")]))
    graph = _agent_graph(llm, [_research_tool(sub)])
    handler = AgentKVCallbackHandler(model_events=True)
    with capture_events() as events:
        graph.invoke(
            {"messages": [("user", "go")]},
            {"configurable": {"thread_id": "p3"}, "callbacks": [handler]},
        )
    children = {e.trajectory_id for e in events if e.trajectory_id != "p3"}
    assert len(children) == 2, _rows(events)
    for cid in children:
        assert cid.startswith("p3/researcher-")
        mine = [e.event for e in events if e.trajectory_id == cid]
        assert mine == ["model_started", "trajectory_finished"]
    started = [e.turn_id for e in events if e.trajectory_id == "p3" and e.event == "model_started"]
    assert started == [0, 1]


def test_subagent_requests_carry_the_child_trajectory() -> None:
    """A wrapped ChatOpenAI in the subagent: its request names the child trajectory (and
    its turn 0), the caller's requests name the caller's."""
    fake = FakeOpenAI([[("research", {"question": "q"})], "found it", "done"], loop_last=False)

    def llm() -> ChatOpenAI:
        return wrap_chat_openai(
            ChatOpenAI(
                model="agentkv-tiny",
                base_url=fake.base_url,
                api_key="-",
                http_client=fake.sync_http(),
                max_retries=0,
            ),
            backend="vllm",
        )

    sub = _agent_graph(llm(), [], name="researcher")
    graph = _agent_graph(llm(), [_research_tool(sub)])
    handler = AgentKVCallbackHandler()
    with capture_events() as events:
        graph.invoke(
            {"messages": [("user", "go")]},
            {"configurable": {"thread_id": "p4"}, "callbacks": [handler]},
        )
    ids = [x["agentkv_trajectoryId"] for x in fake.xargs()]
    assert ids[0] == ids[2] == "p4"
    assert ids[1].startswith("p4/researcher-")
    assert [x["agentkv_turnId"] for x in fake.xargs()] == [0, 0, 1]
    child = [e for e in events if e.trajectory_id == ids[1]]
    assert [e.event for e in child] == ["model_started", "trajectory_finished"]
    assert all(e.parent_trajectory_id == "p4" for e in child)


def test_chain_run_in_a_tool_is_a_child_only_when_it_calls_a_model() -> None:
    """A tool running a runnable without a model leaves no child trajectory; a tool
    running a chain with a model call gets one (its turn is not the caller's)."""
    upper = RunnableLambda(lambda text: str(text).upper())
    summariser = RunnableLambda(lambda text: [("user", str(text))]) | _Fake(
        messages=iter([AIMessage("short")])
    )

    @tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return str(upper.invoke(text))

    @tool
    def summarise(text: str) -> str:
        """Summarise the text."""
        return str(summariser.with_config(run_name="summariser").invoke(text).content)

    turn = _calls(("shout", {"text": "hi"}))
    llm = _Fake(messages=iter([turn, _calls(("summarise", {"text": "x"})), AIMessage("done")]))
    graph = _agent_graph(llm, [shout, summarise])
    handler = AgentKVCallbackHandler(model_events=True)
    with capture_events() as events:
        graph.invoke(
            {"messages": [("user", "go")]},
            {"configurable": {"thread_id": "p5"}, "callbacks": [handler]},
        )
    child = [e for e in events if e.trajectory_id != "p5"]
    assert {e.trajectory_id.rsplit("-", 1)[0] for e in child} == {"p5/summariser"}
    assert [(e.turn_id, e.event) for e in child] == [
        (0, "model_started"),
        (0, "trajectory_finished"),
    ]
    assert _rows([e for e in events if e.trajectory_id == "p5"]) == [
        ("p5", 0, "model_started", None),
        ("p5", 0, "tool_started", "shout"),
        ("p5", 0, "tool_finished", "shout"),
        ("p5", 1, "model_started", None),
        ("p5", 1, "tool_started", "summarise"),
        ("p5", 1, "tool_finished", "summarise"),
        ("p5", 2, "model_started", None),
        ("p5", 2, "tool_started", "human"),
    ]


async def test_async_subagent_is_a_child_trajectory() -> None:
    """The same through ``ainvoke`` and an async tool awaiting the subagent."""
    sub = _agent_graph(_Fake(messages=iter([AIMessage("found it")])), [], name="researcher")

    @tool
    async def research(question: str) -> str:
        """Ask the research subagent."""
        out = await sub.ainvoke({"messages": [("user", question)]})
        return str(out["messages"][-1].content)

    llm = _Fake(messages=iter([_calls(("research", {"question": "q"})), AIMessage("done")]))
    graph = _agent_graph(llm, [research])
    handler = AgentKVCallbackHandler(model_events=True)
    with capture_events() as events:
        await graph.ainvoke(
            {"messages": [("user", "go")]},
            {"configurable": {"thread_id": "pa"}, "callbacks": [handler]},
        )
    child = [e for e in events if e.trajectory_id != "pa"]
    assert [e.event for e in child] == ["model_started", "trajectory_finished"]
    assert child[0].trajectory_id.startswith("pa/researcher-")
    assert all(e.parent_trajectory_id == "pa" for e in child)
    started = [e.turn_id for e in events if e.trajectory_id == "pa" and e.event == "model_started"]
    assert started == [0, 1]

"""LangGraph threads are conversations; the callback handler; structured output.

Against a real local HTTP server (``FakeOpenAI.serve()``: scripted chat completions and
an agentkv control route that records lifecycle events), with the real ``ChatOpenAI``,
LangGraph's stock ``ToolNode`` and ``create_agent``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.structured_output import ProviderStrategy
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel

import agentkv
from agentkv.client import _accounting, _lifecycle
from agentkv.client._lifecycle import LifecycleChannel
from agentkv.integrations.langgraph import (
    AgentKVCallbackHandler,
    AgentKVMiddleware,
    end_thread,
    watch_checkpointer,
    wrap_chat_openai,
)
from agentkv.testing import capture_events
from tests.support.integration_fakes import FakeOpenAI


@tool
def grep(pattern: str) -> str:
    """Search the code for a pattern."""
    return f"3 matches for {pattern}"


class Verdict(BaseModel):
    answer: str


@pytest.fixture
def channel() -> Iterator[LifecycleChannel]:
    ch = LifecycleChannel(timeout_s=0.5, max_attempts=1, flush_interval_s=0.0)
    _lifecycle.set_channel(ch)
    yield ch
    _lifecycle.reset_channel()


def serve(script: list[Any]) -> FakeOpenAI:
    fake = FakeOpenAI(script, loop_last=False)
    fake.serve()
    return fake


def llm_for(fake: FakeOpenAI) -> ChatOpenAI:
    return ChatOpenAI(model="agentkv-tiny", base_url=fake.base_url, api_key="-", max_retries=0)


def graph_with_stock_tool_node(llm: ChatOpenAI, checkpointer: Any) -> Any:
    bound = llm.bind_tools([grep])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([grep]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


TWO_RUNS = [[("grep", {"pattern": "a"})], "first", [("grep", {"pattern": "b"})], "second"]


def kinds(events: list[agentkv.TrajectoryEvent]) -> list[tuple[str, int, str, str | None]]:
    return [(e.trajectory_id, e.turn_id, e.event, e.tool_class) for e in events]


def test_handler_two_invokes_on_one_thread_are_one_trajectory(channel: LifecycleChannel) -> None:
    """Stock ToolNode + callbacks=[handler]: turns continue across invokes, the time
    between runs is the idle pseudo-tool, nothing is released until the thread ends."""
    fake = serve(TWO_RUNS)
    saver = watch_checkpointer(InMemorySaver())
    graph = graph_with_stock_tool_node(wrap_chat_openai(llm_for(fake)), saver)
    handler = AgentKVCallbackHandler(tool_classes={"grep": "search"})
    config: Any = {"configurable": {"thread_id": "conv-1"}, "callbacks": [handler]}
    try:
        with capture_events() as events:
            graph.invoke({"messages": [("user", "find a")]}, config)
            channel.flush(3)
            between = list(fake.events)
            graph.invoke({"messages": [("user", "find b")]}, config)
            channel.flush(3)
            saver.delete_thread("conv-1")  # the thread is deleted: the conversation ends
            channel.flush(3)
    finally:
        fake.close()
    assert kinds(events) == [
        ("conv-1", 0, "model_started", None),
        ("conv-1", 0, "tool_started", "search"),
        ("conv-1", 0, "tool_finished", "search"),
        ("conv-1", 1, "model_started", None),
        ("conv-1", 1, "tool_started", "human"),
        ("conv-1", 1, "tool_finished", "human"),
        ("conv-1", 2, "model_started", None),
        ("conv-1", 2, "tool_started", "search"),
        ("conv-1", 2, "tool_finished", "search"),
        ("conv-1", 3, "model_started", None),
        ("conv-1", 3, "tool_started", "human"),
        ("conv-1", 3, "tool_finished", "human"),
        ("conv-1", 3, "trajectory_finished", None),
    ]
    assert events[1].tool_call_id == "call_0"  # LangChain's tool call id
    assert [x["agentkv_trajectoryId"] for x in fake.xargs()] == ["conv-1"] * 4
    assert [x["agentkv_turnId"] for x in fake.xargs()] == [0, 1, 2, 3]
    assert not [e for e in between if e["event"] == "trajectory_finished"]  # no release
    assert [e["event"] for e in fake.events if e["event"].startswith("trajectory")] == [
        "trajectory_finished"
    ]


def test_middleware_two_invokes_on_one_thread_are_one_trajectory(
    channel: LifecycleChannel,
) -> None:
    fake = serve(TWO_RUNS)
    agent = create_agent(
        llm_for(fake),
        tools=[grep],
        middleware=[AgentKVMiddleware(tool_classes={"grep": "search"})],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "conv-mw"}}
    try:
        with capture_events() as events:
            agent.invoke({"messages": [("user", "find a")]}, config)
            agent.invoke({"messages": [("user", "find b")]}, config)
            channel.flush(3)
    finally:
        fake.close()
    started = [e.turn_id for e in events if e.event == "model_started"]
    assert started == [0, 1, 2, 3]
    assert {e.trajectory_id for e in events} == {"conv-mw"}
    assert not [e for e in events if e.event == "trajectory_finished"]
    assert not [e for e in fake.events if e["event"].startswith("trajectory")]
    assert end_thread("conv-mw") and not end_thread("conv-mw")


def test_idle_conversations_end_after_their_ttl(channel: LifecycleChannel) -> None:
    fake = serve(["one", "two"])
    graph = graph_with_stock_tool_node(wrap_chat_openai(llm_for(fake)), InMemorySaver())
    handler = AgentKVCallbackHandler(idle_ttl_s=0.0)
    try:
        with capture_events() as events:
            graph.invoke(
                {"messages": [("user", "hi")]},
                {"configurable": {"thread_id": "old"}, "callbacks": [handler]},
            )
            graph.invoke(
                {"messages": [("user", "hi")]},
                {"configurable": {"thread_id": "new"}, "callbacks": [handler]},
            )
    finally:
        fake.close()
    ended = [e.trajectory_id for e in events if e.event == "trajectory_finished"]
    assert ended == ["old"]


def test_structured_output_through_create_agent_carries_hints(channel: LifecycleChannel) -> None:
    fake = serve(['{"answer": "yes"}'])
    agent = create_agent(
        llm_for(fake),
        tools=[],
        response_format=ProviderStrategy(Verdict),
        middleware=[AgentKVMiddleware()],
    )
    try:
        out = agent.invoke({"messages": [("user", "ok?")]}, {"configurable": {"thread_id": "so"}})
    finally:
        fake.close()
    assert out["structured_response"] == Verdict(answer="yes")
    [(body, headers)] = fake.requests
    assert body["response_format"]["type"] == "json_schema"
    assert body["vllm_xargs"]["agentkv_trajectoryId"] == "so" and headers["x-session-id"] == "so"
    [rec] = _accounting.get_records("so")
    assert rec.prompt_tokens is not None and rec.cached_tokens is not None


def _salts(fake: FakeOpenAI) -> list[Any]:
    return [body.get("cache_salt") for body, _ in fake.requests]


def test_two_tenants_with_one_thread_id_are_two_conversations(channel: LifecycleChannel) -> None:
    """Two handlers of one process, tenants a and b, both on thread "1": b's model calls
    carry b's salt and start b's own conversation at turn 0; ending b's leaves a's."""
    from agentkv.prefix._namespace import CacheNamespace
    from agentkv.prefix._secret import install_secret

    fake = serve(["a0", "b0", "a1"])
    graph = graph_with_stock_tool_node(wrap_chat_openai(llm_for(fake)), InMemorySaver())
    ha, hb = AgentKVCallbackHandler(tenant="a"), AgentKVCallbackHandler(tenant="b")
    try:
        with capture_events() as events:
            for handler in (ha, hb, ha):
                graph.invoke(
                    {"messages": [("user", "hi")]},
                    {"configurable": {"thread_id": "1"}, "callbacks": [handler]},
                )
            assert end_thread("1", tenant="b") and not end_thread("1", tenant="b")
            channel.flush(3)
    finally:
        fake.close()
    def salt(tenant: str) -> str:
        return CacheNamespace().cache_salt(tenant, secret=install_secret())

    assert _salts(fake) == [salt("a"), salt("b"), salt("a")]
    started = [(e.tenant, e.turn_id) for e in events if e.event == "model_started"]
    assert started == [("a", 0), ("b", 0), ("a", 1)]
    finished = [e.tenant for e in events if e.event == "trajectory_finished"]
    assert finished == ["b"]


def test_middleware_keeps_tenants_apart_on_one_thread_id(channel: LifecycleChannel) -> None:
    fake = serve(["a0", "b0", "a1"])
    agents = {
        t: create_agent(
            llm_for(fake),
            tools=[grep],
            middleware=[AgentKVMiddleware(tenant=t)],
            checkpointer=InMemorySaver(),
        )
        for t in ("a", "b")
    }
    config: Any = {"configurable": {"thread_id": "1"}}
    try:
        with capture_events() as events:
            for t in ("a", "b", "a"):
                agents[t].invoke({"messages": [("user", "hi")]}, config)
    finally:
        fake.close()
    started = [(e.tenant, e.turn_id) for e in events if e.event == "model_started"]
    assert started == [("a", 0), ("b", 0), ("a", 1)]
    assert end_thread("1", tenant="a") and end_thread("1", tenant="b")

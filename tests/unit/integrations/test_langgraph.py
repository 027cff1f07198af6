"""LangGraph / LangChain v1 integration against a scripted OpenAI-compatible endpoint.

The endpoint (tests/support/integration_fakes.py) runs in memory; the real ``ChatOpenAI`` and
``openai`` clients build the requests, so the tests read exactly what would go on the
wire. The same agent against a real vLLM server is in tests/server/test_integrations.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

import agentkv
from agentkv.integrations.langgraph import (
    STATE_KEY,
    AgentKVMiddleware,
    graph_trajectory,
    tool_node,
    trajectory_id_for,
    wrap_chat_openai,
)
from agentkv.testing import capture_events
from tests.support.integration_fakes import FakeOpenAI


@tool
def grep(pattern: str) -> str:
    """Search the code for a pattern."""
    return f"3 matches for {pattern}"


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


CLASSES = {"grep": "search", "read_file": "file_read"}


def _llm(fake: FakeOpenAI, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model="agentkv-tiny",
        base_url=fake.base_url,
        api_key="-",
        http_client=fake.sync_http(),
        http_async_client=fake.async_http(),
        max_retries=0,
        **kwargs,
    )


def _script() -> list[Any]:
    return [
        [("grep", {"pattern": "TODO"})],
        [("read_file", {"path": "a.py"}), ("grep", {"pattern": "FIXME"})],  # parallel
        "done",
    ]


def _summary(events: list[agentkv.TrajectoryEvent]) -> list[tuple[str, int, str, str | None]]:
    return [(e.trajectory_id, e.turn_id, e.event, e.tool_class) for e in events]


def _check_run(events: list[agentkv.TrajectoryEvent], fake: FakeOpenAI, thread: str) -> None:
    kinds = _summary(events)
    assert kinds[0] == (thread, 0, "model_started", None)
    assert kinds[1:3] == [
        (thread, 0, "tool_started", "search"),
        (thread, 0, "tool_finished", "search"),
    ]
    assert kinds[3] == (thread, 1, "model_started", None)
    parallel = kinds[4:8]
    assert sorted(k[3] for k in parallel if k[2] == "tool_started") == ["file_read", "search"]
    assert sorted(k[3] for k in parallel if k[2] == "tool_finished") == ["file_read", "search"]
    assert kinds[8:] == [
        (thread, 2, "model_started", None),
        (thread, 2, "tool_started", "human"),  # the conversation waits for its next run
    ]
    assert all(e.trajectory_id == thread for e in events)
    xargs = fake.xargs()
    assert [x["agentkv_trajectoryId"] for x in xargs] == [thread] * 3
    assert [x["agentkv_turnId"] for x in xargs] == [0, 1, 2]
    assert all(h["x-session-id"] == thread for _, h in fake.requests)


def test_middleware_maps_thread_tools_and_turns_sync() -> None:
    """thread_id is the trajectory id, tools carry their class, turns advance per model call."""
    fake = FakeOpenAI(_script())
    agent = create_agent(
        _llm(fake),
        tools=[grep, read_file],
        middleware=[AgentKVMiddleware(tool_classes=CLASSES, backend="vllm")],
        checkpointer=InMemorySaver(),
    )
    with capture_events() as events:
        out = agent.invoke(
            {"messages": [{"role": "user", "content": "find todos"}]},
            {"configurable": {"thread_id": "thread-sync"}},
        )
    assert out["messages"][-1].content == "done"
    assert STATE_KEY not in out  # private state stays private
    _check_run(events, fake, "thread-sync")


async def test_middleware_maps_thread_tools_and_turns_async() -> None:
    """The async twins give the same events for an async graph."""
    fake = FakeOpenAI(_script())
    agent = create_agent(
        _llm(fake),
        tools=[grep, read_file],
        middleware=[AgentKVMiddleware(tool_classes=CLASSES, backend="vllm")],
        checkpointer=InMemorySaver(),
    )
    with capture_events() as events:
        await agent.ainvoke(
            {"messages": [{"role": "user", "content": "find todos"}]},
            {"configurable": {"thread_id": "thread-async"}},
        )
    _check_run(events, fake, "thread-async")


def test_chat_openai_extra_body_is_merged_not_replaced() -> None:
    """The model's own extra_body (vllm_xargs keys included) survives next to the hints."""
    fake = FakeOpenAI(["ok"])
    llm = _llm(fake, extra_body={"top_k": 3, "vllm_xargs": {"mine": 7}})
    agent = create_agent(llm, tools=[], middleware=[AgentKVMiddleware(backend="vllm")])
    agent.invoke(
        {"messages": [{"role": "user", "content": "hi"}]}, {"configurable": {"thread_id": "m-1"}}
    )
    body, headers = fake.requests[0]
    assert body["top_k"] == 3
    assert body["vllm_xargs"]["mine"] == 7
    assert body["vllm_xargs"]["agentkv_trajectoryId"] == "m-1"
    assert body["session_id"] == "m-1"
    assert headers["x-request-id"].startswith("agentkv-m-1-0-")


def test_per_call_extra_body_is_merged_too() -> None:
    """A per-call extra_body (bind) keeps its keys; agentkv adds its own under them."""
    fake = FakeOpenAI(["ok"])
    llm = wrap_chat_openai(_llm(fake), backend="vllm")
    with agentkv.trajectory("bound-1"):
        llm.bind(extra_body={"vllm_xargs": {"agentkv_turnId": 99, "x": "y"}}).invoke("hi")
    xargs = fake.xargs()[0]
    assert xargs["x"] == "y" and xargs["agentkv_trajectoryId"] == "bound-1"
    assert xargs["agentkv_turnId"] == 99  # the caller's value wins


def test_run_without_thread_id_gets_a_generated_id() -> None:
    """No checkpointer and no thread_id: the run is still one trajectory (lg-<uuid>)."""
    fake = FakeOpenAI([[("grep", {"pattern": "x"})], "done"])
    agent = create_agent(_llm(fake), tools=[grep], middleware=[AgentKVMiddleware(backend="vllm")])
    with capture_events() as events:
        agent.invoke({"messages": [{"role": "user", "content": "hi"}]})
    ids = {e.trajectory_id for e in events}
    assert len(ids) == 1 and next(iter(ids)).startswith("lg-")
    assert events[-1].event == "trajectory_finished"


def test_user_trajectory_around_invoke_is_used_and_left_open() -> None:
    """A trajectory the caller opened wins over thread_id and is ended by the caller."""
    fake = FakeOpenAI(["done"])
    agent = create_agent(_llm(fake), tools=[], middleware=[AgentKVMiddleware(backend="vllm")])
    with capture_events() as events, agentkv.trajectory("mine") as traj:
        agent.invoke(
            {"messages": [{"role": "user", "content": "hi"}]}, {"configurable": {"thread_id": "t"}}
        )
        assert not traj.finished
    assert [(e.trajectory_id, e.event) for e in events] == [
        ("mine", "model_started"),
        ("mine", "trajectory_finished"),
    ]


class _ToolCallingFake(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def test_subagent_called_from_a_tool_is_a_child_trajectory() -> None:
    """A create_agent graph invoked inside a tool call becomes a child of the caller."""
    sub = create_agent(
        _ToolCallingFake(messages=iter([AIMessage(content="found it")])),
        tools=[],
        middleware=[AgentKVMiddleware()],
        name="researcher",
    )

    @tool
    def research(question: str) -> str:
        """Ask the research subagent."""
        out = sub.invoke({"messages": [{"role": "user", "content": question}]})
        return str(out["messages"][-1].content)

    script = [
        AIMessage(
            content="", tool_calls=[{"name": "research", "args": {"question": "q"}, "id": "c1"}]
        )
    ]
    script.append(AIMessage(content="done"))
    agent = create_agent(
        _ToolCallingFake(messages=iter(script)),
        tools=[research],
        middleware=[AgentKVMiddleware(tool_classes={"research": "subagent"})],
        checkpointer=InMemorySaver(),
    )
    with capture_events() as events:
        agent.invoke(
            {"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "p"}}
        )
    child = [e for e in events if e.trajectory_id != "p"]
    assert child and all(e.parent_trajectory_id == "p" for e in child)
    assert child[0].trajectory_id.startswith("p/researcher-")
    assert [e.event for e in child] == ["model_started", "trajectory_finished"]
    # The child ran entirely inside the parent's tool call.
    kinds = [(e.trajectory_id == "p", e.event) for e in events]
    start = kinds.index((True, "tool_started"))
    end = kinds.index((True, "tool_finished"))
    assert all(start < events.index(e) < end for e in child)


def test_model_error_ends_the_trajectory_with_error() -> None:
    """An exception leaving the model call propagates and ends the run with status error."""

    class Broken(_ToolCallingFake):
        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("model down")

    agent = create_agent(Broken(messages=iter([])), tools=[], middleware=[AgentKVMiddleware()])
    with capture_events() as events, pytest.raises(RuntimeError, match="model down"):
        agent.invoke(
            {"messages": [{"role": "user", "content": "hi"}]}, {"configurable": {"thread_id": "e"}}
        )
    assert [(e.event, e.status) for e in events] == [
        ("model_started", None),
        ("trajectory_finished", "error"),
    ]


def test_decorated_tools_are_not_counted_twice() -> None:
    """A tool already decorated with @agentkv.tool keeps its own single event pair."""

    @tool
    @agentkv.tool(tool_class="shell")
    def run(cmd: str) -> str:
        """Run a command."""
        return "ok"

    script = [AIMessage(content="", tool_calls=[{"name": "run", "args": {"cmd": "ls"}, "id": "c"}])]
    script.append(AIMessage(content="done"))
    agent = create_agent(
        _ToolCallingFake(messages=iter(script)), tools=[run], middleware=[AgentKVMiddleware()]
    )
    with capture_events() as events:
        agent.invoke({"messages": [{"role": "user", "content": "hi"}]})
    tools = [(e.event, e.tool_class) for e in events if e.event.startswith("tool_")]
    assert tools == [("tool_started", "shell"), ("tool_finished", "shell")]


def _custom_graph(fake: FakeOpenAI) -> Any:
    llm = wrap_chat_openai(_llm(fake), backend="vllm").bind_tools([grep, read_file])

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", tool_node([grep, read_file], tool_classes=CLASSES))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile()


def test_tool_node_in_a_hand_built_graph() -> None:
    """tool_node + graph_trajectory instrument a custom StateGraph (sync, parallel calls)."""
    fake = FakeOpenAI([[("grep", {"pattern": "a"}), ("read_file", {"path": "b"})], "done"])
    graph = _custom_graph(fake)
    config = {"configurable": {"thread_id": "custom-1"}}
    assert trajectory_id_for(config) == "custom-1"
    with capture_events() as events, graph_trajectory(config):
        graph.invoke({"messages": [{"role": "user", "content": "hi"}]}, config)
    kinds = [(e.event, e.tool_class) for e in events]
    assert kinds[0] == ("model_started", None)
    assert sorted(c for k, c in kinds if k == "tool_started") == ["file_read", "search"]
    assert kinds[-2:] == [("model_started", None), ("trajectory_finished", None)]
    assert {e.trajectory_id for e in events} == {"custom-1"}
    assert [x["agentkv_turnId"] for x in fake.xargs()] == [0, 1]


def test_hand_built_graph_outside_a_trajectory_runs_plainly() -> None:
    """Without a trajectory: no events, no hints, and the graph still works."""
    fake = FakeOpenAI([[("grep", {"pattern": "a"})], "done"])
    with capture_events() as events:
        out = _custom_graph(fake).invoke({"messages": [{"role": "user", "content": "hi"}]})
    assert out["messages"][-1].content == "done"
    assert out["messages"][-2].content == "3 matches for a"
    assert events == []
    assert fake.xargs() == [{}, {}]


def test_other_chat_models_get_turn_events() -> None:
    """A non-OpenAI chat model still advances turns (no hints to attach)."""
    agent = create_agent(
        _ToolCallingFake(messages=iter([AIMessage(content="hi")])),
        tools=[],
        middleware=[AgentKVMiddleware()],
    )
    with capture_events() as events:
        agent.invoke(
            {"messages": [{"role": "user", "content": "hi"}]}, {"configurable": {"thread_id": "o"}}
        )
    assert [(e.turn_id, e.event) for e in events] == [
        (0, "model_started"),
        (0, "tool_started"),  # the idle pseudo-tool: the thread's conversation waits
    ]


def test_import_agentkv_does_not_import_langgraph() -> None:
    """The integration is imported only on demand."""
    import subprocess
    import sys

    code = "import sys, agentkv; agentkv.trajectory; print('langgraph' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""The LangGraph and Agents SDK adapters against a real vLLM server (tiny model): ``server``.

A random-weight model never decides to call a tool, so both agents follow a *scripted
tool plan*: every model call really goes to the server (with agentkv's hints), then the
harness replaces the answer's tool calls with the next planned step. The tools, the
events, the hints and the server's counters are all real.

Uses the shared ``agentkv_server`` fixture (tests/support/server_fixtures.py): one server for
the whole session.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import agentkv
from agentkv.client import _accounting
from agentkv.testing import capture_events
from agentkv.vllm._control import STATS_MAX_AGE_S

pytestmark = pytest.mark.server

SYSTEM = "You are a careful coding agent. Use the tools to inspect the repository. " * 8
CLASSES = {"grep": "search", "read_file": "file_read"}
PLAN: list[list[tuple[str, dict[str, Any]]] | None] = [
    [("grep", {"pattern": "TODO"})],
    [("read_file", {"path": "a.py"}), ("grep", {"pattern": "FIXME"})],  # parallel
    [("read_file", {"path": "b.py"})],
    None,  # final answer
]


@pytest.fixture
def server(agentkv_server: Any) -> Any:
    """The session's shared agentkv-profile server (tests/support/server_fixtures.py)."""
    return agentkv_server


@pytest.fixture(autouse=True)
def _fresh_accounting() -> Iterator[None]:
    _accounting.reset()
    yield


def _stats(server: Any) -> dict[str, Any]:

    agentkv.flush(5)
    time.sleep(STATS_MAX_AGE_S + 0.1)  # the route's snapshot is up to this old
    out: dict[str, Any] = httpx.get(server.base_url + "/agentkv/v1/stats", timeout=10).json()
    return out


def _check(events: list[agentkv.TrajectoryEvent], trajectory_id: str) -> None:
    mine = [e for e in events if e.trajectory_id == trajectory_id]
    turns = [e.turn_id for e in mine if e.event == "model_started"]
    assert turns == [0, 1, 2, 3]
    started = [
        (e.turn_id, e.tool_class)
        for e in mine
        if e.event == "tool_started" and e.tool_class != "human"
    ]
    assert sorted(started) == [(0, "search"), (1, "file_read"), (1, "search"), (2, "file_read")]
    # the run's end paused the conversation; ending it explicitly finished it
    assert [(e.event, e.tool_class) for e in mine[-3:]] == [
        ("tool_started", "human"),
        ("tool_finished", "human"),
        ("trajectory_finished", None),
    ]
    assert mine[-1].status == "ok"
    records = _accounting.get_records(trajectory_id)
    assert [r.turn_id for r in records] == [0, 1, 2, 3]
    assert all(r.cached_tokens is not None for r in records)
    stats = agentkv.stats()
    assert stats.prefix_reuse_ratio is not None
    print(f"{trajectory_id}: prefix_reuse_ratio={stats.prefix_reuse_ratio:.2f}")


def test_langgraph_agent_on_the_real_server(server: Any) -> None:
    """A create_agent graph with two tools runs four steps; hints and events reach the server."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    from agentkv.integrations.langgraph import AgentKVMiddleware, end_thread

    @tool
    def grep(pattern: str) -> str:
        """Search the repository for a pattern."""
        return f"src/a.py:3: {pattern} handle the empty case"

    @tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        return f"# {path}\ndef f(x):\n    return x\n"

    ids = itertools.count()
    plan = list(PLAN)

    class ScriptedToolPlan(AgentMiddleware):  # type: ignore[type-arg]
        """Send the real request, then take the tool calls from the plan."""

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            # "none": the tools stay in the prompt; the server runs without a tool parser.
            response = handler(request.override(tool_choice="none"))
            step = plan.pop(0) if plan else None
            real = response.result[0]
            calls = [
                {"name": n, "args": a, "id": f"call-{next(ids)}", "type": "tool_call"}
                for n, a in step or []
            ]
            response.result[0] = AIMessage(
                content="" if calls else str(real.content),
                tool_calls=calls,
                usage_metadata=real.usage_metadata,
            )
            return response

    llm = ChatOpenAI(
        model=server.model,
        base_url=server.openai_base_url,
        api_key="-",
        max_tokens=4,
        temperature=0,
    )
    agent = create_agent(
        llm,
        tools=[grep, read_file],
        system_prompt=SYSTEM,
        middleware=[AgentKVMiddleware(tool_classes=CLASSES), ScriptedToolPlan()],
        checkpointer=InMemorySaver(),
    )
    before = _stats(server)
    with capture_events() as events:
        agent.invoke(
            {"messages": [{"role": "user", "content": "find and fix the TODOs"}]},
            {"configurable": {"thread_id": "lg-server-1"}},
        )
        assert end_thread("lg-server-1")
    after = _stats(server)
    _check(events, "lg-server-1")
    assert after["hints_received"] >= before["hints_received"] + 4
    assert after["events_received"] > before["events_received"]


async def test_openai_agents_on_the_real_server(server: Any) -> None:
    """An Agents SDK agent with two tools runs four steps; hints and events reach the server."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        function_tool,
        set_trace_processors,
    )
    from agents.models.interface import Model
    from openai import AsyncOpenAI
    from openai.types.responses import ResponseFunctionToolCall

    from agentkv.integrations.openai_agents import AgentKVTracingProcessor, end_conversation

    @function_tool
    def grep(pattern: str) -> str:
        """Search the repository for a pattern."""
        return f"src/a.py:3: {pattern} handle the empty case"

    @function_tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        return f"# {path}\ndef f(x):\n    return x\n"

    plan = list(PLAN)
    ids = itertools.count()

    class ScriptedToolPlan(Model):
        """Send the real request, then take the tool calls from the plan."""

        def __init__(self, inner: Model) -> None:
            self.inner = inner

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            response = await self.inner.get_response(*args, **kwargs)
            step = plan.pop(0) if plan else None
            if step:
                response.output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        call_id=f"call-{next(ids)}",
                        name=name,
                        arguments=json.dumps(args),
                    )
                    for name, args in step
                ]
            return response

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("this test does not stream")

    client = agentkv.wrap_openai(AsyncOpenAI(base_url=server.openai_base_url, api_key="-"))
    model = ScriptedToolPlan(OpenAIChatCompletionsModel(model=server.model, openai_client=client))
    agent = Agent(
        name="coder",
        instructions=SYSTEM,
        model=model,
        tools=[grep, read_file],
        # "none": the tools stay in the prompt; the server runs without a tool parser.
        model_settings=ModelSettings(max_tokens=4, temperature=0, tool_choice="none"),
        reset_tool_choice=False,  # keep "none" after tool calls
    )
    set_trace_processors([AgentKVTracingProcessor(tool_classes=CLASSES)])
    try:
        before = _stats(server)
        with capture_events() as events:
            await Runner.run(
                agent, "find and fix the TODOs", run_config=RunConfig(group_id="oa-server-1")
            )
            assert end_conversation("oa-server-1")
        after = _stats(server)
    finally:
        set_trace_processors([])
        await client.close()
    _check(events, "oa-server-1")
    assert after["hints_received"] >= before["hints_received"] + 4
    assert after["events_received"] > before["events_received"]

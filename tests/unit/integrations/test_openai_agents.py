"""OpenAI Agents SDK integration against a scripted OpenAI-compatible endpoint.

The SDK's own ``OpenAIChatCompletionsModel`` drives an ``AsyncOpenAI`` client wrapped
with ``agentkv.wrap_openai``; the endpoint runs in memory (tests/support/integration_fakes.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_trace_processors,
)

import agentkv
from agentkv.integrations.openai_agents import AgentKVRunHooks, AgentKVTracingProcessor
from agentkv.testing import capture_events
from tests.support.integration_fakes import FakeOpenAI


@function_tool
def grep(pattern: str) -> str:
    """Search the code for a pattern."""
    return f"3 matches for {pattern}"


@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


CLASSES = {"grep": "search", "read_file": "file_read"}


@pytest.fixture
def processor() -> Iterator[AgentKVTracingProcessor]:
    """Only agentkv's processor (no export to OpenAI), restored afterwards."""
    proc = AgentKVTracingProcessor(tool_classes=CLASSES)
    set_trace_processors([proc])
    try:
        yield proc
    finally:
        set_trace_processors([])


def _model(fake: FakeOpenAI, *, wrap: bool = True) -> OpenAIChatCompletionsModel:
    client = fake.async_openai()
    if wrap:
        client = agentkv.wrap_openai(client, backend="vllm")
    return OpenAIChatCompletionsModel(model="agentkv-tiny", openai_client=client)


def _agent(fake: FakeOpenAI, **kwargs: Any) -> Agent[Any]:
    return Agent(name="coder", instructions="You fix bugs.", model=_model(fake), **kwargs)


SCRIPT: list[Any] = [
    [("grep", {"pattern": "TODO"})],
    [("read_file", {"path": "a.py"}), ("grep", {"pattern": "FIXME"})],
    "done",
]


async def test_processor_maps_group_id_tools_and_turns(processor: AgentKVTracingProcessor) -> None:
    """group_id is the trajectory id; tool spans are tool events with classes; turns advance."""
    fake = FakeOpenAI(list(SCRIPT))
    agent = _agent(fake, tools=[grep, read_file])
    with capture_events() as events:
        result = await Runner.run(agent, "fix it", run_config=RunConfig(group_id="conv-1"))
    assert result.final_output == "done"
    kinds = [(e.trajectory_id, e.turn_id, e.event, e.tool_class) for e in events]
    assert kinds[:3] == [
        ("conv-1", 0, "model_started", None),
        ("conv-1", 0, "tool_started", "search"),
        ("conv-1", 0, "tool_finished", "search"),
    ]
    assert kinds[3] == ("conv-1", 1, "model_started", None)
    assert sorted(k[3] for k in kinds[4:8] if k[2] == "tool_started") == ["file_read", "search"]
    assert kinds[8:] == [
        ("conv-1", 2, "model_started", None),
        ("conv-1", 2, "tool_started", "human"),  # a group is a conversation: it waits
    ]
    assert [x["agentkv_trajectoryId"] for x in fake.xargs()] == ["conv-1"] * 3
    assert [x["agentkv_turnId"] for x in fake.xargs()] == [0, 1, 2]


async def test_agent_as_tool_is_a_child_trajectory(processor: AgentKVTracingProcessor) -> None:
    """An agent run from inside a tool call is a child trajectory of the caller."""
    fake = FakeOpenAI([[("ask", {"input": "why"})], "sub answer", "done"])
    sub = Agent(name="researcher", instructions="You research.", model=_model(fake))
    main = _agent(fake, tools=[sub.as_tool(tool_name="ask", tool_description="Ask research.")])
    with capture_events() as events:
        await Runner.run(main, "go", run_config=RunConfig(group_id="conv-2"))
    child = [e for e in events if e.trajectory_id != "conv-2"]
    assert child and {e.parent_trajectory_id for e in child} == {"conv-2"}
    assert [e.event for e in child] == ["model_started", "trajectory_finished"]
    child_xargs = [x for x in fake.xargs() if x["agentkv_trajectoryId"] != "conv-2"]
    assert [x["agentkv_parentTrajectoryId"] for x in child_xargs] == ["conv-2"]
    parent_turns = [
        e.turn_id for e in events if e.trajectory_id == "conv-2" and e.event == "model_started"
    ]
    assert parent_turns == [0, 1]


async def test_trace_id_is_used_without_group_id(processor: AgentKVTracingProcessor) -> None:
    """Without a group_id the trajectory id is the SDK's trace id."""
    fake = FakeOpenAI(["done"])
    with capture_events() as events:
        await Runner.run(_agent(fake), "hi")
    assert events[0].trajectory_id.startswith("trace_")
    assert events[-1].event == "trajectory_finished"


async def test_user_trajectory_is_used_and_left_open(processor: AgentKVTracingProcessor) -> None:
    """A trajectory opened around Runner.run is used as is and ended by its owner."""
    fake = FakeOpenAI(["done"])
    with capture_events() as events:
        async with agentkv.trajectory("mine") as traj:
            await Runner.run(_agent(fake), "hi", run_config=RunConfig(group_id="ignored"))
            assert not traj.finished
    assert [(e.trajectory_id, e.event) for e in events] == [
        ("mine", "model_started"),
        ("mine", "trajectory_finished"),
    ]


async def test_failed_run_ends_with_error(processor: AgentKVTracingProcessor) -> None:
    """A run that raises ends its trajectory with status error; the exception propagates."""
    fake = FakeOpenAI(["done"])
    fake.handler = lambda request: (_ for _ in ()).throw(RuntimeError("endpoint down"))  # type: ignore[method-assign]
    with capture_events() as events, pytest.raises(Exception, match="endpoint down"):
        await Runner.run(_agent(fake), "hi", run_config=RunConfig(group_id="conv-err"))
    assert events[-1].event == "trajectory_finished"
    assert events[-1].status == "error"
    assert agentkv.current_trajectory() is None


async def test_model_events_for_an_unwrapped_client(processor: AgentKVTracingProcessor) -> None:
    """With model_events=True generation spans advance the turn (no client wrapper)."""
    processor.model_events = True
    fake = FakeOpenAI([[("grep", {"pattern": "x"})], "done"])
    agent = Agent(name="a", instructions="i", model=_model(fake, wrap=False), tools=[grep])
    with capture_events() as events:
        await Runner.run(agent, "hi", run_config=RunConfig(group_id="conv-raw"))
    assert [(e.turn_id, e.event) for e in events if e.event == "model_started"] == [
        (0, "model_started"),
        (1, "model_started"),
    ]
    assert fake.xargs() == [{}, {}]  # no wrapper: no hints


async def test_run_hooks_inside_a_user_trajectory() -> None:
    """AgentKVRunHooks emit tool events on the caller's trajectory (tracing off)."""
    fake = FakeOpenAI([[("grep", {"pattern": "x"}), ("read_file", {"path": "y"})], "done"])
    agent = _agent(fake, tools=[grep, read_file])
    with capture_events() as events:
        async with agentkv.trajectory("hooked"):
            await Runner.run(
                agent,
                "hi",
                hooks=AgentKVRunHooks(tool_classes=CLASSES),
                run_config=RunConfig(tracing_disabled=True),
            )
    tools = sorted((e.event, e.tool_class) for e in events if e.event.startswith("tool_"))
    assert tools == [
        ("tool_finished", "file_read"),
        ("tool_finished", "search"),
        ("tool_started", "file_read"),
        ("tool_started", "search"),
    ]
    assert {e.trajectory_id for e in events} == {"hooked"}
    assert [x["agentkv_turnId"] for x in fake.xargs()] == [0, 1]


async def test_run_hooks_outside_a_trajectory_do_nothing() -> None:
    """Without a trajectory the hooks are silent and the run is unaffected."""
    fake = FakeOpenAI([[("grep", {"pattern": "x"})], "done"])
    with capture_events() as events:
        result = await Runner.run(
            _agent(fake, tools=[grep]),
            "hi",
            hooks=AgentKVRunHooks(model_events=True),
            run_config=RunConfig(tracing_disabled=True),
        )
    assert result.final_output == "done"
    assert events == []

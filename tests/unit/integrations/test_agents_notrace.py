"""The Agents SDK with tracing disabled: the model provider wrapper and group conversations.

Against a real local HTTP server (``FakeOpenAI.serve()``) with the SDK's own
``OpenAIProvider`` (Chat Completions) behind :class:`AgentKVModelProvider`.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_trace_processors
from agents.models.openai_provider import OpenAIProvider
from openai import AsyncOpenAI

from agentkv.integrations.openai_agents import (
    AgentKVModelProvider,
    AgentKVRunHooks,
    AgentKVTracingProcessor,
    conversation,
    end_conversation,
)
from agentkv.testing import capture_events
from tests.support.integration_fakes import FakeOpenAI


@function_tool
def grep(pattern: str) -> str:
    """Search the code for a pattern."""
    return f"3 matches for {pattern}"


_clients: list[AsyncOpenAI] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> Any:
    yield
    while _clients:
        await _clients.pop().close()


def provider_for(fake: FakeOpenAI) -> AgentKVModelProvider:
    client = AsyncOpenAI(base_url=fake.base_url, api_key="-", max_retries=0)
    _clients.append(client)
    return AgentKVModelProvider(OpenAIProvider(openai_client=client, use_responses=False))


async def test_two_runs_of_a_group_without_tracing_are_one_trajectory() -> None:
    fake = FakeOpenAI([[("grep", {"pattern": "a"})], "first", "second"], loop_last=False)
    fake.serve()
    agent = Agent(name="coder", instructions="Fix.", tools=[grep], model="agentkv-tiny")
    config = RunConfig(model_provider=provider_for(fake), tracing_disabled=True)
    hooks = AgentKVRunHooks(tool_classes={"grep": "search"})
    try:
        with capture_events() as events:
            async with conversation("group-1"):
                await Runner.run(agent, "one", run_config=config, hooks=hooks)
            async with conversation("group-1"):
                await Runner.run(agent, "two", run_config=config, hooks=hooks)
            assert end_conversation("group-1")
    finally:
        fake.close()
    summary = [(e.turn_id, e.event, e.tool_class) for e in events]
    assert summary == [
        (0, "model_started", None),
        (0, "tool_started", "search"),
        (0, "tool_finished", "search"),
        (1, "model_started", None),
        (1, "tool_started", "human"),
        (1, "tool_finished", "human"),
        (2, "model_started", None),
        (2, "tool_started", "human"),
        (2, "tool_finished", "human"),
        (2, "trajectory_finished", None),
    ]
    assert [x["agentkv_trajectoryId"] for x in fake.xargs()] == ["group-1"] * 3
    assert [x["agentkv_turnId"] for x in fake.xargs()] == [0, 1, 2]


async def test_processor_with_tracing_off_warns(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeOpenAI(["done"])
    fake.serve()
    processor = AgentKVTracingProcessor()
    set_trace_processors([processor])
    agent = Agent(name="coder", instructions="Fix.", model="agentkv-tiny")
    config: Any = RunConfig(model_provider=provider_for(fake), tracing_disabled=True)
    try:
        with caplog.at_level(logging.WARNING, logger="agentkv"):
            await Runner.run(agent, "hi", run_config=config)
    finally:
        set_trace_processors([])
        fake.close()
    assert "tracing disabled" in caplog.text


async def test_two_tenants_with_one_group_id_are_two_conversations() -> None:
    """Tenants a and b of one process both run group "g": each run carries its own
    tenant's salt and continues only its own tenant's turns; ending needs the tenant
    once the id is ambiguous."""
    from agentkv.prefix._namespace import CacheNamespace
    from agentkv.prefix._secret import install_secret

    fake = FakeOpenAI(["a0", "b0", "a1"], loop_last=False)
    fake.serve()
    agent = Agent(name="coder", instructions="Fix.", model="agentkv-tiny")
    config = RunConfig(model_provider=provider_for(fake), tracing_disabled=True)
    try:
        with capture_events() as events:
            for tenant in ("a", "b", "a"):
                async with conversation("g", tenant=tenant):
                    await Runner.run(agent, "hi", run_config=config)
            assert not end_conversation("g")  # two tenants hold "g": neither is guessed
            assert end_conversation("g", tenant="b") and end_conversation("g", tenant="a")
    finally:
        fake.close()
    def salt(tenant: str) -> str:
        return CacheNamespace().cache_salt(tenant, secret=install_secret())

    salts = [body.get("cache_salt") for body, _ in fake.requests]
    assert salts == [salt("a"), salt("b"), salt("a")]
    started = [(e.tenant, e.turn_id) for e in events if e.event == "model_started"]
    assert started == [("a", 0), ("b", 0), ("a", 1)]


async def test_provider_without_a_conversation_warns_once_why_no_hints_are_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tracing off, no processor, no ``conversation()``: no trajectory, so no hints; one
    warning says so and how to fix it (not one per model call)."""
    fake = FakeOpenAI(["done"])
    fake.serve()
    agent = Agent(name="coder", instructions="Fix.", model="agentkv-tiny")
    config = RunConfig(model_provider=provider_for(fake), tracing_disabled=True, group_id="g-9")
    try:
        with caplog.at_level(logging.WARNING, logger="agentkv"):
            await Runner.run(agent, "hi", run_config=config)
            await Runner.run(agent, "again", run_config=config)
    finally:
        fake.close()
    assert fake.xargs() == [{}, {}]  # no trajectory: nothing was hinted
    warnings = [r for r in caplog.records if "outside any trajectory" in r.getMessage()]
    assert len(warnings) == 1 and "conversation(group_id)" in warnings[0].getMessage()

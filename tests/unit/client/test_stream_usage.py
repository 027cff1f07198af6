"""Streams record usage on every path, and the caller's stream stays as it was.

vLLM (like OpenAI) sends stream usage only when ``stream_options.include_usage`` is set,
in one extra chunk without choices. The wrapper asks for it when the caller did not and
takes that chunk out of the caller's stream again. Real clients (openai, ChatOpenAI in a
LangGraph agent, the Agents SDK) talk to a local HTTP server that streams the way vLLM
does (tests/support/integration_fakes.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import agentkv
from agentkv.client import _accounting
from tests.support.integration_fakes import FakeOpenAI

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(["hello there"])
    server.serve()
    try:
        yield server
    finally:
        server.close()


def _client(fake: FakeOpenAI) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=fake.base_url, api_key="-", max_retries=0)


def _chunks(stream: Any) -> list[dict[str, Any]]:
    return [c.model_dump(exclude={"id"}) for c in stream]


def test_create_stream_records_prompt_and_cached_tokens_and_hides_the_usage_chunk(
    fake: FakeOpenAI,
) -> None:
    plain = _chunks(
        _client(fake).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    )
    client = agentkv.wrap_openai(_client(fake), backend="vllm")
    with agentkv.trajectory("t-stream-usage"):
        wrapped = _chunks(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert wrapped == plain  # the caller's stream, as it would have been
    assert all(c["choices"] for c in wrapped)
    body = fake.requests[-1][0]
    assert body["stream_options"] == {"include_usage": True}
    (rec,) = _accounting.get_records("t-stream-usage")
    assert rec.streamed and (rec.prompt_tokens, rec.cached_tokens) == (50, 30)


def test_a_caller_asking_for_usage_keeps_its_chunk_and_its_other_stream_options(
    fake: FakeOpenAI,
) -> None:
    client = agentkv.wrap_openai(_client(fake), backend="vllm")
    with agentkv.trajectory("t-own-usage"):
        own = _chunks(
            client.chat.completions.create(
                model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            )
        )
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": False, "continuous_usage_stats": False},
        ).close()
    assert own[-1]["choices"] == [] and own[-1]["usage"]["prompt_tokens"] == 50
    assert fake.requests[-1][0]["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": False,
    }
    first = _accounting.get_records("t-own-usage")[0]
    assert first.cached_tokens == 30


async def test_async_create_stream_records_usage(fake: FakeOpenAI) -> None:
    from openai import AsyncOpenAI

    client = agentkv.wrap_openai(
        AsyncOpenAI(base_url=fake.base_url, api_key="-", max_retries=0), backend="vllm"
    )
    async with agentkv.trajectory("t-async-usage"):
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        chunks = [c async for c in stream]
    await client.close()
    assert chunks and all(c.choices for c in chunks)
    (rec,) = _accounting.get_records("t-async-usage")
    assert (rec.prompt_tokens, rec.cached_tokens) == (50, 30)


def test_a_server_refusing_stream_options_still_answers_and_is_not_asked_again() -> None:
    """Hints never break the call: a strict server's 400 on the added field gives the
    caller's request back, and later streams do not ask."""
    fake = FakeOpenAI(["ok"])
    fake.refuse_fields = {"stream_options"}
    client = agentkv.wrap_openai(fake.openai(), backend="vllm")
    with agentkv.trajectory("t-refused"):
        for _ in range(2):
            chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "ok"
    sent = [("stream_options" in body) for body, _ in fake.requests]
    assert sent == [True, False, False]
    assert all(body.get("vllm_xargs") for body, _ in fake.requests)  # hints kept


def test_langgraph_stream_mode_messages_records_usage_on_every_turn(fake: FakeOpenAI) -> None:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from agentkv.integrations.langgraph import AgentKVMiddleware

    @tool
    def grep(pattern: str) -> str:
        """Search the code for a pattern."""
        return f"3 matches for {pattern}"

    fake.script = [[("grep", {"pattern": "TODO"})], "done"]
    llm = ChatOpenAI(model="agentkv-tiny", base_url=fake.base_url, api_key="-", max_retries=0)
    agent = create_agent(llm, [grep], middleware=[AgentKVMiddleware()])
    config = {"configurable": {"thread_id": "lg-stream"}}
    parts = list(agent.stream({"messages": [("user", "go")]}, config, stream_mode="messages"))
    assert parts
    recs = _accounting.get_records("lg-stream")
    assert [(r.streamed, r.prompt_tokens is not None, r.cached_tokens) for r in recs] == [
        (True, True, 30),
        (True, True, 50),
    ]
    assert _accounting.stats().prefix_reuse_ratio is not None


async def test_agents_sdk_run_streamed_records_usage_on_every_turn(fake: FakeOpenAI) -> None:
    import agents
    from openai import AsyncOpenAI

    from agentkv.integrations.openai_agents import AgentKVTracingProcessor

    @agents.function_tool
    def grep(pattern: str) -> str:
        """Search the code for a pattern."""
        return f"3 matches for {pattern}"

    fake.script = [[("grep", {"pattern": "TODO"})], "done"]
    client = agentkv.wrap_openai(
        AsyncOpenAI(base_url=fake.base_url, api_key="-", max_retries=0), backend="vllm"
    )
    model = agents.OpenAIChatCompletionsModel(model="agentkv-tiny", openai_client=client)
    agent = agents.Agent(name="coder", instructions="Fix bugs.", model=model, tools=[grep])
    agents.set_trace_processors([AgentKVTracingProcessor()])
    try:
        run = agents.Runner.run_streamed(
            agent, "go", run_config=agents.RunConfig(group_id="agents-stream")
        )
        async for _ in run.stream_events():
            pass
    finally:
        agents.set_trace_processors([])
        await client.close()
    recs = _accounting.get_records("agents-stream")  # the instructions are one more message
    assert [(r.streamed, r.cached_tokens) for r in recs] == [(True, 40), (True, 60)]

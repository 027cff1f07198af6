"""OpenTelemetry trees with the real SDK and a real local HTTP server.

The trajectory's ``invoke_agent`` span is current while it runs, so the client's ``chat``
span and the sink's ``execute_tool`` spans are its children; with another instrumentor
(OpenLLMetry's ``OpenAIInstrumentor``) there is still one chat span per call, whichever
wrapped first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agentkv
from agentkv.client import _lifecycle
from agentkv.client._lifecycle import LifecycleChannel
from tests.support.client_fakes import FakeServer

MESSAGES = [{"role": "user", "content": "hi"}]
# opentelemetry-instrumentation-openai defines a pydantic model the old way.
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")


@pytest.fixture
def exporter() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    agentkv.configure(tracer_provider=provider, sinks=[agentkv.OTelSink()])
    _lifecycle.set_channel(LifecycleChannel(timeout_s=0.3, max_attempts=1))
    yield spans, provider
    _lifecycle.reset_channel()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer("agentkv")
    try:
        yield fake
    finally:
        fake.close()


def by_name(spans: Any) -> dict[str, Any]:
    return {s.name: s for s in spans}


def test_chat_and_tool_spans_are_children_of_the_agent_span(
    exporter: tuple[InMemorySpanExporter, TracerProvider], server: FakeServer
) -> None:
    spans, _ = exporter
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    client = agentkv.wrap_openai(raw)
    with agentkv.trajectory("t-otel", metadata={"agent_name": "coder"}):
        client.chat.completions.create(model="m", messages=MESSAGES)
        with agentkv.tool_call("shell", name="run", call_id="call_7"):
            pass
    raw.close()
    named = by_name(spans.get_finished_spans())
    agent, chat, tool = named["invoke_agent coder"], named["chat m"], named["execute_tool run"]
    assert chat.parent is not None and chat.parent.span_id == agent.context.span_id
    assert tool.parent is not None and tool.parent.span_id == agent.context.span_id
    assert chat.context.trace_id == agent.context.trace_id
    assert agent.attributes["gen_ai.agent.name"] == "coder"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_7"
    attrs = chat.attributes
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", server.port)
    assert attrs["gen_ai.response.model"] == "m" and attrs["gen_ai.response.id"] == "chatcmpl-1"
    assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("stop",)
    assert attrs["gen_ai.agent.name"] == "coder"


def test_one_chat_span_beside_another_instrumentor_in_either_order(
    exporter: tuple[InMemorySpanExporter, TracerProvider], server: FakeServer
) -> None:
    """One call, one chat span (the instrumentor's, with agentkv's attributes), whether
    agentkv wrapped the client before or after the instrumentor patched openai.

    (Both orders in one test: the instrumentor's ``uninstrument`` leaves a wrapper
    behind, so instrumenting twice in one process would nest two.)"""
    spans, provider = exporter
    instrumentor = OpenAIInstrumentor()
    raw_first = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    agentkv_first = agentkv.wrap_openai(raw_first)
    instrumentor.instrument(tracer_provider=provider)
    raw_after = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    try:
        agentkv_after = agentkv.wrap_openai(raw_after)
        for tid, client in (("t-first", agentkv_first), ("t-after", agentkv_after)):
            with agentkv.trajectory(tid):
                client.chat.completions.create(model="m", messages=MESSAGES)
    finally:
        instrumentor.uninstrument()
        raw_first.close()
        raw_after.close()
    finished = spans.get_finished_spans()
    chats = [s for s in finished if not s.name.startswith(("invoke_agent", "execute_tool"))]
    assert [c.attributes["agentkv.trajectory.id"] for c in chats] == ["t-first", "t-after"]
    assert all(c.attributes["gen_ai.usage.cache_read.input_tokens"] == 64 for c in chats)
    assert all(c.instrumentation_scope.name != "agentkv" for c in chats)  # theirs, annotated
    reqs = server.model_requests()
    assert [r["body"]["vllm_xargs"]["agentkv_trajectoryId"] for r in reqs] == ["t-first", "t-after"]

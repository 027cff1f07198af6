"""``agentkv.wrap_anthropic`` with the real ``anthropic`` SDK against a local HTTP server.

The server (``tests.support.anthropic_fakes``) records each ``POST /v1/messages`` body and
answers like the Messages API, plain or as a server-sent-event stream.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

import agentkv
from agentkv.client import _accounting
from agentkv.client.backends._anthropic import choose_ttl
from tests.support.anthropic_fakes import MessagesServer


@pytest.fixture
def server() -> Iterator[MessagesServer]:
    s = MessagesServer()
    yield s
    s.close()


TOOLS = [{"name": "grep", "description": "search", "input_schema": {"type": "object"}}]


def test_breakpoints_ttl_and_usage(server: MessagesServer) -> None:
    raw = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    client = agentkv.wrap_anthropic(raw)
    with agentkv.trajectory("t-a"):
        out = client.messages.create(
            model="claude-x",
            max_tokens=8,
            system="You fix bugs.",
            tools=TOOLS,
            messages=[{"role": "user", "content": "hi"}],
        )
        with client.messages.stream(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "again"}]
        ) as stream:
            assert stream.get_final_text() == "ok"
        mine = [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]
        client.messages.create(
            model="claude-x",
            max_tokens=8,
            system=mine,
            messages=[{"role": "user", "content": "third"}],
        )
    raw.close()
    assert out.content[0].text == "ok"
    first, second, third = server.bodies
    control = {"type": "ephemeral", "ttl": "5m"}  # nothing learned yet: the short TTL
    assert first["tools"][-1]["cache_control"] == control
    assert first["system"] == [{"type": "text", "text": "You fix bugs.", "cache_control": control}]
    assert first["messages"][-1]["content"][-1]["cache_control"] == control
    assert second["messages"][-1]["content"][-1]["cache_control"] == control
    assert third["system"] == mine and third["messages"][-1]["content"] == "third"  # theirs stand
    recs = _accounting.get_records("t-a")
    assert [(r.api, r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in recs] == [
        ("messages", 1000, 900, 3),
        ("messages", 1000, 900, 3),
        ("messages", 1000, 900, 3),
    ]
    assert recs[1].streamed and recs[1].finish_reasons == ("end_turn",)
    assert all(r.backend == "anthropic" for r in recs)


async def test_async_client_and_tenant_rule(server: MessagesServer) -> None:
    raw = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", max_retries=0)
    client = agentkv.wrap_anthropic(raw)
    async with agentkv.trajectory("t-b", tenant="acme"):
        with pytest.raises(agentkv.TenantIsolationError):
            await client.messages.create(
                model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
    assert server.bodies == []
    agentkv.unwrap_openai(client)
    agentkv.wrap_anthropic(client, options=agentkv.ClientOptions(allow_unsalted=True))
    async with agentkv.trajectory("t-c", tenant="acme"):
        await client.messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    await raw.close()
    assert server.bodies[0]["messages"][0]["content"][0]["cache_control"]["ttl"] == "5m"


def test_ttl_cost_rule() -> None:
    """1h pays when the next call is likely (> 0.65) later than 5 min, within the hour."""
    assert choose_ttl(None, None) == "5m"
    assert choose_ttl(30.0, 120.0) == "5m"  # short tool gaps
    assert choose_ttl(900.0, 1800.0) == "1h"  # a 15-minute CI run
    assert choose_ttl(400.0, 4000.0) == "5m"  # too uncertain: p(> 5 min) below break-even
    assert choose_ttl(7200.0, 9000.0) == "5m"  # past the hour either way


def test_an_anthropic_run_names_anthropic_on_its_agent_span_and_metrics(
    server: MessagesServer,
) -> None:
    """``invoke_agent`` and the model-call metrics say the backend's provider, not vllm."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    agentkv.configure(
        sinks=[agentkv.OTelSink()], tracer_provider=tracer_provider, meter_provider=meter_provider
    )
    try:
        client = agentkv.wrap_anthropic(
            anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        )
        with agentkv.trajectory("t-provider"):
            client.messages.create(
                model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        client.close()
        data = reader.get_metrics_data()
    finally:
        agentkv.configure(sinks=[], tracer_provider=None, meter_provider=None)
    spans = {s.attributes["gen_ai.operation.name"]: s for s in exporter.get_finished_spans()}
    assert spans["invoke_agent"].attributes["gen_ai.provider.name"] == "anthropic"
    assert spans["chat"].attributes["gen_ai.provider.name"] == "anthropic"
    names = {
        m.name: {p.attributes["gen_ai.provider.name"] for p in m.data.data_points}
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert names["gen_ai.client.operation.duration"] == {"anthropic"}

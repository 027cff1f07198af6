"""The OpenTelemetry sink: GenAI span names and attributes, no global provider."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agentkv


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    agentkv.configure(sinks=[agentkv.OTelSink(tracer_provider=provider, agent_name="coder")])
    yield exp


def test_trajectory_and_tools_become_invoke_agent_and_execute_tool_spans(
    exporter: InMemorySpanExporter,
) -> None:
    @agentkv.tool(tool_class="shell", name="bash")
    def bash() -> None:
        pass

    with agentkv.trajectory("t-otel", tenant="acme"):
        bash()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    agent_span = spans["invoke_agent coder"]
    tool_span = spans["execute_tool bash"]
    assert agent_span.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent_span.attributes["gen_ai.conversation.id"] == "t-otel"
    assert agent_span.attributes["agentkv.tenant"] == "acme"
    assert tool_span.attributes["gen_ai.tool.name"] == "bash"
    assert tool_span.attributes["agentkv.tool.class"] == "shell"
    assert tool_span.parent is not None
    assert tool_span.parent.span_id == agent_span.context.span_id


def test_errors_mark_spans_and_subagents_nest(exporter: InMemorySpanExporter) -> None:
    @agentkv.tool
    def broken() -> None:
        raise RuntimeError("x")

    with pytest.raises(RuntimeError), agentkv.trajectory("parent"):
        with agentkv.trajectory("child"):
            pass
        broken()
    spans = exporter.get_finished_spans()
    by_conv = {s.attributes.get("gen_ai.conversation.id"): s for s in spans}
    assert by_conv["child"].parent.span_id == by_conv["parent"].context.span_id
    tool = next(s for s in spans if s.name.startswith("execute_tool"))
    assert tool.status.status_code == trace.StatusCode.ERROR
    assert tool.attributes["error.type"] == "_OTHER"
    assert by_conv["parent"].status.status_code == trace.StatusCode.ERROR


def test_sink_never_installs_a_global_provider() -> None:
    before = trace.get_tracer_provider()
    agentkv.OTelSink()
    assert trace.get_tracer_provider() is before


def test_labelled_turns_count_from_the_trajectory_counter(exporter: InMemorySpanExporter) -> None:
    """A turn labelled with the harness's own string id still counts the agent's turns."""
    with agentkv.trajectory("t-labels"):
        with agentkv.model_call(turn_id="run-3/turn-1"):
            pass
        with agentkv.model_call(turn_id="run-3/turn-2"), agentkv.tool_call("shell"):
            pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["invoke_agent coder"].attributes["agentkv.turns"] == 2
    assert spans["execute_tool shell"].attributes["agentkv.turn.id"] == "run-3/turn-2"

"""GenAI metrics through opentelemetry-api meters, read with the SDK's in-memory reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import agentkv
from tests.support.integration_fakes import FakeOpenAI

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    agentkv.configure(meter_provider=provider)
    try:
        yield reader
    finally:
        agentkv.configure(meter_provider=None)
        provider.shutdown()


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """Every histogram data point of metric ``name``."""
    data = reader.get_metrics_data()
    found = []
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    assert sm.scope.name == "agentkv"
                    found.extend(metric.data.data_points)
    return found


def test_every_tool_execution_records_its_duration(reader: InMemoryMetricReader) -> None:
    @agentkv.tool(tool_class="shell", name="bash")
    def bash() -> str:
        return "ok"

    @agentkv.tool(tool_class="search")
    def broken() -> None:
        raise RuntimeError("x")

    with agentkv.trajectory("t-tools"):
        bash()
        bash()
        with pytest.raises(RuntimeError):
            broken()
        with agentkv.tool_call("file_read", name="read_file"):
            pass
    by_tool = {
        p.attributes["gen_ai.tool.name"]: p for p in points(reader, "gen_ai.execute_tool.duration")
    }
    assert set(by_tool) == {"bash", "broken", "read_file"}
    assert (
        by_tool["bash"].count == 2 and by_tool["bash"].attributes["agentkv.tool.class"] == "shell"
    )
    assert by_tool["bash"].attributes["gen_ai.operation.name"] == "execute_tool"
    assert "error.type" not in by_tool["bash"].attributes
    assert by_tool["broken"].attributes["error.type"] == "_OTHER"


def test_model_calls_record_operation_duration_and_token_usage(
    reader: InMemoryMetricReader,
) -> None:
    fake = FakeOpenAI(["hello"])
    client = agentkv.wrap_openai(fake.openai(), backend="vllm")
    with agentkv.trajectory("t-calls"):
        client.chat.completions.create(model="m", messages=MESSAGES)
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    (duration,) = points(reader, "gen_ai.client.operation.duration")
    assert duration.count == 2
    attrs = duration.attributes
    assert (attrs["gen_ai.operation.name"], attrs["gen_ai.provider.name"]) == ("chat", "vllm")
    assert attrs["gen_ai.request.model"] == "m" and attrs["server.address"] == "127.0.0.1"
    usage = {
        p.attributes["gen_ai.token.type"]: p for p in points(reader, "gen_ai.client.token.usage")
    }
    assert (usage["input"].count, usage["input"].sum) == (2, 100)
    assert (usage["output"].count, usage["output"].sum) == (2, 10)


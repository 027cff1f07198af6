"""``wrap_anthropic`` caching and tracing, with the real ``anthropic`` SDK against a local
HTTP fake (``tests.support.anthropic_fakes``) that refuses what the Messages API refuses
(more than four breakpoints, one on a thinking or empty text block), and the OTel SDK's
in-memory exporter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

import agentkv
from agentkv.client import _accounting
from agentkv.client.backends._anthropic import LOOKBACK_BLOCKS
from tests.support.anthropic_fakes import MessagesServer, breakpoint_error


@pytest.fixture
def server() -> Iterator[MessagesServer]:
    s = MessagesServer()
    yield s
    s.close()


TOOLS = [{"name": "grep", "description": "search", "input_schema": {"type": "object"}}]


def _client(server: MessagesServer, **kwargs: Any) -> anthropic.Anthropic:
    raw = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0, **kwargs)
    return agentkv.wrap_anthropic(raw)


def _marks(body: dict[str, Any]) -> list[tuple[int, int]]:
    """(message, block) of every breakpoint in the conversation."""
    out = []
    for m, message in enumerate(body["messages"]):
        content = message["content"]
        if isinstance(content, list):
            out += [(m, b) for b, block in enumerate(content) if "cache_control" in block]
    return out


def _wide_turn(width: int) -> list[dict[str, Any]]:
    """A conversation whose last turn made ``width`` parallel tool calls."""
    uses = [
        {"type": "tool_use", "id": f"u{i}", "name": "grep", "input": {"q": str(i)}}
        for i in range(width)
    ]
    results = [
        {"type": "tool_result", "tool_use_id": f"u{i}", "content": "ok"} for i in range(width)
    ]
    return [
        {"role": "user", "content": "fix the bug"},
        {"role": "assistant", "content": [{"type": "text", "text": "looking"}, *uses]},
        {"role": "user", "content": results},
    ]


def test_wide_turn_uses_the_fourth_breakpoint_within_the_lookback(server: MessagesServer) -> None:
    """12 parallel tool uses and their results put the last block 25 blocks past the
    previous request's end: a second conversation breakpoint within 20 blocks of that
    end reads the previous entry; with tools and system that is four, all accepted."""
    client = _client(server)
    with agentkv.trajectory("t-wide"):
        client.messages.create(
            model="claude-x",
            max_tokens=8,
            system="You fix bugs.",
            tools=TOOLS,
            messages=_wide_turn(12),
        )
    client.close()
    (body,) = server.bodies
    assert breakpoint_error(body) is None
    # Flat block positions: the previous request ended at 0 (the first user message),
    # the assistant's text and 12 tool uses are 1-13, the 12 results 14-25.
    assert _marks(body) == [(2, 6), (2, 11)]  # positions 20 and 25
    bridge, last = 14 + 6, 14 + 11
    assert bridge - 0 <= LOOKBACK_BLOCKS  # the bridge reads the previous request's entry
    assert last - bridge <= LOOKBACK_BLOCKS  # and the last breakpoint reads the bridge
    assert "cache_control" in body["tools"][-1] and "cache_control" in body["system"][-1]


def test_narrow_turn_keeps_one_conversation_breakpoint(server: MessagesServer) -> None:
    client = _client(server)
    with agentkv.trajectory("t-narrow"):
        client.messages.create(model="claude-x", max_tokens=8, messages=_wide_turn(2))
    client.close()
    assert _marks(server.bodies[0]) == [(2, 1)]


def test_breakpoints_skip_thinking_and_empty_text_blocks(server: MessagesServer) -> None:
    """The last block of the conversation is an empty text block after thinking: the
    breakpoint goes on the last block that can carry one, and the API takes the call
    on the first try (no 400, no retry without hints)."""
    client = _client(server)
    messages = [
        {"role": "user", "content": "why?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "because"},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "text", "text": "go on"}, {"type": "text", "text": ""}],
        },
    ]
    system = [{"type": "text", "text": "You fix bugs."}, {"type": "text", "text": ""}]
    with agentkv.trajectory("t-thinking"):
        client.messages.create(model="claude-x", max_tokens=8, system=system, messages=messages)
        client.messages.create(
            model="claude-x",
            max_tokens=8,
            messages=[*messages[:2], {"role": "user", "content": [messages[1]["content"][0]]}],
        )
    client.close()
    first, second = server.bodies[:2]
    assert len(server.bodies) == 2  # both accepted at once: no refused request, no retry
    assert breakpoint_error(first) is None and breakpoint_error(second) is None
    assert _marks(first) == [(2, 0)]
    assert "cache_control" in first["system"][0] and "cache_control" not in first["system"][1]
    assert _marks(second) == [(1, 1)]  # the thinking-only message carries none


@pytest.mark.parametrize(
    "settings",
    [
        {"cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"extra_body": {"cache_control": {"type": "ephemeral"}}},
        {
            "extra_body": {
                "system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]
            }
        },
    ],
    ids=["automatic", "automatic-extra-body", "breakpoint-extra-body"],
)
def test_callers_own_cache_settings_stand(server: MessagesServer, settings: dict[str, Any]) -> None:
    """The top-level automatic ``cache_control`` (an argument or through ``extra_body``)
    and breakpoints given through ``extra_body`` are the caller's caching: no breakpoint
    is added beside them."""
    client = _client(server)
    with agentkv.trajectory("t-own"):
        client.messages.create(
            model="claude-x",
            max_tokens=8,
            tools=TOOLS,
            messages=[{"role": "user", "content": "hi"}],
            **settings,
        )
    client.close()
    (body,) = server.bodies
    assert "cache_control" not in body["tools"][-1]
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_cache_write_tokens_recorded(server: MessagesServer) -> None:
    client = _client(server)
    with agentkv.trajectory("t-write"):
        client.messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        with client.messages.stream(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "again"}]
        ) as stream:
            stream.get_final_text()
    client.close()
    assert [r.cache_write_tokens for r in _accounting.get_records("t-write")] == [90, 90]


@pytest.fixture
def otel() -> Iterator[tuple[Any, Any]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agentkv.configure(sinks=[agentkv.OTelSink()], tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        agentkv.configure(sinks=[], tracer_provider=None)


def _chat_spans(exporter: Any) -> list[Any]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get("gen_ai.operation.name") == "chat"
    ]


def test_one_chat_span_per_call_when_the_sdk_traces(
    server: MessagesServer, otel: tuple[Any, Any]
) -> None:
    """The SDK traces to agentkv's provider: each call (parsed and streamed) has one chat
    span, the SDK's, a child of ``invoke_agent``, carrying agentkv's attributes and the
    cache write tokens."""
    provider, exporter = otel
    client = _client(server, open_telemetry={"tracer_provider": provider})
    with agentkv.trajectory("t-span"):
        client.messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        with client.messages.stream(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "again"}]
        ) as stream:
            stream.get_final_text()
    client.close()
    chats = _chat_spans(exporter)
    assert len(chats) == 2
    (agent,) = [
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get("gen_ai.operation.name") == "invoke_agent"
    ]
    for span, turn in zip(chats, (0, 1), strict=True):
        assert span.instrumentation_scope.name == "com.anthropic.sdk.python"
        assert span.parent is not None and span.parent.span_id == agent.context.span_id
        assert span.attributes["agentkv.trajectory.id"] == "t-span"
        assert span.attributes["agentkv.turn.id"] == turn
        assert span.attributes["agentkv.backend"] == "anthropic"
        assert span.attributes["gen_ai.conversation.id"] == "t-span"
        assert span.attributes["gen_ai.usage.cache_write.input_tokens"] == 90
        assert span.attributes["gen_ai.usage.cache_read.input_tokens"] == 900


def test_own_chat_span_when_the_sdk_does_not_trace(
    server: MessagesServer, otel: tuple[Any, Any]
) -> None:
    """With the SDK's tracing off, agentkv's own chat span reports cache writes too."""
    _, exporter = otel
    client = _client(server, open_telemetry=False)
    with agentkv.trajectory("t-own-span"):
        client.messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    client.close()
    (span,) = _chat_spans(exporter)
    assert span.instrumentation_scope.name == "agentkv"
    assert span.attributes["gen_ai.usage.cache_write.input_tokens"] == 90


async def test_one_chat_span_per_async_call_when_the_sdk_traces(
    server: MessagesServer, otel: tuple[Any, Any]
) -> None:
    provider, exporter = otel
    raw = anthropic.AsyncAnthropic(
        base_url=server.url,
        api_key="k",
        max_retries=0,
        open_telemetry={"tracer_provider": provider},
    )
    client = agentkv.wrap_anthropic(raw)
    async with agentkv.trajectory("t-async-span"):
        await client.messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        stream = await client.messages.create(
            model="claude-x",
            max_tokens=8,
            stream=True,
            messages=[{"role": "user", "content": "again"}],
        )
        async for _ in stream:
            pass
    await raw.close()
    chats = _chat_spans(exporter)
    assert [s.attributes["agentkv.turn.id"] for s in chats] == [0, 1]
    assert {s.instrumentation_scope.name for s in chats} == {"com.anthropic.sdk.python"}
    assert all(s.attributes["gen_ai.usage.cache_write.input_tokens"] == 90 for s in chats)


def test_raw_response_under_the_sdks_span_still_records_the_turn(
    server: MessagesServer, otel: tuple[Any, Any]
) -> None:
    """A raw response parsed after the call keeps the SDK's span alone (no second span)
    and the turn is recorded from the body."""
    provider, exporter = otel
    client = _client(server, open_telemetry={"tracer_provider": provider})
    with agentkv.trajectory("t-raw-span"):
        raw = client.messages.with_raw_response.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.parse().content[0].text == "ok"
    client.close()
    (span,) = _chat_spans(exporter)
    assert span.instrumentation_scope.name == "com.anthropic.sdk.python"
    (rec,) = _accounting.get_records("t-raw-span")
    assert (rec.cached_tokens, rec.cache_write_tokens) == (900, 90)

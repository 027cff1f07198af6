"""Per-turn records, reuse ratio and rebuild tax, and the OTel chat span."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agentkv
from agentkv.client import _accounting
from agentkv.client._accounting import TurnRecord


def rec(
    turn: int, prompt: int | None, cached: int | None, eligible: int, **kw: object
) -> TurnRecord:
    base: dict[str, object] = dict(
        trajectory_id="t",
        turn_id=turn,
        api="chat",
        model="m",
        backend="vllm",
        mode="active",
        started_at_ms=0,
        latency_ms=1.0,
        outcome="ok",
        prompt_tokens=prompt,
        completion_tokens=5,
        cached_tokens=cached,
        eligible_prefix_tokens=eligible,
    )
    base.update(kw)
    return TurnRecord(**base)  # type: ignore[arg-type]


def test_reused_and_recomputed_prefix_per_turn() -> None:
    r = rec(1, 1000, 600, 900)
    assert r.reused_prefix_tokens == 600 and r.recomputed_prefix_tokens == 300
    shared = rec(0, 1000, 512, 0)  # cached beyond the trajectory's own prefix
    assert shared.reused_prefix_tokens == 0 and shared.recomputed_prefix_tokens == 0
    unknown = rec(2, 1000, None, 900)
    assert unknown.recomputed_prefix_tokens == 0


def test_stats_ratios() -> None:
    for r in (
        rec(0, 1000, 0, 0),
        rec(1, 1200, 900, 1000),
        rec(2, 1400, 1200, 1200),
        rec(3, 1500, None, 1400),
    ):
        _accounting.record_turn(r)
    s = agentkv.stats()
    assert s.num_turns == 4 and s.num_turns_with_usage == 3
    assert s.eligible_prefix_tokens == 2200 and s.reused_prefix_tokens == 2100
    assert s.prefix_reuse_ratio == pytest.approx(2100 / 2200)
    assert s.prefill_tokens == 1000 + 300 + 200
    assert s.rebuild_tax == pytest.approx(100 / 1500)
    assert s.reused_offloaded_tokens is None  # no server stats read: no split
    assert s.tier_split_reason is not None
    assert s.to_dict()["prefix_reuse_ratio"] == s.prefix_reuse_ratio


def test_empty_stats_have_no_ratios() -> None:
    s = agentkv.stats()
    assert s.num_turns == 0 and s.prefix_reuse_ratio is None and s.rebuild_tax is None


def test_records_are_retrievable_and_serialisable() -> None:
    _accounting.record_turn(rec(0, 10, 0, 0))
    [r] = _accounting.get_records("t")
    assert r.to_dict()["advice"] is None
    assert _accounting.get_records("other") == []


def test_chat_span_carries_cache_read_tokens() -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agentkv.configure(tracer_provider=provider)
    span = _accounting.start_chat_span(
        api="chat",
        model="m",
        provider_name="vllm",
        base_url="http://127.0.0.1:8000/v1",
        trajectory_id="t",
    )
    assert span is not None
    _accounting.end_chat_span(span, rec(1, 1000, 640, 900, ttft_ms=12.0))
    [span] = exporter.get_finished_spans()
    assert span.name == "chat m"
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 640
    assert attrs["gen_ai.usage.input_tokens"] == 1000
    assert attrs["gen_ai.conversation.id"] == "t"
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", 8000)


def test_one_provider_setting_reaches_the_sink_and_the_chat_spans() -> None:
    """configure(tracer_provider=) is where agentkv's spans go: OTelSink's and chat spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agentkv.configure(tracer_provider=provider, sinks=[agentkv.OTelSink()])
    with agentkv.trajectory("t"):
        pass
    span = _accounting.start_chat_span(
        api="chat", model="m", provider_name="vllm", base_url="", trajectory_id="t"
    )
    assert span is not None
    _accounting.end_chat_span(span, rec(0, 10, 0, 0))
    assert sorted(s.name for s in exporter.get_finished_spans()) == ["chat m", "invoke_agent"]


def test_make_turn_record_equals_the_constructed_record_and_stays_frozen() -> None:
    """The client's one-step builder gives the same frozen record as the constructor."""
    import dataclasses

    from agentkv.client._accounting import make_turn_record

    full = dataclasses.asdict(rec(2, 1000, 600, 900, ttft_ms=3.5, finish_reasons=("stop",)))
    made = make_turn_record(dict(full))
    assert made == TurnRecord(**full)  # type: ignore[arg-type]
    assert made.reused_prefix_tokens == 600 and made.to_dict()["ttft_ms"] == 3.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.turn_id = 3  # type: ignore[misc]
    partial = {k: v for k, v in full.items() if k != "finish_reasons"}
    assert make_turn_record(partial).finish_reasons == ()  # defaults: the constructor


def test_stats_fold_every_record_across_batches() -> None:
    """Records are folded into the totals in batches; every read sees all of them."""
    n = 3 * _accounting._Ledger.FOLD_EVERY + 5
    records = [
        rec(i, 1000 + i, (500 + i) if i % 3 else None, 700, ttft_ms=float(i),
            advice_sent=False, outcome="ok" if i % 4 else "error")
        for i in range(n)
    ]  # fmt: skip
    half = n // 2
    for r in records[:half]:
        _accounting.record_turn(r)
    assert agentkv.stats().num_turns == half  # a read between batches folds what it has
    for r in records[half:]:
        _accounting.record_turn(r)
    s = agentkv.stats()
    usage = [r for r in records if r.cached_tokens is not None]
    assert s.num_turns == n and s.num_turns_with_usage == len(usage)
    assert s.prompt_tokens == sum(r.prompt_tokens or 0 for r in usage)
    assert s.reused_prefix_tokens == sum(r.reused_prefix_tokens for r in usage)
    assert s.recomputed_prefix_tokens == sum(r.recomputed_prefix_tokens for r in usage)
    assert s.outcomes == {"ok": sum(i % 4 != 0 for i in range(n)), "error": (n + 3) // 4}
    assert s.ttft_ms_p50 == float(sorted(range(n))[n // 2])
    assert len(_accounting.get_records()) == n

"""The tier split in ``agentkv.stats()``: taken from the servers' ``/agentkv/v1/stats``
answers that the lifecycle channel reads for the load, as differences since first seen."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

import agentkv
from agentkv.advice._advisor import Advisor
from agentkv.client import _lifecycle, _tier
from agentkv.client._lifecycle import LifecycleChannel, TrajectoryRoute
from agentkv.client._load import LoadTracker
from agentkv.testing import FakeClock, reset
from tests.support.client_fakes import FakeServer

CPU_REASON = "CPU build: vLLM's offloading connector needs a GPU"


def tier_stats(*figures: float) -> dict[str, Any]:
    """What a GPU plugin's stats carry: ``figures`` are the counters in ``_tier.COUNTERS``
    order (local, tier hits, recomputed, load bytes, load ms, store bytes, store ms); the
    load fields are included, so the channel keeps asking the stats route."""
    assert len(figures) == len(_tier.COUNTERS)
    return {
        "kv_usage": 0.5,
        "num_waiting": 0,
        **dict(zip(_tier.COUNTERS, figures, strict=True)),
        "offload_load_bytes_per_s": None,  # the server's lifetime figure; not what we report
        "offload_store_bytes_per_s": None,
    }


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def channel(clock: FakeClock) -> Iterator[LifecycleChannel]:
    ch = LifecycleChannel(timeout_s=0.3, max_attempts=2, down_backoff_s=0.1, clock=clock)
    _lifecycle.set_channel(ch)
    yield ch
    _lifecycle.reset_channel()


def _fake() -> Iterator[FakeServer]:
    s = FakeServer("agentkv")
    yield s
    s.close()


server = pytest.fixture(_fake)
other = pytest.fixture(_fake)


def _watch(channel: LifecycleChannel, srv: FakeServer, tid: str) -> None:
    channel.tracker(srv.root, {}, has_lower_tier=True)
    channel.register(tid, TrajectoryRoute(srv.root, {}, Advisor(), LoadTracker()))


def _read(channel: LifecycleChannel, clock: FakeClock) -> None:
    assert channel.refresh_loads()
    clock.advance(channel.load_refresh_s)  # the next refresh asks again


def test_before_any_stats_the_split_is_none_with_a_reason() -> None:
    s = agentkv.stats()
    assert s.reused_gpu_tokens is None and s.reused_offloaded_tokens is None
    assert s.offload_load_bytes is None and s.offload_load_bytes_per_s is None
    assert s.tier_split_reason == _tier.NOT_SEEN_REASON


def test_a_tiered_server_reports_its_counters_since_first_seen(
    channel: LifecycleChannel, server: FakeServer, clock: FakeClock
) -> None:
    """What the server counted before the client saw it is left out; bandwidth is the
    bytes moved since then over the transfer time since then."""
    server.stats_extra = tier_stats(1000, 500, 300, 4_000_000, 4.0, 8_000_000, 16.0)
    _watch(channel, server, "t1")
    _read(channel, clock)
    first = agentkv.stats()
    assert first.reused_gpu_tokens == 0 and first.reused_offloaded_tokens == 0
    assert first.offload_load_bytes_per_s is None  # nothing moved since first seen
    assert first.tier_split_reason is None

    server.stats_extra = tier_stats(1640, 756, 428, 6_000_000, 5.0, 9_000_000, 20.0)
    _read(channel, clock)
    s = agentkv.stats()
    assert s.reused_gpu_tokens == 640
    assert s.reused_offloaded_tokens == 256
    assert s.tier_recomputed_tokens == 128
    assert s.offload_load_bytes == 2_000_000 and s.offload_store_bytes == 1_000_000
    assert s.offload_load_bytes_per_s == pytest.approx(2_000_000 / 0.001)
    assert s.offload_store_bytes_per_s == pytest.approx(1_000_000 / 0.004)
    assert s.tier_split_reason is None
    assert s.to_dict()["reused_offloaded_tokens"] == 256


def test_a_cpu_server_leaves_the_split_none_with_its_reason(
    channel: LifecycleChannel, server: FakeServer, clock: FakeClock
) -> None:
    server.stats_extra = {
        "kv_usage": 0.2,
        "num_waiting": 0,
        "tier_local_hit_tokens": None,
        "tier_hit_tokens": None,
        "tier_recomputed_tokens": None,
        "tier_split_reason": CPU_REASON,
    }
    _watch(channel, server, "c1")
    _read(channel, clock)
    _read(channel, clock)
    s = agentkv.stats()
    assert s.reused_gpu_tokens is None and s.reused_offloaded_tokens is None
    assert s.tier_recomputed_tokens is None and s.offload_store_bytes is None
    assert s.tier_split_reason == CPU_REASON


def test_a_server_without_the_fields_leaves_the_split_none_with_a_reason(
    channel: LifecycleChannel, server: FakeServer, clock: FakeClock
) -> None:
    """An older plugin's stats (load, no split): None, and the reason says the server
    does not report the split."""
    server.stats_extra = {"kv_usage": 0.2, "num_waiting": 0}
    _watch(channel, server, "o1")
    _read(channel, clock)
    s = agentkv.stats()
    assert s.reused_gpu_tokens is None and s.offload_load_bytes is None
    assert s.tier_split_reason == _tier.NOT_SERVED_REASON


def test_servers_are_summed_and_one_without_a_tier_is_named_in_the_reason(
    channel: LifecycleChannel, server: FakeServer, other: FakeServer, clock: FakeClock
) -> None:
    server.stats_extra = tier_stats(0, 0, 0, 0, 0.0, 0, 0.0)
    other.stats_extra = tier_stats(100, 100, 100, 1000, 1.0, 0, 0.0)
    _watch(channel, server, "a")
    _watch(channel, other, "b")
    _read(channel, clock)
    server.stats_extra = tier_stats(10, 20, 30, 3000, 1.0, 0, 0.0)
    other.stats_extra = tier_stats(110, 140, 100, 2000, 2.0, 0, 0.0)
    _read(channel, clock)
    s = agentkv.stats()
    assert (s.reused_gpu_tokens, s.reused_offloaded_tokens, s.tier_recomputed_tokens) == (
        20,
        60,
        30,
    )
    assert s.offload_load_bytes == 4000
    assert s.offload_load_bytes_per_s == pytest.approx(4000 / 0.002)
    assert s.offload_store_bytes_per_s is None  # nothing stored: no bandwidth
    assert s.tier_split_reason is None


def test_a_partial_sum_names_what_it_left_out() -> None:
    ledger = _tier.TierLedger()
    ledger.observe("http://a", tier_stats(0, 0, 0, 0, 0.0, 0, 0.0))
    ledger.observe("http://a", tier_stats(5, 6, 7, 8, 1.0, 9, 1.0))
    ledger.observe("http://b", {"tier_hit_tokens": None, "tier_split_reason": CPU_REASON})
    split = ledger.split()
    assert (split.local_hit_tokens, split.tier_hit_tokens) == (5, 6)
    assert split.reason == f"1 of 2 servers do not report it: {CPU_REASON}"


def test_a_restarted_server_keeps_what_it_counted_and_counts_anew() -> None:
    """Counters that go down mean a new server process: its counts add to the old ones."""
    ledger = _tier.TierLedger()
    ledger.observe("http://a", tier_stats(100, 100, 100, 100, 1.0, 100, 1.0))
    ledger.observe("http://a", tier_stats(150, 120, 110, 300, 2.0, 100, 1.0))
    ledger.observe("http://a", tier_stats(7, 3, 1, 50, 0.5, 0, 0.0))  # restarted
    split = ledger.split()
    assert (split.local_hit_tokens, split.tier_hit_tokens, split.recomputed_tokens) == (
        57,
        23,
        11,
    )
    assert split.load_bytes == 250
    assert split.load_bytes_per_s == pytest.approx(250 / 0.0015)


def test_reset_starts_the_split_again_from_the_next_answer() -> None:
    _tier.observe_stats("http://a", tier_stats(0, 0, 0, 0, 0.0, 0, 0.0))
    _tier.observe_stats("http://a", tier_stats(9, 9, 9, 9, 1.0, 9, 1.0))
    assert agentkv.stats().reused_gpu_tokens == 9
    reset()
    assert agentkv.stats().tier_split_reason == _tier.NOT_SEEN_REASON
    _tier.observe_stats("http://a", tier_stats(20, 20, 20, 20, 2.0, 20, 2.0))
    assert agentkv.stats().reused_gpu_tokens == 0


def test_a_wrapped_client_gets_the_split_with_no_extra_request_on_its_calls(
    server: FakeServer,
) -> None:
    """Model calls through ``wrap_openai`` make the server known to the channel; the
    split arrives with the load reads, never as a request of its own on the call path."""
    server.capabilities = {**server.capabilities, "platform": "cuda"}
    server.capabilities["features"] = {**server.capabilities["features"], "offload": True}
    server.stats_extra = tier_stats(0, 0, 0, 0, 0.0, 0, 0.0)
    raw = openai.OpenAI(base_url=server.base_url, api_key="k")
    client = agentkv.wrap_openai(raw)
    try:
        with agentkv.trajectory("w1"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            assert _lifecycle.get_channel().refresh_loads()
        stats_reads = sum(1 for r in server.requests if r["path"] == "/agentkv/v1/stats")
        assert stats_reads == 1
        assert agentkv.stats().reused_offloaded_tokens == 0
        assert agentkv.stats().tier_split_reason is None
    finally:
        raw.close()

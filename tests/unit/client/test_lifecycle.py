"""The lifecycle channel: batched events with advice, release at the end, lag, bounds."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import openai
import pytest

import agentkv
from agentkv.advice._advisor import Advisor
from agentkv.client import _accounting, _lifecycle
from agentkv.client._lifecycle import LifecycleChannel, TrajectoryRoute
from agentkv.client._load import LoadTracker
from agentkv.events import _pipeline
from agentkv.events._schema import TrajectoryEvent
from agentkv.gaps._model import GapModel
from agentkv.testing import FakeClock
from tests.support.client_fakes import FakeServer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def channel(clock: FakeClock) -> Iterator[LifecycleChannel]:
    ch = LifecycleChannel(timeout_s=0.3, max_attempts=2, down_backoff_s=0.1, clock=clock)
    _lifecycle.set_channel(ch)
    yield ch
    _lifecycle.reset_channel()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer("agentkv")
    yield s
    s.close()


def trained_gaps() -> GapModel:
    gaps = GapModel()
    for _ in range(20):
        gaps.observe("shell", 0.5)
        gaps.observe("browser", 6.0)  # so the all-tools estimate differs from shell's
    return gaps


def test_tool_events_carry_advice_and_the_end_releases(
    channel: LifecycleChannel, server: FakeServer
) -> None:
    advisor = Advisor(trained_gaps())
    raw = openai.OpenAI(base_url=server.base_url, api_key="k")
    client = agentkv.wrap_openai(raw, advisor=advisor)

    @agentkv.tool(tool_class="shell")
    def run() -> str:
        return "ok"

    with agentkv.trajectory("traj-l1"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        run()
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert channel.flush(3)
    raw.close()
    kinds = [e["event"] for e in server.events]
    # tool_finished is not posted: the server has nothing to do on it
    assert kinds == ["tool_started", "trajectory_finished"]
    started = server.events[0]
    assert started["toolClass"] == "shell"
    assert started["advice"]["action"] == "retain"
    assert started["advice"]["ttlMs"] <= advisor.max_ttl_ms
    assert started["advice"]["policyVersion"] and started["advice"]["reason"]
    assert all(
        r["headers"].get("Authorization") == "Bearer k"
        for r in server.requests
        if r["path"] == "/agentkv/v1/events"
    )
    s = agentkv.stats()
    assert s.lifecycle["posted"] == 2
    assert s.hint_lag_ms_p50 is not None and s.hint_lag_ms_p50 >= 0
    assert channel.route("traj-l1") is None  # forgotten at the end


def test_two_tenants_running_one_id_post_under_their_own_salts(
    channel: LifecycleChannel, server: FakeServer
) -> None:
    """Tenants a and b of one process run "job-1" at once: each one's tool_started and
    end are posted with its own salt (a's end releases a, not b), and b's events still
    reach the server after a's trajectory ended."""
    from agentkv.prefix._namespace import CacheNamespace
    from agentkv.prefix._secret import install_secret

    raw = openai.OpenAI(base_url=server.base_url, api_key="k")
    client = agentkv.wrap_openai(raw, advisor=Advisor(trained_gaps()))

    @agentkv.tool(tool_class="shell")
    def run() -> None:
        return None

    def call() -> None:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

    a = agentkv.trajectory("job-1", tenant="a")
    b = agentkv.trajectory("job-1", tenant="b")
    with b:
        call()
        with a:
            call()
            run()
        run()  # after a ended: b's route is still there
    assert channel.flush(3)
    raw.close()
    ns = CacheNamespace()
    posted = [(e["event"], e.get("tenant"), e.get("cacheSalt")) for e in server.events]
    sa, sb = (ns.cache_salt(t, secret=install_secret()) for t in "ab")
    assert posted == [
        ("tool_started", "a", sa),
        ("trajectory_finished", "a", sa),
        ("tool_started", "b", sb),
        ("trajectory_finished", "b", sb),
    ]
    assert channel.route("job-1", "a") is None and channel.route("job-1", "b") is None


def test_shadow_mode_sends_nothing_that_schedules_and_logs_what_it_would(
    channel: LifecycleChannel, server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 13 finding 14 (shadow): no lifecycle post and no trajectory id leaves the
    process; the advice is scored locally and what would have been sent is logged."""
    advisor = Advisor(trained_gaps(), mode="shadow")
    raw = openai.OpenAI(base_url=server.base_url, api_key="k")
    client = agentkv.wrap_openai(raw, advisor=advisor)

    @agentkv.tool(tool_class="shell")
    def run() -> None:
        return None

    with caplog.at_level(logging.INFO, logger="agentkv.shadow"):
        with agentkv.trajectory("traj-l2"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            run()
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    channel.flush(3)
    raw.close()
    assert server.events == []
    assert not [r for r in server.requests if r["path"] == "/agentkv/v1/events"]
    for req in server.model_requests():
        assert set(req["body"]) == {"model", "messages"}
        assert "x-session-id" not in {k.lower() for k in req["headers"]}
    assert "would send body ['priority', 'session_id', 'vllm_xargs']" in caplog.text
    outcomes = advisor.shadow_log.summary()["outcomes"]
    assert outcomes.get("shadow:retain_hit") == 1  # the tool returned well within the TTL


def _route(url: str) -> TrajectoryRoute:
    return TrajectoryRoute(url, {}, Advisor(), LoadTracker())


def _event(tid: str, kind: str = "tool_started") -> TrajectoryEvent:
    return TrajectoryEvent(
        trajectory_id=tid, turn_id=0, event=kind, tool_class="shell", emitted_at_ms=1
    )


def test_events_are_batched_into_few_posts(channel: LifecycleChannel, server: FakeServer) -> None:
    for i in range(50):
        channel.register(f"b-{i}", _route(server.root))
    for i in range(50):
        _pipeline.emit(_event(f"b-{i}"))
    channel.flush(3)
    posts = [r for r in server.requests if r["path"] == "/agentkv/v1/events"]
    assert len(server.events) == 50
    assert len(posts) < 50


def test_unregistered_trajectories_are_ignored(
    channel: LifecycleChannel, server: FakeServer
) -> None:
    channel.ensure_subscribed()
    _pipeline.emit(_event("nobody"))
    channel.flush(1)
    assert server.events == []


def test_bounded_queue_drops_oldest_and_counts() -> None:
    ch = LifecycleChannel(max_queue=3, autostart=False)  # no worker: the queue only fills
    for i in range(5):
        ch.register(f"q{i}", _route("http://127.0.0.1:9"))
        _pipeline.emit(_event(f"q{i}"))
    assert ch.stats()["queued"] == 3
    assert _accounting.stats().lifecycle["dropped_queue_full"] == 2


def test_unchanged_advice_and_tool_finished_are_not_posted() -> None:
    """Each post is an engine RPC: only news travels out of band."""
    ch = LifecycleChannel(autostart=False)  # no worker: inspect the queue
    ch.register("u", _route("http://127.0.0.1:9"))
    for _ in range(3):
        _pipeline.emit(_event("u"))  # same tool class, same advice: posted once
        _pipeline.emit(_event("u", "tool_finished"))
    assert ch.stats()["queued"] == 1
    assert _accounting.stats().lifecycle["skipped_unchanged"] == 2
    _pipeline.emit(_event("u", "trajectory_finished"))  # the release always goes
    assert ch.stats()["queued"] == 2


def test_dead_server_is_counted_not_raised(channel: LifecycleChannel) -> None:
    channel.register("dead", _route("http://127.0.0.1:9"))
    _pipeline.emit(_event("dead"))
    _pipeline.emit(_event("dead", "trajectory_finished"))
    channel.flush(5)
    lc = agentkv.stats().lifecycle
    assert lc.get("failed", 0) + lc.get("dropped_server_down", 0) == 2


def test_load_is_refreshed_from_metrics(channel: LifecycleChannel, server: FakeServer) -> None:
    tracker = channel.tracker(server.root, {}, has_lower_tier=False)
    channel.register("m", _route(server.root))
    assert channel.refresh_loads()
    assert tracker.get().kv_usage == pytest.approx(0.25)
    assert any(r["path"] == "/metrics" for r in server.requests)


def test_load_comes_from_the_stats_route_when_it_carries_load(
    channel: LifecycleChannel, server: FakeServer
) -> None:
    """A server whose stats carry ``kv_usage`` / ``num_waiting`` is never scraped at /metrics."""
    server.stats_extra = {"kv_usage": 0.4, "num_waiting": 2}
    tracker = channel.tracker(server.root, {}, has_lower_tier=False)
    channel.register("s", _route(server.root))
    assert channel.refresh_loads()
    assert tracker.get().kv_usage == pytest.approx(0.4)
    assert tracker.get().num_waiting == 2
    assert any(r["path"] == "/agentkv/v1/stats" for r in server.requests)
    assert not any(r["path"] == "/metrics" for r in server.requests)


def test_stats_without_load_fall_back_to_metrics_and_are_not_asked_again(
    channel: LifecycleChannel, server: FakeServer, clock: FakeClock
) -> None:
    """Stats without the load fields (an older plugin) send the channel to /metrics for good."""
    tracker = channel.tracker(server.root, {}, has_lower_tier=False)
    channel.register("f", _route(server.root))
    assert channel.refresh_loads()
    assert tracker.get().kv_usage == pytest.approx(0.25)
    assert not tracker.needs_refresh()  # fresh on the channel's clock
    clock.advance(channel.load_refresh_s)
    assert tracker.needs_refresh()
    assert channel.refresh_loads()

    def count(path: str) -> int:
        return sum(1 for r in server.requests if r["path"] == path)

    assert count("/agentkv/v1/stats") == 1 and count("/metrics") == 2

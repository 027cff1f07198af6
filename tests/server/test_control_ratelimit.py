"""The control route's per-caller rate limit, from the route's handler to the client.

- the route's own middleware (the code vLLM's API server runs), in process: a caller past
  its burst gets 429 with ``Retry-After``, counted as ``control_requests_limited`` in the
  stats it serves, and another caller is not held back;
- the client's lifecycle channel against a real loopback HTTP server answering 429: one
  more try after ``Retry-After``, else the events are dropped and counted, and neither
  the tool nor the trajectory ever sees an error;
- one real server (the shared fixture): the limit its profile set reaches the route.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import agentkv
from agentkv.advice._advisor import Advisor
from agentkv.client import _lifecycle
from agentkv.client._lifecycle import LifecycleChannel, TrajectoryRoute, retry_after_s
from agentkv.client._load import LoadTracker
from agentkv.protocol._wire import SALT_HEADER
from agentkv.vllm._ratelimit import ControlLimit
from tests.support.control_fakes import control_request
from tests.support.requires import require_module


# -- the route's handler, in process ---------------------------------------------------------
class _Engine:
    """The engine-core client the route calls (``call_utility_async``): stats, and no
    trajectory known."""

    async def call_utility_async(self, method: str, payload: str) -> str:
        assert method == "agentkv_control"
        if json.loads(payload)["op"] == "stats":
            return json.dumps({"leases_created": 0})
        return json.dumps({"status": 404, "error": "unknown trajectory"})


@pytest.fixture
def route(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    require_module("starlette")
    from agentkv.vllm import _control

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    # A burst of 2 that refills once in ~17 minutes: nothing refills within a test.
    _control.configure_limit(ControlLimit(burst=2, rate_per_s=0.001))
    yield _control
    _control.configure_limit(None)


async def _get(control: Any, path: str, headers: dict[str, str], host: str = "127.0.0.1") -> Any:
    async def never(_: Any) -> Any:
        raise AssertionError("the control route answers its own paths")

    return await control.control_middleware(
        control_request(_Engine(), path, headers, host=host), never
    )


async def test_a_caller_past_its_burst_gets_429_with_retry_after(route: Any) -> None:
    a = {SALT_HEADER: "tenant-a"}
    path = "/agentkv/v1/trajectories/t"
    first = [await _get(route, path, a) for _ in range(2)]
    assert all(r.status_code != 429 for r in first)  # 404: no such trajectory, not limited
    refused = await _get(route, path, a)
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert "too many control requests" in json.loads(refused.body)["error"]
    # Another tenant, and another address without a scope, are not held back by a's flood.
    assert (await _get(route, path, {SALT_HEADER: "tenant-b"})).status_code != 429
    assert (await _get(route, path, {}, host="10.1.2.3")).status_code != 429


async def test_limited_requests_are_counted_in_the_stats_the_route_serves(route: Any) -> None:
    b = {SALT_HEADER: "tenant-b"}
    stats = await _get(route, "/agentkv/v1/stats", b)
    assert stats.status_code == 200
    before = json.loads(stats.body)["control_requests_limited"]
    await _get(route, "/agentkv/v1/stats", b)  # the burst's second token
    assert (await _get(route, "/agentkv/v1/stats", b)).status_code == 429
    other = await _get(route, "/agentkv/v1/stats", {SALT_HEADER: "tenant-c"})
    assert json.loads(other.body)["control_requests_limited"] == before + 1


async def test_rate_zero_never_limits(route: Any) -> None:
    route.configure_limit(ControlLimit(burst=1, rate_per_s=0.0))
    answers = [await _get(route, "/agentkv/v1/trajectories/t", {}) for _ in range(20)]
    assert all(r.status_code == 404 for r in answers)


# -- the client: a real loopback server answering 429 ----------------------------------------
class LimitingServer:
    """Answers ``POST /agentkv/v1/events`` from a script of (status, Retry-After) (the last
    entry repeats) and records each post's events."""

    def __init__(self, script: list[tuple[int, str | None]]) -> None:
        self.script = list(script)
        self.posts: list[list[dict[str, Any]]] = []
        self.gets: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                events = json.loads(self.rfile.read(length))["events"]
                server.posts.append(events)
                status, retry = server.script.pop(0) if len(server.script) > 1 else server.script[0]
                if status == 200:
                    body = {"accepted": len(events), "rejected": [], "server_time_ms": 0}
                else:
                    body = {"error": "too many control requests from this caller"}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if retry is not None:
                    self.send_header("Retry-After", retry)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                server.gets.append(self.path)
                data = b'{"error": "too many control requests from this caller"}'
                self.send_response(429)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def channel() -> Iterator[LifecycleChannel]:
    ch = LifecycleChannel(timeout_s=2.0, max_attempts=1, flush_interval_s=0)
    _lifecycle.set_channel(ch)
    yield ch
    _lifecycle.reset_channel()


def _run_trajectory(channel: LifecycleChannel, url: str, traj: str) -> str:
    """A tool call and a trajectory end whose events go to ``url``; the tool's result."""
    channel.register(traj, TrajectoryRoute(url, {}, Advisor(), LoadTracker()))

    @agentkv.tool(tool_class="shell")
    def run() -> str:
        return "tool ran"

    with agentkv.trajectory(traj):
        result = run()
    assert channel.flush(10)
    return result


def _lifecycle_counts() -> dict[str, int]:
    return dict(agentkv.stats().lifecycle)


def _delta(before: dict[str, int], name: str) -> int:
    return _lifecycle_counts().get(name, 0) - before.get(name, 0)


def test_a_429_is_retried_once_after_retry_after(channel: LifecycleChannel) -> None:
    server = LimitingServer([(429, "0"), (200, None)])
    try:
        before = _lifecycle_counts()
        assert _run_trajectory(channel, server.url, "limited-once") == "tool ran"
    finally:
        server.close()
    kinds = [[e["event"] for e in post] for post in server.posts]
    assert kinds[0] == kinds[1]  # the refused post, sent once more
    assert "trajectory_finished" in kinds[-1]
    assert _delta(before, "dropped_rate_limited") == 0
    assert _delta(before, "posted") == sum(len(p) for p in server.posts[1:])


def test_a_second_429_drops_the_events_and_counts_them(channel: LifecycleChannel) -> None:
    server = LimitingServer([(429, "0")])
    try:
        before = _lifecycle_counts()
        assert _run_trajectory(channel, server.url, "limited-always") == "tool ran"
    finally:
        server.close()
    assert len(server.posts) % 2 == 0  # each post tried twice, never more
    dropped = sum(len(p) for p in server.posts[::2])
    assert _delta(before, "dropped_rate_limited") == dropped >= 1
    assert _delta(before, "posted") == 0 and _delta(before, "failed") == 0


def test_a_long_retry_after_drops_at_once_and_holds_later_posts(
    channel: LifecycleChannel,
) -> None:
    server = LimitingServer([(429, "3600")])
    try:
        before = _lifecycle_counts()
        assert _run_trajectory(channel, server.url, "limited-long") == "tool ran"
        sent = len(server.posts)
        assert _run_trajectory(channel, server.url, "limited-long-2") == "tool ran"
    finally:
        server.close()
    assert sent == 1  # no wait of an hour, no second try
    assert len(server.posts) == 1  # the server asked for an hour: nothing more was posted
    assert _delta(before, "dropped_rate_limited") >= 2


def test_a_rate_limited_stats_route_is_asked_again_later() -> None:
    """A 429 from ``/agentkv/v1/stats`` is not taken for a server without load stats: the
    next refresh asks the stats route again, never ``/metrics`` instead."""
    channel = LifecycleChannel(timeout_s=2.0, load_refresh_s=0.0)
    server = LimitingServer([(200, None)])
    try:
        channel.tracker(server.url, {}, has_lower_tier=False)
        channel.register("t", TrajectoryRoute(server.url, {}, Advisor(), LoadTracker()))
        assert channel.refresh_loads(5) and channel.refresh_loads(5)
    finally:
        channel.close()
        server.close()
    assert len(server.gets) >= 2 and set(server.gets) == {"/agentkv/v1/stats"}


@pytest.mark.parametrize(
    ("value", "wait_s"),
    [("0", 0.0), ("2", 2.0), ("1.5", 1.5), (None, 1.0), ("soon", 1.0), ("-3", 0.0),
     ("nan", 1.0), ("99999", 3600.0)],
)  # fmt: skip
def test_retry_after_is_read_as_seconds_with_a_safe_default(
    value: str | None, wait_s: float
) -> None:
    assert retry_after_s(value) == wait_s


# -- a real server -------------------------------------------------------------------------
@pytest.mark.server
def test_the_profiles_limit_reaches_the_route_of_a_real_server(agentkv_server: Any) -> None:
    """The shared server's profile turns the limit off (its tests share one caller), and
    the route says so; its stats carry the route's own counter."""
    import httpx

    with httpx.Client(base_url=agentkv_server.base_url, timeout=60) as http:
        caps = http.get("/agentkv/v1/capabilities").json()
        stats = http.get("/agentkv/v1/stats").json()
    assert caps["limits"]["control_rate_per_s"] == 0.0
    assert caps["limits"]["control_burst"] == 100
    assert stats["control_requests_limited"] == 0

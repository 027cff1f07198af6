"""Ending a trajectory tells a sticky router (vllm-router ``sticky_least_loaded``) so.

The channel sends ``POST /finish_session?session_id=<trajectory>`` right after the
trajectory's end was posted under ``X-Session-ID``; a server without that route (vLLM
answers 404) is never asked again; a dead one costs nothing but a counter. The real
router's behaviour is tested in tests/server/test_vllm_replicas.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest

import agentkv
from agentkv.client import _accounting, _lifecycle
from agentkv.client._sessions import RouterSessions
from agentkv.vllm._launch import find_free_port
from tests.support.client_fakes import FakeServer


class _Router(BaseHTTPRequestHandler):
    """Answers /finish_session like vllm-router; records every request."""

    seen: list[tuple[str, str, dict[str, str]]]
    status = 200

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.seen.append(("POST", self.path, {k.lower(): v for k, v in self.headers.items()}))
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def router() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]], type[_Router]]]:
    seen: list[tuple[str, str, dict[str, str]]] = []
    handler = type("Router", (_Router,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen, handler
    httpd.shutdown()
    httpd.server_close()


def _ended(tid: str, kind: str = "trajectory_finished") -> dict[str, Any]:
    return {"trajectoryId": tid, "turnId": "3", "event": kind, "emittedAtMs": 1}


def test_only_ended_trajectories_posted_under_their_session_key_are_finished(
    router: tuple[str, list[Any], type[_Router]],
) -> None:
    url, seen, _ = router
    sessions = RouterSessions()
    auth = {"Authorization": "Bearer k"}
    sessions.after_post(url, {**auth, "X-Session-ID": "t1"}, [_ended("t1")])
    sessions.after_post(url, {"x-session-id": "t2"}, [_ended("t2", "trajectory_cancelled")])
    # not ended, no session header, or another trajectory's end under this key: nothing
    sessions.after_post(url, {"X-Session-ID": "t3"}, [{**_ended("t3"), "event": "tool_started"}])
    sessions.after_post(url, auth, [_ended("t4")])
    sessions.after_post(url, {"X-Dynamo-Session-ID": "t5"}, [_ended("t5")])
    sessions.after_post(url, {"X-Session-ID": "t6"}, [_ended("t7")])
    assert len(sessions) == 2
    before = _accounting.stats().lifecycle.get("sessions_finished", 0)
    with httpx.Client(timeout=2) as http:
        sessions.drain(http)
    assert [(m, p) for m, p, _ in seen] == [
        ("POST", "/finish_session?session_id=t1"),
        ("POST", "/finish_session?session_id=t2"),
    ]
    assert seen[0][2]["authorization"] == "Bearer k"  # a router with --api-key needs it
    assert _accounting.stats().lifecycle["sessions_finished"] == before + 2
    assert len(sessions) == 0


def test_a_server_without_the_route_is_asked_once(
    router: tuple[str, list[Any], type[_Router]],
) -> None:
    url, seen, handler = router
    handler.status = 404  # what vLLM answers
    sessions = RouterSessions()
    with httpx.Client(timeout=2) as http:
        for tid in ("a", "b", "c"):
            sessions.after_post(url, {"X-Session-ID": tid}, [_ended(tid)])
            sessions.drain(http)
    assert len(seen) == 1


def test_a_dead_router_costs_a_counter_and_nothing_raises() -> None:
    sessions = RouterSessions()
    url = f"http://127.0.0.1:{find_free_port()}"  # nothing listens there
    before = _accounting.stats().lifecycle.get("finish_session_failed", 0)
    sessions.after_post(url, {"X-Session-ID": "t"}, [_ended("t")])
    with httpx.Client(timeout=0.5) as http:
        sessions.drain(http)  # does not raise
    assert _accounting.stats().lifecycle["finish_session_failed"] == before + 1
    assert len(sessions) == 0


def test_the_wrapped_client_finishes_after_the_end_event_and_stops_at_a_plain_server() -> None:
    """One vLLM server (no router): the end event is posted, then one /finish_session is
    tried and answered 404, and later trajectories send none."""
    server = FakeServer("agentkv")
    channel = _lifecycle.LifecycleChannel(timeout_s=1.0)
    _lifecycle.set_channel(channel)
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    try:
        client = agentkv.wrap_openai(raw)
        for i in range(3):
            with agentkv.trajectory(f"plain-{i}"):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}]
                )
            assert channel.flush(3)
    finally:
        raw.close()
        _lifecycle.reset_channel()
        server.close()
    posts = [r for r in server.requests if r["method"] == "POST"]
    paths = [r["path"] for r in posts]
    assert paths.count("/finish_session") == 1
    first_end = next(
        i
        for i, r in enumerate(posts)
        if r["path"] == "/agentkv/v1/events"
        and any(e["event"] == "trajectory_finished" for e in r["body"]["events"])
    )
    assert paths.index("/finish_session") > first_end  # after the end was posted
    assert [e["trajectoryId"] for e in server.events if e["event"] == "trajectory_finished"] == [
        "plain-0",
        "plain-1",
        "plain-2",
    ]

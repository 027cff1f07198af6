"""Replicas behind vllm-router: command line, stats merging, wire shapes through the real router.

The router tests start the real ``vllm-router`` in front of small recording HTTP servers
(no vLLM), so they check what the router forwards, to which replica, and what comes back.
The last test runs two real vLLM replicas on the tiny model.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv._errors import ServeError
from agentkv.vllm import _replicas
from agentkv.vllm._replicas import ReplicaSet, router_command
from tests.support.client_fakes import CAPABILITIES
from tests.support.router_fakes import real_router
from tests.support.server_fixtures import SMALL_POOL, require_vllm, unavailable

CHAT = "/v1/chat/completions"


def test_router_command_shape() -> None:
    cmd = router_command(
        ["http://127.0.0.1:1", "http://127.0.0.1:2"],
        host="127.0.0.1",
        port=9000,
        prometheus_port=9001,
        extra_args=["--disable-retries"],
        executable=["vllm-router"],
    )
    assert cmd[:1] == ["vllm-router"]
    i = cmd.index("--worker-urls")
    assert cmd[i + 1 : i + 3] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert cmd[cmd.index("--policy") + 1] == "sticky_least_loaded"  # the default
    assert cmd[cmd.index("--prometheus-port") + 1] == "9001"
    assert cmd[cmd.index("--log-level") + 1] == "warning"
    assert cmd[-1] == "--disable-retries"


def test_missing_router_fails_before_starting_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_replicas.shutil, "which", lambda name: None)
    monkeypatch.setattr(_replicas.importlib.util, "find_spec", lambda name: None)
    started: list[Any] = []
    monkeypatch.setattr(_replicas, "start_server", lambda *a, **k: started.append(1))
    with pytest.raises(ServeError, match="pip install"):
        _replicas.serve_replicas(replicas=2)
    assert started == []


# -- the real router in front of recording servers ------------------------------------
class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]]
    name: str

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, body: bytes) -> None:
        path = self.path.split("?")[0]
        if path not in ("/health", "/metrics"):
            self.seen.append(
                {"name": self.name, "method": self.command, "path": path,
                 "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
            )  # fmt: skip
        if path in ("/v1/chat/completions",):
            out: dict[str, Any] = {
                "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": self.name}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }  # fmt: skip
        elif path == "/agentkv/v1/capabilities":
            out = dict(CAPABILITIES)
        elif path == "/agentkv/v1/events":
            n = len(json.loads(body).get("events", []))
            out = {"accepted": n, "rejected": [], "replica": self.name}
        else:
            out = {"replica": self.name, "path": path}
        data = json.dumps(out).encode() if path != "/health" else b""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Agentkv-Replica", self.name)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self._answer(self.rfile.read(n) if n else b"")


@contextlib.contextmanager
def _recorders() -> Iterator[tuple[list[dict[str, Any]], list[str]]]:
    """Two recording servers standing in for replicas: (what they saw, their URLs)."""
    seen: list[dict[str, Any]] = []
    httpds, urls = [], []
    for i in range(2):
        handler = type(f"R{i}", (_Recorder,), {"seen": seen, "name": f"r{i}"})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        httpds.append(httpd)
        urls.append(f"http://127.0.0.1:{httpd.server_address[1]}")
    try:
        yield seen, urls
    finally:
        for httpd in httpds:
            httpd.shutdown()
            httpd.server_close()


def _routed(policy: str) -> Iterator[tuple[str, list[dict[str, Any]], list[str]]]:
    with _recorders() as (seen, urls), real_router(urls, policy) as base:
        yield base, seen, urls


@pytest.fixture()
def routed() -> Iterator[tuple[str, list[dict[str, Any]], list[str]]]:
    """The real vllm-router (consistent_hash) in front of two recording servers."""
    yield from _routed("consistent_hash")


@pytest.fixture()
def routed_sticky() -> Iterator[tuple[str, list[dict[str, Any]], list[str]]]:
    """The real vllm-router (sticky_least_loaded) in front of two recording servers."""
    yield from _routed("sticky_least_loaded")


def _replica_set(urls: list[str], port: int | None, log_dir: Path) -> ReplicaSet:
    stand_ins = [SimpleNamespace(base_url=u, model="m", running=True) for u in urls]
    return ReplicaSet(stand_ins, host="127.0.0.1", port=port, log_dir=log_dir)  # type: ignore[arg-type]


@contextlib.contextmanager
def _taken(port: int) -> Iterator[None]:
    """A listener already on ``port`` (what made a CI run's router start fail)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


@pytest.mark.server
def test_router_start_moves_off_a_port_taken_since_it_was_drawn(tmp_path: Path) -> None:
    import httpx

    if shutil.which("vllm-router") is None:
        unavailable("vllm-router is not installed (pip install 'agentkv-cache[router]')")
    with _recorders() as (_, urls):
        rs = _replica_set(urls, None, tmp_path)
        drawn = rs.port
        try:
            with _taken(drawn):
                rs.start_router("consistent_hash", timeout_s=30)
            assert rs.port != drawn
            assert rs.base_url == f"http://127.0.0.1:{rs.port}"
            assert rs.openai_base_url == rs.base_url + "/v1"
            assert _replicas.ADDRESS_IN_USE in rs.logs  # the first start did fail
            assert httpx.get(rs.base_url + "/health", timeout=5).status_code == 200
            # Once clients know the port, a restart keeps it.
            rs.restart_router("round_robin")
            assert httpx.get(rs.base_url + "/health", timeout=5).status_code == 200
        finally:
            rs.stop_router(timeout_s=10)


@pytest.mark.server
def test_router_on_a_fixed_taken_port_fails_clearly_without_moving(tmp_path: Path) -> None:
    from agentkv.vllm import find_free_port

    if shutil.which("vllm-router") is None:
        unavailable("vllm-router is not installed (pip install 'agentkv-cache[router]')")
    port = find_free_port()
    with _recorders() as (_, urls), _taken(port):
        rs = _replica_set(urls, port, tmp_path)
        with pytest.raises(ServeError, match="Address already in use"):
            rs.start_router("consistent_hash", timeout_s=30)
        assert rs.port == port and rs.base_url.endswith(f":{port}")
        assert rs.router is not None and rs.router.poll() is not None  # nothing left running
        assert rs.logs.count("RuntimeError: " + _replicas.ADDRESS_IN_USE) == _replicas.BIND_ATTEMPTS


def _both_used(where: dict[str, set[str]]) -> bool:
    """Whether the trajectories seen so far went to two different replicas."""
    return len({next(iter(r)) for r in where.values()}) == 2


@pytest.mark.server
def test_router_pins_trajectory_and_control_route_follows(
    routed: tuple[str, list[dict[str, Any]], list[str]],
) -> None:
    import httpx

    base, seen, _ = routed
    where: dict[str, set[str]] = {}
    with httpx.Client(timeout=10) as client:
        # The hash ring's points come from the replicas' URLs (random ports), so a few ids can
        # all land on one replica: go on until both are used (64 ids; 8 once fell on one).
        for traj in [f"traj-{i}" for i in range(64)]:
            if _both_used(where) and len(where) >= 8:
                break
            for turn in range(2):
                r = client.post(
                    base + "/v1/chat/completions",
                    headers={"X-Session-ID": traj},
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                          "session_id": traj, "cache_salt": "t",
                          "vllm_xargs": {"agentkv_trajectoryId": traj, "agentkv_turnId": turn,
                                         "agentkv_hints": "{\"a\":1}"}},
                )  # fmt: skip
                assert r.status_code == 200
                where.setdefault(traj, set()).add(r.headers["x-agentkv-replica"])
            r = client.post(
                base + "/agentkv/v1/events",
                headers={"X-Session-ID": traj},
                json={"events": [{"trajectoryId": traj, "event": "tool_started"}]},
            )
            assert r.status_code == 200
            where[traj].add(r.headers["x-agentkv-replica"])
    assert all(len(replicas) == 1 for replicas in where.values()), where
    assert _both_used(where), where
    chat = next(s for s in seen if s["path"] == "/v1/chat/completions")
    body = json.loads(chat["body"])
    assert body["vllm_xargs"] == {"agentkv_trajectoryId": "traj-0", "agentkv_turnId": 0,
                                  "agentkv_hints": "{\"a\":1}"}  # fmt: skip
    assert (body["session_id"], body["cache_salt"]) == ("traj-0", "t")
    assert chat["headers"]["x-session-id"] == "traj-0"
    control = next(s for s in seen if s["path"] == "/agentkv/v1/events")
    assert json.loads(control["body"])["events"][0]["trajectoryId"] == "traj-0"
    # Unknown paths are forwarded without the client's headers.
    assert "x-session-id" not in control["headers"]


@pytest.mark.server
def test_wrapped_client_keeps_each_trajectory_on_one_replica_of_the_real_router(
    routed: tuple[str, list[dict[str, Any]], list[str]],
) -> None:
    """vllm-router 0.1.17, consistent_hash: a wrapped OpenAI client's model calls and
    lifecycle posts of one trajectory reach one replica; Program metadata arrives as the
    JSON string vLLM accepts."""
    import openai

    import agentkv
    from agentkv.client import _lifecycle

    base, seen, _ = routed
    channel = _lifecycle.LifecycleChannel(timeout_s=2.0)
    _lifecycle.set_channel(channel)
    raw = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0)
    try:
        options = agentkv.ClientOptions(backend="vllm", agentic_context=True)
        client = agentkv.wrap_openai(raw, options=options)

        @agentkv.tool(tool_class="shell")
        def run() -> str:
            return "ok"

        # The router's hash ring depends on the replicas' (free, so varying) ports: run
        # trajectories until both replicas got some (at least 8), so the one-replica-per-
        # trajectory check below cannot pass because everything went to one replica.
        count = 0
        while count < 8 or len({s["name"] for s in seen if s["path"] == CHAT}) < 2:
            assert count < 64, "the router sent 64 trajectories to one replica"
            with agentkv.trajectory(f"traj-{count}"):
                for _ in range(2):
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "x"}]
                    )
                    run()
            count += 1
        assert channel.flush(5)
    finally:
        raw.close()
        _lifecycle.reset_channel()
    where: dict[str, set[str]] = {}
    for s in seen:
        if s["path"] == "/v1/chat/completions":
            xargs = json.loads(s["body"])["vllm_xargs"]
            tid = xargs["agentkv_trajectoryId"]
            assert json.loads(xargs["agentic_context"])["program_id"] == tid
            where.setdefault(tid, set()).add(s["name"])
        elif s["path"] == "/agentkv/v1/events":
            for ev in json.loads(s["body"])["events"]:
                where.setdefault(ev["trajectoryId"], set()).add(s["name"])
    assert len(where) == count
    assert all(len(names) == 1 for names in where.values()), where
    assert len({next(iter(n)) for n in where.values()}) == 2


def _replica_of_each(seen: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Trajectory -> replicas that served its model calls or its lifecycle posts."""
    where: dict[str, set[str]] = {}
    for s in seen:
        if s["path"] == CHAT:
            where.setdefault(s["headers"]["x-session-id"], set()).add(s["name"])
        elif s["path"] == "/agentkv/v1/events":
            for ev in json.loads(s["body"])["events"]:
                where.setdefault(ev["trajectoryId"], set()).add(s["name"])
    return where


@pytest.mark.server
def test_sticky_router_balances_live_trajectories_and_forgets_ended_ones(
    routed_sticky: tuple[str, list[dict[str, Any]], list[str]],
) -> None:
    """vllm-router 0.1.17, sticky_least_loaded, with the wrapped client: each trajectory's
    calls and lifecycle posts stay on one replica, and because the client finishes each
    ended trajectory's session, trajectories that start one after another while a long
    one runs all go to the other replica (without /finish_session they would alternate)."""
    import openai

    import agentkv
    from agentkv.client import _lifecycle

    base, seen, _ = routed_sticky
    channel = _lifecycle.LifecycleChannel(timeout_s=2.0)
    _lifecycle.set_channel(channel)
    raw = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0)
    before = agentkv.stats().lifecycle.get("sessions_finished", 0)
    try:
        client = agentkv.wrap_openai(raw, options=agentkv.ClientOptions(backend="vllm"))

        def call() -> None:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

        @agentkv.tool(tool_class="shell")
        def run() -> str:
            return "ok"

        with agentkv.trajectory("long"):
            call()
            for i in range(4):
                with agentkv.trajectory(f"short-{i}"):
                    call()
                    run()
                    call()
                assert channel.flush(5)
            call()
    finally:
        raw.close()
        _lifecycle.reset_channel()
    where = _replica_of_each(seen)
    assert all(len(names) == 1 for names in where.values()), where
    (home,) = where["long"]
    assert {next(iter(where[f"short-{i}"])) for i in range(4)} == {"r0", "r1"} - {home}
    assert agentkv.stats().lifecycle["sessions_finished"] >= before + 4


@pytest.mark.server
def test_two_real_replicas_behind_the_router() -> None:
    import httpx

    import agentkv

    require_vllm()
    if shutil.which("vllm-router") is None:
        unavailable("vllm-router is not installed (pip install 'agentkv-cache[router]')")
    with agentkv.serve(replicas=2, progress=None, timeout_s=600, **SMALL_POOL) as rs:
        assert isinstance(rs, ReplicaSet)
        assert len(rs.replica_urls) == 2 and rs.openai_base_url.endswith("/v1")
        if len(os.sched_getaffinity(0)) >= 2:  # each replica's model worker on its own cores
            from agentkv.bench.testbed._costs import ProcessSampler

            workers = [
                os.sched_getaffinity(ProcessSampler(s.process.pid).pids["worker"])
                for s in rs.servers
            ]
            assert not workers[0] & workers[1], (workers, rs.replica_env)
        trajs = [f"t{i}" for i in range(6)]
        with httpx.Client(timeout=120) as client:
            for traj in trajs:
                r = client.post(
                    rs.openai_base_url + "/chat/completions",
                    headers={"X-Session-ID": traj},
                    json={"model": rs.model, "max_tokens": 2,
                          "messages": [{"role": "user", "content": f"{traj} hello"}],
                          "vllm_xargs": {"agentkv_trajectoryId": traj, "agentkv_turnId": 0}},
                )  # fmt: skip
                assert r.status_code == 200, r.text
                r = client.post(
                    rs.base_url + "/agentkv/v1/events",
                    headers={"X-Session-ID": traj},
                    json={"events": [{"trajectoryId": traj, "event": "tool_started"}]},
                )
                assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
            holders = {
                traj: [
                    url
                    for url in rs.replica_urls
                    if client.get(url + f"/agentkv/v1/trajectories/{traj}").status_code == 200
                ]
                for traj in trajs
            }
        assert all(len(h) == 1 for h in holders.values()), holders
        # the default policy, sticky_least_loaded: new trajectories alternate
        assert sorted(Counter(h[0] for h in holders.values()).values()) == [3, 3]
        stats = rs.get_stats()
        assert stats["total"]["parts_reporting"] == 2
        assert stats["total"]["events_unknown_trajectory"] == 0
        assert stats["total"]["events_received"] == len(trajs)  # each reached its holder only
        assert stats["total"]["trajectories_tracked"] == len(trajs)
        rs.restart_router("round_robin")  # same replicas, same port, another policy
        assert rs.policy == "round_robin" and rs.running
        with httpx.Client(timeout=120) as client:
            r = client.get(rs.openai_base_url + "/models")
            assert r.status_code == 200, r.text
    assert not rs.running


@pytest.mark.server
def test_the_routers_api_key_never_shows_on_its_command_line(tmp_path: Path) -> None:
    """``--replicas N --api-key K``: the router gets the key from its environment, so
    ``ps`` (every process's argv) never shows it, and the router still runs with it."""
    import httpx

    if shutil.which("vllm-router") is None:
        unavailable("vllm-router is not installed (pip install 'agentkv-cache[router]')")
    key = "s3cret-router-key"
    with _recorders() as (seen, urls):
        stand_ins = [SimpleNamespace(base_url=u, model="m", running=True) for u in urls]
        rs = ReplicaSet(stand_ins, host="127.0.0.1", port=None, log_dir=tmp_path, api_key=key)  # type: ignore[arg-type]
        try:
            rs.start_router("round_robin", timeout_s=30)
            assert rs.router is not None
            # the argv the router was exec'd with (vllm-router later retitles itself
            # "vllm::router", but ps shows the real argv until then)
            assert key not in rs.router.args and "--api-key" not in rs.router.args
            assert key not in " ".join(rs.router_argv)
            got = httpx.post(
                rs.base_url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            )
            assert got.status_code == 200
            assert [s["path"] for s in seen if s["path"] == "/v1/chat/completions"]
        finally:
            rs.stop_router(timeout_s=10)

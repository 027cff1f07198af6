"""Issue 13's client-side findings, each against a real local HTTP server.

1. The tenant's ``cache_salt`` is cache identity: it survives a 400 on a hinted request
   (the plain retry keeps it), a slow capability probe is asked again with a back-off
   instead of settling on headers only, and a salt that cannot be sent fails closed.
11. An absurd capabilities answer is converted once, with defaults; no probe per call.
14. Observe (and shadow) modes send nothing that can change scheduling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import agentkv
from agentkv.client import _lifecycle
from agentkv.client._lifecycle import LifecycleChannel
from agentkv.testing import capture_events
from tests.support.client_fakes import FakeServer

MESSAGES = [{"role": "user", "content": "hi"}]
_clients: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _fresh_channel() -> Iterator[LifecycleChannel]:
    channel = LifecycleChannel(timeout_s=0.3, max_attempts=1)
    _lifecycle.set_channel(channel)
    yield channel
    _lifecycle.reset_channel()
    while _clients:
        _clients.pop().close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer("agentkv", slow_s=1.0)
    try:
        yield fake
    finally:
        fake.close()


def wrapped(server: FakeServer, **options: Any) -> openai.OpenAI:
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    _clients.append(raw)
    return agentkv.wrap_openai(raw, options=agentkv.ClientOptions(**options))


def bodies(server: FakeServer) -> list[dict[str, Any]]:
    return [r["body"] for r in server.model_requests()]


def test_finding1_salt_survives_a_rejected_hint_and_every_later_call(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.reject_fields = {"vllm_xargs"}  # takes cache_salt, refuses agentkv's other fields
    client = wrapped(server)
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        with agentkv.trajectory("t1", tenant="acme"):
            first = client.chat.completions.create(model="m", messages=MESSAGES)
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert first.choices[0].message.content == "ok"
    hinted, retry, later = bodies(server)
    assert "vllm_xargs" in hinted
    salt = hinted["cache_salt"]
    assert retry["cache_salt"] == salt and "vllm_xargs" not in retry
    assert later["cache_salt"] == salt and "vllm_xargs" not in later
    assert "only the cache salt" in caplog.text


def test_finding1_slow_probe_is_retried_and_fails_closed_meanwhile(server: FakeServer) -> None:
    """A tenant's call waits for one patient probe (5x the timeout), then fails closed."""
    server.slow_probes = 2
    client = wrapped(server, probe_timeout_s=0.1, probe_retry_s=0.05)
    with agentkv.trajectory("t2", tenant="acme"):
        with pytest.raises(agentkv.TenantIsolationError, match="allow_unsalted"):
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert server.model_requests() == []  # nothing left unsalted
        time.sleep(0.1)
        client.chat.completions.create(model="m", messages=MESSAGES)
    [body] = bodies(server)
    assert body["cache_salt"].startswith("akv1-") and body["vllm_xargs"]["agentkv_trajectoryId"] == "t2"
    probes = [r for r in server.requests if r["path"] == "/agentkv/v1/capabilities"]
    assert len(probes) == 3  # slow, slow (patient), then answered


def test_a_slow_server_costs_one_call_the_patient_wait_not_every_call(
    server: FakeServer,
) -> None:
    """While the probe's back-off runs, later tenant calls fail closed at once: no
    quick probe and no patient probe each (before: every call waited both)."""
    server.slow_probes = 100  # the capabilities answer stays slow
    client = wrapped(server, probe_timeout_s=0.1, probe_retry_s=30.0)
    with agentkv.trajectory("t2b", tenant="acme"):
        for _ in range(4):
            with pytest.raises(agentkv.TenantIsolationError, match="allow_unsalted"):
                client.chat.completions.create(model="m", messages=MESSAGES)
    probes = [r for r in server.requests if r["path"] == "/agentkv/v1/capabilities"]
    assert len(probes) == 2  # the first call's quick and patient probes, then none
    assert server.model_requests() == []


def test_finding1_slow_probe_without_a_tenant_sends_headers_then_hints(server: FakeServer) -> None:
    server.slow_probes = 1
    client = wrapped(server, probe_timeout_s=0.2, probe_retry_s=0.05)
    with agentkv.trajectory("t3"):
        client.chat.completions.create(model="m", messages=MESSAGES)
        time.sleep(0.1)
        client.chat.completions.create(model="m", messages=MESSAGES)
    first, second = bodies(server)
    assert set(first) == {"model", "messages"}
    assert second["vllm_xargs"]["agentkv_trajectoryId"] == "t3"


def test_finding1_rejected_salt_fails_closed_unless_allowed(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.reject_fields = {"cache_salt"}
    strict = wrapped(server)
    with agentkv.trajectory("t4", tenant="acme"):
        with pytest.raises(agentkv.TenantIsolationError, match="allow_unsalted"):
            strict.chat.completions.create(model="m", messages=MESSAGES)
        with pytest.raises(agentkv.TenantIsolationError):  # remembered: not even sent
            strict.chat.completions.create(model="m", messages=MESSAGES)
    assert len(server.model_requests()) == 1
    lenient = wrapped(server, allow_unsalted=True)
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        with agentkv.trajectory("t5", tenant="acme"):
            r = lenient.chat.completions.create(model="m", messages=MESSAGES)
    assert r.choices[0].message.content == "ok"
    assert "cache_salt" not in bodies(server)[-1]
    assert "without a cache salt" in caplog.text or "rejected cache_salt" in caplog.text


def test_finding11_absurd_capabilities_are_converted_once(server: FakeServer) -> None:
    server.capabilities["num_blocks"] = "HUGE"  # 10**400 on the wire
    client = wrapped(server)
    with agentkv.trajectory("t6"):
        for _ in range(3):
            client.chat.completions.create(model="m", messages=MESSAGES)
    probes = [r for r in server.requests if r["path"] == "/agentkv/v1/capabilities"]
    assert len(probes) == 1
    assert all(b["vllm_xargs"]["agentkv_trajectoryId"] == "t6" for b in bodies(server))


@pytest.mark.parametrize("mode", ["observe", "shadow"])
def test_finding14_observe_and_shadow_send_nothing_that_schedules(
    server: FakeServer, _fresh_channel: LifecycleChannel, mode: str
) -> None:
    client = wrapped(server, mode=mode)

    @agentkv.tool(tool_class="shell")
    def run() -> str:
        return "done"

    with capture_events() as events, agentkv.trajectory("t7", tenant="acme"):
        client.chat.completions.create(model="m", messages=MESSAGES)
        run()
        client.chat.completions.create(model="m", messages=MESSAGES)
    _fresh_channel.flush(2)
    assert [e.event for e in events] == [
        "model_started",
        "tool_started",
        "tool_finished",
        "model_started",
        "trajectory_finished",
    ]
    assert not [r for r in server.requests if r["path"] == "/agentkv/v1/events"]
    for req in server.model_requests():
        assert set(req["body"]) == {"model", "messages", "cache_salt"}  # identity only
        headers = {k.lower() for k in req["headers"]}
        assert not headers & {"x-session-id", "x-request-id", "x-vllm-priority"}


def test_lifecycle_events_carry_the_tenant_scope(
    server: FakeServer, _fresh_channel: LifecycleChannel
) -> None:
    """The server keys trajectories by the requests' salt: events name the same scope."""
    client = wrapped(server)

    @agentkv.tool(tool_class="shell")
    def run() -> str:
        return "done"

    with agentkv.trajectory("t8", tenant="acme"):
        client.chat.completions.create(model="m", messages=MESSAGES)
        run()
    _fresh_channel.flush(3)
    [body] = bodies(server)
    assert server.events and all(e["cacheSalt"] == body["cache_salt"] for e in server.events)
    assert {e["turnId"] for e in server.events} == {"0"}  # a string on the wire


def test_finding1_one_slow_probe_costs_a_tenant_nothing(server: FakeServer) -> None:
    """A probe slower than its timeout is asked again at once for a tenant's call."""
    server.slow_probes = 1
    client = wrapped(server, probe_timeout_s=0.2)
    with agentkv.trajectory("t9", tenant="acme"):
        client.chat.completions.create(model="m", messages=MESSAGES)
    [body] = bodies(server)
    assert body["cache_salt"].startswith("akv1-") and body["vllm_xargs"]["agentkv_trajectoryId"] == "t9"

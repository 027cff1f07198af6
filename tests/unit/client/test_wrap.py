"""wrap_openai against a real local HTTP server: request shape, merging, privacy, fallbacks."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import agentkv
from agentkv.client import _accounting, _lifecycle
from agentkv.client._lifecycle import LifecycleChannel
from tests.support.client_fakes import FakeServer

MARKER = "MARKER-7f3a-prompt-text"
MESSAGES = [
    {"role": "system", "content": f"system {MARKER}"},
    {"role": "user", "content": f"user {MARKER}"},
]


@pytest.fixture(autouse=True)
def _fresh_channel() -> Iterator[LifecycleChannel]:
    channel = LifecycleChannel(timeout_s=0.3, max_attempts=2, down_backoff_s=0.1)
    _lifecycle.set_channel(channel)
    yield channel
    _lifecycle.reset_channel()


_open_clients: list[Any] = []


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    """An agentkv-served fake on a free port."""
    server = FakeServer("agentkv")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _open_clients:
        _open_clients.pop().close()


def client_for(server: FakeServer, **kw: Any) -> openai.OpenAI:
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    _open_clients.append(raw)
    return agentkv.wrap_openai(raw, **kw)


def hint_view(req: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    body = {
        k: v for k, v in (req["body"] or {}).items() if k not in ("messages", "prompt", "input")
    }
    return body, {k.lower(): v for k, v in req["headers"].items()}


def test_outside_a_trajectory_nothing_is_added(fake_server: FakeServer) -> None:
    client = client_for(fake_server)
    client.chat.completions.create(model="m", messages=MESSAGES)
    [req] = fake_server.model_requests()
    body, headers = hint_view(req)
    assert body == {"model": "m"}
    assert "x-session-id" not in headers and "x-request-id" not in headers
    assert not [r for r in fake_server.requests if r["path"].startswith("/agentkv")]  # no probe
    assert _accounting.stats().num_turns == 0


def test_inside_a_trajectory_flat_xargs_ids_salt_and_priority(fake_server: FakeServer) -> None:
    client = client_for(fake_server)
    with agentkv.trajectory("traj-1", tenant="acme"):
        client.chat.completions.create(model="m", messages=MESSAGES)
        client.chat.completions.create(model="m", messages=MESSAGES)
    first, second = fake_server.model_requests()
    body, headers = hint_view(second)
    # the router session key is tenant-scoped: the id and a MAC under the tenant's salt
    assert body["session_id"] == headers["x-session-id"] != "traj-1"
    assert headers["x-session-id"].startswith("traj-1.")
    assert headers["x-request-id"].startswith("agentkv-traj-1-1-")
    assert body["cache_salt"].startswith("akv1-")
    assert hint_view(first)[0]["cache_salt"] == body["cache_salt"]  # stable per tenant
    xargs = body["vllm_xargs"]
    assert xargs["agentkv_trajectoryId"] == "traj-1" and xargs["agentkv_turnId"] == 1
    assert all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in xargs.values())
    assert "agentkv_hints" not in xargs  # the server did not advertise the envelope
    # a resumed turn on a priority-scheduling server carries a bounded priority
    assert body["priority"] == xargs["agentkv_priority"] == -1


def test_a_server_that_reads_the_envelope_gets_it_alone(fake_server: FakeServer) -> None:
    fake_server.capabilities["features"] = {
        **fake_server.capabilities["features"], "hint_envelope": True,
    }  # fmt: skip
    client = client_for(fake_server)
    with agentkv.trajectory("traj-e"):
        client.chat.completions.create(model="m", messages=MESSAGES)
        client.chat.completions.create(model="m", messages=MESSAGES)
    body, _ = hint_view(fake_server.model_requests()[1])
    xargs = body["vllm_xargs"]
    assert list(xargs) == ["agentkv_hints"]
    envelope = json.loads(xargs["agentkv_hints"])
    assert envelope["protocol_version"] == "agentkv/1"
    [action] = envelope["actions"]
    assert action["payload"]["trajectoryId"] == "traj-e" and action["payload"]["turnId"] == 1
    assert body["priority"] == action["payload"]["priority"] == -1


def test_a_server_advertising_the_kv_hints_field_gets_the_envelope_there(
    fake_server: FakeServer,
) -> None:
    """``kv_hints_field`` advertised: the envelope goes, as a JSON object, in vLLM's own
    ``kv_hints`` request field, and ``vllm_xargs`` carries no second copy."""
    fake_server.capabilities["features"] = {
        **fake_server.capabilities["features"], "hint_envelope": True, "kv_hints_field": True,
    }  # fmt: skip
    client = client_for(fake_server)
    with agentkv.trajectory("traj-k"):
        client.chat.completions.create(model="m", messages=MESSAGES)
        client.chat.completions.create(model="m", messages=MESSAGES)
    body, headers = hint_view(fake_server.model_requests()[1])
    assert "vllm_xargs" not in body
    envelope = body["kv_hints"]
    assert isinstance(envelope, dict) and envelope["protocol_version"] == "agentkv/1"
    assert set(envelope) == {"protocol_version", "message_id", "actions"}
    [action] = envelope["actions"]
    assert set(action) == {"action_id", "action_type", "action_version", "payload"}
    assert action["payload"]["trajectoryId"] == "traj-k" and action["payload"]["turnId"] == 1
    assert body["session_id"] == headers["x-session-id"]  # the rest of the hints still go


def test_without_the_kv_hints_feature_the_field_is_never_sent(fake_server: FakeServer) -> None:
    """The fallback: a server that does not advertise ``kv_hints_field`` (stock vLLM 0.32 /
    0.33 ignore or reject the unknown field) gets the hint in ``vllm_xargs`` only."""
    fake_server.capabilities["features"] = {
        **fake_server.capabilities["features"], "hint_envelope": True, "kv_hints_field": False,
    }  # fmt: skip
    client = client_for(fake_server)
    with agentkv.trajectory("traj-x"):
        client.chat.completions.create(model="m", messages=MESSAGES)
    body, _ = hint_view(fake_server.model_requests()[0])
    assert "kv_hints" not in body
    assert list(body["vllm_xargs"]) == ["agentkv_hints"]


def test_caller_extra_body_and_headers_are_merged_and_win(fake_server: FakeServer) -> None:
    client = client_for(fake_server)
    with agentkv.trajectory("traj-2"):
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            extra_body={
                "vllm_xargs": {"mine": 7, "agentkv_turnId": 99},
                "top_k": 3,
                "session_id": "callers",
            },
            extra_headers={"x-request-id": "my-id", "X-Other": "1"},
        )
    body, headers = hint_view(fake_server.model_requests()[0])
    assert body["top_k"] == 3 and body["session_id"] == "callers"
    assert body["vllm_xargs"]["mine"] == 7 and body["vllm_xargs"]["agentkv_turnId"] == 99
    assert body["vllm_xargs"]["agentkv_trajectoryId"] == "traj-2"
    assert headers["x-request-id"] == "my-id" and headers["x-other"] == "1"
    assert headers["x-session-id"] == "traj-2"


def test_no_prompt_text_in_any_hint_header_or_event(
    fake_server: FakeServer, _fresh_channel: LifecycleChannel
) -> None:
    client = client_for(fake_server)

    @agentkv.tool(tool_class="shell")
    def run(cmd: str) -> str:
        return f"output {MARKER}"

    with agentkv.trajectory("traj-3", tenant="t"):
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "run",
                        "description": MARKER,
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
            ],
        )
        run(f"echo {MARKER}")
        client.chat.completions.create(model="m", messages=MESSAGES)
    _fresh_channel.flush(3)
    for req in fake_server.requests:
        body, headers = hint_view(req)
        body.pop("tools", None)
        assert MARKER not in json.dumps(body)
        assert MARKER not in json.dumps(headers)
    assert fake_server.events and MARKER not in json.dumps(fake_server.events)


def test_wrap_is_idempotent_typed_and_follows_copies(fake_server: FakeServer) -> None:
    raw = openai.OpenAI(base_url=fake_server.base_url, api_key="k")
    _open_clients.append(raw)
    client = agentkv.wrap_openai(raw)
    assert client is raw and agentkv.wrap_openai(client) is client
    assert isinstance(client, openai.OpenAI)
    copy = client.with_options(timeout=5)
    with agentkv.trajectory("traj-4"):
        copy.chat.completions.create(model="m", messages=MESSAGES)
        client.with_raw_response.chat.completions.create(model="m", messages=MESSAGES)
    reqs = fake_server.model_requests()
    assert all(hint_view(r)[1].get("x-session-id") == "traj-4" for r in reqs)
    assert len(reqs) == 2


def test_raw_response_calls_still_record_usage(fake_server: FakeServer) -> None:
    """with_raw_response (what langchain-openai calls) gives the turn record its usage."""
    client = client_for(fake_server)
    with agentkv.trajectory("traj-raw"):
        raw = client.with_raw_response.chat.completions.create(model="m", messages=MESSAGES)
    assert raw.parse().choices[0].message.content == "ok"
    (record,) = _accounting.get_records("traj-raw")
    assert (
        record.cached_tokens == 64 and record.prompt_tokens is not None
    )  # the fake reports 64 on non-streamed calls


def test_streaming_records_ttft_and_cached_tokens(fake_server: FakeServer) -> None:
    client = client_for(fake_server)
    with agentkv.trajectory("traj-5"):
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "ok"
        early = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        next(iter(early))
        early.close()
    first, second = _accounting.get_records("traj-5")
    assert first.streamed and first.ttft_ms is not None and first.cached_tokens == 96
    assert first.outcome == "ok"
    assert second.outcome == "incomplete" and second.cached_tokens is None
    body, _ = hint_view(fake_server.model_requests()[0])
    assert body["vllm_xargs"]["agentkv_trajectoryId"] == "traj-5"


def test_completions_and_responses_are_wrapped(fake_server: FakeServer) -> None:
    client = client_for(fake_server)
    with agentkv.trajectory("traj-6"):
        client.completions.create(model="m", prompt=MARKER)
        client.responses.create(model="m", input=MARKER)
    reqs = fake_server.model_requests()
    assert [r["path"] for r in reqs] == ["/v1/completions", "/v1/responses"]
    assert all(hint_view(r)[0]["vllm_xargs"]["agentkv_trajectoryId"] == "traj-6" for r in reqs)
    recs = _accounting.get_records("traj-6")
    assert [(r.api, r.cached_tokens) for r in recs] == [("completions", 32), ("responses", 48)]


def test_per_turn_records_and_stats(fake_server: FakeServer) -> None:
    client = client_for(fake_server)
    with agentkv.trajectory("traj-7"):
        for _ in range(3):
            client.chat.completions.create(model="m", messages=MESSAGES)
    recs = _accounting.get_records("traj-7")
    assert [r.turn_id for r in recs] == [0, 1, 2]
    assert [r.cached_tokens for r in recs] == [64, 64, 64]
    assert [r.eligible_prefix_tokens for r in recs] == [0, 100, 100]
    s = agentkv.stats()
    assert s.prefix_reuse_ratio == pytest.approx(128 / 200)
    assert s.rebuild_tax == pytest.approx(72 / 108)


async def test_async_client_same_shape(fake_server: FakeServer) -> None:
    client = agentkv.wrap_openai(openai.AsyncOpenAI(base_url=fake_server.base_url, api_key="k"))
    async with agentkv.trajectory("traj-8", tenant="acme"):
        await client.chat.completions.create(model="m", messages=MESSAGES)
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        async for _ in stream:
            pass
    await client.close()
    reqs = fake_server.model_requests()
    assert all(hint_view(r)[0]["vllm_xargs"]["agentkv_trajectoryId"] == "traj-8" for r in reqs)
    recs = _accounting.get_records("traj-8")
    assert [r.cached_tokens for r in recs] == [64, 96]


def test_server_rejecting_hint_fields_gets_the_plain_request(
    fake_server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    fake_server.reject_unknown_body = True
    client = client_for(fake_server)
    with caplog.at_level(logging.WARNING, logger="agentkv"), agentkv.trajectory("traj-9"):
        r = client.chat.completions.create(model="m", messages=MESSAGES)
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert r.choices[0].message.content == "ok"
    reqs = fake_server.model_requests()
    assert "vllm_xargs" in reqs[0]["body"] and "vllm_xargs" not in reqs[1]["body"]
    assert "vllm_xargs" not in reqs[2]["body"]
    assert hint_view(reqs[2])[1]["x-session-id"] == "traj-9"
    assert "rejected the request" in caplog.text


def test_user_errors_pass_through_unchanged(fake_server: FakeServer) -> None:
    client = client_for(fake_server)
    with agentkv.trajectory("traj-10"), pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="m", input="x")  # not wrapped: untouched
    with agentkv.trajectory("traj-11"), pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="bad-model", messages=MESSAGES)
    [rec] = _accounting.get_records("traj-11")
    assert rec.outcome == "error" and rec.error_type == "BadRequestError"
    with agentkv.trajectory("traj-12"):  # the user's own error did not switch hints off
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert "vllm_xargs" in fake_server.model_requests()[-1]["body"]


@pytest.mark.parametrize("control", ["down", "slow", "garbage"])
def test_broken_control_route_never_breaks_the_tool_or_the_request(
    control: str, _fresh_channel: LifecycleChannel, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeServer("agentkv", slow_s=10.0)
    try:
        client = client_for(server, probe_timeout_s=0.3)
        ran: list[str] = []

        @agentkv.tool(tool_class="shell")
        def run() -> str:
            ran.append("yes")
            return "done"

        with caplog.at_level(logging.WARNING, logger="agentkv"), agentkv.trajectory("traj-b"):
            client.chat.completions.create(model="m", messages=MESSAGES)  # probe: healthy
            server.control = control  # now the control route misbehaves
            assert run() == "done"
            r = client.chat.completions.create(model="m", messages=MESSAGES)
        assert ran == ["yes"] and r.choices[0].message.content == "ok"
        _fresh_channel.flush(3)
        lc = agentkv.stats().lifecycle
        assert lc.get("posted", 0) == 0
        assert sum(lc.values()) >= 1
    finally:
        server.close()


@pytest.mark.parametrize("control", ["down", "slow", "garbage"])
def test_broken_probe_falls_back_to_headers_only(control: str) -> None:
    server = FakeServer(control, slow_s=10.0)
    try:
        client = client_for(server, probe_timeout_s=0.2)
        with agentkv.trajectory("traj-p"):
            r = client.chat.completions.create(model="m", messages=MESSAGES)
        assert r.choices[0].message.content == "ok"
        body, headers = hint_view(server.model_requests()[0])
        assert body == {"model": "m"} and headers["x-session-id"] == "traj-p"
    finally:
        server.close()


def test_unreachable_control_route_and_tool_still_run() -> None:
    raw = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
    _open_clients.append(raw)
    client = agentkv.wrap_openai(raw, probe_timeout_s=0.2)

    @agentkv.tool
    def noop() -> int:
        return 1

    with agentkv.trajectory("traj-dead"):
        assert noop() == 1
        with pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(model="m", messages=MESSAGES)


def test_client_options_are_the_settings_and_keywords_override_them(
    fake_server: FakeServer,
) -> None:
    """``options=`` carries the settings; a keyword given beside it wins over its field."""
    options = agentkv.ClientOptions(backend="generic", lifecycle=False)
    headers_only = client_for(fake_server, options=options)
    hosted = client_for(fake_server, options=options, backend="openai")
    with agentkv.trajectory("traj-opt"):
        headers_only.chat.completions.create(model="m", messages=MESSAGES)
        hosted.chat.completions.create(model="m", messages=MESSAGES)
    first, second = fake_server.model_requests()
    body, headers = hint_view(first)
    assert body == {"model": "m"} and headers["x-session-id"] == "traj-opt"
    body, headers = hint_view(second)
    assert body["prompt_cache_key"].startswith("akv-") and "x-session-id" not in headers
    with pytest.raises(agentkv.ConfigError):
        agentkv.ClientOptions(backend="nope")
    with pytest.raises(agentkv.ConfigError):
        client_for(fake_server, options=options, mode="loud")  # type: ignore[arg-type]


def test_a_non_ascii_trajectory_id_goes_out_as_printable_ascii_headers(
    fake_server: FakeServer,
) -> None:
    """Header values stay printable ASCII (a hash where the id is not); the body keeps it."""
    client = client_for(fake_server)
    with agentkv.trajectory("déploiement-1"):
        client.chat.completions.create(model="m", messages=MESSAGES)
    [req] = fake_server.model_requests()
    body, headers = hint_view(req)
    assert body["session_id"] == "déploiement-1"
    session = headers["x-session-id"]
    assert session.startswith("h-") and session.isascii() and session.isprintable()
    assert headers["x-request-id"].startswith("agentkv-h-")

"""The wire protocol: what the client writes is what the server reads (one module for both)."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st
from test_backends import RETAIN

from agentkv._protocol import (
    PROTOCOL_VERSION,
    XARG_GAP_MS,
    XARG_GAP_P90_MS,
    XARG_GAP_P99_MS,
    XARG_HINTS,
    build_envelope,
    parse_envelope,
)
from agentkv.client.backends import RequestHints, VLLMAdapter, _adapters
from agentkv.events._schema import ADVICE_ACTIONS, ADVICE_REASONS, CacheAdvice
from agentkv.vllm._hints import parse_hint


def test_the_adapter_fields_parse_back_into_the_same_hint_flat_or_enveloped() -> None:
    hints = RequestHints("t-1", 3, "r-1", parent_id="p-0", advice=RETAIN)
    body: dict = {}
    VLLMAdapter().apply(hints, body, {})
    xargs = body["vllm_xargs"]
    flat = parse_hint(xargs)
    enveloped = parse_hint({XARG_HINTS: xargs[XARG_HINTS]})
    for hint in (flat, enveloped):
        assert hint is not None and not hint.errors
        assert (hint.trajectory_id, hint.turn_id, hint.parent_id) == ("t-1", 3, "p-0")
        assert (hint.action, hint.ttl_ms, hint.priority) == ("retain", 90_000, -1)
        assert (hint.reason, hint.policy_version) == ("short_tool_gap", "p")
        assert (hint.gap_ms, hint.gap_p90_ms, hint.gap_p99_ms) == (400_000, None, None)


def test_the_gap_forecast_travels_flat_and_enveloped() -> None:
    advice = RETAIN.model_copy(
        update={"predicted_gap_ms": 1500.4, "predicted_gap_p90_ms": 6000.0,
                "predicted_gap_p99_ms": 30_000.0}
    )  # fmt: skip
    body: dict = {}
    VLLMAdapter().apply(RequestHints("t-1", 3, "r-1", advice=advice), body, {})
    xargs = body["vllm_xargs"]
    assert (xargs[XARG_GAP_MS], xargs[XARG_GAP_P90_MS], xargs[XARG_GAP_P99_MS]) == (
        1500, 6000, 30_000,
    )  # fmt: skip
    for hint in (parse_hint(xargs), parse_hint({XARG_HINTS: xargs[XARG_HINTS]})):
        assert hint is not None and not hint.errors
        assert (hint.gap_ms, hint.gap_p90_ms, hint.gap_p99_ms) == (1500, 6000, 30_000)


def test_an_envelope_without_advice_carries_no_action() -> None:
    errors: list[str] = []
    raw = build_envelope(None, {})
    assert PROTOCOL_VERSION in raw
    assert parse_envelope(raw, errors) == {} and errors == ["agentkv_hints: no actions"]


def test_the_scope_round_trips_from_the_client_to_the_plugins_key() -> None:
    """What a salted tenant's client sends (the request's cache_salt, each lifecycle
    event's cacheSalt) parses on the server into the same tenant-scoped key."""
    import openai
    from test_client_fakes import FakeServer

    import agentkv
    from agentkv._protocol import EVENT_SALT_FIELD
    from agentkv.client import _lifecycle
    from agentkv.vllm._control import validate_events_body
    from agentkv.vllm._tenancy import Scoper

    channel = _lifecycle.LifecycleChannel(timeout_s=0.5, max_attempts=1)
    _lifecycle.set_channel(channel)
    server = FakeServer("agentkv")
    raw = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    try:
        client = agentkv.wrap_openai(raw)

        @agentkv.tool(tool_class="shell")
        def run() -> str:
            return "ok"

        with agentkv.trajectory("scoped-1", tenant="acme"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            run()
        assert channel.flush(3)
    finally:
        raw.close()
        server.close()
        _lifecycle.reset_channel()
    (request,) = [r["body"] for r in server.model_requests()]
    salt = request["cache_salt"]
    hint = parse_hint(request["vllm_xargs"])
    posts = [r["raw"] for r in server.requests if r["path"] == "/agentkv/v1/events"]
    events = [ev for raw_body in posts for ev in validate_events_body(raw_body)[0]]
    assert salt and {e["cache_salt"] for e in events} == {salt}
    assert all(EVENT_SALT_FIELD in ev for ev in server.events)
    scope = Scoper()
    assert hint is not None
    request_key = scope.key(salt, hint.trajectory_id)
    assert {scope.key(e["cache_salt"], e["trajectory_id"]) for e in events} == {request_key}
    assert scope.key(None, hint.trajectory_id) != request_key  # unscoped events miss it


_JSON_VALUES = st.one_of(
    st.text(), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)
)


@given(
    action=st.one_of(st.none(), st.sampled_from(["retain", "release"]), st.text()),
    payload=st.dictionaries(st.text(), _JSON_VALUES, max_size=8),
)
def test_the_envelope_is_byte_for_byte_what_json_dumps_writes(
    action: str | None, payload: dict[str, object]
) -> None:
    """The envelope written directly (str and int payloads) or through ``json`` (any
    other) is the compact ``json.dumps`` of the same envelope, so the wire never
    depends on the path taken."""
    raw = build_envelope(action, payload)
    sent = json.loads(raw)
    actions = []
    if action is not None:
        first = sent["actions"][0]
        actions = [
            {
                "action_id": first["action_id"],
                "action_type": action,
                "action_version": "1",
                "payload": payload,
            }
        ]
    expected = {
        "protocol_version": PROTOCOL_VERSION,
        "message_id": sent["message_id"],
        "actions": actions,
    }
    assert raw == json.dumps(expected, separators=(",", ":"))


_GAP_MS = st.one_of(st.none(), st.floats(0, 1e9), st.integers(0, 10**9))


@given(
    action=st.sampled_from(ADVICE_ACTIONS),
    reason=st.sampled_from(ADVICE_REASONS),
    ttl_ms=st.one_of(st.none(), st.integers(0, 10**9)),
    gaps=st.tuples(_GAP_MS, _GAP_MS, _GAP_MS),
    priority=st.one_of(st.none(), st.integers(-1000, 1000)),
    policy=st.text(min_size=1, max_size=64),
    trajectory_id=st.text(min_size=1, max_size=40),
    turn_id=st.integers(0, 10**6),
    parent_id=st.one_of(st.none(), st.text(max_size=20)),
    priority_supported=st.booleans(),
)
def test_the_advice_written_from_cached_parts_is_what_the_general_path_writes(
    action: str,
    reason: str,
    ttl_ms: int | None,
    gaps: tuple[float | None, float | None, float | None],
    priority: int | None,
    policy: str,
    trajectory_id: str,
    turn_id: int,
    parent_id: str | None,
    priority_supported: bool,
) -> None:
    """The vLLM adapter writes a decision's xargs and envelope from parts cached per
    decision; the body (key order included) is the one written field by field, ids aside."""
    advice = CacheAdvice(
        trajectory_id=trajectory_id, action=action, ttl_ms=ttl_ms, priority=priority,
        reason=reason, policy_version=policy, turn_id=turn_id, predicted_gap_ms=gaps[0],
        predicted_gap_p90_ms=gaps[1], predicted_gap_p99_ms=gaps[2],
    )  # fmt: skip
    hints = RequestHints(trajectory_id, turn_id, "r", parent_id=parent_id, advice=advice)
    adapter = VLLMAdapter(priority_supported=priority_supported)

    def written(cached: bool) -> str:
        parts = _adapters._advice_parts
        if not cached:
            _adapters._advice_parts = lambda advice: None  # type: ignore[assignment]
        try:
            body: dict[str, object] = {}
            adapter.apply(hints, body, {})
        finally:
            _adapters._advice_parts = parts
        return re.sub(r"[0-9a-f]{32}", "ID", json.dumps(body))

    assert written(True) == written(False)
    assert written(True) == written(True)  # the cached parts, again

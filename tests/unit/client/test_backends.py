"""Backend adapters and the capability probe: what each server gets."""

from __future__ import annotations

import json
import logging

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentkv
from agentkv.client._lifecycle import LifecycleChannel
from agentkv.client.backends import (
    DynamoAdapter,
    GenericAdapter,
    OpenAIHostedAdapter,
    RequestHints,
    VLLMAdapter,
    adapter_from_probe,
    is_hosted_openai,
    server_root,
)
from agentkv.client.backends._request import parse_usage
from agentkv.events._schema import CacheAdvice
from tests.support.client_fakes import CAPABILITIES, FakeServer

RETAIN = CacheAdvice(
    trajectory_id="t",
    action="retain",
    ttl_ms=90_000,
    priority=-1,
    reason="short_tool_gap",
    policy_version="p",
    predicted_gap_ms=400_000,
)


def hints(**kw: object) -> RequestHints:
    base: dict[str, object] = dict(
        trajectory_id="t",
        turn_id=2,
        request_id="agentkv-t-2-x",
        parent_id="root",
        tenant="acme",
        cache_salt="akv1-s",
        family_key="root",
        advice=RETAIN,
    )
    base.update(kw)
    return RequestHints(**base)  # type: ignore[arg-type]


def apply(adapter: object, h: RequestHints) -> tuple[dict[str, object], dict[str, str]]:
    body: dict[str, object] = {}
    headers: dict[str, str] = {}
    adapter.apply(h, body, headers)  # type: ignore[attr-defined]
    return body, headers


def test_vllm_adapter_fields_are_flat_and_priority_needs_support() -> None:
    body, headers = apply(VLLMAdapter(), hints())
    assert "priority" not in body
    xargs = body["vllm_xargs"]
    assert isinstance(xargs, dict)
    assert xargs["agentkv_priority"] == -1 and xargs["agentkv_ttlMs"] == 90_000
    assert xargs["agentkv_parentTrajectoryId"] == "root" and xargs["agentkv_action"] == "retain"
    assert all(not isinstance(v, (dict, list, bool)) for v in xargs.values())
    assert "agentkv_hints" not in xargs  # one form per request
    enveloped, _ = apply(VLLMAdapter(capabilities={"features": {"hint_envelope": True}}), hints())
    env = json.loads(str(enveloped["vllm_xargs"]["agentkv_hints"]))  # type: ignore[index]
    assert env["actions"][0]["payload"]["ttlMs"] == 90_000
    assert headers == {"X-Session-ID": "t", "X-Request-Id": "agentkv-t-2-x"}
    body2, _ = apply(VLLMAdapter(priority_supported=True), hints())
    assert body2["priority"] == -1


def test_openai_hosted_adapter_key_is_stable_per_family_and_tenant() -> None:
    body, headers = apply(OpenAIHostedAdapter(), hints(model="gpt-5.1"))
    assert headers == {} and set(body) == {"prompt_cache_key", "prompt_cache_retention"}
    assert body["prompt_cache_retention"] == "24h"  # predicted gap beyond in-memory caching
    newer, _ = apply(OpenAIHostedAdapter(), hints(model="gpt-5.6-mini"))
    assert newer["prompt_cache_options"] == {"ttl": "30m"}  # retention is deprecated there
    assert "prompt_cache_retention" not in newer
    older, _ = apply(OpenAIHostedAdapter(), hints(model="gpt-4o"))
    assert set(older) == {"prompt_cache_key"}  # no longer-retention field on this model
    same_family, _ = apply(OpenAIHostedAdapter(), hints(trajectory_id="child", turn_id=0))
    assert same_family["prompt_cache_key"] == body["prompt_cache_key"]
    other_tenant, _ = apply(OpenAIHostedAdapter(), hints(tenant="other"))
    assert other_tenant["prompt_cache_key"] != body["prompt_cache_key"]
    short, _ = apply(OpenAIHostedAdapter(), hints(advice=None))
    assert "prompt_cache_retention" not in short
    assert apply(OpenAIHostedAdapter(), hints(api="completions")) == ({}, {})


def test_dynamo_adapter_headers_and_nvext() -> None:
    body, headers = apply(DynamoAdapter(), hints())
    assert headers["X-Dynamo-Session-ID"] == "t" and headers["X-Dynamo-Parent-Session-ID"] == "root"
    nvext = body["nvext"]
    assert isinstance(nvext, dict)
    assert nvext["agent_hints"] == {"priority": 1}  # Dynamo: higher runs sooner
    assert "cache_control" not in nvext  # deprecated
    assert nvext["cache_salt"] == "akv1-s"
    assert nvext["agent_context"] == {
        "session_type_id": "agentkv",
        "session_id": "root",  # the root run
        "trajectory_id": "t",
        "parent_trajectory_id": "root",
    }
    assert "X-Dynamo-Session-Final" not in headers
    _, final = apply(DynamoAdapter(), hints(final=True))
    assert final["X-Dynamo-Session-Final"] == "true"
    observe, observe_headers = apply(DynamoAdapter(), hints(scheduling=False))
    assert observe == {"nvext": {"cache_salt": "akv1-s"}} and observe_headers == {}


def test_generic_adapter_sends_headers_only() -> None:
    assert apply(GenericAdapter(), hints()) == (
        {},
        {"X-Session-ID": "t", "X-Request-Id": "agentkv-t-2-x"},
    )


def test_probe_decisions(caplog: pytest.LogCaptureFixture) -> None:
    agentkv_vllm = adapter_from_probe("http://a", CAPABILITIES, None)
    assert isinstance(agentkv_vllm, VLLMAdapter) and agentkv_vllm.control_url == "http://a"
    assert agentkv_vllm.priority_supported
    stock = adapter_from_probe("http://b", None, {"version": "0.32.0"})
    assert isinstance(stock, VLLMAdapter) and stock.control_url is None
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        unknown = adapter_from_probe("http://c-unknown", None, None)
        adapter_from_probe("http://c-unknown", {"protocol_version": 3}, "x")
    assert isinstance(unknown, GenericAdapter)
    assert caplog.text.count("http://c-unknown") == 1  # one warning per server


def test_urls() -> None:
    assert server_root("http://h:8000/v1/") == "http://h:8000"
    assert server_root("http://h/proxy/v1") == "http://h/proxy"
    assert is_hosted_openai("https://api.openai.com/v1")
    assert not is_hosted_openai("http://127.0.0.1:8000/v1")


@pytest.mark.parametrize(
    ("backend", "control", "expect_body", "expect_header"),
    [
        ("auto", "stock", {"session_id", "vllm_xargs"}, "x-session-id"),
        ("openai", "agentkv", {"prompt_cache_key"}, None),
        ("dynamo", "agentkv", {"nvext"}, "x-dynamo-session-id"),
        ("generic", "agentkv", set(), "x-session-id"),
    ],
)
def test_configured_and_probed_backends_end_to_end(
    channel: LifecycleChannel,
    backend: str,
    control: str,
    expect_body: set[str],
    expect_header: str | None,
) -> None:
    server = FakeServer(control)
    raw = openai.OpenAI(base_url=server.base_url, api_key="k")
    try:
        client = agentkv.wrap_openai(raw, backend=backend)
        with agentkv.trajectory("tb", tenant=None):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        [req] = server.model_requests()
        added = set(req["body"]) - {"model", "messages"}
        assert added == expect_body
        headers = {k.lower() for k in req["headers"]}
        if expect_header:
            assert expect_header in headers
        else:
            assert "x-session-id" not in headers
        if backend != "auto":
            assert not [r for r in server.requests if r["path"].startswith("/agentkv")]
    finally:
        raw.close()
        server.close()


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(agentkv.ConfigError):
        agentkv.wrap_openai(openai.OpenAI(api_key="k"), backend="sglang")


def test_make_hints_equals_the_constructed_hints_and_stays_frozen() -> None:
    """The client's one-step builder gives the same frozen hints as the constructor."""
    import dataclasses

    from agentkv.client.backends._adapters import make_hints

    full = dataclasses.asdict(hints())
    full["advice"] = RETAIN  # asdict turned the advice into a dict
    made = make_hints(dict(full))
    assert made == RequestHints(**full)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.turn_id = 3  # type: ignore[misc]
    few = {"trajectory_id": "t", "turn_id": 1, "request_id": "r"}
    assert make_hints(few) == RequestHints("t", 1, "r")  # defaults: the constructor


_USAGE_VALUE = st.one_of(
    st.none(), st.integers(-5, 10**6), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3)
)
_USAGE_KEYS = [
    "prompt_tokens", "input_tokens", "completion_tokens", "output_tokens",
    "cache_read_input_tokens", "cache_creation_input_tokens",
]  # fmt: skip


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@given(
    st.dictionaries(st.sampled_from(_USAGE_KEYS), _USAGE_VALUE),
    st.one_of(st.none(), st.fixed_dictionaries({"cached_tokens": _USAGE_VALUE})),
)
def test_usage_is_read_as_ints_only_from_any_answer(
    usage: dict[str, object], details: dict[str, object] | None
) -> None:
    """Token counts are taken only where they are ints (not bools, floats or text), with
    the Responses / Anthropic names as fallbacks and Anthropic's cache reads added."""
    if details is not None:
        usage = {**usage, "prompt_tokens_details": details}
    prompt = _int_or_none(usage.get("prompt_tokens"))
    if prompt is None:
        prompt = _int_or_none(usage.get("input_tokens"))
    completion = _int_or_none(usage.get("completion_tokens"))
    if completion is None:
        completion = _int_or_none(usage.get("output_tokens"))
    cached = _int_or_none(details.get("cached_tokens")) if details else None
    read = _int_or_none(usage.get("cache_read_input_tokens"))
    if read is not None:
        created = _int_or_none(usage.get("cache_creation_input_tokens")) or 0
        cached, prompt = read, (prompt or 0) + read + created
    assert parse_usage({"usage": usage}) == (prompt, completion, cached)

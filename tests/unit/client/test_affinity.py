"""Router affinity: the key shapes, the DP rank, Program metadata, and each router's wire shape.

The wire-shape tests run the real OpenAI client, wrapped by agentkv, against a real local
HTTP server playing each router (``tests.support.router_fakes``): every model call and every lifecycle
post of a trajectory must carry that router's key, so they reach one replica. The
vllm-router case against the real router is in ``tests/server/test_vllm_replicas.py``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import openai
import pytest

import agentkv
from agentkv._errors import ConfigError
from agentkv.client import _lifecycle
from agentkv.client._affinity import (
    AFFINITY_PRESETS,
    Affinity,
    RouteKeys,
    data_parallel_rank,
    make_agentic_context,
)
from agentkv.client._lifecycle import LifecycleChannel
from agentkv.client.backends import RequestHints
from agentkv.events._schema import CacheAdvice
from tests.support.router_fakes import CookieGateway, RouterFake, body_key, header_key

# --- the key shapes (pure) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "name"),
    [
        ("vllm-router", "header", "X-Session-ID"),
        ("production-stack", "header", "x-user-id"),
        ("llm-d", "cookie", "llm-d-session"),
        ("dynamo", "header", "X-Dynamo-Session-ID"),
        ("header:x-session-key", "header", "x-session-key"),
        ("cookie: sticky", "cookie", "sticky"),
        ("body:user", "body", "user"),
    ],
)
def test_affinity_specs(spec: str, kind: str, name: str) -> None:
    affinity = Affinity.parse(spec)
    assert (affinity.kind, affinity.name) == (kind, name)
    assert Affinity.parse(affinity) is affinity


@pytest.mark.parametrize("spec", ["", "x-user-id", "query:x", "header:", "header:two words"])
def test_bad_affinity_is_refused_at_setup(spec: str) -> None:
    with pytest.raises(ConfigError):
        Affinity.parse(spec)
    with pytest.raises(ConfigError):
        agentkv.ClientOptions(affinity=spec)


def test_data_parallel_rank_is_stable_in_range_and_spreads() -> None:
    ranks = [data_parallel_rank(f"traj-{i}", 4) for i in range(400)]
    assert ranks == [data_parallel_rank(f"traj-{i}", 4) for i in range(400)]
    assert set(ranks) == {0, 1, 2, 3}
    assert min(ranks.count(r) for r in range(4)) > 60
    assert data_parallel_rank("x", 1) == 0


def _hints(advice: CacheAdvice | None, parent: str | None = None) -> RequestHints:
    return RequestHints(trajectory_id="child", turn_id=3, request_id="r", parent_id=parent,
                        advice=advice, root_id="root")  # fmt: skip


def test_agentic_context_is_a_json_string_from_the_trajectory_state() -> None:
    retain = CacheAdvice(trajectory_id="child", action="retain", ttl_ms=4500,
                         reason="short_tool_gap", policy_version="p1")  # fmt: skip
    context = json.loads(make_agentic_context(_hints(retain, parent="parent")))
    assert context == {"program_id": "child", "step_id": 3, "root_program_id": "root",
                       "parent_program_id": "parent", "expected_resume": True,
                       "kv_retention_ttl_seconds": 4.5}  # fmt: skip
    release = CacheAdvice(trajectory_id="child", action="release", reason="terminal_state",
                          policy_version="p1")  # fmt: skip
    context = json.loads(make_agentic_context(_hints(release)))
    assert context["expected_resume"] is False and "kv_retention_ttl_seconds" not in context
    default = CacheAdvice(trajectory_id="child", action="default", predicted_gap_ms=900.0,
                          reason="capacity_pressure", policy_version="p1")  # fmt: skip
    assert json.loads(make_agentic_context(_hints(default)))["kv_retention_ttl_seconds"] == 0.9
    assert "kv_retention_ttl_seconds" not in json.loads(make_agentic_context(_hints(None)))


def test_agentic_context_says_whether_a_subagent_blocks_its_parent_and_its_output_length() -> None:
    def context(**fields: object) -> dict[str, object]:
        hints = RequestHints(trajectory_id="child", turn_id=1, request_id="r", **fields)  # type: ignore[arg-type]
        return json.loads(make_agentic_context(hints))

    assert context(parent_id="p", critical_path=True)["blocks_parent"] is True
    assert context(parent_id="p", critical_path=False)["blocks_parent"] is False
    assert "blocks_parent" not in context(parent_id="p")  # the harness did not say
    assert "blocks_parent" not in context(critical_path=True)  # no parent to block
    assert context(expected_output_tokens=37)["expected_output_length"] == 37
    assert "expected_output_length" not in context()
    assert "expected_output_length" not in context(expected_output_tokens=0)


def test_route_keys_per_shape_and_data_parallel_rank() -> None:
    keys = RouteKeys(None)
    assert keys.session_headers("t", None) == {"X-Session-ID": "t"}
    assert keys.session_headers("t", None, default=False) == {}
    keys.set_backend("dynamo", {"data_parallel_size": 2})
    assert keys.session_headers("t", None) == {
        "X-Dynamo-Session-ID": "t",
        "X-data-parallel-rank": str(data_parallel_rank("t", 2)),
    }
    dynamo = RouteKeys(AFFINITY_PRESETS["dynamo"])
    assert dynamo.session_headers("c", "p") == {
        "X-Dynamo-Session-ID": "c",
        "X-Dynamo-Parent-Session-ID": "p",
    }
    body = RouteKeys(Affinity.parse("body:user"))
    assert body.session_body("t") == {"user": "t"} and body.session_headers("t", None) == {}
    cookie = RouteKeys(Affinity.parse("llm-d"))
    assert cookie.session_headers("t", None) == {}  # nothing learned yet
    import httpx2

    cookie.observe_response("t", httpx2.Headers([("set-cookie", "other=1"),
                                                 ("set-cookie", "llm-d-session=abc=; Path=/")]))  # fmt: skip
    assert cookie.session_headers("t", None) == {"Cookie": "llm-d-session=abc="}
    assert cookie.session_headers("u", None) == {}


# --- each router's wire shape, against a real local HTTP server -------------------------


@pytest.fixture
def channel() -> Iterator[LifecycleChannel]:
    ch = LifecycleChannel(timeout_s=2.0, max_attempts=2)
    _lifecycle.set_channel(ch)
    yield ch
    _lifecycle.reset_channel()


def _run_agent(client: openai.OpenAI, trajectories: list[str], turns: int = 3) -> None:
    @agentkv.tool(tool_class="shell")
    def run() -> str:
        return "ok"

    for tid in trajectories:
        with agentkv.trajectory(tid):
            for _ in range(turns):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4
                )
                run()


def _check_pinned(router: RouterFake, trajectories: list[str], key: str) -> None:
    """Every chat call and lifecycle post of a trajectory reached one replica, by its key."""
    chats = router.served("/v1/chat/completions")
    assert len(chats) == 3 * len(trajectories)
    per: dict[str, set[str | None]] = {}
    for r in chats:
        tid = r["body"]["vllm_xargs"]["agentkv_trajectoryId"]
        per.setdefault(tid, set()).add(r["replica"])
    for tid, replicas in router.events_by_trajectory().items():
        per[tid] |= replicas
    assert set(per) == set(trajectories)
    split = [t for t, r in per.items() if len(r) != 1 or None in r]
    assert not split, [
        (r["path"], r["replica"], r["headers"].get("cookie"), r["headers"].get(key))
        for r in router.requests
        if split[0] in json.dumps(r["body"])
    ]
    assert len({next(iter(r)) for r in per.values()}) == 2, "both replicas serve someone"
    events = router.served("/agentkv/v1/events")
    assert events, "trajectory_finished at least"
    assert all(len({e["trajectoryId"] for e in r["body"]["events"]}) == 1 for r in events)
    assert key  # the shape under test


TRAJS = [f"traj-{i}" for i in range(8)]


@pytest.mark.parametrize(
    ("affinity", "header"),
    [
        (None, "x-session-id"),  # vllm-router's consistent_hash: the default
        ("vllm-router", "x-session-id"),
        ("production-stack", "x-user-id"),  # --routing-logic session --session-key x-user-id
        ("header:x-agent-session", "x-agent-session"),
    ],
)
def test_header_affinity_reaches_one_replica(
    channel: LifecycleChannel, affinity: str | None, header: str
) -> None:
    router = RouterFake(header_key(header))
    raw = openai.OpenAI(base_url=router.base_url, api_key="-")
    try:
        client = agentkv.wrap_openai(raw, options=agentkv.ClientOptions(affinity=affinity))
        _run_agent(client, TRAJS)
        assert channel.flush(5)
        _check_pinned(router, TRAJS, header)
        for r in router.served("/v1/chat/completions"):
            assert r["headers"][header] == r["body"]["vllm_xargs"]["agentkv_trajectoryId"]
    finally:
        raw.close()
        router.close()


def test_production_stack_body_field_affinity(channel: LifecycleChannel) -> None:
    """production-stack reads the session key from the top-level body field when the
    header is absent; lifecycle posts carry the same field."""
    router = RouterFake(body_key("agent_session"))
    raw = openai.OpenAI(base_url=router.base_url, api_key="-")
    try:
        options = agentkv.ClientOptions(affinity="body:agent_session")
        _run_agent(agentkv.wrap_openai(raw, options=options), TRAJS)
        assert channel.flush(5)
        _check_pinned(router, TRAJS, "agent_session")
        for r in router.served("/agentkv/v1/events"):
            assert r["body"]["agent_session"] == r["body"]["events"][0]["trajectoryId"]
    finally:
        raw.close()
        router.close()


def test_llm_d_cookie_is_learned_and_echoed_per_trajectory(channel: LifecycleChannel) -> None:
    gateway = CookieGateway()
    raw = openai.OpenAI(base_url=gateway.base_url, api_key="-")
    try:
        client = agentkv.wrap_openai(raw, options=agentkv.ClientOptions(affinity="llm-d"))
        _run_agent(client, TRAJS)
        assert channel.flush(5)
        _check_pinned(gateway, TRAJS, "cookie")
        chats = gateway.served("/v1/chat/completions")
        first_of: dict[str, dict] = {}
        for r in chats:
            tid = r["body"]["vllm_xargs"]["agentkv_trajectoryId"]
            if tid not in first_of:
                first_of[tid] = r
                assert "cookie" not in r["headers"]  # the gateway chooses the pod
            else:
                value = r["headers"]["cookie"].split("=", 1)[1]
                pod = base64.b64decode(value).decode()
                assert pod == f"default/{first_of[tid]['replica']}"
        assert all("cookie" in r["headers"] for r in gateway.served("/agentkv/v1/events"))
    finally:
        raw.close()
        gateway.close()


def test_dynamo_session_headers_and_agent_context(channel: LifecycleChannel) -> None:
    router = RouterFake(header_key("x-dynamo-session-id"))
    raw = openai.OpenAI(base_url=router.base_url, api_key="-")
    try:
        options = agentkv.ClientOptions(backend="dynamo", affinity="dynamo")
        client = agentkv.wrap_openai(raw, options=options)
        with agentkv.trajectory("parent-1"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            with agentkv.trajectory("sub-1"):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}]
                )
        calls = router.served("/v1/chat/completions")
        assert [r["headers"]["x-dynamo-session-id"] for r in calls] == ["parent-1", "sub-1"]
        assert calls[1]["headers"]["x-dynamo-parent-session-id"] == "parent-1"
        context = calls[1]["body"]["nvext"]["agent_context"]
        assert context["trajectory_id"] == "sub-1"
        assert context["parent_trajectory_id"] == "parent-1"
        assert context["session_id"] == "parent-1"  # the root run
        assert "x-session-id" not in calls[0]["headers"]
    finally:
        raw.close()
        router.close()


def test_agentic_context_and_dp_rank_ride_on_model_calls_and_posts(
    channel: LifecycleChannel,
) -> None:
    """A data-parallel server (capabilities say 2 ranks) gets each trajectory pinned to a
    rank on its calls and posts; Program metadata travels as a JSON string."""
    from tests.support.client_fakes import CAPABILITIES

    router = RouterFake(header_key("x-session-id"),
                        capabilities={**CAPABILITIES, "data_parallel_size": 2})  # fmt: skip
    raw = openai.OpenAI(base_url=router.base_url, api_key="-")
    try:
        options = agentkv.ClientOptions(agentic_context=True)
        _run_agent(agentkv.wrap_openai(raw, options=options), TRAJS[:4], turns=2)
        assert channel.flush(5)
        lengths: dict[str, list[object]] = {}
        for r in router.served("/v1/chat/completions"):
            tid = r["body"]["vllm_xargs"]["agentkv_trajectoryId"]
            context = r["body"]["vllm_xargs"]["agentic_context"]
            assert isinstance(context, str) and json.loads(context)["program_id"] == tid
            lengths.setdefault(tid, []).append(json.loads(context).get("expected_output_length"))
            assert r["headers"]["x-data-parallel-rank"] == str(data_parallel_rank(tid, 2))
        # no answer yet at the first call; then the answers' 5 tokens, capped by max_tokens=4
        assert lengths == {tid: [None, 4] for tid in TRAJS[:4]}
        for r in router.served("/agentkv/v1/events"):
            tid = r["body"]["events"][0]["trajectoryId"]
            assert r["headers"]["x-data-parallel-rank"] == str(data_parallel_rank(tid, 2))
    finally:
        raw.close()
        router.close()


def test_expected_output_is_the_mean_answer_capped_by_the_request_limit() -> None:
    from types import SimpleNamespace

    from agentkv.client._call import _expected_output

    traj = SimpleNamespace(extras={})
    assert _expected_output(traj, {"max_tokens": 8}) is None  # type: ignore[arg-type]
    traj.extras["agentkv.output_tokens"] = (3, 100)  # three answers, 100 tokens
    assert _expected_output(traj, {}) == 33  # type: ignore[arg-type]
    assert _expected_output(traj, {"max_completion_tokens": 20}) == 20  # type: ignore[arg-type]
    assert _expected_output(traj, {"max_output_tokens": 64}) == 33  # type: ignore[arg-type]
    # a limit that is not a positive integer bounds nothing
    assert _expected_output(traj, {"max_tokens": True, "max_output_tokens": -1}) == 33  # type: ignore[arg-type]

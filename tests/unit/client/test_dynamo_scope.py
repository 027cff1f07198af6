"""Dynamo's ``nvext.agent_context`` ids are tenant-scoped like the router session keys
(issue 31): two tenants of one process running trajectory "1" under one root send two
sets of ids, each the same key the ``X-Dynamo-Session-*`` headers carry."""

from __future__ import annotations

from agentkv.client._affinity import session_key
from agentkv.client.backends._adapters import DynamoAdapter, RequestHints


def _apply(scope: str | None, **kw: object) -> tuple[dict[str, object], dict[str, str]]:
    fields: dict[str, object] = dict(
        trajectory_id="1", turn_id=0, request_id="r", parent_id="root", family_key="root",
        cache_salt=scope, session_scope=scope,
    )  # fmt: skip
    fields.update(kw)
    body: dict[str, object] = {}
    headers: dict[str, str] = {}
    DynamoAdapter().apply(RequestHints(**fields), body, headers)  # type: ignore[arg-type]
    return body, headers


def _context(body: dict[str, object]) -> dict[str, object]:
    nvext = body["nvext"]
    assert isinstance(nvext, dict)
    context = nvext["agent_context"]
    assert isinstance(context, dict)
    return context


def test_two_tenants_with_one_id_send_two_agent_contexts() -> None:
    a_body, a_headers = _apply("salt-a")
    b_body, b_headers = _apply("salt-b")
    a, b = _context(a_body), _context(b_body)
    for key in ("session_id", "trajectory_id", "parent_trajectory_id"):
        assert a[key] != b[key], key
    assert a["trajectory_id"] == a_headers["X-Dynamo-Session-ID"] == session_key("1", "salt-a")
    assert a["parent_trajectory_id"] == a_headers["X-Dynamo-Parent-Session-ID"]
    assert a["session_id"] == session_key("root", "salt-a")
    assert b["trajectory_id"] == b_headers["X-Dynamo-Session-ID"]
    assert all("salt-a" not in str(v) for v in a.values())  # the salt itself never travels


def test_without_a_tenant_the_ids_are_the_trajectory_ids() -> None:
    context = _context(_apply(None)[0])
    assert (context["session_id"], context["trajectory_id"]) == ("root", "1")
    assert context["parent_trajectory_id"] == "root"

"""Router session keys are tenant-scoped (issue 31): two tenants of one process running
trajectory "1" send two session keys, and each finishes only its own.

The router is a real loopback HTTP server (``tests/router_fakes.py``) that records every
request's headers and body and answers ``/finish_session`` like vllm-router: the wire is
what is checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import agentkv
from agentkv.client import _lifecycle
from agentkv.client._affinity import session_key
from agentkv.client._lifecycle import LifecycleChannel
from tests.support.router_fakes import RouterFake, header_key

CHAT = "/v1/chat/completions"
EVENTS = "/agentkv/v1/events"
FINISH = "/finish_session"


class StickyRouter(RouterFake):
    """A vllm-router that pins on ``X-Session-ID`` and takes ``/finish_session``."""

    def __init__(self) -> None:
        super().__init__(header_key("x-session-id"))

    def answer(self, path: str, body: Any) -> tuple[int, Any]:
        if path == FINISH:
            return 200, {"status": "ok"}
        return super().answer(path, body)


@pytest.fixture
def channel() -> Iterator[LifecycleChannel]:
    ch = LifecycleChannel(timeout_s=2.0)
    _lifecycle.set_channel(ch)
    yield ch
    _lifecycle.reset_channel()


@pytest.fixture
def router() -> Iterator[StickyRouter]:
    r = StickyRouter()
    yield r
    r.close()


def _run_two_tenants(router: StickyRouter, options: agentkv.ClientOptions) -> None:
    raw = openai.OpenAI(base_url=router.base_url, api_key="-", max_retries=0)
    try:
        client = agentkv.wrap_openai(raw, options=options)

        @agentkv.tool(tool_class="shell")
        def run() -> str:
            return "ok"

        for tenant in ("tenant-a", "tenant-b"):
            with agentkv.trajectory("1", tenant=tenant):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}]
                )
                run()
    finally:
        raw.close()


def _key_by_salt(router: StickyRouter) -> dict[str, str]:
    """Each tenant's salt -> the session key its model calls carried (one per tenant)."""
    keys: dict[str, set[str]] = {}
    for r in router.served(CHAT):
        keys.setdefault(r["body"]["cache_salt"], set()).add(r["headers"]["x-session-id"])
    assert all(len(k) == 1 for k in keys.values()), keys
    return {salt: next(iter(k)) for salt, k in keys.items()}


def test_two_tenants_with_one_trajectory_id_have_two_session_keys(
    channel: LifecycleChannel, router: StickyRouter
) -> None:
    _run_two_tenants(router, agentkv.ClientOptions(backend="vllm", salt_secret="install-1"))
    assert channel.flush(5)
    keys = _key_by_salt(router)
    assert len(keys) == 2 and len(set(keys.values())) == 2  # two tenants, two keys
    for salt, key in keys.items():
        assert key != "1" and key.startswith("1.")
        assert salt not in key  # the salt never travels as the key
        assert key == session_key("1", salt)
    # Model calls put the same key in vLLM's session_id; each tenant's lifecycle posts
    # carry its own key, never the other's.
    for r in router.served(CHAT):
        assert r["body"]["session_id"] == r["headers"]["x-session-id"]
    posts = router.served(EVENTS)
    assert posts
    for r in posts:
        (salt,) = {e["cacheSalt"] for e in r["body"]["events"]}
        assert r["headers"]["x-session-id"] == keys[salt]


def test_each_tenant_finishes_only_its_own_session(
    channel: LifecycleChannel, router: StickyRouter
) -> None:
    """Tenant a ending "1" sends /finish_session for a's key alone: b's pin on "1" stays
    (with raw ids, a's call named "1", which was b's session too)."""
    _run_two_tenants(router, agentkv.ClientOptions(backend="vllm", salt_secret="install-1"))
    assert channel.flush(5)
    keys = _key_by_salt(router)
    finished = [r["headers"]["x-session-id"] for r in router.served(FINISH)]
    assert sorted(finished) == sorted(keys.values())  # one each, each its own
    assert "1" not in finished


def test_program_ids_for_the_router_are_scoped_too(
    channel: LifecycleChannel, router: StickyRouter
) -> None:
    options = agentkv.ClientOptions(backend="vllm", salt_secret="install-1", agentic_context=True)
    _run_two_tenants(router, options)
    programs = {
        r["body"]["cache_salt"]: json.loads(r["body"]["vllm_xargs"]["agentic_context"])
        for r in router.served(CHAT)
    }
    assert len(programs) == 2
    for salt, context in programs.items():
        assert context["program_id"] == context["root_program_id"] == session_key("1", salt)


def test_another_install_of_the_same_tenant_gets_other_keys(
    channel: LifecycleChannel, router: StickyRouter
) -> None:
    """The key follows the salt, which follows the install's secret: a tenant name alone
    does not give another install (or tenant) the key."""
    _run_two_tenants(router, agentkv.ClientOptions(backend="vllm", salt_secret="install-1"))
    first = set(_key_by_salt(router).values())
    router.requests.clear()
    _run_two_tenants(router, agentkv.ClientOptions(backend="vllm", salt_secret="install-2"))
    assert not first & set(_key_by_salt(router).values())


def test_without_a_tenant_the_key_is_the_trajectory_id(
    channel: LifecycleChannel, router: StickyRouter
) -> None:
    raw = openai.OpenAI(base_url=router.base_url, api_key="-", max_retries=0)
    try:
        client = agentkv.wrap_openai(raw, options=agentkv.ClientOptions(backend="vllm"))
        with agentkv.trajectory("job-7"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    finally:
        raw.close()
    assert channel.flush(5)
    assert [r["headers"]["x-session-id"] for r in router.served(CHAT)] == ["job-7"]
    assert [r["headers"]["x-session-id"] for r in router.served(FINISH)] == ["job-7"]

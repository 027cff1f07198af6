"""A trajectory scope's ``critical_path`` and parent reach the vLLM hint; hosted and other
backends, which have no such field, send exactly what they sent before."""

from __future__ import annotations

import copy
import json
from typing import Any

import openai
import pytest

import agentkv
from agentkv.client._lifecycle import LifecycleChannel
from agentkv.protocol._hints import decode_hint
from tests.support.client_fakes import FakeServer

MESSAGES = [{"role": "user", "content": "x"}]


def _bodies(backend: str, critical: bool | None, *, envelope: bool = False) -> list[dict[str, Any]]:
    """The model requests' bodies of a parent's call and its subagent's call (the
    subagent's scope marked ``critical``), through the wrapped client."""
    server = FakeServer("agentkv")
    if envelope:
        server.capabilities = copy.deepcopy(server.capabilities)
        server.capabilities["features"]["hint_envelope"] = True
    raw = openai.OpenAI(base_url=server.base_url, api_key="k")
    try:
        client = agentkv.wrap_openai(raw, backend=backend)
        with agentkv.trajectory("lin-parent"):
            client.chat.completions.create(model="gpt-5.1", messages=MESSAGES)
            with agentkv.trajectory("lin-child", critical_path=critical):
                client.chat.completions.create(model="gpt-5.1", messages=MESSAGES)
        return [r["body"] for r in server.model_requests()]
    finally:
        raw.close()
        server.close()


@pytest.mark.parametrize("critical", [True, False])
@pytest.mark.parametrize("envelope", [False, True])
def test_the_scopes_critical_path_and_parent_reach_the_vllm_hint(
    channel: LifecycleChannel, critical: bool, envelope: bool
) -> None:
    parent_body, child_body = _bodies("auto", critical, envelope=envelope)
    child = decode_hint(child_body["vllm_xargs"])
    assert child is not None and not child.rejected, child and child.errors
    assert (child.trajectory_id, child.parent_id, child.critical_path) == (
        "lin-child",
        "lin-parent",
        critical,
    )
    parent = decode_hint(parent_body["vllm_xargs"])
    assert parent is not None and parent.critical_path is None and parent.parent_id is None
    if not envelope:  # flat values only: the boolean travels as 1 / 0
        assert child_body["vllm_xargs"]["agentkv_criticalPath"] == int(critical)
        assert "agentkv_criticalPath" not in parent_body["vllm_xargs"]


def test_an_unmarked_scope_sends_no_critical_path(channel: LifecycleChannel) -> None:
    _, child_body = _bodies("auto", None)
    assert "agentkv_criticalPath" not in child_body["vllm_xargs"]
    assert child_body["vllm_xargs"]["agentkv_parentTrajectoryId"] == "lin-parent"


@pytest.mark.parametrize("backend", ["openai", "dynamo", "generic"])
def test_other_backends_are_unchanged_by_the_mark(channel: LifecycleChannel, backend: str) -> None:
    """No hosted API (nor Dynamo, nor a generic server) has a critical-path field: the
    marked subagent's request is the unmarked one's, field for field."""
    marked = _bodies(backend, True)
    unmarked = _bodies(backend, None)
    assert marked == unmarked
    assert "critical" not in json.dumps(marked).lower()

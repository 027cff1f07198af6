"""Per-hint outcomes against one real ``agentkv serve`` (the session's shared
``agentkv_server``: tiny model, small pool), through a real OpenAI client: the verdict at
the request, and the result once the retained context is reused (issue 31, "safe
rollout, server side")."""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

import agentkv
from agentkv.client import _accounting
from agentkv.client._lifecycle import get_channel
from agentkv.protocol._wire import SALT_HEADER
from tests.support.requires import require_module

pytestmark = pytest.mark.server


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(20, 1500) for _ in range(n)]


def _outcomes(server: Any, tid: str, salt: str | None) -> httpx.Response:
    headers = {SALT_HEADER: salt} if salt else {}
    return httpx.get(f"{server.base_url}/agentkv/v1/outcomes/{tid}", headers=headers, timeout=30)


def _send(client: Any, server: Any, prompt: list[int], salt: str, **xargs: Any) -> None:
    client.completions.create(
        model=server.model, prompt=prompt, max_tokens=1, temperature=0,
        extra_body={"cache_salt": salt, "vllm_xargs": xargs},
    )  # fmt: skip


def test_a_retained_turn_is_accepted_then_applied_and_bad_hints_say_why(
    agentkv_server: Any,
) -> None:
    openai = require_module("openai")
    server = agentkv_server
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0)
    salt, prompt = "outcomes-tenant", _tokens(7100, 600)
    retain = {"agentkv_trajectoryId": "o-job", "agentkv_action": "retain", "agentkv_ttlMs": 60_000}
    _send(client, server, prompt, salt, **retain, agentkv_turnId=0)
    (first,) = _outcomes(server, "o-job", salt).json()["turns"]
    assert (first["turnId"], first["verdict"], first["result"]) == (0, "accepted", None)
    assert _outcomes(server, "o-job", "someone-else").status_code == 404  # scoped
    _send(client, server, [*prompt, *_tokens(7101, 20)], salt, **retain, agentkv_turnId=1)
    turns = _outcomes(server, "o-job", salt).json()["turns"]
    assert [(t["turnId"], t["verdict"], t["result"]) for t in turns] == [
        (0, "accepted", "applied"),
        (1, "accepted", None),
    ]
    # A hint the protocol rejects, and one this server does not support.
    bad = {"agentkv_trajectoryId": "o-bad", "agentkv_turnId": 0, "agentkv_ttlMs": -5}
    _send(client, server, _tokens(7102, 40), salt, **bad)
    (rejected,) = _outcomes(server, "o-bad", salt).json()["turns"]
    assert rejected["verdict"] == "rejected" and "ttlMs" in rejected["verdictReason"]
    pre = {"agentkv_trajectoryId": "o-pre", "agentkv_turnId": 0, "agentkv_action": "prefetch"}
    _send(client, server, _tokens(7103, 40), salt, **pre)
    (unsupported,) = _outcomes(server, "o-pre", salt).json()["turns"]
    assert unsupported["verdict"] == "unsupported" and "prefetch" in unsupported["verdictReason"]
    end = {"trajectoryId": "o-job", "event": "trajectory_finished", "cacheSalt": salt}
    answer = httpx.post(f"{server.base_url}/agentkv/v1/events", json={"events": [end]}, timeout=30)
    (entry,) = answer.json()["hintOutcomes"]
    assert [t["result"] for t in entry["turns"]] == ["applied", "expired"]


def test_the_wrapped_client_records_the_outcomes_in_turns_and_stats(agentkv_server: Any) -> None:
    """Measured on a quiet pool: (accepted, applied), (accepted, applied), (accepted,
    expired: the end released the last lease)."""
    openai = require_module("openai")
    raw = openai.OpenAI(base_url=agentkv_server.base_url + "/v1", api_key="-", max_retries=0)
    client = agentkv.wrap_openai(raw)
    messages = [{"role": "system", "content": "You are a careful agent. " * 120},
                {"role": "user", "content": "start"}]  # fmt: skip

    @agentkv.tool(tool_class="shell")
    def run() -> str:
        return "ok"

    with agentkv.trajectory("o-wrapped", tenant="acme"):
        for turn in range(3):
            r = client.chat.completions.create(
                model=agentkv_server.model, messages=messages, max_tokens=4, temperature=0
            )
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            messages.append({"role": "user", "content": f"tool said {run()} at {turn}"})
    assert get_channel().flush(5)
    raw.close()
    records = _accounting.get_records("o-wrapped")
    assert [r.turn_id for r in records] == [0, 1, 2]
    hints = [r.hint for r in records]
    assert all(h is not None and h.verdict == "accepted" for h in hints)
    results = [h.result for h in hints if h is not None]
    counts = agentkv.stats().hint_outcomes
    assert counts["accepted"] == 3
    assert sum(counts.get(k, 0) for k in ("applied", "failed", "expired")) == sum(
        1 for x in results if x is not None
    )
    # Turn 0's lease was taken up by turn 1 (or given way / not granted on a busy pool):
    # its result is in by the end, carried by the answer to trajectory_finished.
    assert results[0] is not None


def test_lineage_hints_are_accepted_and_a_bad_critical_path_says_why(agentkv_server: Any) -> None:
    """``criticalPath`` and ``parentTrajectoryId`` through a real OpenAI client: a flat
    ``true`` (which vLLM's request model turns into 1) and the envelope's JSON boolean
    are accepted; a string is rejected with a reason naming the field, and the user's
    call is answered all the same (invariant 1)."""
    openai = require_module("openai")
    from agentkv.protocol._wire import XARG_HINTS, build_envelope

    server = agentkv_server
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0)
    salt = "lineage-tenant"
    parent = {"agentkv_trajectoryId": "l-parent", "agentkv_turnId": 0, "agentkv_action": "retain",
              "agentkv_ttlMs": 60_000}  # fmt: skip
    _send(client, server, _tokens(7200, 300), salt, **parent)
    child = {"agentkv_trajectoryId": "l-child", "agentkv_turnId": 0,
             "agentkv_parentTrajectoryId": "l-parent", "agentkv_criticalPath": True}  # fmt: skip
    _send(client, server, _tokens(7201, 60), salt, **child)
    payload = {"trajectoryId": "l-env", "turnId": 0, "parentTrajectoryId": "l-parent",
               "criticalPath": False}  # fmt: skip
    envelope = {XARG_HINTS: build_envelope("default", payload)}
    _send(client, server, _tokens(7202, 60), salt, **envelope)
    for tid in ("l-parent", "l-child", "l-env"):
        (turn,) = _outcomes(server, tid, salt).json()["turns"]
        assert turn["verdict"] == "accepted", (tid, turn)
    bad = {"agentkv_trajectoryId": "l-bad", "agentkv_turnId": 0, "agentkv_criticalPath": "yes"}
    r = client.completions.create(
        model=server.model, prompt=_tokens(7203, 40), max_tokens=1, temperature=0,
        extra_body={"cache_salt": salt, "vllm_xargs": bad},
    )  # fmt: skip
    assert r.choices and r.choices[0].finish_reason is not None  # served as if unhinted
    (rejected,) = _outcomes(server, "l-bad", salt).json()["turns"]
    assert rejected["verdict"] == "rejected"
    assert "criticalPath must be true or false" in rejected["verdictReason"]
    end = [{"trajectoryId": t, "event": "trajectory_finished", "cacheSalt": salt}
           for t in ("l-parent", "l-child", "l-env")]  # fmt: skip
    httpx.post(f"{server.base_url}/agentkv/v1/events", json={"events": end}, timeout=30)

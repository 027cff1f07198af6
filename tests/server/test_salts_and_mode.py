"""Issue 31 against one real ``agentkv serve`` (tiny model, small pool), through a real
OpenAI client: the bound on new salt scopes per source, and the policy-mode switch on the
control route.

The server's bound is 4 new salts per source, refilled at one per 1,000 s (so a test run
sees the burst alone); every caller here is one source (127.0.0.1, no API key).
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import pytest

from tests.support.requires import require_module
from tests.support.server_fixtures import SMALL_POOL

pytestmark = [pytest.mark.server, pytest.mark.slow]

OPTIONS: dict[str, Any] = {**SMALL_POOL, "new_salt_burst": 4, "new_salt_rate_per_s": 0.001}


@pytest.fixture()
def server(agentkv_server_factory: Any) -> Any:
    return agentkv_server_factory(**OPTIONS)


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(20, 1500) for _ in range(n)]


def _retain(tid: str) -> dict[str, Any]:
    return {"agentkv_trajectoryId": tid, "agentkv_action": "retain", "agentkv_ttlMs": 60_000}


def _stats(server: Any) -> dict[str, Any]:
    time.sleep(1.1)  # the route serves a snapshot up to a second old
    return dict(httpx.get(server.base_url + "/agentkv/v1/stats", timeout=30).json())


def _complete(client: Any, server: Any, salt: str | None, prompt: list[int], tid: str) -> Any:
    body: dict[str, Any] = {"vllm_xargs": _retain(tid)}
    if salt is not None:
        body["cache_salt"] = salt
    return client.completions.create(
        model=server.model, prompt=prompt, max_tokens=1, temperature=0, extra_body=body
    )


def test_made_up_salts_from_one_source_open_no_more_scopes_than_its_burst(server: Any) -> None:
    """Finding: any client could open a new tenant scope per request by making up salts.
    Past its burst of 4, one source's hinted requests with new salts are served as stock
    vLLM (no scope, no lease), each call still answered, and counted."""
    openai = require_module("openai")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="-")
    before = _stats(server)
    answers = [
        _complete(client, server, f"made-up-{i}", _tokens(9100 + i, 40), f"t{i}") for i in range(12)
    ]
    assert all(a.choices and a.usage.prompt_tokens == 40 for a in answers)
    after = _stats(server)
    opened = after["new_salts_admitted"] - before["new_salts_admitted"]
    assert opened == 4 and after["new_salts_limited"] - before["new_salts_limited"] >= 8
    assert after["hints_received"] - before["hints_received"] == opened  # the rest: stock
    assert after["tenants_tracked"] - before["tenants_tracked"] <= opened
    caps = httpx.get(server.base_url + "/agentkv/v1/capabilities", timeout=30).json()
    assert caps["limits"]["new_salt_burst"] == 4
    # A salt the source opened within its burst keeps its hints.
    first = client.completions.create(
        model=server.model, prompt=_tokens(9100, 40), max_tokens=1, temperature=0,
        extra_body={"cache_salt": "made-up-0", "vllm_xargs": _retain("t0")},
    )  # fmt: skip
    assert first.choices
    assert _stats(server)["hints_received"] == after["hints_received"] + 1


def test_the_policy_mode_switches_at_run_time_through_the_control_route(server: Any) -> None:
    openai = require_module("openai")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="-")
    url = server.base_url + "/agentkv/v1/mode"
    caps = httpx.get(server.base_url + "/agentkv/v1/capabilities", timeout=30).json()
    assert caps["policy_mode"] == "act" and "shadow" in caps["features"]["policy_modes"]
    assert httpx.get(url, timeout=30).status_code == 405
    assert httpx.post(url, json={"mode": "sideways"}, timeout=30).status_code == 400
    salt = None  # the unsalted scope: the other test spends this source's new salts
    prompt = _tokens(9300, 200)  # 6 full blocks
    try:
        _complete(client, server, salt, prompt, "m1")
        traj = httpx.get(server.base_url + "/agentkv/v1/trajectories/m1", timeout=30).json()
        assert traj["leased_blocks"] == 6
        r = httpx.post(url, json={"mode": "shadow"}, timeout=30)
        assert r.status_code == 200 and r.json()["previous"] == "act"
        s = _stats(server)
        assert s["policy_mode"] == "shadow" and s["leases_active"] == 0  # the lease ended
        _complete(client, server, salt, [*prompt, *_tokens(9301, 40)], "m1")
        s = _stats(server)
        assert s["shadow_leases_created"] >= 1 and s["shadow_hints_received"] >= 1
        assert s["leases_active"] == 0 and s["retained_blocks"] == 0
        traj = httpx.get(server.base_url + "/agentkv/v1/trajectories/m1", timeout=30).json()
        assert traj["leased_blocks"] == 0 and traj["shadow_leased_blocks"] > 0
    finally:
        back = httpx.post(url, json={"mode": "act"}, timeout=30)
    assert back.status_code == 200
    s = _stats(server)
    assert s["policy_mode"] == "act" and s["mode_switches"] >= 2 and s["internal_errors"] == 0
